"""Goodput of a training run under failures, checkpoints and restarts: analytic and Monte Carlo.

The run alternates ``tau`` seconds of training with a checkpoint of ``C`` seconds. Failures arrive
at random with the job's mean time between failures ``M`` (exponential inter-failure times, any
time, checkpoints and restarts included); a failure loses the work since the last completed
checkpoint and costs a restart of ``R`` seconds, after which training resumes from that checkpoint.
Goodput is the share of wall time that becomes kept training progress.

Analytic (the exact expectation of that model; Daly 2006, "A higher order estimate of the optimum
checkpoint interval for restart dumps", FGCS 22(3))::

    goodput(tau) = tau * exp(-R / M) / (M * (exp((tau + C) / M) - 1))

Best interval: Young 1974 ``sqrt(2 C M)``; Daly's higher-order form
``sqrt(2 C M) * (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C`` (``M`` when ``C >= 2M``); and the
exact maximum of the formula, ``M * (1 + W0(-exp(-1 - C / M)))`` (W0: Lambert's W).

Monte Carlo: timelines of exponential inter-failure times over a long horizon; in each up-period
of length ``x`` the restart comes first, then ``floor((x - R) / (tau + C))`` whole segments of
``tau`` seconds are kept. All intervals share the same timelines (common random numbers), so the
curve is smooth and its maximum a fair estimate of the best interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def analytic(tau: np.ndarray | float, c: float, r: float, m: float) -> np.ndarray:
    """Expected goodput at checkpoint interval ``tau`` (seconds of training between checkpoints)."""
    t = np.asarray(tau, dtype=float)
    return np.asarray(t * math.exp(-r / m) / (m * np.expm1((t + c) / m)))


def young(c: float, m: float) -> float:
    """Young's best interval, ``sqrt(2 C M)``."""
    return math.sqrt(2 * c * m)


def daly(c: float, m: float) -> float:
    """Daly's higher-order best interval."""
    if c >= 2 * m:
        return m
    x = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c


def exact(c: float, m: float) -> float:
    """The interval that maximises :func:`analytic` (it does not depend on ``R``): ``t = tau / M``
    solves ``1 - exp(-(t + C/M)) = t`` (``t = 1 + W0(-exp(-1 - C/M))``), found by bisection on (0, 1),
    where the left side minus ``t`` falls from positive to negative."""
    k, lo, hi = c / m, 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if -math.expm1(-(mid + k)) - mid > 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * hi:
            break
    return m * (lo + hi) / 2


@dataclass(frozen=True)
class Timelines:
    """Up-periods of simulated failure timelines, ``R`` already taken off: ``up[k, i]`` is the time
    left for training in replica ``k``'s ``i``-th period (0 past the horizon)."""

    up: np.ndarray
    horizon_s: float
    failures: int

    def goodput(self, tau: np.ndarray | float, c: float) -> tuple[np.ndarray, np.ndarray]:
        """Mean goodput over the replicas at each interval, and its standard error."""
        t = np.atleast_1d(np.asarray(tau, dtype=float))
        per = np.empty((len(t), self.up.shape[0]))
        for j, tj in enumerate(t):  # one interval at a time keeps memory at one timeline array
            per[j] = np.floor(self.up / (tj + c)).sum(axis=1) * tj / self.horizon_s
        k = per.shape[1]
        err = per.std(axis=1, ddof=1) / math.sqrt(k) if k > 1 else np.zeros(len(t))
        return per.mean(axis=1), err


def timelines(m: float, r: float, replicas: int, horizon_mtbf: float, seed: int) -> Timelines:
    """``replicas`` timelines of ``horizon_mtbf * m`` seconds each, failures every ``m`` on average."""
    rng = np.random.default_rng(seed)
    horizon = horizon_mtbf * m
    n = int(horizon_mtbf + 8 * math.sqrt(horizon_mtbf) + 16)
    gaps = rng.exponential(m, size=(replicas, n))
    while (gaps.sum(axis=1) < horizon).any():  # rare: draw more periods until every timeline is covered
        gaps = np.concatenate([gaps, rng.exponential(m, size=(replicas, n))], axis=1)
    ends = np.cumsum(gaps, axis=1)
    starts = ends - gaps
    length = np.clip(np.minimum(ends, horizon) - starts, 0.0, None)
    failures = int((ends < horizon).sum())
    return Timelines(np.clip(length - r, 0.0, None), horizon, failures)


def interval_grid(best: float, c: float, m: float, points: int) -> np.ndarray:
    """Checkpoint intervals for the curve: log-spaced from ``best / 30`` to ``30 * best`` (at most
    a few MTBFs), the best among them."""
    lo, hi = best / 30, min(best * 30, 5 * m + best)
    grid = np.geomspace(lo, hi, points)
    return np.unique(np.append(grid, best))


def monte_carlo_best(tl: Timelines, best: float, c: float, points: int = 41) -> tuple[float, float, float]:
    """The interval of the largest Monte Carlo goodput on a fine grid around ``best`` (x/2 to x2),
    with its goodput and standard error."""
    grid = np.geomspace(best / 2, best * 2, points)
    g, e = tl.goodput(grid, c)
    i = int(np.argmax(g))
    return float(grid[i]), float(g[i]), float(e[i])
