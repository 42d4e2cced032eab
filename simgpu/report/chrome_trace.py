"""The Chrome / Perfetto trace of one simulated iteration (``trace.json``).

This module owns the translation of records into the Trace Event Format that ``chrome://tracing``
and https://ui.perfetto.dev open: one complete event (``"ph": "X"``) per record, process = rank,
thread = stream, plus metadata events naming and ordering processes and threads. Link busy
intervals, when recorded, become one extra process named ``links`` with a thread per link: one
event per stretch the link is busy (its records merged where they overlap), with the owners whose
transfers it carried in ``args``.

Units: ``ts`` and ``dur`` are microseconds from the start of the iteration (the format's unit),
rounded to nanoseconds; ``displayTimeUnit`` is ``ms``.
"""

from __future__ import annotations

import json
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..result import SimResult

#: Thread id of each known stream; other streams follow in name order.
STREAM_TIDS: dict[str, int] = {"cpu": 0, "compute": 1, "comm": 2, "copy": 3}
#: Decimal places kept on microsecond times (3 = nanoseconds).
US_DECIMALS = 3


def stream_tids(streams: list[str]) -> dict[str, int]:
    """Thread id for every stream name: the fixed ids of :data:`STREAM_TIDS`, then 4, 5, ... by name."""
    tids = {s: STREAM_TIDS[s] for s in streams if s in STREAM_TIDS}
    extra = sorted(s for s in set(streams) if s not in STREAM_TIDS)
    tids.update({s: len(STREAM_TIDS) + i for i, s in enumerate(extra)})
    return tids


def _meta_event(name: str, pid: int, args: dict[str, Any], tid: int | None = None) -> dict[str, Any]:
    ev: dict[str, Any] = {"name": name, "ph": "M", "pid": pid}
    if tid is not None:
        ev["tid"] = tid
    ev["args"] = args
    return ev


def _us(seconds: pd.Series) -> np.ndarray[Any, np.dtype[np.float64]]:
    values: np.ndarray[Any, np.dtype[np.float64]] = np.asarray(seconds, dtype=np.float64) * 1e6
    return np.round(values, US_DECIMALS)


def _nullable(values: pd.Series) -> list[Any]:
    """Column as a Python list, with NaN / None turned into None (JSON null)."""
    obj = values.astype(object)
    return list(obj.where(obj.notna(), None).tolist())


def _merged(links: pd.DataFrame) -> tuple[pd.DataFrame, list[list[str]]]:
    """Each link's rows merged where they overlap (one busy stretch each, as one event of a thread),
    with the owners of each stretch (sorted; none without an ``owner`` column)."""
    if "owner" not in links.columns:
        return links.reset_index(drop=True), [[] for _ in range(len(links))]
    names = links["link"].astype(str).to_numpy()
    s = links["start_s"].to_numpy(dtype=np.float64)
    e = links["end_s"].to_numpy(dtype=np.float64)
    order = np.lexsort((s, names))
    names, s, e = names[order], s[order], e[order]
    frontier = pd.Series(e).groupby(names, sort=False).cummax().to_numpy(dtype=np.float64)
    new = np.ones(len(s), dtype=bool)
    new[1:] = (names[1:] != names[:-1]) | (s[1:] >= frontier[:-1])  # not inside the stretch before
    span = np.cumsum(new) - 1
    firsts = np.flatnonzero(new)
    out = links.iloc[order[firsts]].reset_index(drop=True)
    out["end_s"] = np.maximum.reduceat(e, firsts)
    owner = links["owner"].astype(str).to_numpy()[order]
    owners: list[set[str]] = [set() for _ in firsts]
    for k, o in zip(span.tolist(), owner.tolist(), strict=True):
        if o:
            owners[k].add(o)
    return out, [sorted(x) for x in owners]


