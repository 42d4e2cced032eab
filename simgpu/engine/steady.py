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
iteration's tail stands in for it. Link statistics are the mean over the iterations run.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from .result import SimResult

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
    n = len(ends)
    links = result.link_stats.copy()
    for col in ("nbytes", "busy_s"):
        links[col] = links[col] / n
    link_records = result.link_records
    if link_records is not None:
        lk = (link_records["end_s"] > b0 - TAIL_FRACTION * t) & (link_records["start_s"] < b1)
        link_records = link_records.loc[lk].copy()
        link_records["start_s"] -= b0
        link_records["end_s"] -= b0
        link_records = link_records.reset_index(drop=True)
    meta = dict(result.meta)
    meta["iteration_ends_s"] = ends
    meta["first_iteration_s"] = ends[0]
    return replace(result, records=records, link_stats=links, iteration_time_s=t, meta=meta,
                   link_records=link_records)
