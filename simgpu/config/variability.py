"""The ``variability`` section of a workload file: GPUs that run slower than the others (stragglers),
random noise on kernel times, and measured per-GPU speeds.

Absent, every GPU runs at its kernel models' times. Present, each rank's kernels (or its CPU
thread's launches and host work) take a factor longer: the product of the ``slow`` entries that
pick it, its ``speeds_csv`` factor and its jitter. :func:`resolve` turns the section into those
factors per rank (:class:`Speeds`), drawn with the run's seed; the engine applies them.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, NonNegativeInt, PrivateAttr, model_validator

from .base import Spec


class Slow(Spec):
    """GPUs that run slower: the ranks named, every GPU of the nodes named, or a fraction of the GPUs
    picked with the run's seed (give one of the three)."""

    ranks: list[NonNegativeInt] | None = Field(
        None, min_length=1, description="the slow GPUs by global rank (0 to world size - 1)")
    nodes: list[NonNegativeInt] | None = Field(
        None, min_length=1, description="the slow nodes by index (0 to nodes - 1): every GPU of each is slow")
    fraction: float | None = Field(
        None, gt=0, le=1, description="the share of the job's GPUs that are slow, in (0, 1]; that many GPUs "
                                      "(rounded, at least one) are picked at random with the run's seed")
    factor: float = Field(
        gt=0, description="time multiplier (dimensionless, > 0): the slow GPUs' work takes factor times as long "
                          "(1.3: 30% slower; 1: no change; below 1: faster)")
    what: Literal["compute", "memory", "host"] = Field(
        "compute", description="what runs slower: compute (every kernel of the GPU), memory (its memory-bound "
                               "kernels only: a throttled HBM) or host (the CPU thread's launches and host ops)")

    @model_validator(mode="after")
    def _one_pick(self) -> Slow:
        given = [k for k in ("ranks", "nodes", "fraction") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give one of ranks, nodes or fraction to pick the slow GPUs, got "
                             f"{', '.join(given) if given else 'none'}")
        return self


class Jitter(Spec):
    """Random noise on kernel times: a lognormal factor with mean 1, drawn with the run's seed."""

    cv: float = Field(ge=0, le=2, description="coefficient of variation of the factor (dimensionless, 0 to 2; "
                                              "0.05: a standard deviation of 5% of the kernel's time; 0: none)")
    per: Literal["kernel", "gpu"] = Field(
        "kernel", description="kernel: a factor drawn for every kernel op of every GPU; gpu: one factor per GPU for "
                              "the whole iteration")


class Variability(Spec):
    """GPUs that are not alike: stragglers, noise and measured speeds (see docs/variability.md)."""

    slow: list[Slow] = Field(default_factory=list, description="slow GPUs (stragglers), each entry a set of GPUs "
                                                               "and a factor; factors of entries that overlap multiply")
    jitter: Jitter | None = Field(None, description="random noise on kernel times; None: none")
    speeds_csv: str | None = Field(
        None, description="a CSV file (path relative to the workload file) of measured per-GPU speeds, columns rank "
                          "and factor: each listed rank's kernels take factor (> 0) times as long; ranks not listed: 1")
    #: The CSV's rows once read where the job was loaded (a job sent to another machine carries them).
    _speeds: dict[int, float] | None = PrivateAttr(None)

    def measured_speeds(self, workload_file: str) -> dict[int, float] | None:
        """The speeds CSV's rows: those read when the job was loaded, else read now."""
        if self.speeds_csv is None:
            return None
        if self._speeds is None:
            self._speeds = read_speeds(speeds_path(workload_file, self.speeds_csv))
        return self._speeds


@dataclass(frozen=True)
class Speeds:
    """Per rank, the time multipliers the engine applies: ``compute`` on every kernel, ``memory`` on
    memory-bound kernels (on top of ``compute``), ``host`` on the CPU thread's launches and host work;
    ``cv`` the kernel jitter's coefficient of variation, ``per_kernel`` whether it is drawn per kernel op
    (else it is in ``compute``, one factor per GPU), drawn with ``seed``."""

    compute: tuple[float, ...]
    memory: tuple[float, ...]
    host: tuple[float, ...]
    cv: float = 0.0
    per_kernel: bool = False
    seed: int = 0

    def jitter(self, rank: int, n: int) -> np.ndarray | None:
        """Rank ``rank``'s per-op jitter factors for a program of ``n`` ops (None: no per-kernel jitter)."""
        if not self.per_kernel or self.cv <= 0:
            return None
        return lognormal(np.random.default_rng([self.seed, 1, rank]), self.cv, n)


