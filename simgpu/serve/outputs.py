"""The files of a serving run: ``requests.csv``, ``summary.json``, ``kv_occupancy.csv`` and the
pictures (latency CDFs, KV-cache occupancy over time, the Gantt chart of a window of iterations,
and, with a rate sweep, throughput and latency against load).

The Gantt chart is drawn by :mod:`simgpu.report.gantt`: one row per replica (its iterations on the
``compute`` stream, coloured prefill / decode / mixed; under pipeline parallelism one row per
stage of a replica, the batches of its virtual engines passing them) and, disaggregated, the KV
transfers arriving at each decode replica on its ``comm`` stream.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from ..report.gantt import plot_timeline
from ..result import RECORD_COLUMNS, SimResult
from .loop import ServeResult
from .metrics import kv_occupancy, request_table


def one_axis_figure(w: float = 7.0, h: float = 4.5) -> tuple[Figure, Any]:
    fig = Figure(figsize=(w, h), dpi=120)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def cdf_axis(ax: Any, curves: Sequence[tuple[np.ndarray, str | None]], slo_ms: float | None, xlabel: str) -> None:
    """Empirical CDFs of positive values on a log x axis, the SLO as a dashed line and the median, P90 and
    P99 as grey lines; a curve without a label is drawn in one colour."""
    drawn = False
    for values, label in curves:
        x = np.sort(values[~np.isnan(values)])
        x = x[x > 0]
        if len(x):
            ax.plot(x, np.arange(1, len(x) + 1) / len(x), label=label, color=None if label else "#1f77b4")
            drawn = True
    if drawn:
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
    if slo_ms is not None:
        ax.axvline(slo_ms, color="#d62728", linestyle="--", linewidth=1, label=f"SLO {slo_ms:g} ms")
    for q in (0.5, 0.9, 0.99):
        ax.axhline(q, color="#bbbbbb", linewidth=0.4)
    ax.set_xlabel(xlabel)
    ax.set_ylim(0, 1.01)
    ax.grid(linewidth=0.3, alpha=0.5)


#: Per column of the request table: the CDF levels, and the P10 and P90 of the latency at each level
#: over the draws of ``--uncertainty`` (a band around the point's curve).
Bands = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]


def latency_cdf(table: pd.DataFrame, path: Path, title: str, slo: tuple[float, float] | None = None,
                bands: Bands | None = None) -> None:
    """CDFs of TTFT, TPOT and E2E (ms, log x axis), with the SLOs as vertical lines, and where
    ``bands`` has a column, its P10-P90 band over the draws shaded behind the curve."""
    fig = Figure(figsize=(12, 4), dpi=120)
    FigureCanvasAgg(fig)
    for k, (col, label) in enumerate((("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E"))):
        ax = fig.add_subplot(1, 3, k + 1)
        limit = slo[k] if slo is not None and k < 2 else None
        if bands and col in bands:
            levels, lo, hi = bands[col]
            ax.fill_betweenx(levels, lo, hi, color="#1f77b4", alpha=0.2, linewidth=0, label="P10-P90 of the draws")
        cdf_axis(ax, [(table[col].to_numpy(dtype=float), None)], limit, f"{label} (ms)")
        if limit is not None or (bands and col in bands):
            ax.legend(fontsize=8, loc="lower right")
        if k == 0:
            ax.set_ylabel("share of requests")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, format="png")


def kv_plot(occ: pd.DataFrame, path: Path, title: str) -> None:
    """Share of each replica's KV blocks in use over time (at most 2,000 points per replica)."""
    fig, ax = one_axis_figure(9, 4)
    for (pool, rep), g in occ.groupby(["pool", "replica"], sort=True):
        step = max(1, len(g) // 2000)
        ax.plot(g["time_s"].to_numpy()[::step], g["share"].to_numpy()[::step], linewidth=0.7,
                label=f"{pool} {rep}")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("KV cache in use")
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.grid(linewidth=0.3, alpha=0.5)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, format="png")


