"""Correlated draws of a job through the engine: P10 / P50 / P90 of its iteration and what spreads it.

An error of a kernel model is systematic (the same family is off the same way on every shape of a
run), so a draw takes one standard normal ``z`` per source, not per op: every kernel of a family is
scaled by ``exp(sigma * z)`` with its own ``sigma`` (which model timed it: :meth:`Spread.kernel`), a
fabric's bandwidth is divided by ``exp(sigma_big * z)`` and its latency multiplied by
``exp(sigma_small * z)`` (large messages are bandwidth-bound, small ones latency-bound), and the host
time per launched op is scaled by ``exp(sigma_host * z)``. The factors are the same on every rank of a
draw, so a symmetric job stays symmetric and the fold and the periodic shortcut still apply. The
``z`` of each source are a Latin hypercube over the draws (each source's ``N`` values one per
``1/N`` quantile of the normal, in an order drawn from the run's seed), so that a few dozen draws
give steady percentiles; the same seed gives the same draws.

What spreads the iteration: for each source, the share of the variance of ``ln(iteration time)``
over the draws that its ``z`` explains in a least-squares plane through every source's
(:func:`variance_shares`; the sources are drawn independently, so the shares add up to the plane's
R^2, 1 less what the sources' interactions and the engine's non-linearity explain).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from ..config.loader import Job
from ..config.mixed import is_mixed
from ..config.platform import PlatformSpec
from ..errors import ConfigError
from ..graph import KernelSpec
from ..result import SimResult
from ..sim import simulate
from .sources import Spread
from .sources import spread as sources_of

#: The percentiles reported.
QUANTILES = (10, 50, 90)


@dataclass(frozen=True)
class Uncertainty:
    """The draws of one job: each draw's iteration time and what spread them."""

    seed: int
    point_s: float
    times_s: tuple[float, ...]
    #: per source, the share of the variance of ln(iteration time) its factor explains, largest first
    shares: Mapping[str, float]
    #: samples and tokens of one iteration (None where the workload has none), for the throughput
    samples: float | None = None
    tokens: float | None = None
    sources: tuple[str, ...] = field(default=())

    @property
    def draws(self) -> int:
        return len(self.times_s)

    def quantiles_s(self) -> dict[int, float]:
        """P10, P50 and P90 of the iteration time, s."""
        t = np.asarray(self.times_s)
        return {q: float(np.quantile(t, q / 100)) for q in QUANTILES}

    def as_dict(self) -> dict[str, Any]:
        """The ``uncertainty`` section of ``summary.json`` (ms, per second)."""
        q = self.quantiles_s()
        out: dict[str, Any] = {"draws": self.draws, "seed": self.seed, "interval": "80% (P10 to P90)",
                               "iteration_time_ms": {f"p{k}": v * 1e3 for k, v in q.items()}}
        for name, amount in (("samples_per_s", self.samples), ("tokens_per_s", self.tokens)):
            if amount:  # a slow draw is a low throughput: P10 of throughput is amount / P90 of time
                out.setdefault("throughput", {})[name] = {f"p{k}": amount / q[100 - k] for k in QUANTILES}
        out["variance_share"] = dict(self.shares)
        return out


def normals(n: int, sources: int, seed: int) -> np.ndarray:
    """An ``n x sources`` Latin hypercube of standard normals from ``seed`` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    inv = NormalDist().inv_cdf
    out = np.empty((n, sources))
    for j in range(sources):
        u = (rng.permutation(n) + rng.random(n)) / n
        out[:, j] = [inv(min(max(x, 1e-12), 1 - 1e-12)) for x in u]
    return out


def kernel_sigmas(spread: Spread, kernels: Sequence[KernelSpec], models: Sequence[str]) -> np.ndarray:
    """Each kernel's spread, by its family and the model that timed it."""
    return np.array([spread.kernel(k.family, m) for k, m in zip(kernels, models, strict=True)])


def drawn(secs: np.ndarray, kernels: Sequence[KernelSpec], sig: np.ndarray, z: Mapping[str, float]) -> np.ndarray:
    """Kernel times scaled by ``exp(sigma * z)`` of their family in a draw (``z`` by family)."""
    return np.asarray(secs, dtype=float) * np.exp(sig * np.array([z.get(k.family, 0.0) for k in kernels]))


class _Timer:
    """The kernel times of every run of one job: the models' point times, computed once per kernel
    table, scaled per family by the current draw's factors."""

    def __init__(self, spread: Spread) -> None:
        self.spread = spread
        self.z: Mapping[str, float] = {}
        self._point: dict[tuple[KernelSpec, ...], tuple[np.ndarray, list[str], np.ndarray]] = {}

    def families(self) -> list[str]:
        """The families whose kernels any run so far timed with a spread above 0, sorted."""
        return sorted({k.family for key, (_, models, sig) in self._point.items()
                       for k, s in zip(key, sig, strict=True) if s > 0})

    def __call__(self, kernels: Sequence[KernelSpec],
                 point: Callable[[], tuple[np.ndarray, list[str]]]) -> tuple[np.ndarray, list[str]]:
        key = tuple(kernels)
        got = self._point.get(key)
        if got is None:
            d, models = point()
            got = self._point[key] = (np.asarray(d, dtype=float), list(models),
                                      kernel_sigmas(self.spread, kernels, models))
        d, models, sig = got
        return (drawn(d, kernels, sig, self.z) if self.z else d), models


def fabrics(job: Job) -> list[str]:
    """The fabrics a job's collectives may cross: NVLink (else PCIe) inside a node, the network between."""
    p = job.platform
    inside = [] if job.platform.node.gpus <= 1 and job.workload.nodes <= 1 else (
        ["nvlink"] if p.node.nvlink is not None else ["pcie"])
    return inside + (["network"] if job.workload.nodes > 1 else [])


