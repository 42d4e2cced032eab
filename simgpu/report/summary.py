"""The summary of one simulated iteration: the numbers behind ``summary.json`` and the printed table.

This module owns the arithmetic of the report: interval-union measures (how long a set of possibly
overlapping intervals covers), the per-rank breakdown into compute, communication, exposed
communication and idle time, category and link rankings, and the plain-text table. It writes no
files (see :mod:`simgpu.report.outputs`).

Units: records carry seconds (``start_s``, ``end_s``); the summary reports milliseconds (keys ending
in ``_ms``), bytes as gigabytes (``gbytes``, 1e9 bytes), memory in GiB, utilisation and shares as
fractions in [0, 1]. Floats are rounded to :data:`SIGNIFICANT_DIGITS` significant digits so that the
same result always serialises to the same JSON bytes.

Definitions, per rank, over the window [0, iteration_time] (intervals are clipped to it):

- compute: union of kernel and memcpy intervals (not on the ``cpu`` row);
- communication: union of collective intervals, whichever stream they run on;
- exposed communication: communication minus compute (comm time not hidden under compute), also
  per collective kind (each kind's collectives minus compute);
- idle: iteration time minus the union of compute and communication;
- cpu busy: union of intervals on the ``cpu`` stream (host waits excluded).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..result import SimResult
from .kinds import kinds_summary

#: Significant digits kept for every float in the summary.
SIGNIFICANT_DIGITS = 6
#: Number of links listed in ``busiest_links``.
TOP_LINKS = 10
#: Record kinds that count as GPU compute work on non-comm streams.
COMPUTE_KINDS = ("kernel", "memcpy")
#: Record kinds that never count as busy time (the thread or stream is waiting).
WAIT_KINDS = ("host_wait",)
#: Record kinds that are host-side work and never count as GPU work on any stream.
HOST_KINDS = ("launch", "host_wait")
#: Up to this many ranks the printed table lists every rank; above it, min / mean / max.
MAX_TABLE_RANKS = 16

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]


# --------------------------------------------------------------------------- interval unions


def union_measure(starts: Sequence[float] | np.ndarray, ends: Sequence[float] | np.ndarray) -> float:
    """Total length covered by the union of intervals ``[starts[i], ends[i])``.

    Intervals may overlap, nest or touch; empty or reversed intervals contribute nothing.
    O(n log n): sort by start, keep the running maximum of the ends seen so far (the covered
    frontier), and count only what each interval adds beyond that frontier.
    """
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    if s.shape != e.shape or s.ndim != 1:
        raise ValueError(f"starts and ends must be 1-D arrays of one length, got {s.shape} and {e.shape}")
    if s.size == 0:
        return 0.0
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    frontier = np.maximum.accumulate(e)
    before = np.empty_like(frontier)
    before[0] = -np.inf
    before[1:] = frontier[:-1]
    return float(np.clip(e - np.maximum(s, before), 0.0, None).sum())


def grouped_union_measure(
    groups: np.ndarray, starts: np.ndarray, ends: np.ndarray, n_groups: int
) -> FloatArray:
    """Union measure of the intervals of each group, as an array of length ``n_groups``.

    ``groups`` holds integer codes in ``[0, n_groups)``. The same algorithm as
    :func:`union_measure`, done for all groups at once: one lexicographic sort by (group, start)
    and a running maximum of the ends that restarts at each group.
    """
    g = np.asarray(groups, dtype=np.int64)
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    if not (g.shape == s.shape == e.shape) or g.ndim != 1:
        raise ValueError("groups, starts and ends must be 1-D arrays of one length")
    if n_groups < 0:
        raise ValueError(f"n_groups must be >= 0, got {n_groups}")
    if g.size == 0:
        return np.zeros(n_groups, dtype=np.float64)
    if g.min() < 0 or g.max() >= n_groups:
        raise ValueError(f"group codes must lie in [0, {n_groups})")
    order = np.lexsort((s, g))
    g, s, e = g[order], s[order], e[order]
    frontier = pd.Series(e).groupby(g, sort=False).cummax().to_numpy(dtype=np.float64)
    before = np.empty_like(frontier)
    before[0] = -np.inf
    before[1:] = frontier[:-1]
    first_of_group = np.ones(g.size, dtype=bool)
    first_of_group[1:] = g[1:] != g[:-1]
    before[first_of_group] = -np.inf
    added = np.clip(e - np.maximum(s, before), 0.0, None)
    return np.bincount(g, weights=added, minlength=n_groups).astype(np.float64)


# --------------------------------------------------------------------------- helpers


def round_sig(x: float | None, digits: int = SIGNIFICANT_DIGITS) -> float | None:
    """``x`` rounded to ``digits`` significant digits; None for None, NaN or infinity."""
    if x is None:
        return None
    x = float(x)
    if not math.isfinite(x):
        return None
    if x == 0.0:
        return 0.0  # also turns -0.0 into 0.0
    return float(f"{x:.{digits}g}")


def _jsonable(value: Any) -> Any:
    """Plain-Python, rounded copy of a meta value (numpy scalars, tuples and dicts included)."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return round_sig(float(value))
    if value is None or isinstance(value, str):
        return value
    return str(value)