def gantt_result(res: ServeResult, iterations: int, name: str, platform: str) -> SimResult | None:
    """The iterations (and transfers) in a window of ``iterations`` iterations from the middle of
    the run, as a :class:`SimResult` for the timeline drawer: one rank per replica."""
    if not res.iterations or iterations <= 0:
        return None
    it = sorted(res.iterations, key=lambda x: x[2])
    mid = max(0, len(it) // 2 - iterations // 2)
    window = it[mid:mid + iterations]
    t0, t1 = window[0][2], max(x[3] for x in window)
    stages = [p.stages for p in res.pools]
    base = np.cumsum([0] + [p.timer.replicas * k for p, k in zip(res.pools, stages, strict=True)])
    rows: list[tuple[Any, ...]] = []

    def kind(pf: int, dec: int) -> str:
        return "prefill" if pf and not dec else "decode" if dec and not pf else "mixed"

    for p, r, s, e, pf, dec in it:
        if e > t0 and s < t1 and stages[p] == 1:
            rows.append((int(base[p] + r), "compute", f"{res.pools[p].name}{r}: {pf} prompt tokens, {dec} decodes",
                         kind(pf, dec), "fwd", "kernel", max(s, t0) - t0, min(e, t1) - t0, 0, "timer"))
    for p, r, v, bounds, pf, dec in res.stage_spans:  # pipeline parallel: one row per stage
        for k in range(stages[p]):
            s, e = bounds[2 * k], bounds[2 * k + 1]
            if e > t0 and s < t1:
                rows.append((int(base[p] + r * stages[p] + k), "compute",
                             f"{res.pools[p].name}{r} stage {k}, engine {v}: {pf} prompt tokens, {dec} decodes",
                             kind(pf, dec), "fwd", "kernel", max(s, t0) - t0, min(e, t1) - t0, 0, "timer"))
    for d, s, e, nbytes in res.transfers:
        if e > t0 and s < t1:
            rows.append((int(base[1] + d * stages[1]), "comm", "kv transfer", "kv_transfer", "fwd", "collective",
                         max(s, t0) - t0, min(e, t1) - t0, nbytes, "network"))
    rec = pd.DataFrame(rows, columns=list(RECORD_COLUMNS))
    row = "row = replica" if max(stages) == 1 else "row = replica, or its stage under pipeline parallelism"
    links = pd.DataFrame(columns=["link", "link_kind", "capacity_gbytes_per_s", "nbytes", "busy_s"])
    return SimResult(rec, links, t1 - t0, len(rows),
                     meta={"workload": f"{name} (iterations {mid}-{mid + len(window)} from {t0:.3f} s; {row})",
                           "platform": platform})


def load_plot(sweep: pd.DataFrame, path: Path, title: str, *, unit: str, served: tuple[tuple[str, str], ...],
              latencies: tuple[tuple[str, str], ...], served_axis: str) -> None:
    """What is served (left) and latencies in ms (right, log scale) against the arrival rate of
    ``unit`` per second; a column of ``served`` that is all missing is left out."""
    fig = Figure(figsize=(11, 4), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 2, 1)
    for (col, label), marker in zip(served, "osd^", strict=False):
        if sweep[col].notna().any():
            ax.plot(sweep["rate_per_s"], sweep[col], marker=marker, label=label)
    ax2 = fig.add_subplot(1, 2, 2)
    for col, label in latencies:
        ax2.plot(sweep["rate_per_s"], sweep[col], marker="o", label=label)
    ax2.set_yscale("log")
    ax.set_ylabel(served_axis)
    ax2.set_ylabel("ms")
    for a in (ax, ax2):
        a.set_xlabel(f"arrival rate ({unit}/s)")
        a.grid(linewidth=0.3, alpha=0.5)
        a.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, format="png")


def throughput_plot(sweep: pd.DataFrame, path: Path, title: str) -> None:
    """Output tokens/s and P99 latencies against the arrival rate."""
    load_plot(sweep, path, title, unit="requests", served_axis="output tokens/s",
              served=(("output_tokens_per_s", "output tokens/s"), ("goodput_tokens_per_s", "within SLO")),
              latencies=(("ttft_p99_ms", "TTFT P99"), ("tpot_p99_ms", "TPOT P99"), ("e2e_mean_ms", "E2E mean")))


def write_outputs(res: ServeResult, summary: dict[str, Any], out: Path, *, slo: tuple[float, float],
                  gantt_iterations: int = 200, sweep: pd.DataFrame | None = None,
                  cdf_bands: Bands | None = None) -> dict[str, Path]:
    """Write every file of a serving run into ``out`` (``cdf_bands``: see :func:`latency_cdf`); returns
    them by name."""
    out.mkdir(parents=True, exist_ok=True)
    name = str(summary.get("name", "serving"))
    paths = {"requests": out / "requests.csv", "summary": out / "summary.json", "kv": out / "kv_occupancy.csv",
             "cdf": out / "latency_cdf.png", "kv_plot": out / "kv_occupancy.png"}
    table = request_table(res)
    table.to_csv(paths["requests"], index=False, float_format="%.4f")
    paths["summary"].write_text(json.dumps(summary, indent=2, default=str) + "\n")
    occ = kv_occupancy(res)
    occ.to_csv(paths["kv"], index=False, float_format="%.6g")
    latency_cdf(table, paths["cdf"], f"{name}: latency CDFs", slo, cdf_bands)
    kv_plot(occ, paths["kv_plot"], f"{name}: KV cache in use")
    g = gantt_result(res, gantt_iterations, name, str(summary.get("platform", "")))
    if g is not None:
        paths["timeline"] = out / "timeline.png"
        plot_timeline(g, paths["timeline"])
    if sweep is not None and len(sweep):
        paths["sweep"] = out / "sweep.csv"
        sweep.to_csv(paths["sweep"], index=False)
        paths["load"] = out / "throughput_vs_load.png"
        throughput_plot(sweep, paths["load"], f"{name}: throughput and latency against load")
    return paths
