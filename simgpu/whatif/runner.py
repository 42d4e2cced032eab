"""Running the variants of a study: in this process, on a local process pool, or on Dask.

Each variant is simulated independently and becomes one flat row (iteration time, throughput, MFU,
the compute / exposed communication / idle breakdown, memory, feasible or why not). Rows are
appended to ``results.jsonl`` as they finish, so a study that was interrupted resumes where it
stopped; a variant that fails is recorded with its error and the others go on.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from ..errors import ConfigError, SimgpuError
from .study import Study, Variant

ROW_KEYS = ("id", "name", "status", "feasible", "why", "iteration_time_ms", "samples_per_s", "tokens_per_s",
            "mfu", "compute_ms", "communication_ms", "exposed_communication_ms", "idle_ms", "memory_gib",
            "gpus", "wall_s")


def run_variant(base: str, variant: Variant) -> dict[str, Any]:
    """Simulate one variant; never raises: failures become rows with ``status`` and ``why``."""
    from ..config.loader import load_job
    from ..report import summarize
    from ..sim import simulate

    t0 = time.perf_counter()
    row: dict[str, Any] = {"id": variant.id, "name": variant.name}
    row.update({k: v for k, v in variant.swept})
    try:
        summary = summarize(simulate(load_job(base, variant.as_args())))
    except ConfigError as e:
        infeasible = "does not fit" in e.message
        row.update(status="infeasible" if infeasible else "invalid", feasible=False, why=str(e))
    except (SimgpuError, ValueError, KeyError) as e:
        row.update(status="error", feasible=False, why=f"{type(e).__name__}: {e}")
    else:
        b = summary["breakdown_ms"]
        mem = summary.get("memory_gib") or {}
        row.update(status="ok", feasible=True, why="", iteration_time_ms=summary["iteration_time_ms"],
                   samples_per_s=summary["throughput"].get("samples_per_s"),
                   tokens_per_s=summary["throughput"].get("tokens_per_s"), mfu=summary.get("mfu"),
                   compute_ms=b["compute"], communication_ms=b["communication"],
                   exposed_communication_ms=b["exposed_communication"], idle_ms=b["idle"],
                   memory_gib=mem.get("total") if isinstance(mem, dict) else None,
                   gpus=summary["gpus"])
    row["wall_s"] = round(time.perf_counter() - t0, 3)
    return row


def _pool(base: str, todo: list[Variant], workers: int) -> Iterator[dict[str, Any]]:
    if workers <= 1:
        for v in todo:
            yield run_variant(base, v)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_variant, base, v) for v in todo]
        for f in as_completed(futures):
            yield f.result()


def _dask(base: str, todo: list[Variant], address: str) -> Iterator[dict[str, Any]]:
    from distributed import Client
    from distributed import as_completed as dask_completed

    with Client(address) as client:
        futures = client.map(run_variant, [base] * len(todo), todo, pure=False)
        for f in dask_completed(futures):
            yield f.result()


def load_rows(path: Path) -> list[dict[str, Any]]:
    """Rows already written (a truncated last line, from an interrupted study, is ignored)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def run_study(study: Study, out: Path, *, workers: int | None = None, scheduler: str | None = None,
              progress: Callable[[int, int, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Simulate every variant not yet in ``out/results.jsonl``; return all rows in study order."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.jsonl"
    done = {r["id"]: r for r in load_rows(path)}
    todo = [v for v in study.variants if v.id not in done]
    workers = workers if workers is not None else max(1, min(len(todo), os.cpu_count() or 1))
    rows: Iterable[dict[str, Any]] = (_dask(str(study.base), todo, scheduler) if scheduler
                                      else _pool(str(study.base), todo, workers))
    with path.open("a") as f:
        for i, row in enumerate(rows, 1):
            f.write(json.dumps(row, default=str) + "\n")
            f.flush()
            done[row["id"]] = row
            if progress:
                progress(i, len(todo), row)
    return [done[v.id] for v in study.variants]


def text_progress(i: int, n: int, row: dict[str, Any]) -> None:
    """A one-line progress bar on stderr."""
    width = 30
    filled = int(width * i / max(n, 1))
    t = row.get("iteration_time_ms")
    tail = f"{t:.2f} ms" if isinstance(t, int | float) else row.get("status", "")
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {i}/{n} {row['name'][:40]:40} {tail:>14}")
    if i == n:
        sys.stderr.write("\n")
    sys.stderr.flush()
