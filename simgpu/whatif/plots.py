"""Comparison plots of a study: stacked bars per variant, and a line per swept key.

Both stay readable at any number of variants: bars wrap into rows of :data:`BARS_PER_ROW` and
paginate into ``bars.png``, ``bars-2.png``, ... of at most :data:`ROWS_PER_PAGE` rows each (so no
picture is wider than about 13 in); lines get a colour each, never one colour for two series,
with the legend beside the axes in as many columns as it needs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

PARTS = (("compute_ms", "compute", "#4c72b0"), ("exposed_communication_ms", "exposed communication", "#dd8452"),
         ("idle_ms", "idle", "#c7c7c7"))
#: Variants per row of bars, and rows per picture.
BARS_PER_ROW = 24
ROWS_PER_PAGE = 4
#: Legend entries per column of the lines plot.
LEGEND_ROWS = 20


def page_paths(path: Path, pages: int) -> list[Path]:
    """``bars.png``, then ``bars-2.png``, ``bars-3.png``, ... for further pages."""
    return [path if i == 0 else path.with_name(f"{path.stem}-{i + 1}{path.suffix}") for i in range(pages)]


def bars(table: pd.DataFrame, path: Path, title: str) -> list[Path]:
    """Iteration time of each feasible variant split into compute, exposed communication, idle;
    returns the pictures written (more than one when the variants do not fit in one)."""
    ok = table[table["feasible"]].reset_index(drop=True)
    per_page = BARS_PER_ROW * ROWS_PER_PAGE
    pages = max(1, math.ceil(len(ok) / per_page))
    top = float((ok["compute_ms"].fillna(0) + ok["exposed_communication_ms"].fillna(0)
                 + ok["idle_ms"].fillna(0)).max()) if len(ok) else 1.0
    intervals = "iteration_p90_ms" in ok and ok["iteration_p90_ms"].notna().any()
    if intervals:  # the study's uncertainty draws: an error bar from P10 to P90 on each bar
        top = max(top, float(ok["iteration_p90_ms"].max()))
    paths = page_paths(path, pages)
    for page, out in enumerate(paths):
        chunk = ok.iloc[page * per_page:(page + 1) * per_page]
        rows = max(1, math.ceil(len(chunk) / BARS_PER_ROW))
        width = min(16.0, max(6.0, 0.45 * min(len(chunk), BARS_PER_ROW) + 2))
        fig, axes = plt.subplots(rows, 1, figsize=(width, 4.5 * rows), squeeze=False)
        for r in range(rows):
            ax = axes[r][0]
            part = chunk.iloc[r * BARS_PER_ROW:(r + 1) * BARS_PER_ROW]
            x = np.arange(len(part))
            bottom = np.zeros(len(part))
            for col, label, colour in PARTS:
                vals = part[col].fillna(0.0).to_numpy(dtype=float)
                ax.bar(x, vals, bottom=bottom, label=label, color=colour)
                bottom = bottom + vals
            if intervals:
                lo = (bottom - part["iteration_p10_ms"].to_numpy(dtype=float)).clip(min=0)
                hi = (part["iteration_p90_ms"].to_numpy(dtype=float) - bottom).clip(min=0)
                ax.errorbar(x, bottom, yerr=[lo, hi], fmt="none", ecolor="black", capsize=3, lw=1,
                            label="80% interval")
            ax.set_xticks(x, [str(n)[:40] for n in part["name"]], rotation=60, ha="right", fontsize=8)
            ax.set_xlim(-0.6, BARS_PER_ROW - 0.4 if rows > 1 or pages > 1 else len(part) - 0.4)
            ax.set_ylim(0, top * 1.05)  # one scale on every row and page
            ax.set_ylabel("iteration time (ms)")
            if r == 0:
                head = title if pages == 1 else f"{title} (page {page + 1} of {pages})"
                ax.set_title(head)
                ax.legend(frameon=False, fontsize=8)
        fig.tight_layout()
        fig.savefig(out, dpi=120)
        plt.close(fig)
    for stale in path.parent.glob(f"{path.stem}-*{path.suffix}"):  # pages of an earlier, longer study
        if stale not in paths:
            stale.unlink()
    return paths


def series_colours(n: int) -> list[Any]:
    """``n`` distinct colours: matplotlib's tab10 or tab20 where they suffice, else evenly spaced
    along a perceptual colour map."""
    if n <= 10:
        return [plt.get_cmap("tab10")(i) for i in range(n)]
    if n <= 20:
        return [plt.get_cmap("tab20")(i) for i in range(n)]
    return [plt.get_cmap("turbo")(v) for v in np.linspace(0.03, 0.97, n)]


def lines(table: pd.DataFrame, swept: list[str], path: Path, title: str) -> bool:
    """Iteration time against the first numeric swept key, one line per value of the others."""
    ok = table[table["feasible"]].dropna(subset=[k for k in swept if k in table])
    numeric = [k for k in swept if k in ok and pd.api.types.is_numeric_dtype(ok[k])] if len(ok) else []
    if not numeric:
        return False
    x = numeric[0]
    others = [k for k in swept if k != x]
    # a swept value may be a list (a straggler's ranks): grouped by its text
    ok = ok.assign(**{k: ok[k].map(lambda v: str(v) if isinstance(v, (list, tuple, dict)) else v)
                      for k in others if k in ok})
    groups: list[tuple[Any, pd.DataFrame]] = list(ok.groupby(others)) if others else [((), ok)]
    colours = series_colours(len(groups))
    columns = max(1, math.ceil(len(groups) / LEGEND_ROWS))
    fig, ax = plt.subplots(figsize=(6.5 + 2.2 * columns * (len(groups) > 1), 4.5))
    for (key, g), colour in zip(groups, colours, strict=True):
        g = g.sort_values(x)
        label = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(others, key if isinstance(key, tuple) else (key,)))
        ax.plot(g[x], g["iteration_time_ms"], marker="o", color=colour, label=label or None)
        ax.plot(g[x], g["exposed_communication_ms"], marker=".", linestyle=":", color=colour)
    ax.set_xlabel(x)
    ax.set_ylabel("iteration time (ms); dotted: exposed communication")
    if ok[x].min() > 0 and ok[x].max() / ok[x].min() >= 8:
        ax.set_xscale("log", base=2)
        ticks = sorted(ok[x].unique())
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
    ax.set_title(title)
    if others and len(groups) > 1:
        ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=columns)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
