"""Writing a run's output folder: ``summary.json``, ``timeline.png``, ``trace.json`` and the records.

This module owns the file layout and the file formats; the numbers come from
:mod:`simgpu.report.summary`, the picture from :mod:`simgpu.report.gantt`, the trace from
:mod:`simgpu.report.chrome_trace`. Records are written with times in microseconds (``start_us``,
``end_us``, ``dur_us``), sorted by rank, stream (cpu, compute, comm, copy, then others by name) and
start.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from os import PathLike
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from simgpu.report.chrome_trace import US_DECIMALS, stream_tids, write_chrome_trace
from simgpu.report.gantt import plot_timeline
from simgpu.report.summary import summarize

from ..errors import ConfigError
from ..result import SimResult

RecordsFormat = Literal["csv", "parquet", "none"]
RECORDS_FORMATS: tuple[str, ...] = ("csv", "parquet", "none")


def summary_json(summary: dict[str, Any]) -> str:
    """The text of ``summary.json``: indented, key order kept, no NaN, newline-terminated."""
    return json.dumps(summary, indent=2, allow_nan=False, ensure_ascii=False) + "\n"


def records_table(result: SimResult) -> pd.DataFrame:
    """The records as written: times in microseconds (rounded to ns), sorted by rank, stream and start.

    ``start_s`` / ``end_s`` are replaced by ``start_us`` / ``end_us``; ``dur_us`` is added.
    """
    rec = result.records
    out = rec.drop(columns=["start_s", "end_s"])
    start_us = np.round(rec["start_s"].to_numpy(dtype=np.float64) * 1e6, US_DECIMALS)
    end_us = np.round(rec["end_s"].to_numpy(dtype=np.float64) * 1e6, US_DECIMALS)
    cols = list(out.columns)
    at = cols.index("kind") + 1 if "kind" in cols else len(cols)
    out.insert(at, "start_us", start_us)
    out.insert(at + 1, "end_us", end_us)
    out.insert(at + 2, "dur_us", np.round(end_us - start_us, US_DECIMALS))
    if len(out):
        streams = out["stream"].astype(str)
        tids = stream_tids(sorted(set(streams)))
        order = np.lexsort((start_us, streams.map(tids).to_numpy(dtype=np.int64), out["rank"].to_numpy()))
        out = out.iloc[order]
    return out.reset_index(drop=True)


def write_outputs(
    result: SimResult,
    out_dir: str | PathLike[str],
    *,
    links: bool = False,
    records_format: RecordsFormat = "csv",
    trace: bool = True,
    window_s: tuple[float, float] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """Write the outputs of ``result`` into ``out_dir`` (created if missing).

    Returns the written paths under the keys ``summary``, ``timeline``, ``trace`` and ``records``
    (those written). ``links`` adds the busiest links to the timeline (the trace includes link
    records whenever the result has them); ``records_format`` is ``"csv"``, ``"parquet"`` or
    ``"none"``; ``trace`` False writes no trace; ``window_s`` (start, end) keeps only the intervals
    that overlap it in the trace and the records (the summary and the timeline cover the whole
    iteration). ``progress`` is told which file is being written.
    """
    if records_format not in RECORDS_FORMATS:
        valid = ", ".join(RECORDS_FORMATS)
        raise ValueError(f"records_format must be one of {valid}, got {records_format!r}")
    if window_s is not None and (trace or records_format != "none"):
        check_window(result, *window_s)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda _: None)
    paths = {"summary": out / "summary.json", "timeline": out / "timeline.png"}
    with _whole(paths["summary"]) as tmp:
        tmp.write_text(summary_json(summarize(result)), encoding="utf-8")
    say("drawing timeline.png")
    with _whole(paths["timeline"]) as tmp:
        plot_timeline(result, tmp, show_links=links)
    part = result if window_s is None else windowed(result, *window_s)
    if trace:
        paths["trace"] = out / "trace.json"
        say("writing trace.json")
        with _whole(paths["trace"]) as tmp:
            write_chrome_trace(part, tmp)
    if records_format != "none":
        paths["records"] = out / f"records.{records_format}"
        say(f"writing {paths['records'].name}")
        table = records_table(part)
        with _whole(paths["records"]) as tmp:
            if records_format == "parquet":
                table.to_parquet(tmp, index=False)
            else:
                table.to_csv(tmp, index=False)
    return paths


@contextmanager
def _whole(path: Path) -> Iterator[Path]:
    """A temporary name to write ``path`` under, renamed to it once written: an interrupted run
    leaves no file half-written (the older one, if any, stays as it was)."""
    tmp = path.with_name(f".{path.name}.part")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def check_window(result: SimResult, start_s: float, end_s: float, option: str = "--trace-window") -> None:
    """Refuse a window that no interval of ``result`` overlaps (it would write an empty trace)."""
    frames = [df for df in (result.records, result.link_records) if df is not None and len(df)]
    first = min((float(df["start_s"].min()) for df in frames), default=0.0)
    last = max((float(df["end_s"].max()) for df in frames), default=0.0)
    if not frames or start_s > last or end_s < first:
        raise ConfigError(f"{start_s * 1e3:g}:{end_s * 1e3:g} ms holds none of the simulated intervals, which span "
                          f"{first * 1e3:.3f} to {last * 1e3:.3f} ms; expected a window inside that span",
                          key=option)


def windowed(result: SimResult, start_s: float, end_s: float) -> SimResult:
    """``result`` with only the intervals that overlap [start_s, end_s]."""
    def keep(df: pd.DataFrame) -> pd.DataFrame:
        return df[(df["end_s"] >= start_s) & (df["start_s"] <= end_s)].reset_index(drop=True)

    links = result.link_records
    return replace(result, records=keep(result.records), link_records=None if links is None else keep(links))
