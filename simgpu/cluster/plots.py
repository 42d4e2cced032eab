"""The cluster's figures. The timeline: a band of rows per job (the first rank of each of its nodes,
at most four, its compute and comm streams), each op a bar in its category's colour, a line where
the job ends together and a dashed one where it ends alone. The link timeline: a row per busiest
link between switches (the summary's table), split into one lane per job, a bar where the job had
transfers on the link, in the job's colour."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..report.gantt import DPI, category_color, merge_close_intervals
from .run import ClusterResult, job_link_records

#: each job's colour on the link timeline, in the cluster file's order (then again from the first)
JOB_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")

#: ranks drawn per job, and their streams
RANKS_PER_JOB = 4
STREAMS = ("compute", "comm")


def timeline(res: ClusterResult, path: str | Path) -> None:
    """Draw the shared run's timeline, ranks grouped by job, into the PNG ``path``."""
    rec = res.together.records
    gpn = res.cluster.gpus_per_node
    rows: list[tuple[str, int, str]] = []  # (job, rank, stream)
    for name, ranks in res.ranks.items():
        firsts = [int(r) for r in ranks[::gpn][:RANKS_PER_JOB]]
        rows += [(name, r, s) for r in firsts for s in STREAMS]
    fig = Figure(figsize=(12, 1.0 + 0.28 * len(rows)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    verts, colors = [], []
    for y, (_, rank, stream) in enumerate(rows):
        d = rec[(rec["rank"] == rank) & (rec["stream"] == stream)]
        for s, e, cat in zip(d["start_s"].to_numpy() * 1e3, d["end_s"].to_numpy() * 1e3, d["category"].astype(str),
                             strict=True):
            verts.append([(s, y - 0.4), (s, y + 0.4), (e, y + 0.4), (e, y - 0.4)])
            colors.append(category_color(cat))
    ax.add_collection(PolyCollection(verts, facecolors=colors, edgecolors="none"))
    start = 0
    for name in res.ranks:
        n = sum(1 for r in rows if r[0] == name)
        lo, hi = start - 0.5, start + n - 0.5
        ax.vlines(res.together_s[name] * 1e3, lo, hi, colors="black", linewidth=1.2)
        if name in res.alone_s:
            ax.vlines(res.alone_s[name] * 1e3, lo, hi, colors="black", linestyles="dashed", linewidth=1.0)
        if start:
            ax.axhline(lo, color="grey", linewidth=0.6)
        start += n
    ax.set_yticks(range(len(rows)), [f"{j} r{r} {s}" for j, r, s in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, max(res.together_s.values(), default=0.0) * 1e3 * 1.02 or 1.0)
    ax.set_xlabel("ms (solid: the job's end together; dashed: alone)")
    ax.set_title(f"{res.cluster.spec.name}: {len(res.ranks)} jobs on {res.cluster.spec.nodes} nodes")
    fig.savefig(Path(path), format="png", dpi=DPI, bbox_inches="tight")


def link_timeline(res: ClusterResult, links: list[str], path: str | Path) -> bool:
    """Draw who used the links ``links`` when in the shared run into the PNG ``path``: a row per link
    (top to bottom as given), a lane per job in it, a bar where the job had transfers on the link and
    a line where each job ends. False (nothing drawn) where no link or no interval of them was kept."""
    spans = job_link_records(res, links)
    if not links or spans.empty:
        return False
    names = list(res.ranks)
    span_ms = max(res.together_s.values(), default=0.0) * 1e3 or 1.0
    width_in = 12.0
    fig = Figure(figsize=(width_in, 1.2 + 0.25 * len(links) * max(2, len(names))))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    lane = 0.8 / len(names)
    row = {lk: y for y, lk in enumerate(links)}
    gap_ms = 0.5 * span_ms / (width_in * DPI)  # half a pixel
    legend = []
    for j, name in enumerate(names):
        color = JOB_COLORS[j % len(JOB_COLORS)]
        d = spans[spans["job"] == name]
        rows, s0, s1 = merge_close_intervals(d["link"].map(row).to_numpy(dtype="int64"),
                                             d["start_s"].to_numpy() * 1e3, d["end_s"].to_numpy() * 1e3, gap_ms)
        lo = rows - 0.4 + j * lane
        verts = [[(a, y), (a, y + lane), (b, y + lane), (b, y)] for a, b, y in zip(s0, s1, lo, strict=True)]
        ax.add_collection(PolyCollection(verts, facecolors=color, edgecolors="none"))
        ax.vlines(res.together_s[name] * 1e3, -0.5, len(links) - 0.5, colors=color, linewidth=1.0)
        legend.append(Patch(facecolor=color, label=f"job {name}"))
    for y in range(1, len(links)):
        ax.axhline(y - 0.5, color="#bbbbbb", linewidth=0.4)
    ax.set_yticks(range(len(links)), links, fontsize=7)
    ax.set_ylim(len(links) - 0.5, -0.5)
    ax.set_xlim(0, span_ms * 1.02)
    ax.set_xlabel("ms (a line where each job ends)")
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_title(f"{res.cluster.spec.name}: who used the busiest links between switches when (a lane per job)")
    fig.savefig(Path(path), format="png", dpi=DPI, bbox_inches="tight")
    return True
