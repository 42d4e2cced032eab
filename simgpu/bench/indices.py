"""Embedding index distributions for the lookup benchmarks.

``uniform`` draws rows uniformly; ``zipf<a>`` draws row ``i`` of a random permutation with
probability proportional to ``1 / (i + 1)^a`` (the popular rows are scattered over the table, as
in real data sets); ``hot<p>_<q>`` sends ``q``% of the lookups to a random ``p``% of the rows and
the rest uniformly to the others, a real-like hot set. All draws come from the caller's generator.
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import ConfigError


def draw(dist: str, rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` row ids (int64) of a table of ``rows`` rows under distribution ``dist``."""
    if rows < 1 or n < 0:
        raise ValueError(f"need rows >= 1 and n >= 0, got rows={rows}, n={n}")
    if dist == "uniform":
        return rng.integers(0, rows, n, dtype=np.int64)
    m = re.fullmatch(r"zipf(\d+(?:\.\d+)?)", dist)
    if m:
        a = float(m.group(1))
        weights = np.arange(1, rows + 1, dtype=float) ** -a
        cdf = np.cumsum(weights)
        rank = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right")
        rank = np.minimum(rank, rows - 1)
        return rng.permutation(rows).astype(np.int64)[rank]
    m = re.fullmatch(r"hot(\d+(?:\.\d+)?)_(\d+(?:\.\d+)?)", dist)
    if m:
        share_rows, share_hits = float(m.group(1)) / 100, float(m.group(2)) / 100
        hot = max(1, int(share_rows * rows))
        perm = rng.permutation(rows).astype(np.int64)
        is_hot = rng.random(n) < share_hits
        out = np.empty(n, dtype=np.int64)
        out[is_hot] = perm[rng.integers(0, hot, int(is_hot.sum()))]
        cold = rows - hot
        k = int((~is_hot).sum())
        out[~is_hot] = perm[hot + rng.integers(0, cold, k)] if cold > 0 else perm[rng.integers(0, hot, k)]
        return out
    raise ConfigError(f"unknown index distribution {dist!r}; expected uniform, zipf<a> or hot<p>_<q>")