def chrome_trace(result: SimResult) -> dict[str, Any]:
    """The trace of ``result`` as a dict ``{"traceEvents": [...], "displayTimeUnit": "ms"}``.

    Events are in a fixed order (metadata, then records by rank, stream and start, then links), so
    the same result always gives the same trace.
    """
    rec = result.records
    ranks = sorted(int(r) for r in pd.unique(rec["rank"])) if len(rec) else []
    streams = [str(s) for s in pd.unique(rec["stream"])] if len(rec) else []
    tids = stream_tids(streams)

    events: list[dict[str, Any]] = []
    used_per_rank: dict[int, list[str]] = {}
    if len(rec):
        pairs = rec[["rank", "stream"]].drop_duplicates()
        for r, s in zip(pairs["rank"].astype(int), pairs["stream"].astype(str), strict=True):
            used_per_rank.setdefault(int(r), []).append(s)
    for r in ranks:
        events.append(_meta_event("process_name", r, {"name": f"rank {r}"}))
        events.append(_meta_event("process_sort_index", r, {"sort_index": r}))
        for s in sorted(used_per_rank.get(r, []), key=lambda x: tids[x]):
            events.append(_meta_event("thread_name", r, {"name": s}, tids[s]))
            events.append(_meta_event("thread_sort_index", r, {"sort_index": tids[s]}, tids[s]))

    if len(rec):
        tid_col = rec["stream"].astype(str).map(tids).to_numpy(dtype=np.int64)
        rank_col = rec["rank"].to_numpy(dtype=np.int64)
        ts = _us(rec["start_s"])
        dur = np.round(np.clip(_us(rec["end_s"]) - ts, 0.0, None), US_DECIMALS)
        order = np.lexsort((ts, tid_col, rank_col))
        nbytes = rec["nbytes"].fillna(0).to_numpy(dtype=np.float64)
        cols = zip(
            rank_col[order].tolist(),
            tid_col[order].tolist(),
            ts[order].tolist(),
            dur[order].tolist(),
            _nullable(rec["name"].iloc[order]),
            _nullable(rec["category"].iloc[order]),
            _nullable(rec["phase"].iloc[order]),
            _nullable(rec["kind"].iloc[order]),
            np.rint(nbytes[order]).astype(np.int64).tolist(),
            _nullable(rec["model"].iloc[order]),
            strict=True,
        )
        for pid, tid, t0, d, name, cat, phase, kind, nb, model in cols:
            events.append(
                {
                    "name": name,
                    "cat": cat,
                    "ph": "X",
                    "ts": t0,
                    "dur": d,
                    "pid": pid,
                    "tid": tid,
                    "args": {"phase": phase, "kind": kind, "nbytes": nb, "model": model},
                }
            )

    links = result.link_records
    if links is not None and len(links):
        links, owners = _merged(links)
        pid = (max(ranks) + 1) if ranks else 0
        names = links["link"].astype(str)
        link_names = sorted(set(names))
        link_tid = {name: i for i, name in enumerate(link_names)}
        events.append(_meta_event("process_name", pid, {"name": "links"}))
        events.append(_meta_event("process_sort_index", pid, {"sort_index": pid}))
        for name in link_names:
            events.append(_meta_event("thread_name", pid, {"name": name}, link_tid[name]))
            events.append(
                _meta_event("thread_sort_index", pid, {"sort_index": link_tid[name]}, link_tid[name])
            )
        tid_col = names.map(link_tid).to_numpy(dtype=np.int64)
        ts = _us(links["start_s"])
        dur = np.round(np.clip(_us(links["end_s"]) - ts, 0.0, None), US_DECIMALS)
        order = np.lexsort((ts, tid_col))
        for tid, t0, d, name, kind, who in zip(
            tid_col[order].tolist(),
            ts[order].tolist(),
            dur[order].tolist(),
            names.iloc[order].tolist(),
            _nullable(links["link_kind"].iloc[order]),
            [owners[k] for k in order.tolist()],
            strict=True,
        ):
            events.append(
                {"name": name, "cat": kind, "ph": "X", "ts": t0, "dur": d, "pid": pid, "tid": tid,
                 "args": {"owners": who} if who else {}}
            )

    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(result: SimResult, path: str | PathLike[str]) -> Path:
    """Write :func:`chrome_trace` of ``result`` as compact JSON to ``path``; returns the path."""
    out = Path(path)
    with out.open("w", encoding="utf-8") as f:
        # dumps, not dump: the C encoder only serves whole-string encoding (several times faster)
        f.write(json.dumps(chrome_trace(result), separators=(",", ":"), allow_nan=False))
        f.write("\n")
    return out
