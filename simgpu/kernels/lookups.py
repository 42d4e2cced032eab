"""The embedding lookup families' shape parameters, and the reuse statistics of their ids.

:func:`lookup_params` fills in a lookup kernel's defaults, uniform ids' statistics
(:func:`uniform_reuse`) where the kernel carries none; :func:`reuse_stats` measures them on ids.
The analytical model's lookup formula (:mod:`simgpu.kernels.embedding`) and the learned models'
features (:mod:`simgpu.kernels.features`) both read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import numpy as np

from ..graph import KernelSpec

#: Optional parameters of the embedding families: the pooled output's bytes per element (NaN: the
#: table's), the optimizer state bytes per row, and whether the backward is fused with the optimizer
#: (1, FBGEMM's table-batched kernels) or PyTorch's sparse gradients and a separate step (0); see
#: :mod:`simgpu.kernels.embedding`.
EMBEDDING_OPTIONAL: Final[Mapping[str, float]] = {"out_bytes": np.nan, "state_bytes": 0.0, "fused": 1.0}
#: The names of the reuse statistics of embedding lookups (fractions in [0, 1]), see :func:`reuse_stats`.
REUSE: Final = ("reuse_top0p1", "reuse_top1", "reuse_top10", "reuse_unique")
_TOP_SHARES: Final = (0.001, 0.01, 0.1)

#: The lookup families' shape parameters and their defaults (None: required): ``batch`` bags of
#: ``pooling`` ids in each of ``tables`` tables of ``rows`` rows of ``dim`` elements, the ids'
#: reuse statistics (NaN: those of uniform ids) and the optional figures above.
LOOKUP_PARAMS: Final[Mapping[str, float | None]] = {"batch": None, "tables": None, "pooling": None, "dim": None,
                                                     "rows": None, **{r: np.nan for r in REUSE}, **EMBEDDING_OPTIONAL}


def with_defaults(family: str, spec: Mapping[str, float | None], given: Mapping[str, float]) -> dict[str, float]:
    """``spec``'s parameters from ``given``, else their defaults; a required one missing raises."""
    out: dict[str, float] = {}
    for name, default in spec.items():
        if name in given:
            out[name] = given[name]
        elif default is None:
            raise KeyError(f"{family} kernel has no parameter {name!r}")
        else:
            out[name] = default
    return out


def lookup_params(kernel: KernelSpec) -> dict[str, float]:
    """A lookup kernel's parameters with the defaults filled in: uniform ids' reuse statistics where
    the kernel carries none (``out_bytes`` stays NaN: the table's width)."""
    out = with_defaults(kernel.family, LOOKUP_PARAMS, dict(kernel.params))
    if np.isnan(out["reuse_unique"]):
        out.update(uniform_reuse(out["rows"], out["batch"] * out["pooling"]))
    return out


def reuse_stats(ids: np.ndarray, rows: int) -> dict[str, float]:
    """Index-reuse statistics of one table's lookups ``ids`` (row numbers in ``[0, rows)``).

    ``reuse_topX``: the fraction of lookups that hit the most-looked-up X% of the table's rows
    (0.1%, 1%, 10%; at least one row each); ``reuse_unique``: distinct rows / lookups. Uniform
    access over a large table gives small top shares and ``unique`` near 1; a skewed (Zipf or
    hot-set) access gives large top shares and much reuse, which caches turn into speed.
    """
    ids = np.asarray(ids)
    if ids.size == 0:
        return {r: 0.0 for r in REUSE}
    counts = np.bincount(ids, minlength=rows)
    nz = np.sort(counts[counts > 0])[::-1]
    cum = np.cumsum(nz)
    out = {}
    for name, share in zip(REUSE, _TOP_SHARES, strict=False):
        top = max(1, int(share * rows))
        out[name] = float(cum[min(top, nz.size) - 1] / ids.size)
    out["reuse_unique"] = float(nz.size / ids.size)
    return out


def uniform_reuse(rows: float, lookups: float) -> dict[str, float]:
    """The statistics of :func:`reuse_stats` expected for uniformly random ids (no skew).

    ``unique`` is exact (``rows * (1 - (1 - 1/rows)^lookups) / lookups``). For the top shares, the
    number of rows hit ``j`` times is Poisson: ``rows * P(X = j)`` with mean ``lookups / rows``; the
    most-hit rows are filled from the highest ``j`` down until X% of the rows are taken.
    """
    rows, lookups = max(float(rows), 1.0), max(float(lookups), 1.0)
    distinct = rows * -np.expm1(lookups * np.log1p(-1.0 / rows)) if rows > 1 else 1.0
    out = {"reuse_unique": float(distinct / lookups)}
    mean = lookups / rows
    up = np.arange(1, int(mean + 12.0 * np.sqrt(mean) + 12.0) + 1, dtype=float)
    j, log_fact = up[::-1], np.cumsum(np.log(up))[::-1]  # hits, most first, and log(j!)
    log_pmf = -mean + j * np.log(mean) - log_fact
    count = rows * np.exp(log_pmf)             # expected rows hit exactly j times
    cum_rows, cum_hits = np.cumsum(count), np.cumsum(count * j)
    for name, share in zip(REUSE, _TOP_SHARES, strict=False):
        top = max(1.0, np.floor(share * rows))
        i = int(np.searchsorted(cum_rows, top))
        if i >= len(j):
            hits = float(cum_hits[-1])
        else:
            prev_rows, prev_hits = (cum_rows[i - 1], cum_hits[i - 1]) if i else (0.0, 0.0)
            hits = prev_hits + (top - prev_rows) * j[i]
        out[name] = float(min(1.0, hits / lookups))
    return out
