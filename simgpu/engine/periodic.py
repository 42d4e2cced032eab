"""The periodic shortcut: the identical middle micro-batches of a pipeline schedule, simulated once.

In the steady state of a 1F1B or interleaved schedule every stage repeats one period (a forward
and a backward, or a group of ``pp`` micro-batches through its model chunks), and so does all the
traffic between stages. So the job is simulated with two short counts of micro-batches, ``m``
and ``m + period`` (:func:`counts`; the builder keeps samples, FLOPs and memory the job's), and
the two runs are compared on every rank and stream (:func:`extend`). The shortcut holds where,
on each of them, the longer run's records are the shorter one's with one block inserted: before
the block they are the same, after it they are the same delayed by the difference ``D`` of the
two iterations, and the block is the one before it delayed by ``D`` (the steady state has
already repeated once). Where the longer run has ``m + 2 period`` instead (:func:`counts`'s first
try on an interleaved schedule), it is the shorter one with two blocks inserted, the second the
first delayed by ``D`` (here half the difference of the two iterations), and the shorter run
need not hold a period of the steady state itself. Then each further period inserts the same block
``D`` later, and the job's iteration is the longer run with its block copied once per missing period: its records
have every micro-batch, the copies shifted by whole periods, and its link statistics grow by the
difference of the two runs per period. Times are compared within :data:`TOLERANCE` of the
iteration.

Where a stream does not repeat so (contention that changes from period to period, a straggler
whose delay the pipeline has not absorbed yet, a schedule that has not settled), the check finds
it, and the shortcut tries the next pair of counts (farther past ``least``) or gives up, so the
caller simulates the job's own count (:mod:`simgpu.engine.shortcuts`). It is tried only where the
runs together are at most :data:`BUDGET` of the job's micro-batches. It does not apply where link
intervals are recorded.

Programs that run ``n`` iterations back to back (:mod:`simgpu.engine.steady`) repeat a period in
each: there the longer run is the shorter one with one block inserted per iteration, ``n`` per
stream, the records after the ``j``-th block delayed by ``j D`` and each block the one before it
in its iteration delayed by ``D``; each iteration must end ``D`` later than the one before it did
(``meta["iteration_ends_s"]``). The job's run has each block copied once per missing period, and
its iteration ends delayed as much, so the steady window is cut where it is cut from a run of
every micro-batch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from ..graph import PipelineShape
from ..result import RECORD_COLUMNS, SimResult

#: Times of the two runs must agree (shifted where they are) within this fraction of the iteration.
TOLERANCE: Final = 1e-9
#: The short runs together simulate at most this fraction of the job's micro-batches.
BUDGET: Final = 0.5
#: Columns that must be equal between matched records (besides their times).
_SAME = ("name", "category", "phase", "kind", "nbytes", "model")


#: Micro-batches past ``least`` that the tries after the first give the schedule to settle (rounded
#: up to whole periods): a pipeline's first periods of steady state still differ a little, as it fills.
SETTLE: Final = 4


def _margin(shape: PipelineShape) -> int:
    """The margin past ``least`` of the tries after the first, in periods."""
    return -(-SETTLE // shape.period)


def counts(shape: PipelineShape) -> list[tuple[int, int]]:
    """The pairs of counts to try, in order: ``(m, m + r * period)``, the longer run with ``r`` periods
    inserted.

    First, where a period is several micro-batches (the interleaved schedule), ``least`` and ``least
    + 2 period``, if those two runs are within :data:`BUDGET` of the job's micro-batches: each
    inserted period but the first is checked against the inserted one before it, so the shorter run
    needs no settled period of its own. (Under 1F1B, ``least`` is ``pp`` and the first periods still
    differ: GPT-3 on PP16 differs from 16 to 18 micro-batches, and from 18 to 20.) Then ``least``
    plus :data:`SETTLE` micro-batches for the schedule to settle and one period more, then twice that
    margin, as long as these runs stay within :data:`BUDGET` (a count already run is not run again).
    So all the runs together are at most the job's micro-batches."""
    p, least = shape.period, shape.least
    limit = BUDGET * shape.micro_batches
    out: list[tuple[int, int]] = []
    if p > 1 and 2 * least + 2 * p <= limit:
        out.append((least, least + 2 * p))
    margin = _margin(shape)
    spent = 0
    for x in (margin, 2 * margin):
        m = least + x * p
        spent += 2 * m + p
        if spent > limit:
            break
        out.append((m, m + p))
    return out