def _positive(value: Any) -> float | None:
    """``value`` as a float when it is a finite number > 0, else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x > 0 else None


def _ms(seconds: float) -> float | None:
    return round_sig(seconds * 1e3)


def _rank_axis(result: SimResult) -> IntArray:
    """Ranks the summary computes: every rank in the records and, when known, 0 .. gpus-1 (the
    representative ranks only, for a folded simulation)."""
    records, meta = result.records, result.meta
    ranks = set(int(r) for r in pd.unique(records["rank"])) if len(records) else set()
    gpus = meta.get("gpus")
    if result.replicas is not None:
        ranks.update(result.replicas.representatives())
    elif isinstance(gpus, (int, np.integer)) and not isinstance(gpus, bool) and gpus > 0:
        ranks.update(range(int(gpus)))
    return np.array(sorted(ranks), dtype=np.int64)


# --------------------------------------------------------------------------- computation


def _is(column: pd.Series, value: str) -> np.ndarray:
    """Whether each record's ``column`` is ``value``, as a boolean array (a categorical column is
    compared by its codes, without a string per record)."""
    return (column == value).to_numpy(dtype=bool)


def _isin(column: pd.Series, values: Sequence[str]) -> np.ndarray:
    """Whether each record's ``column`` is one of ``values``, as a boolean array."""
    return column.isin(list(values)).to_numpy(dtype=bool)


def or_other(column: pd.Series) -> pd.Series:
    """``column`` with missing values as ``"other"`` (a categorical column gains that category
    where it needs it)."""
    if isinstance(column.dtype, pd.CategoricalDtype) and "other" not in column.cat.categories:
        if not column.isna().any():
            return column
        column = column.cat.add_categories(["other"])
    return column.fillna("other")



def rank_breakdown(result: SimResult) -> pd.DataFrame:
    """Per-rank busy times in seconds.

    Returns one row per rank (index ``rank``) with columns ``compute_s``, ``communication_s``,
    ``exposed_communication_s``, ``idle_s`` and ``cpu_busy_s``, as defined in the module docstring.
    """
    t = float(result.iteration_time_s)
    rec = result.records
    ranks = _rank_axis(result)
    n = len(ranks)
    cols = ["compute_s", "communication_s", "exposed_communication_s", "idle_s", "cpu_busy_s"]
    if n == 0:
        return pd.DataFrame(columns=cols, index=pd.Index([], name="rank", dtype=np.int64), dtype=float)
    if len(rec):
        rank_idx = np.searchsorted(ranks, rec["rank"].to_numpy(dtype=np.int64))
        s = np.clip(rec["start_s"].to_numpy(dtype=np.float64), 0.0, t)
        e = np.clip(rec["end_s"].to_numpy(dtype=np.float64), 0.0, t)
        on_cpu = _is(rec["stream"], "cpu")
        is_comm = _is(rec["kind"], "collective")
        computes, waits = _isin(rec["kind"], COMPUTE_KINDS), _isin(rec["kind"], WAIT_KINDS)
    else:
        rank_idx = np.zeros(0, dtype=np.int64)
        s = e = np.zeros(0, dtype=np.float64)
        on_cpu = is_comm = computes = waits = np.zeros(0, dtype=bool)
    # communication is what collectives do, on whichever stream they run (comm, comm_recv, a trace's
    # several NCCL streams); compute is every kernel and copy elsewhere
    is_compute = ~on_cpu & computes & ~is_comm
    is_cpu = on_cpu & ~waits

    def measure(mask: np.ndarray) -> FloatArray:
        return grouped_union_measure(rank_idx[mask], s[mask], e[mask], n)

    compute = measure(is_compute)
    comm = measure(is_comm)
    either = measure(is_compute | is_comm)
    out = pd.DataFrame(
        {
            "compute_s": compute,
            "communication_s": comm,
            "exposed_communication_s": np.clip(either - compute, 0.0, None),
            "idle_s": np.clip(t - either, 0.0, None),
            "cpu_busy_s": measure(is_cpu),
        },
        index=pd.Index(ranks, name="rank"),
    )
    rep = result.replicas
    if rep is not None:  # every rank has its representative's breakdown
        every = np.arange(rep.world, dtype=np.int64)
        out = out.loc[rep.reps_of(every)].set_axis(pd.Index(every, name="rank"))
    return out


