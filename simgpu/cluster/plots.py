"""The cluster's timeline: a band of rows per job (the first rank of each of its nodes, at most four,
its compute and comm streams), each op a bar in its category's colour, a line where the job ends
together and a dashed one where it ends alone."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from ..report.gantt import DPI, category_color
from .run import ClusterResult

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