def lognormal(rng: np.random.Generator, cv: float, n: int) -> np.ndarray:
    """``n`` lognormal factors of mean 1 and coefficient of variation ``cv``."""
    sigma2 = math.log1p(cv * cv)
    return np.asarray(rng.lognormal(-sigma2 / 2, math.sqrt(sigma2), n), dtype=float)


def speeds_path(workload_file: str, ref: str) -> Path:
    """The speeds CSV ``ref`` names: absolute, or relative to the workload file's folder."""
    p = Path(ref)
    return p if p.is_absolute() else Path(workload_file).parent / p


def read_speeds(path: Path) -> dict[int, float]:
    """The ``rank,factor`` rows of a speeds CSV; raises ValueError saying what is wrong."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or not {"rank", "factor"} <= {c.strip() for c in reader.fieldnames}:
            raise ValueError(f"{path.name}: expected columns rank and factor, got {reader.fieldnames}")
        out: dict[int, float] = {}
        for n, row in enumerate(reader, start=2):
            row = {k.strip(): v for k, v in row.items() if k is not None}
            try:
                rank, factor = int(str(row["rank"]).strip()), float(str(row["factor"]).strip())
            except ValueError:
                raise ValueError(f"{path.name} line {n}: expected an integer rank and a number factor, got "
                                 f"{row['rank']!r}, {row['factor']!r}") from None
            if rank < 0 or not (factor > 0 and math.isfinite(factor)):
                raise ValueError(f"{path.name} line {n}: expected a rank >= 0 and a factor > 0, got {rank}, {factor}")
            out[rank] = factor
    return out


def picked(slow: Slow, index: int, world: int, gpus_per_node: int, seed: int) -> list[int]:
    """The ranks ``slow`` (entry ``index`` of the list) picks, sorted."""
    if slow.ranks is not None:
        return sorted(set(slow.ranks))
    if slow.nodes is not None:
        return sorted({n * gpus_per_node + g for n in slow.nodes for g in range(gpus_per_node)})
    assert slow.fraction is not None
    k = min(world, max(1, round(slow.fraction * world)))
    rng = np.random.default_rng([seed, 2, index])
    return sorted(int(r) for r in rng.choice(world, size=k, replace=False))


def resolve(v: Variability, world: int, gpus_per_node: int, seed: int, speeds: dict[int, float] | None = None
            ) -> Speeds:
    """The per-rank factors of section ``v`` on a job of ``world`` GPUs (``speeds``: the CSV's rows)."""
    factors = {w: np.ones(world) for w in ("compute", "memory", "host")}
    for i, s in enumerate(v.slow):
        factors[s.what][picked(s, i, world, gpus_per_node, seed)] *= s.factor
    for rank, f in (speeds or {}).items():
        factors["compute"][rank] *= f
    cv = v.jitter.cv if v.jitter is not None else 0.0
    per_kernel = v.jitter is not None and v.jitter.per == "kernel"
    if cv > 0 and not per_kernel:
        factors["compute"] *= lognormal(np.random.default_rng([seed, 3]), cv, world)
    def each(w: str) -> tuple[float, ...]:
        return tuple(float(x) for x in factors[w])

    return Speeds(each("compute"), each("memory"), each("host"), cv=cv, per_kernel=per_kernel, seed=seed)


def describe(v: Variability, world: int, gpus_per_node: int, seed: int) -> list[str]:
    """The section in words, one line per entry (which ranks, how much slower)."""
    out = []
    for i, s in enumerate(v.slow):
        ranks = picked(s, i, world, gpus_per_node, seed)
        shown = ", ".join(map(str, ranks[:8])) + (f", ... ({len(ranks)} GPUs)" if len(ranks) > 8 else "")
        how = {"compute": "kernels", "memory": "memory-bound kernels", "host": "host launches and work"}[s.what]
        out.append(f"rank{'s' if len(ranks) > 1 else ''} {shown}: {how} x {s.factor:g}")
    if v.jitter is not None and v.jitter.cv > 0:
        out.append(f"jitter: lognormal, mean 1, cv {v.jitter.cv:g}, per {v.jitter.per}")
    if v.speeds_csv is not None:
        out.append(f"measured speeds: {v.speeds_csv}")
    return out