def blocker(shape: PipelineShape | None, record_links: bool) -> str:
    """Why the shortcut does not apply to these programs ("" where it may be tried)."""
    if record_links:
        return "link intervals are recorded for every link"
    if shape is None:
        return "no pipeline schedule that repeats one period at a time"
    if not counts(shape):
        p = shape.period
        m = shape.least if p > 1 else shape.least + _margin(shape) * p  # the cheapest pair counts() tries
        m2 = m + (2 * p if p > 1 else p)
        return (f"{shape.micro_batches} micro-batches are too few: the short runs would simulate "
                f"{m + m2} ({m} and {m2}), more than {BUDGET:.0%} of them")
    return ""


def extend(short: SimResult, long: SimResult, m: int, shape: PipelineShape, iterations: int = 1,
           inserted: int = 1) -> SimResult | str:
    """The job's result from runs of ``m`` and ``m + inserted * shape.period`` micro-batches
    (``short``, ``long``) of programs that run ``iterations`` iterations back to back, or why the
    runs do not repeat one period in each iteration (see the module docstring)."""
    p, r = shape.period, inserted
    n, rest = divmod(shape.micro_batches - m, p)
    if rest or n < r or r < 1:
        raise ValueError(f"{shape.micro_batches} micro-batches are not {m} plus a multiple of {p}, "
                         f"expected at least {max(r, 1)} of them")
    its = iterations
    d = (long.iteration_time_s - short.iteration_time_s) / (its * r)
    if not d > 0:
        return f"{m + r * p} micro-batches took no longer than {m}"
    tol = TOLERANCE * long.iteration_time_s
    ends_a = [float(x) for x in short.meta.get("iteration_ends_s", ())]
    ends_b = [float(x) for x in long.meta.get("iteration_ends_s", ())]
    if its > 1:
        if len(ends_a) != its or len(ends_b) != its:
            return f"the runs do not give the ends of their {its} iterations"
        if any(abs(x + (i + 1) * r * d - y) > tol for i, (x, y) in enumerate(zip(ends_a, ends_b, strict=True))):
            return (f"an iteration of {m + r * p} micro-batches does not end {r} period{'s' if r > 1 else ''} "
                    "later than the one before it")
    a, b = short.records, long.records
    ga, gb = _groups(a, b)
    keys_a, start_a, na = _runs(ga)
    keys_b, start_b, nb = _runs(gb)
    if not np.array_equal(keys_a, keys_b):
        return "the two runs use different streams"
    kr, odd = np.divmod(nb - na, its)                  # records each iteration inserts: r blocks of k
    if (kr < 0).any() or odd.any():
        return ("a stream has fewer records with more micro-batches" if (kr < 0).any() else
                f"a stream's extra records with more micro-batches are not the same in each of {its} iterations")
    k, odd = np.divmod(kr, r)
    if odd.any():
        return f"a stream's extra records with {r} more periods are not {r} blocks alike"
    same = _codes(a, b)
    sa, ea = a["start_s"].to_numpy(), a["end_s"].to_numpy()
    sb, eb = b["start_s"].to_numpy(), b["end_s"].to_numpy()
    g = np.repeat(np.arange(len(na)), na)              # each record of the short run: its stream
    j = np.arange(len(a)) - start_a[g]                 # and its place on it
    # per stream, the short run's records up to the first block, between the blocks and after the
    # last are the longer run's with as many blocks before them, delayed as much (the i-th block
    # placed where the records stop being so, as late as they may)
    q = np.zeros((its + 1, len(na)), dtype=np.int64)   # where each stretch ends (q[i - 1]: where it starts)
    for i in range(its + 1):
        ok = _equal(same, start_b[g] + j + i * kr[g], sa, ea, sb, eb, tol, i * r * d)
        since = q[i - 1][g] if i else np.zeros(len(a), dtype=np.int64)
        q[i] = np.minimum.reduceat(np.where(ok | (j < since), na[g], j), start_a)
    gap = np.flatnonzero(q[its] < na)
    if len(gap):
        return _where(a, start_a[gap[0]] + q[its][gap[0]],
                      f"{len(gap)} of {len(na)} rank streams differ between {m} and {m + r * p} micro-batches by "
                      f"more than {'one inserted block' if r == 1 else f'{r} inserted blocks'}"
                      f"{' per iteration' if its > 1 else ''}")
    starts = np.vstack([np.zeros(len(na), dtype=np.int64), q[:its - 1]])
    if r == 1 and (q[:its] - starts < k).any():
        return "a stream's inserted block is longer than what runs before it"
    # each inserted block is the one before it, delayed by d: one inserted block, the records before
    # it; several, each but the first the inserted one before it
    gk = np.repeat(np.arange(len(k)), k)
    t = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
    for i in range(its):
        first = 1 if r > 1 else 0
        block = np.concatenate([start_b[gk] + q[i][gk] + i * kr[gk] + j * k[gk] + t for j in range(first, r)])
        gj = np.tile(gk, r - first)
        earlier = block - k[gj]
        ok = _equal((same[1], same[1]), earlier, sb[block], eb[block], sb, eb, tol, -d, rows=block)
        if not ok.all():
            bad = int(gj[np.argmin(ok)])
            return _where(b, start_b[bad], f"the steady state has not settled by {m} micro-batches: a period "
                          "differs from the one before it")
    records = _repeat(b, start_b, q, k, n, d, r)
    links = _links(short, long, n / r)
    meta = dict(short.meta)
    for key in ("iteration_link_bytes", "iteration_link_busy_s"):  # per iteration: grown as the totals are
        if key in meta and key in long.meta:
            meta[key] = _per_iteration(short, long, key, n / r, links["link"])
        else:
            meta.pop(key, None)
    for key in ("fold_slack_s",):
        if key in meta:
            meta[key] = float(meta[key]) + n / r * (float(long.meta[key]) - float(meta[key]))
    if its > 1:
        meta["iteration_ends_s"] = [e + (i + 1) * n * d for i, e in enumerate(ends_a)]
    each = f" in each of its {its} iterations" if its > 1 else ""
    times = "" if r == 1 else " twice" if r == 2 else f" {r} times"
    meta["periodic"] = (f"periodic: {m} and {m + r * p} micro-batches simulated; the second repeats one period of "
                        f"the steady state{each}{times} ({d * 1e3:.3f} ms, {int(k.sum()):,} records) on every rank and "
                        f"stream and delays the rest by as much, so {n - r} more periods ({(n - r) * p} of the "
                        f"{shape.micro_batches} micro-batches{', each iteration' if its > 1 else ''}) are its "
                        "copies, shifted")
    return replace(short, records=records, link_stats=links, iteration_time_s=short.iteration_time_s + its * n * d,
                   events=short.events + long.events, meta=meta)