def exposed_by_kind(result: SimResult) -> pd.Series:
    """Exposed communication per collective kind (category), seconds, mean over ranks: for each kind,
    the time its collectives run while no compute does. Kinds overlapping one another each count
    the time, so the kinds may sum to more than ``exposed_communication``."""
    t = float(result.iteration_time_s)
    rec = result.records
    ranks = _rank_axis(result)
    if len(rec) == 0 or len(ranks) == 0:
        return pd.Series(dtype=np.float64, name="seconds")
    is_comm = _is(rec["kind"], "collective")
    is_compute = ~_is(rec["stream"], "cpu") & _isin(rec["kind"], COMPUTE_KINDS) & ~is_comm
    rank_idx = np.searchsorted(ranks, rec["rank"].to_numpy(dtype=np.int64))
    s = np.clip(rec["start_s"].to_numpy(dtype=np.float64), 0.0, t)
    e = np.clip(rec["end_s"].to_numpy(dtype=np.float64), 0.0, t)
    n = len(ranks)
    compute = grouped_union_measure(rank_idx[is_compute], s[is_compute], e[is_compute], n)
    codes, names = pd.factorize(or_other(rec["category"]))
    out = {}
    for c, i in sorted((str(names[i]), i) for i in np.unique(codes[is_comm]).tolist()):
        mask = is_compute | (is_comm & (codes == i))
        either = grouped_union_measure(rank_idx[mask], s[mask], e[mask], n)
        out[c] = float(np.clip(either - compute, 0.0, None).mean())
    series = pd.Series(out, dtype=np.float64, name="seconds")
    return series.sort_values(ascending=False, kind="stable")


def category_times(result: SimResult) -> pd.Series:
    """Union time in seconds of GPU work per category, mean over ranks, sorted longest first.

    GPU work is every record on a GPU stream (not ``cpu``) that is not host-side
    (``launch``, ``host_wait``). Ties are broken by category name.
    """
    t = float(result.iteration_time_s)
    rec = result.records
    ranks = _rank_axis(result)
    if len(rec) == 0 or len(ranks) == 0:
        return pd.Series(dtype=np.float64, name="seconds")
    mask = ~_is(rec["stream"], "cpu") & ~_isin(rec["kind"], HOST_KINDS)
    work = rec.loc[mask]
    if len(work) == 0:
        return pd.Series(dtype=np.float64, name="seconds")
    cat_codes, cats = pd.factorize(or_other(work["category"]).astype(str), sort=True)
    rank_idx = np.searchsorted(ranks, work["rank"].to_numpy(dtype=np.int64))
    n_cat = len(cats)
    groups = rank_idx * n_cat + cat_codes
    per = grouped_union_measure(
        groups,
        np.clip(work["start_s"].to_numpy(dtype=np.float64), 0.0, t),
        np.clip(work["end_s"].to_numpy(dtype=np.float64), 0.0, t),
        len(ranks) * n_cat,
    ).reshape(len(ranks), n_cat)
    frame = pd.DataFrame({"category": [str(c) for c in cats], "seconds": per.mean(axis=0)})
    frame = frame.sort_values(["seconds", "category"], ascending=[False, True], kind="stable")
    index = pd.Index(frame["category"], name="category")
    return pd.Series(frame["seconds"].to_numpy(), index=index, name="seconds")