def perturbed(job: Job, sp: Spread, z: Mapping[str, float]) -> Job:
    """``job`` with each fabric's bandwidth divided and latency multiplied by its draw's factors, and
    the host time per op scaled (``z`` by source name: ``collective:nvlink``, ``host``)."""
    p = job.platform

    def f(source: str, sigma: float) -> float:
        return float(np.exp(sigma * z.get(source, 0.0)))

    def bw_lat(fabric: str) -> tuple[float, float]:
        big, small = sp.collective(fabric)
        return f(f"collective:{fabric}", big), f(f"collective:{fabric}", small)

    node, network = p.node, p.network
    if node.nvlink is not None and "collective:nvlink" in z:
        b, lat = bw_lat("nvlink")
        node = node.model_copy(update={"nvlink": node.nvlink.model_copy(update={
            "gbytes_per_s": node.nvlink.gbytes_per_s / b, "latency_us": node.nvlink.latency_us * lat})})
    if "collective:pcie" in z:
        b, lat = bw_lat("pcie")
        pcie = node.pcie
        staged = None if pcie.staged_gbytes_per_s is None else pcie.staged_gbytes_per_s / b
        node = node.model_copy(update={"pcie": pcie.model_copy(update={
            "gbytes_per_s": pcie.gbytes_per_s / b, "latency_us": pcie.latency_us * lat,
            "staged_gbytes_per_s": staged})})
    if "collective:network" in z:
        b, lat = bw_lat("network")
        update: dict[str, Any] = {"nic_gbps": network.nic_gbps / b, "latency_us": network.latency_us * lat}
        if network.dragonfly is not None:
            d = network.dragonfly
            update["dragonfly"] = d.model_copy(update={"local_link_gbps": d.local_link_gbps / b,
                                                       "global_link_gbps": d.global_link_gbps / b})
        network = network.model_copy(update=update)
    h = f("host", sp.host_sigma())
    host = p.host.model_copy(update={"launch_us": p.host.launch_us * h})
    platform: PlatformSpec = p.model_copy(update={"node": node, "network": network, "host": host})
    w = job.workload
    updates: dict[str, Any] = {}
    for section in ("training", "inference"):
        spec = getattr(w, section, None)
        if spec is not None and getattr(spec, "host_overhead_us", None) is not None:
            updates[section] = spec.model_copy(update={"host_overhead_us": spec.host_overhead_us * h})
    workload = w.model_copy(update=updates) if updates else w
    return Job(workload, platform, job.workload_file, job.platform_file, job.overrides)


def propagate(job: Job, draws: int, *, seed: int | None = None, spread: Spread | None = None,
              **kwargs: Any) -> tuple[SimResult, Uncertainty]:
    """The point run of ``job`` (the result :func:`simgpu.sim.simulate` gives) and ``draws`` correlated
    draws through the engine (see the module docstring).

    ``seed`` defaults to the workload's; ``spread`` to :func:`~simgpu.uncertainty.sources.spread` of its
    platform; ``kwargs`` go to :func:`simgpu.sim.simulate` for every run.
    """
    if draws < 1:
        raise ConfigError(f"--uncertainty: expected a number of draws >= 1, got {draws}")
    if is_mixed(job.platform):
        raise ConfigError("--uncertainty: not supported on a mixed platform yet", file=job.platform_file)
    sp = spread if spread is not None else sources_of(job.platform)
    seed = job.workload.seed if seed is None else seed
    timer = _Timer(sp)
    point = simulate(job, kernel_timer=timer, **kwargs)
    names = ([f"kernel:{f}" for f in timer.families()] + [f"collective:{f}" for f in fabrics(job)]
               + (["host"] if sp.host_sigma() > 0 else []))
    z = normals(draws, len(names), seed)
    times = []
    for row in z:
        zs = dict(zip(names, (float(x) for x in row), strict=True))
        timer.z = {s.removeprefix("kernel:"): v for s, v in zs.items() if s.startswith("kernel:")}
        times.append(simulate(perturbed(job, sp, zs), kernel_timer=timer, **kwargs).iteration_time_s)
    timer.z = {}
    meta = point.meta
    u = Uncertainty(seed=seed, point_s=point.iteration_time_s, times_s=tuple(times),
                    shares=variance_shares(z, np.log(times), names),
                    samples=_positive(meta.get("samples")), tokens=_positive(meta.get("tokens")),
                    sources=tuple(names))
    return point, u


def variance_shares(z: np.ndarray, log_t: np.ndarray, sources: Sequence[str]) -> dict[str, float]:
    """Per source, the share of the variance of ``log_t`` that its column of ``z`` explains, largest
    first: ``b_j^2 var(z_j) / var(log_t)`` of the least-squares line in every column at once where the
    draws outnumber the sources, else the squared correlation with its column alone (0 where
    ``log_t`` does not vary)."""
    log_t = np.asarray(log_t, dtype=float)
    n, k = z.shape
    var = float(np.var(log_t))
    if n < 3 or var <= (1e-12 * abs(float(np.mean(log_t)))) ** 2:
        out = dict.fromkeys(sources, 0.0)
    elif n > k + 1:
        x = np.column_stack([np.ones(n), z])
        b = np.linalg.lstsq(x, log_t, rcond=None)[0][1:]
        out = {s: float(b[j] ** 2 * np.var(z[:, j]) / var) for j, s in enumerate(sources)}
    else:
        out = {s: float(np.corrcoef(z[:, j], log_t)[0, 1] ** 2) if np.std(z[:, j]) > 0 else 0.0
               for j, s in enumerate(sources)}
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def _positive(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) and x > 0 else None
