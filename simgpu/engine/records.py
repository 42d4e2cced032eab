"""The records table built from every rank's times once the run is over (:func:`records_table`),
and each iteration's busy time per link (:func:`window_busy`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..graph import Op
from ..result import RECORD_COLUMNS
from .state import _EMPTY_TIMES, _NO_TIMES, _Rank, _Shape

#: the records' string columns, in the order of :attr:`_Columns.codes`
_CODED = ("stream", "name", "category", "phase", "kind", "model")
#: about how many records :meth:`Engine._records` sorts at once (its scratch arrays: some 60 bytes a
#: record), whole ranks at a time
_SORT_ROWS = 1 << 21


def records_table(shapes_all: list[_Shape], ranks_all: dict[int, _Rank], shape_of: dict[int, _Shape],
                  models_all: list[str], op_times: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None
                  ) -> pd.DataFrame:
    """The records table (:data:`RECORD_COLUMNS`) from every rank's times, in the order of
    ``sort_values(["rank", "stream", "start_s", "end_s"], kind="stable")`` over the records as
    they happened: within a rank's stream, records happen in program order (a stream runs its
    ops in issue order; the CPU thread walks the program, an op's launch before its host_wait).
    Each template's columns are worked out once, as codes into one table of strings; the string
    columns are categoricals (per column, the strings it holds in sorted order, and one small
    integer code per record), ``rank`` is int32, the times float64 and ``nbytes`` int64. The
    columns are allocated once and filled a template at a time, a bounded number of its ranks
    at a time: their records sorted in one go, each rank's on their own; a template's times are
    let go once its ranks' rows are filled. Called once, after the run."""
    strings: dict[str, int] = {}

    def code(x: str) -> int:
        c = strings.get(x)
        if c is None:
            c = strings[x] = len(strings)
        return c

    host, cpu, launch, network = code("host"), code("cpu"), code("launch"), code("network")
    models = [code(m) for m in models_all]
    shapes = [shape for shape in shapes_all if shape.ranks]
    tables = [_Columns(shape.ops, code, host, cpu, launch, network, models) for shape in shapes]
    rows = {id(shape): len(t.seq) for shape, t in zip(shapes, tables, strict=True)}
    offset: dict[int, int] = {}  # rank -> its first row: ranks in order, each with its records
    total = 0
    for r in sorted(ranks_all.values(), key=lambda r: r.rank):
        offset[r.rank] = total
        total += rows[id(shape_of[r.rank])]
    table = list(strings)
    # per string column: its categories (the strings it holds, sorted) and each table code's
    # place among them, in the smallest integer type that holds them
    cats: list[list[str]] = []
    remaps: list[np.ndarray] = []
    for c in range(len(_CODED)):
        used = np.unique(np.concatenate([t.codes[c] for t in tables])) if tables else np.zeros(0, dtype=np.int32)
        names = sorted({table[u] for u in used.tolist() if table[u] is not None})
        place = {s: i for i, s in enumerate(names)}
        dtype = _code_dtype(len(names))
        remap = np.full(len(table), -1, dtype=dtype)
        for u in used.tolist():
            if table[u] is not None:
                remap[u] = place[table[u]]
        cats.append(names)
        remaps.append(remap)
    rank = np.empty(total, dtype=np.int32)
    start, end = np.empty(total), np.empty(total)
    nbytes = np.empty(total, dtype=np.int64)
    coded = [np.empty(total, dtype=remap.dtype) for remap in remaps]
    for shape, t in zip(shapes, tables, strict=True):
        n = len(t.seq)
        local_codes = [remap[t.codes[c]] for c, remap in enumerate(remaps)]  # this template's records
        stream_place = local_codes[0].astype(np.int64)  # sorted position of the stream's name
        times = shape.times
        if op_times is not None:  # the block is kept for the check that asked for it
            for k_, r in enumerate(shape.ranks):
                op_times[r.rank] = (times[1][k_], times[2][k_], times[3][k_])
        ranks = shape.ranks
        step = max(1, _SORT_ROWS // max(1, n))
        for a in range(0, len(ranks), step):
            part = ranks[a:a + step]
            k = len(part)
            first = np.concatenate([times[0, a:a + k], times[2, a:a + k][:, t.second]], axis=1).ravel()
            last = np.concatenate([times[1, a:a + k], times[3, a:a + k][:, t.second]], axis=1).ravel()
            # every rank's records sorted on their own: the rank (its row of the block) first
            perm = np.lexsort((np.tile(t.seq, k), last, first, np.tile(stream_place, k),
                               np.repeat(np.arange(k), n)))
            where = _rows(np.asarray([offset[r.rank] for r in part], dtype=np.int64), n)
            rank[where] = np.repeat(np.asarray([r.rank for r in part], dtype=np.int32), n)
            start[where] = first[perm]
            end[where] = last[perm]
            del first, last
            local = perm % n
            del perm
            for out, values in zip(coded, local_codes, strict=True):
                out[where] = values[local]
            nbytes[where] = t.codes[len(_CODED)][local]
            del local, where
        for r in ranks:
            r.launch = r.issue = r.start = r.end = _NO_TIMES  # the records hold them now
        shape.times = times = _EMPTY_TIMES
    columns: dict[str, Any] = {"rank": rank, "start_s": start, "end_s": end, "nbytes": nbytes}
    for col, codes, names in zip(_CODED, coded, cats, strict=True):
        columns[col] = pd.Categorical.from_codes(codes, categories=names, validate=False)
    return pd.DataFrame(columns, columns=list(RECORD_COLUMNS), copy=False)


def window_busy(intervals: list[tuple[int, float, float]], iteration_ends: list[float], used: np.ndarray,
                links: int) -> np.ndarray:
    """Per iteration (the window from the previous iteration's end, 0 for the first, to its own),
    each of the links ``used``'s busy time within it, from the network's busy intervals."""
    ends = np.asarray(iteration_ends, dtype=float)
    out = np.zeros((len(ends), len(used)))
    if not intervals or not len(used):
        return out
    spans = np.asarray(intervals, dtype=float)
    col = np.full(links, -1, dtype=np.int64)
    col[used] = np.arange(len(used))
    where = col[spans[:, 0].astype(np.int64)]
    spans, where = spans[where >= 0], where[where >= 0]
    lo = np.concatenate([[0.0], ends[:-1]])
    for k in range(len(ends)):
        d = np.clip(np.minimum(spans[:, 2], ends[k]) - np.maximum(spans[:, 1], lo[k]), 0.0, None)
        out[k] = np.bincount(where, d, minlength=len(used))
    return out


class _Columns:
    """A template's records as codes (see :meth:`Engine._records`): per record, its columns
    (``codes``: stream, name, category, phase, kind, model as string codes; nbytes), and ``seq``, its
    place among its rank's records as they happen. A rank's records are its ops' CPU thread records
    (launch, or a host op's work) in program order, then the second records of the ops ``second``
    (the stream's, or a host_wait's)."""

    __slots__ = ("codes", "second", "seq")

    def __init__(self, ops: list[Op], code: Any, host: int, cpu: int, launch: int, network: int,
                 models: list[int]) -> None:
        two = [i for i, op in enumerate(ops) if op.kind != "host"]
        cols: list[list[int]] = [[] for _ in range(7)]
        stream, name, category, phase, kind, model, nbytes = cols
        for op in ops:  # the CPU thread's record: the launch, or a host op's work
            h = op.kind == "host"
            stream.append(cpu)
            name.append(code(op.name))
            category.append(code(op.category) if h else launch)
            phase.append(code(op.phase))
            kind.append(host if h else launch)
            model.append(host)
            nbytes.append(0)
        for i in two:  # the stream's record, or a host_wait's on the CPU thread
            op = ops[i]
            w = op.kind == "host_wait"
            stream.append(cpu if w else code(op.stream))
            name.append(code(op.name))
            category.append(code(op.category))
            phase.append(code(op.phase))
            kind.append(code(op.kind))
            model.append(host if w else models[op.kernel] if op.kind == "kernel" else network)
            nbytes.append(0 if w else op.nbytes)
        self.second = np.asarray(two, dtype=np.int64)
        self.codes = [np.asarray(c, dtype=np.int32) for c in cols[:6]] + [np.asarray(nbytes, dtype=np.int64)]
        self.seq = np.concatenate([2 * np.arange(len(ops), dtype=np.int64), 2 * self.second + 1])


def _rows(firsts: np.ndarray, n: int) -> np.ndarray:
    """The table rows of ranks with ``n`` records each whose first rows are ``firsts``, in turn."""
    return np.repeat(firsts, n) + np.tile(np.arange(n, dtype=np.int64), len(firsts))


def _code_dtype(n: int) -> Any:
    """The smallest signed integer type that holds the codes of ``n`` categories (and -1)."""
    return np.int8 if n < 2**7 else np.int16 if n < 2**15 else np.int32
