"""Correlated draws of an LLM serving deployment: P10 / P50 / P90 of its TTFT, TPOT and throughput.

The draws are those of :mod:`.draws`, through the request-level loop instead of one iteration: one
standard normal ``z`` per source (a Latin hypercube from the serving file's seed, :func:`.draws.normals`),
every kernel of a family scaled by ``exp(sigma * z)`` as the pools' timers predict it (the
``kernel_scale`` hook of :class:`simgpu.serve.timer.EngineTimer`), and each pool's job perturbed for
the fabrics and the host by :func:`.draws.perturbed`. Each draw builds the deployment anew and
serves the same requests; the SLOs are not checked in a draw (a slow draw may miss them all).

The kernel families drawn are those the point run's timers timed with a spread above 0; the
fabrics those any pool's job may cross (:func:`.draws.fabrics`); then the host.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config.loader import Job
from ..config.mixed import is_mixed
from ..errors import ConfigError
from ..graph import KernelSpec
from ..serve.deploy import Deployment, build, load, serve
from ..serve.metrics import request_table
from ..serve.spec import Serving
from ..serve.timer import make_timer
from .draws import QUANTILES, drawn, fabrics, kernel_sigmas, normals, perturbed, variance_shares
from .sources import Spread
from .sources import spread as sources_of

#: The figures drawn: key of the ``uncertainty`` section, printed label, where in the summary.
METRICS: tuple[tuple[str, str, tuple[str, str]], ...] = (
    ("ttft_mean_ms", "TTFT mean ms", ("ttft_ms", "mean")),
    ("tpot_mean_ms", "TPOT mean ms", ("tpot_ms", "mean")),
    ("ttft_p99_ms", "TTFT P99 ms", ("ttft_ms", "p99")),
    ("tpot_p99_ms", "TPOT P99 ms", ("tpot_ms", "p99")),
    ("output_tokens_per_s", "output tokens/s", ("throughput", "output_tokens_per_s")),
)
#: The figures whose variance is broken down by source.
SHARED = ("ttft_mean_ms", "tpot_mean_ms")
#: The columns of the request table whose CDF gets a band over the draws, and the CDF levels.
CDF_COLUMNS = ("ttft_ms", "tpot_ms", "e2e_ms")
CDF_LEVELS = np.linspace(0.005, 0.995, 199)
#: How many sources the printed block names per figure.
TOP_SOURCES = 4


def figures(summary: Mapping[str, Any]) -> dict[str, float | None]:
    """The drawn figures of a serving summary (None where it has none: TPOT of one-token outputs)."""
    out: dict[str, float | None] = {}
    for key, _, (section, name) in METRICS:
        value = (summary.get(section) or {}).get(name)
        out[key] = float(value) if isinstance(value, int | float) else None
    return out


class KernelScale:
    """The ``kernel_scale`` of the pools' timers: records the families timed with a spread above 0
    and scales each kernel by ``exp(sigma * z)`` of its family in the current draw (none without ``z``)."""

    def __init__(self, spread: Spread) -> None:
        self.spread = spread
        self.z: Mapping[str, float] = {}
        self.seen: set[str] = set()

    def __call__(self, kernels: Sequence[KernelSpec], secs: np.ndarray, models: Sequence[str]) -> np.ndarray:
        sig = kernel_sigmas(self.spread, kernels, models)
        self.seen.update(k.family for k, s in zip(kernels, sig, strict=True) if s > 0)
        return drawn(secs, kernels, sig, self.z) if self.z else secs


@dataclass(frozen=True)
class ServingUncertainty:
    """The draws of one serving file: each draw's figures and what spreads them."""

    seed: int
    point: Mapping[str, float | None]
    #: per figure of :data:`METRICS`, its value in each draw
    values: Mapping[str, tuple[float | None, ...]]
    #: per figure of :data:`SHARED`, the share of the variance of its log each source explains
    shares: Mapping[str, Mapping[str, float]]
    sources: tuple[str, ...]
    #: per column of :data:`CDF_COLUMNS`, the levels and the P10 and P90 over the draws of the
    #: latency at each (the band of the latency CDF plot; not in :meth:`as_dict`)
    bands: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def draws(self) -> int:
        return len(next(iter(self.values.values()), ()))

    def quantiles(self, key: str) -> dict[str, float] | None:
        x = np.array([v for v in self.values[key] if v is not None], dtype=float)
        return {f"p{q}": float(np.quantile(x, q / 100)) for q in QUANTILES} if len(x) else None

    def as_dict(self) -> dict[str, Any]:
        """The ``uncertainty`` section of ``summary.json``."""
        out: dict[str, Any] = {"draws": self.draws, "seed": self.seed, "interval": "80% (P10 to P90)",
                               "sources": list(self.sources)}
        for key, _, _ in METRICS:
            out[key] = {**(self.quantiles(key) or {}), "point": self.point.get(key)}
        out["variance_share"] = {k: dict(v) for k, v in self.shares.items()}
        return out


