"""The Gantt chart of one simulated iteration (``timeline.png``).

This module owns the timeline picture: which rows are drawn (one per rank and stream, optionally the
busiest links), the stable colour of every category, and the PNG itself. Records are drawn with one
:class:`~matplotlib.collections.PolyCollection` per category, never one artist per record, so that
10^5-10^6 intervals stay cheap. Times on the x axis are milliseconds from the start of the iteration.
Rendering uses matplotlib's Agg canvas directly, so no global backend is switched.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from os import PathLike
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from simgpu.report.summary import link_utilisation, or_other

from ..result import SimResult

#: Fixed colours of known categories (stable across runs and workloads).
CATEGORY_COLORS: dict[str, str] = {
    "gemm": "#1f77b4",
    "bmm": "#6baed6",
    "moe": "#08519c",
    "attention": "#9467bd",
    "embedding": "#8c564b",
    "elementwise": "#bcbd22",
    "norm": "#17becf",
    "softmax": "#e377c2",
    "optimizer": "#7f7f7f",
    "memcpy": "#c7c7c7",
    "all_reduce": "#d62728",
    "all_gather": "#ff7f0e",
    "reduce_scatter": "#2ca02c",
    "all_to_all": "#ff9896",
    "broadcast": "#98df8a",
    "reduce": "#ffbb78",
    "send_recv": "#f7b6d2",
    "launch": "#dbdb8d",
    "host_wait": "#eeeeee",
}
#: Colours for categories not in :data:`CATEGORY_COLORS`, chosen by a stable hash of the name.
FALLBACK_COLORS = (
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
    "#7b4173",
    "#5254a3",
    "#8ca252",
    "#bd9e39",
    "#ad494a",
    "#a55194",
    "#6b6ecf",
    "#b5cf6b",
    "#e7ba52",
    "#d6616b",
    "#ce6dbd",
    "#9c9ede",
)
#: Colour of link busy intervals.
LINK_COLOR = "#555555"
#: Drawing order of streams within a rank.
STREAM_ORDER = ("cpu", "compute", "comm", "copy")
#: At most this many rank rows (a rank and one of its streams each) are drawn; beyond it the ranks
#: drawn are a sample spread evenly from the first to the last, so that 1 or 10,000 ranks give a
#: picture of the same bounded size with labels of :data:`LABEL_PT`.
MAX_RANK_ROWS = 48
#: Size of every label, points (never smaller).
LABEL_PT = 8
#: Figure geometry in inches: at most 1.6 + 0.28 * (48 + 24 link rows) = 22 in high.
ROW_HEIGHT_IN = 0.28
MIN_HEIGHT_IN = 3.0
MAX_HEIGHT_IN = 40.0
WIDTH_IN = 16.0
DPI = 100


def sample_ranks(ranks: Sequence[int], streams: int, max_rows: int = MAX_RANK_ROWS) -> list[int]:
    """The ranks drawn: all of them when their rows fit in ``max_rows``, else as many as fit spread
    evenly from the first to the last (the first and the last always among them)."""
    fit = max(1, max_rows // max(streams, 1))
    if len(ranks) <= fit:
        return list(ranks)
    if fit == 1:
        return [ranks[0]]
    picks = np.unique(np.linspace(0, len(ranks) - 1, fit).round().astype(int))
    return [ranks[i] for i in picks]


def category_color(category: str) -> str:
    """The colour of ``category``: fixed for known ones, a deterministic pick for the rest.

    ``embedding_fwd`` and similar variants take the colour of their base name (``embedding``).
    """
    if category in CATEGORY_COLORS:
        return CATEGORY_COLORS[category]
    for suffix in ("_fwd", "_bwd"):
        if category.endswith(suffix) and category[: -len(suffix)] in CATEGORY_COLORS:
            return CATEGORY_COLORS[category[: -len(suffix)]]
    return FALLBACK_COLORS[zlib.crc32(category.encode()) % len(FALLBACK_COLORS)]


def _stream_key(stream: str) -> tuple[int, str]:
    return (STREAM_ORDER.index(stream), "") if stream in STREAM_ORDER else (len(STREAM_ORDER), stream)


def _bars(starts_s: np.ndarray, ends_s: np.ndarray, rows: np.ndarray, height: float = 0.8) -> np.ndarray:
    """Rectangle vertices (n, 4, 2) in (ms, row) coordinates, rows growing downwards."""
    x0 = starts_s * 1e3
    x1 = np.maximum(ends_s, starts_s) * 1e3
    y0 = rows - height / 2
    y1 = rows + height / 2
    return np.stack(
        [
            np.stack([x0, y0], axis=1),
            np.stack([x1, y0], axis=1),
            np.stack([x1, y1], axis=1),
            np.stack([x0, y1], axis=1),
        ],
        axis=1,
    )


def merge_close_intervals(
    rows: np.ndarray, starts: np.ndarray, ends: np.ndarray, gap: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge intervals of one row that overlap or lie at most ``gap`` apart.

    Returns ``(rows, starts, ends)`` of the merged intervals. Bars closer than a pixel cannot be
    told apart in the picture; merging them first keeps drawing cheap for 10^5-10^6 records.
    """
    r = np.asarray(rows, dtype=np.int64)
    s = np.asarray(starts, dtype=np.float64)
    e = np.maximum(np.asarray(ends, dtype=np.float64), s)
    if r.size == 0:
        return r, s, e
    order = np.lexsort((s, r))
    r, s, e = r[order], s[order], e[order]
    frontier = pd.Series(e).groupby(r, sort=False).cummax().to_numpy(dtype=np.float64)
    new = np.ones(r.size, dtype=bool)
    new[1:] = (r[1:] != r[:-1]) | (s[1:] > frontier[:-1] + gap)
    first = np.flatnonzero(new)
    return r[first], s[first], np.maximum.reduceat(e, first)