def link_utilisation(result: SimResult) -> pd.DataFrame:
    """Link statistics with ``utilisation`` = bytes / (capacity * iteration time), busiest first.

    Returns the columns of :attr:`SimResult.link_stats` plus ``utilisation`` (NaN where the capacity
    or the iteration time is not positive), sorted by utilisation (descending) then link name.
    """
    stats = result.link_stats.copy()
    t = float(result.iteration_time_s)
    if len(stats) == 0:
        stats["utilisation"] = pd.Series(dtype=np.float64)
        return stats
    cap = stats["capacity_gbytes_per_s"].to_numpy(dtype=np.float64) * 1e9
    denom = cap * t
    nbytes = stats["nbytes"].to_numpy(dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        util = np.where(denom > 0, nbytes / np.where(denom > 0, denom, 1.0), np.nan)
    stats["utilisation"] = util
    stats["link"] = stats["link"].astype(str)
    return stats.sort_values(
        ["utilisation", "link"], ascending=[False, True], na_position="last", kind="stable"
    ).reset_index(drop=True)


def _memory(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The per-rank memory dict of the rank with the largest total, plus the GPU capacity."""
    per_rank = meta.get("memory_gib")
    capacity = _positive(meta.get("gpu_memory_gib"))
    if not per_rank:
        return None if capacity is None else {"rank": None, "total": None, "usage": {}, "capacity": capacity}

    def total(d: Mapping[str, Any]) -> float:
        if "total" in d and _positive(d["total"]) is not None:
            return float(d["total"])
        return float(sum(float(v) for k, v in d.items() if k != "rank" and isinstance(v, (int, float))))

    items = list(per_rank.items()) if isinstance(per_rank, Mapping) else list(enumerate(per_rank))
    best_rank, best = max(items, key=lambda kv: (total(kv[1]), -int(kv[0])))
    usage = {str(k): v for k, v in best.items() if k not in ("rank", "total")}
    rank = best.get("rank", best_rank)
    return {
        "rank": int(rank),
        "total": total(best),
        "usage": dict(sorted(usage.items())),
        "capacity": capacity,
    }


def _kernel_model_shares(meta: Mapping[str, Any]) -> dict[str, float]:
    """Model name -> fraction of simulated kernel time, largest first (fractions sum to 1)."""
    raw = meta.get("kernel_model_share") or {}
    seconds = {str(k): float(v) for k, v in raw.items() if _positive(v) is not None}
    total = sum(seconds.values())
    if total <= 0:
        return {}
    ordered = sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))
    return {name: v / total for name, v in ordered}


#: how many ranks and collectives the variability summary lists
TOP_WAITS = 5


def variability_summary(v: Mapping[str, Any], t: float) -> dict[str, Any]:
    """The ``variability`` block of the summary: the iteration without the section (a second
    simulation of the same job with it removed), the stretch, the section in words, and at the
    collectives the :data:`TOP_WAITS` ranks that waited longest at rendezvous (from their arrival to
    the last member's) and the collectives slowest to gather, each with the rank that arrived last."""
    base = float(v["baseline_iteration_s"])
    out: dict[str, Any] = {
        "without_variability_ms": _ms(base),
        "without_variability": str(v.get("baseline_note", "")),
        "stretch": round_sig(t / base) if base > 0 else None,
        "stretch_ms": _ms(t - base),
        "entries": [str(e) for e in v.get("entries", ())],
    }
    rv = v.get("rendezvous")
    if rv:
        waits = sorted(((int(r), float(w)) for r, w in rv["wait_s"].items()), key=lambda x: (-x[1], x[0]))
        least = min(waits, key=lambda x: (x[1], x[0])) if waits else None
        out["rendezvous_wait_ms"] = {
            "longest": [{"rank": r, "wait_ms": _ms(w)} for r, w in waits[:TOP_WAITS] if w > 0],
            "shortest": None if least is None else {"rank": least[0], "wait_ms": _ms(least[1])},
            "mean": _ms(sum(w for _, w in waits) / len(waits)) if waits else None,
            "collectives": int(rv["collectives"]),
        }
        out["slowest_to_gather"] = [
            {"name": str(c["name"]), "op": str(c["op"]), "gather_ms": _ms(float(c["gather_s"])),
             "last_rank": int(c["last_rank"]), "members": int(c["members"])}
            for c in rv["slowest"][:TOP_WAITS]]
    return out


def summarize(result: SimResult) -> dict[str, Any]:
    """The summary of ``result`` as a JSON-ready dict (see the module docstring for definitions).

    Deterministic: the same result gives an equal dict with the same key order, and floats rounded
    to :data:`SIGNIFICANT_DIGITS` significant digits. Unknown quantities (no samples, no peak
    FLOP/s, no memory data) are None. A replayed trace (``meta["measured_step_time_ms"]``) also
    reports its traced step time as ``measured_step_time_ms``, after ``iteration_time_ms``.
    """
    t = float(result.iteration_time_s)
    if not math.isfinite(t) or t < 0:
        raise ValueError(f"iteration_time_s must be a finite number >= 0, got {result.iteration_time_s!r}")
    meta = result.meta
    gpus = meta.get("gpus")

    samples = _positive(meta.get("samples"))
    tokens = _positive(meta.get("tokens"))
    throughput: dict[str, float | None] = {
        "samples_per_s": round_sig(samples / t) if samples and t > 0 else None
    }
    if tokens is not None:
        throughput["tokens_per_s"] = round_sig(tokens / t) if t > 0 else None

    flops = _positive(meta.get("model_flops"))
    peak = _positive(meta.get("peak_flops_per_gpu"))
    n_gpus = _positive(gpus)
    mfu = round_sig(flops / (t * n_gpus * peak)) if flops and peak and n_gpus and t > 0 else None

    per_rank = rank_breakdown(result)
    breakdown = {
        "compute": _ms(float(per_rank["compute_s"].mean())) if len(per_rank) else 0.0,
        "communication": _ms(float(per_rank["communication_s"].mean())) if len(per_rank) else 0.0,
        "exposed_communication": (
            _ms(float(per_rank["exposed_communication_s"].mean())) if len(per_rank) else 0.0
        ),
        "idle": _ms(float(per_rank["idle_s"].mean())) if len(per_rank) else _ms(t),
    }
    rank_rows = [
        {
            "rank": int(rank),
            "compute_ms": _ms(row.compute_s),
            "communication_ms": _ms(row.communication_s),
            "exposed_communication_ms": _ms(row.exposed_communication_s),
            "idle_ms": _ms(row.idle_s),
            "cpu_busy_ms": _ms(row.cpu_busy_s),
        }
        for rank, row in zip(per_rank.index, per_rank.itertuples(index=False), strict=True)
    ]
    categories = {str(c): _ms(float(v)) for c, v in category_times(result).items()}

    links = link_utilisation(result).head(TOP_LINKS)
    busiest = [
        {
            "link": str(row.link),
            "kind": str(row.link_kind),
            "utilisation": round_sig(row.utilisation),
            "gbytes": round_sig(float(row.nbytes) / 1e9),
            "busy_ms": _ms(float(row.busy_s)),
        }
        for row in links.itertuples(index=False)
    ]

    seed = meta.get("seed")
    out: dict[str, Any] = {
        "workload": _jsonable(meta.get("workload")),
        "platform": _jsonable(meta.get("platform")),
        "nodes": _jsonable(meta.get("nodes")),
        "gpus": _jsonable(gpus),
        "iteration_time_ms": _ms(t),
    }
    if meta.get("measured_step_time_ms") is not None:  # a replayed trace: the traced step time
        out["measured_step_time_ms"] = round_sig(float(meta["measured_step_time_ms"]))
    out.update({
        "throughput": throughput,
        "mfu": mfu,
        "breakdown_ms": breakdown,
        "exposed_communication_by_kind_ms": {str(c): _ms(float(v)) for c, v in exposed_by_kind(result).items()},
        "per_rank": rank_rows,
        "categories_ms": categories,
        "busiest_links": busiest,
        "memory_gib": _jsonable(_memory(meta)),
        "kernel_models": {k: round_sig(v) for k, v in _kernel_model_shares(meta).items()},
        "seed": _jsonable(seed),
        "events": int(result.events),
    })
    if meta.get("steady_state"):  # how the reported iteration was found
        out["steady_state"] = str(meta["steady_state"])
    if meta.get("periodic"):  # whether a pipeline's middle micro-batches were repeated, or why not
        out["periodic"] = str(meta["periodic"])
    if meta.get("model_notes"):  # what the model's config reads but approximates
        out["model_notes"] = [str(n) for n in meta["model_notes"]]
    if meta.get("pipeline_note"):  # an inference iteration's one batch through its pipeline stages
        out["pipeline"] = str(meta["pipeline_note"])
    if meta.get("variability"):  # slow GPUs, jitter: how much the iteration stretched and why
        out["variability"] = variability_summary(meta["variability"], t)
    if meta.get("kinds"):  # a mixed platform: compute and idle by kind of node
        out["by_kind"] = _jsonable([{k: round_sig(v) if isinstance(v, float) else v for k, v in row.items()}
                                    for row in kinds_summary(meta["kinds"], per_rank)])
    if "fold" in meta:  # how many identical ranks each simulated rank stood for
        out["fold"] = {"replicas": int(meta["fold"]), "note": str(meta.get("fold_note", ""))}
    if meta.get("run"):  # overrides, seed, platform figures, versions
        out["run"] = _jsonable(meta["run"])
    if meta.get("uncertainty"):  # --uncertainty N: percentiles of the draws and what spreads them
        out["uncertainty"] = _jsonable(meta["uncertainty"])
    return out
