"""Comparison plots of a study: stacked bars per variant, and a line per swept key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

PARTS = (("compute_ms", "compute", "#4c72b0"), ("exposed_communication_ms", "exposed communication", "#dd8452"),
         ("idle_ms", "idle", "#c7c7c7"))


def bars(table: pd.DataFrame, path: Path, title: str) -> None:
    """Iteration time of each feasible variant split into compute, exposed communication, idle."""
    ok = table[table["feasible"]].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(ok) + 2), 4.5))
    bottom = pd.Series(0.0, index=ok.index)
    for col, label, colour in PARTS:
        vals = ok[col].fillna(0.0)
        ax.bar(range(len(ok)), vals, bottom=bottom, label=label, color=colour)
        bottom = bottom + vals
    ax.set_xticks(range(len(ok)), ok["name"], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("iteration time (ms)")
    ax.set_title(title)
    ax.legend(frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def lines(table: pd.DataFrame, swept: list[str], path: Path, title: str) -> bool:
    """Iteration time against the first numeric swept key, one line per value of the others."""
    ok = table[table["feasible"]].dropna(subset=[k for k in swept if k in table])
    numeric = [k for k in swept if k in ok and pd.api.types.is_numeric_dtype(ok[k])] if len(ok) else []
    if not numeric:
        return False
    x = numeric[0]
    others = [k for k in swept if k != x]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    groups: Any = ok.groupby(others) if others else [((), ok)]
    for key, g in groups:
        g = g.sort_values(x)
        label = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(others, key if isinstance(key, tuple) else (key,)))
        ax.plot(g[x], g["iteration_time_ms"], marker="o", label=label or None)
        ax.plot(g[x], g["exposed_communication_ms"], marker=".", linestyle=":", color=ax.lines[-1].get_color())
    ax.set_xlabel(x)
    ax.set_ylabel("iteration time (ms); dotted: exposed communication")
    if ok[x].min() > 0 and ok[x].max() / ok[x].min() >= 8:
        ax.set_xscale("log", base=2)
        ticks = sorted(ok[x].unique())
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
    ax.set_title(title)
    if others and any(not str(line.get_label()).startswith("_") for line in ax.lines):
        ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