def _as_verts(verts: np.ndarray) -> Sequence[Any]:
    # An (n, 4, 2) array is matplotlib's fast path; its stubs only admit sequences.
    return cast(Sequence[Any], verts)


def build_timeline_figure(
    result: SimResult, *, show_cpu: bool = False, show_links: bool = False, max_link_rows: int = 24
) -> Figure:
    """The Gantt chart of ``result`` as a matplotlib :class:`Figure` (not saved, not shown)."""
    if max_link_rows < 0:
        raise ValueError(f"max_link_rows must be >= 0, got {max_link_rows}")
    rec = result.records
    t_ms = float(result.iteration_time_s) * 1e3
    all_ranks = sorted(int(r) for r in pd.unique(rec["rank"])) if len(rec) else []
    streams_present = {str(s) for s in pd.unique(rec["stream"])} if len(rec) else set()
    if not show_cpu:
        streams_present.discard("cpu")
    streams = sorted(streams_present, key=_stream_key)
    drawn_ranks = sample_ranks(all_ranks, len(streams))
    if len(drawn_ranks) < len(all_ranks):  # no row for a stream none of the drawn ranks uses
        used = {str(x) for x in pd.unique(rec.loc[rec["rank"].isin(drawn_ranks), "stream"])}
        streams = [x for x in streams if x in used]

    row_of: dict[tuple[int, str], int] = {}
    labels: list[str] = []
    for r in drawn_ranks:
        for s in streams:
            row_of[(r, s)] = len(labels)
            labels.append(f"r{r} {s}")

    link_rows: list[str] = []
    lr = result.link_records if show_links and max_link_rows > 0 else None
    if lr is not None and len(lr):
        recorded = {str(x) for x in pd.unique(lr["link"])}
        ranked = [str(x) for x in link_utilisation(result)["link"] if str(x) in recorded]
        busy = (lr["end_s"] - lr["start_s"]).groupby(lr["link"].astype(str)).sum()
        rest = sorted(recorded - set(ranked), key=lambda x: (-float(busy[x]), x))
        link_rows = (ranked + rest)[:max_link_rows]

    n_rows = len(labels) + len(link_rows)
    height = min(MAX_HEIGHT_IN, max(MIN_HEIGHT_IN, 1.6 + ROW_HEIGHT_IN * n_rows))
    fig = Figure(figsize=(WIDTH_IN, height), dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)

    legend: list[Patch] = []
    gap_s = 0.5 * max(float(result.iteration_time_s), 0.0) / (WIDTH_IN * DPI)  # half a pixel
    if labels and len(rec):
        sub = rec[rec["rank"].isin(drawn_ranks) & rec["stream"].isin(streams)]
        keys = pd.MultiIndex.from_tuples(list(row_of), names=["rank", "stream"])
        row_index = keys.get_indexer(
            pd.MultiIndex.from_arrays([sub["rank"].astype(np.int64), sub["stream"].astype(str)])
        )
        categories = or_other(sub["category"]).astype(str).to_numpy()
        starts = sub["start_s"].to_numpy(dtype=np.float64)
        ends = sub["end_s"].to_numpy(dtype=np.float64)
        known = [c for c in CATEGORY_COLORS if c in set(categories)]
        order = known + sorted(set(categories) - set(known))
        for cat in order:
            mask = categories == cat
            rows, s0, s1 = merge_close_intervals(row_index[mask], starts[mask], ends[mask], gap_s)
            verts = _bars(s0, s1, rows.astype(np.float64))
            color = category_color(cat)
            ax.add_collection(
                PolyCollection(_as_verts(verts), facecolors=color, edgecolors="none", linewidths=0),
                autolim=False,
            )
            legend.append(Patch(facecolor=color, label=cat))

    for i in range(1, len(drawn_ranks)):  # faint separators between ranks
        ax.axhline(i * len(streams) - 0.5, color="#bbbbbb", linewidth=0.4)

    if lr is not None and link_rows:
        base = len(labels)
        pos = {name: base + i for i, name in enumerate(link_rows)}
        names = lr["link"].astype(str)
        sel = names.isin(link_rows).to_numpy()
        rows, s0, s1 = merge_close_intervals(
            names[sel].map(pos).to_numpy(dtype=np.int64),
            lr["start_s"].to_numpy(dtype=np.float64)[sel],
            lr["end_s"].to_numpy(dtype=np.float64)[sel],
            gap_s,
        )
        verts = _bars(s0, s1, rows.astype(np.float64))
        ax.add_collection(
            PolyCollection(_as_verts(verts), facecolors=LINK_COLOR, edgecolors="none", linewidths=0),
            autolim=False,
        )
        legend.append(Patch(facecolor=LINK_COLOR, label="link busy"))
        labels = labels + [f"link {name}" for name in link_rows]
        if base:
            ax.axhline(base - 0.5, color="black", linewidth=0.6)

    # a steady iteration keeps the previous iteration's tail at negative times: show it, and the boundary
    left = min(0.0, float(rec["start_s"].min()) * 1e3) if len(rec) else 0.0
    if left < 0:
        ax.axvline(0.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xlim(left, t_ms if t_ms > 0 else 1.0)
    ax.set_ylim(max(len(labels), 1) - 0.5, -0.5)  # first row (rank 0) at the top
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=LABEL_PT)
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", linewidth=0.3, alpha=0.5)
    meta: dict[str, Any] = result.meta
    where = f"{meta.get('workload', 'workload')} on {meta.get('platform', 'platform')}"
    title = f"{where}: iteration {t_ms:.3f} ms"
    if left < 0:
        title += " (steady; the previous iteration's tail left of 0)"
    if len(drawn_ranks) < len(all_ranks):
        shown = ", ".join(str(r) for r in drawn_ranks[:4])
        shown += f", ..., {drawn_ranks[-1]}" if len(drawn_ranks) > 4 else ""
        title += f"  ({len(drawn_ranks)} of {len(all_ranks)} ranks shown: {shown})"
    if result.replicas is not None:
        title += f"\nrepresentative ranks, each standing for {result.replicas.factor} identical ranks"
    ax.set_title(title)
    if legend:
        ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=LABEL_PT, frameon=False)
    fig.tight_layout()
    return fig


def plot_timeline(
    result: SimResult,
    path: str | PathLike[str],
    *,
    show_cpu: bool = False,
    show_links: bool = False,
    max_link_rows: int = 24,
) -> None:
    """Draw the Gantt chart of ``result`` and write it as a PNG to ``path``.

    Rows: one per (rank, stream), streams in the order compute, comm, copy (``cpu`` first when
    ``show_cpu``), rank 0 at the top; at most :data:`MAX_RANK_ROWS` of them, the ranks sampled
    evenly when there are more (see :func:`sample_ranks`). With
    ``show_links`` and link records present, the ``max_link_rows`` busiest links follow as extra rows.
    """
    fig = build_timeline_figure(result, show_cpu=show_cpu, show_links=show_links, max_link_rows=max_link_rows)
    fig.savefig(Path(path), format="png", dpi=DPI, bbox_inches="tight")