def _groups(a: pd.DataFrame, b: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """A number per record of ``a`` and of ``b`` for its (rank, stream), the same in both, in the
    order the records are sorted (rank, then stream)."""
    codes, names = pd.factorize(_both(a["stream"], b["stream"]))
    order = np.empty(len(names), dtype=np.int64)
    order[np.argsort(np.asarray(names, dtype=object))] = np.arange(len(names))
    code = order[codes]
    ranks = np.concatenate([a["rank"].to_numpy(dtype=np.int64), b["rank"].to_numpy(dtype=np.int64)])
    g = ranks * len(names) + code
    return g[:len(a)], g[len(a):]


def _both(a: pd.Series, b: pd.Series) -> pd.Series:
    """``a`` then ``b`` as one column; two categorical columns (the engine's records) stay one
    categorical, over the union of their categories, rather than a column of strings."""
    if isinstance(a.dtype, pd.CategoricalDtype) and isinstance(b.dtype, pd.CategoricalDtype):
        return pd.Series(union_categoricals([a.array, b.array]))
    return pd.concat([a, b], ignore_index=True)


def _runs(g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct values of sorted ``g``, where each starts and how many there are."""
    if len(g) and (np.diff(g) < 0).any():
        raise ValueError("records must be sorted by rank and stream")
    start = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if len(g) else np.zeros(0, dtype=np.int64)
    return g[start], start, np.diff(np.r_[start, len(g)])


def _codes(a: pd.DataFrame, b: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The columns of :data:`_SAME` as one integer per record, comparable between ``a`` and ``b``."""
    code = np.zeros(len(a) + len(b), dtype=np.int64)
    for col in _SAME:
        c, uniques = pd.factorize(_both(a[col], b[col]))
        code = pd.factorize(code * (len(uniques) + 1) + c)[0]
    return code[:len(a)], code[len(a):]


def _equal(codes: tuple[np.ndarray, np.ndarray], other: np.ndarray, s: np.ndarray, e: np.ndarray,
           so: np.ndarray, eo: np.ndarray, tol: float, shift: float, rows: np.ndarray | None = None) -> np.ndarray:
    """Whether each record (``rows`` of the first frame, else all) equals the second frame's record
    ``other`` with its times less ``shift``."""
    mine = codes[0] if rows is None else codes[0][rows]
    return ((mine == codes[1][other]) & (np.abs(s + shift - so[other]) <= tol)
            & (np.abs(e + shift - eo[other]) <= tol))


def _where(rec: pd.DataFrame, row: int, what: str) -> str:
    return f"{what} (first: rank {int(rec['rank'].iat[row])}, stream {rec['stream'].iat[row]})"


def _repeat(b: pd.DataFrame, start_b: np.ndarray, q: np.ndarray, k: np.ndarray, n: int, d: float,
            r: int = 1) -> pd.DataFrame:
    """Per stream, with ``r`` blocks of ``k`` records inserted per iteration in the longer run (the
    ``i``-th iteration's where the shorter run's records reach ``q[i]``; ``q[-1]``: their count):
    the longer run's stretches of records between the inserted blocks and its first block of each
    iteration ``n`` times (each copy ``d`` after the one before), everything after the ``i``-th
    iteration's blocks ``i (n - r) d`` later than in the longer run (the shorter run's records are
    the longer run's, where :func:`extend` found them equal)."""
    its = len(q) - 1
    s = len(k)
    pieces = 2 * its + 1                                # stretch, block, stretch, ..., stretch
    first = np.zeros((s, pieces), dtype=np.int64)       # each piece's first row of the longer run
    length = np.zeros((s, pieces), dtype=np.int64)
    shift = np.zeros((s, pieces))
    block = np.zeros((s, pieces), dtype=bool)
    for i in range(its + 1):
        since = q[i - 1] if i else np.zeros(s, dtype=np.int64)
        first[:, 2 * i] = start_b + since + i * r * k
        length[:, 2 * i] = q[i] - since
        shift[:, 2 * i] = i * (n - r) * d
        if i < its:
            first[:, 2 * i + 1] = start_b + q[i] + i * r * k
            length[:, 2 * i + 1] = n * k
            shift[:, 2 * i + 1] = i * (n - r) * d
            block[:, 2 * i + 1] = True
    lengths = length.ravel()
    width = np.repeat(np.maximum(k, 1), pieces)
    piece = np.repeat(np.arange(len(lengths)), lengths)
    t = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    w, blk = width[piece], block.ravel()[piece]
    row = first.ravel()[piece] + np.where(blk, t % w, t)
    times = shift.ravel()[piece] + np.where(blk, (t // w) * d, 0.0)
    out = b.take(row).reset_index(drop=True)
    out["start_s"] = out["start_s"].to_numpy() + times
    out["end_s"] = out["end_s"].to_numpy() + times
    return out[list(RECORD_COLUMNS)]


def _per_iteration(short: SimResult, long: SimResult, key: str, n: float, links: pd.Series) -> list[list[float]]:
    """``meta[key]`` (per iteration, per link of ``link_stats``) of the job: the short run's plus ``n``
    times what the longer run added, on the links ``links``."""
    def table(r: SimResult) -> pd.DataFrame:
        return pd.DataFrame(np.asarray(r.meta[key]).T, index=r.link_stats["link"].to_numpy())

    a, b = table(short), table(long)
    base = a.reindex(b.index, fill_value=0.0)
    out = base + n * (b - base)
    return out.reindex(links.to_numpy(), fill_value=0.0).to_numpy().T.tolist()


def _links(short: SimResult, long: SimResult, n: float) -> pd.DataFrame:
    """Link statistics of the job: the short run's plus ``n`` times what the longer run added."""
    a = short.link_stats.set_index("link")
    b = long.link_stats.set_index("link")
    out = b.copy()
    for col in ("nbytes", "busy_s"):
        base = a[col].reindex(b.index, fill_value=0.0)
        out[col] = base + n * (b[col] - base)
    return out.reset_index()[list(short.link_stats.columns)]
