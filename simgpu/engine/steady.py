"""The steady iteration of programs that run several training iterations back to back.

Measured step times are steady-state: iteration i's tail (the distributed optimizer's parameter
all-gathers, say) runs under iteration i+1's head. When a workload's programs run ``n >= 2``
iterations, :func:`steady_window` keeps the last one: the window from the end of the last kernel of
iteration ``n - 2`` (over every rank) to the end of the last kernel of iteration ``n - 1``. Its
length is the steady iteration time; the records are shifted so that the window starts at 0, and
those of the iteration before that end within :data:`TAIL_FRACTION` of an iteration before the
window stay (at negative times), so the timeline shows the previous iteration's tail. What runs
past the window's end (the last iteration's own all-gathers, the next iteration's head in a
longer run) is kept too; the summary clips every interval to the window, where the previous
iteration's tail stands in for it. Link statistics are the last iteration's: the bytes its own
ops moved over each link (``meta["iteration_link_bytes"]``, counted by the engine per op's
iteration) and each link's busy time within the window (``meta["iteration_link_busy_s"]``).

The programs' first iteration may be run shortened to its last micro-batch
(:mod:`simgpu.engine.steady_cut`, checked by :mod:`simgpu.engine.steady_check`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

import numpy as np

from ..graph import Workload
from ..result import SimResult
from .steady_cut import _base

#: How much of the iteration before the steady one the records keep, as a fraction of an iteration.
TAIL_FRACTION: Final = 0.25


def steady_window(result: SimResult) -> SimResult:
    """``result`` of a run of several iterations (``meta["iteration_ends_s"]``) cut to its last one;
    a result without iteration ends is returned as it is."""
    ends = [float(x) for x in result.meta.get("iteration_ends_s", ())]
    if len(ends) < 2:
        return result
    b0, b1 = ends[-2], ends[-1]
    t = b1 - b0
    rec = result.records
    keep = (rec["end_s"] > b0 - TAIL_FRACTION * t) & (rec["start_s"] < b1 + TAIL_FRACTION * t)
    records = rec.loc[keep].copy()
    records["start_s"] -= b0
    records["end_s"] -= b0
    records = records.reset_index(drop=True)
    meta = dict(result.meta)
    per_bytes, per_busy = meta.pop("iteration_link_bytes", None), meta.pop("iteration_link_busy_s", None)
    links = result.link_stats.copy()
    if per_bytes is not None and per_busy is not None and len(per_bytes) == len(ends):
        links["nbytes"] = np.asarray(per_bytes)[-1]
        links["busy_s"] = np.asarray(per_busy)[-1]
        links = links.loc[links["nbytes"] > 0].reset_index(drop=True)
    else:  # a run extended from others (the periodic shortcut): the mean over the iterations
        for col in ("nbytes", "busy_s"):
            links[col] = links[col] / len(ends)
    link_records = result.link_records
    if link_records is not None:
        lk = (link_records["end_s"] > b0 - TAIL_FRACTION * t) & (link_records["start_s"] < b1)
        link_records = link_records.loc[lk].copy()
        link_records["start_s"] -= b0
        link_records["end_s"] -= b0
        link_records = link_records.reset_index(drop=True)
    meta["iteration_ends_s"] = ends
    meta["first_iteration_s"] = ends[0]
    return replace(result, records=records, link_stats=links, iteration_time_s=t, meta=meta,
                   link_records=link_records)


@dataclass(frozen=True)
class TailRepeat:
    """How far the ops from the optimizer step on of the iteration after ``iteration`` (counted from 1)
    are from those of ``iteration``, shifted by the window between the two iterations' ends: the
    largest difference, s, over every rank's starts and ends, and where it is (``rank``, ``op``; -1
    and "" where none differs)."""

    iteration: int
    offset_s: float
    rank: int
    op: str


def tail_repeats(workload: Workload, op_times: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]],
                 ends: Sequence[float]) -> list[TailRepeat]:
    """For each pair of consecutive iterations of a run of ``workload``'s programs (``op_times``: the
    engine's, ``ends``: each iteration's end), how far the later one's tail (its optimizer step and
    what follows it: the parameter all-gathers) is from the earlier one's, one window later. Every
    tail but the last runs under the next iteration's head; the last runs under nothing, so the
    last pair shows what the next iteration's head does to a tail, the others whether a tail left
    after a cold start repeats. Ranks whose iterations differ in their ops are left out."""
    pairs = len(ends) - 1
    best = [TailRepeat(k + 1, 0.0, -1, "") for k in range(pairs)]
    layouts: dict[int, list[np.ndarray] | None] = {}
    for prog in workload.programs:
        ops = _base(prog)
        if id(ops) not in layouts:  # worked out once per template
            its = np.fromiter((o.iteration for o in ops), dtype=np.int64, count=len(ops))
            got: list[np.ndarray] | None = []
            for k in range(pairs + 1):
                idx = np.flatnonzero(its == k)
                step = next((j for j, i in enumerate(idx.tolist()) if ops[i].phase == "opt"), None)
                if step is None or got is None:
                    got = None
                    break
                got.append(idx[step:])
            if got is not None and any(len(a) != len(got[0]) or any(
                    ops[i].name != ops[j].name for i, j in zip(a.tolist(), got[0].tolist(), strict=True))
                    for a in got):
                got = None
            layouts[id(ops)] = got
        tails = layouts[id(ops)]
        if tails is None or prog.rank not in op_times:
            continue
        _, start, end = op_times[prog.rank]
        for k in range(pairs):
            shift = float(ends[k + 1]) - float(ends[k])
            for col in (start, end):
                gap = np.abs(col[tails[k + 1]] - col[tails[k]] - shift)
                if not len(gap) or np.isnan(gap).all():
                    continue
                j = int(np.nanargmax(gap))
                if float(gap[j]) > best[k].offset_s:
                    best[k] = TailRepeat(k + 1, float(gap[j]), prog.rank, ops[int(tails[k + 1][j])].name)
    return best