class ServingDraws:
    """The point deployment of ``serving`` built with a recording ``kernel_scale``, then
    :meth:`run` for the draws (see the module docstring)."""

    def __init__(self, serving: Serving, spread: Spread | None = None) -> None:
        self.serving = serving
        self.loaded = load(serving)
        first: Job = next(iter(self.loaded.jobs.values()))
        for job in self.loaded.jobs.values():
            if is_mixed(job.platform):
                raise ConfigError("--uncertainty: not supported on a mixed platform yet", file=job.platform_file)
        self.spread = spread if spread is not None else sources_of(first.platform)
        self.scale = KernelScale(self.spread)

    def _build(self, jobs: Mapping[str, Job]) -> Deployment:
        scale = self.scale
        return build(self.serving, make_timer=lambda job: make_timer(job, kernel_scale=scale), jobs=jobs)

    def point(self) -> Deployment:
        """The point deployment (kernel times as without the draws)."""
        self.scale.z = {}
        return self._build(self.loaded.jobs)

    def sources(self) -> list[str]:
        """The sources drawn: the kernel families timed so far, the fabrics, the host."""
        fab = sorted({f for job in self.loaded.jobs.values() for f in fabrics(job)})
        return ([f"kernel:{f}" for f in sorted(self.scale.seen)] + [f"collective:{f}" for f in fab]
                + (["host"] if self.spread.host_sigma() > 0 else []))

    def run(self, draws: int, point: Mapping[str, Any], rate_per_s: float | None = None,
            progress: Callable[[int, int], None] | None = None) -> ServingUncertainty:
        """``draws`` draws after the point run whose summary is ``point``."""
        if draws < 1:
            raise ConfigError(f"--uncertainty: expected a number of draws >= 1, got {draws}")
        names = self.sources()
        seed = self.serving.spec.seed
        z = normals(draws, len(names), seed)
        rows: list[dict[str, float | None]] = []
        curves: dict[str, list[np.ndarray]] = {c: [] for c in CDF_COLUMNS}
        for i, row in enumerate(z):
            if progress is not None:
                progress(i, draws)
            zs = dict(zip(names, (float(x) for x in row), strict=True))
            self.scale.z = {s.removeprefix("kernel:"): v for s, v in zs.items() if s.startswith("kernel:")}
            jobs = {k: perturbed(j, self.spread, zs) for k, j in self.loaded.jobs.items()}
            res, summary = serve(self.serving, self._build(jobs), rate_per_s, trace=self.loaded.trace,
                                 check_slos=False)
            rows.append(figures(summary))
            table = request_table(res)
            for c in CDF_COLUMNS:
                x = table[c].to_numpy(dtype=float)
                x = x[np.isfinite(x) & (x > 0)]
                if len(x):
                    curves[c].append(np.quantile(x, CDF_LEVELS))
        self.scale.z = {}
        values = {key: tuple(r[key] for r in rows) for key, _, _ in METRICS}
        shares = {}
        for key in SHARED:
            v = values[key]
            if all(x is not None and x > 0 for x in v):
                shares[key] = variance_shares(z, np.log(np.array(v, dtype=float)), names)
        bands = {c: (CDF_LEVELS, np.quantile(np.array(v), 0.1, axis=0), np.quantile(np.array(v), 0.9, axis=0))
                 for c, v in curves.items() if len(v) == draws}
        return ServingUncertainty(seed=seed, point=figures(point), values=values, shares=shares,
                                  sources=tuple(names), bands=bands)


def format_lines(u: Mapping[str, Any]) -> list[str]:
    """The printed block of a serving summary's ``uncertainty`` section."""
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:,.1f}"

    out = [f"uncertainty  {u['draws']} correlated draws (seed {u['seed']}), 80% interval:"]
    for key, label, _ in METRICS:
        q = u.get(key) or {}
        if q.get("p10") is None:
            continue
        ratio = f", P90/P10 {q['p90'] / q['p10']:.3f}" if q["p10"] > 0 else ""
        out.append(f"  {label:<16}P10 {f(q['p10']):>10}  P50 {f(q['p50']):>10}  P90 {f(q['p90']):>10}  "
                   f"(point {f(q.get('point'))}{ratio})")
    for key, shares in (u.get("variance_share") or {}).items():
        top = list(shares.items())[:TOP_SOURCES]
        if top:
            label = dict((k, lab) for k, lab, _ in METRICS)[key].removesuffix(" ms")
            out.append(f"  spread of {label} from  " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in top)
                       + " (share of the variance of its log)")
    return out
