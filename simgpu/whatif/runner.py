"""Running the variants of a study: in this process, on a local process pool, or on Dask.

Each variant is simulated independently and becomes one flat row (iteration time, throughput, MFU,
the compute / exposed communication / idle breakdown, memory, feasible or why not). Rows are
appended to ``results.jsonl`` as they finish, each keyed by a hash of the job it simulated (the
resolved workload and platform after overrides, the kernel models' manifest and the simulator's
version), so a study that was interrupted resumes where it stopped and a rerun after the base
workload or the platform changed recomputes exactly the rows whose job changed. A variant that
fails is recorded with its error and the others go on. Ctrl-C stops the workers at once; every
row already written is whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ..errors import ConfigError, Interrupted, SimgpuError
from .study import Study, Variant

ROW_KEYS = ("id", "key", "name", "status", "feasible", "why", "iteration_time_ms", "samples_per_s", "tokens_per_s",
            "samples", "mfu", "compute_ms", "communication_ms", "exposed_communication_ms", "idle_ms", "memory_gib",
            "gpus", "wall_s")


def interrupted(done: int, total: int, path: Path) -> Interrupted:
    return Interrupted(f"interrupted: {done} of {total} variants done and kept in {path}; run the same command "
                       "again to resume")


def job_key(base: str | Path, variant: Variant) -> str:
    """A hash of the job ``variant`` simulates: the validated workload and platform after its overrides,
    the platform's kernel-model manifest and the simulator's version; for a variant that does not
    load, of the files' text, its overrides and the error."""
    from ..config.loader import load_job
    from ..serve.study import is_serving
    from ..version import __version__

    if is_serving(base):
        from ..serve.study import job_key as serving_key

        return serving_key(base, variant)
    parts: dict[str, Any] = {"simgpu": __version__}
    try:
        job = load_job(base, variant.as_args())
    except ConfigError as e:
        parts.update(base=Path(base).read_bytes().hex(), overrides=variant.as_args(), error=str(e))
    else:
        parts.update(workload=job.workload.model_dump(mode="json"), platform=job.platform.model_dump(mode="json"))
        parts["models"] = [hashlib.sha256(m.read_bytes()).hexdigest() for m in _model_manifests(job)]
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _model_manifests(job: Any) -> list[Path]:
    """The manifests of the kernel models that time ``job``: its platform file's own, those its GPU's
    ``kernel_models`` names, and the models fitted across GPUs."""
    from ..kernels import store
    from ..kernels.learned import TRANSFER

    folders = [Path(job.platform_file).with_suffix("")]
    if job.platform.gpu.kernel_models:
        folders.append(store.platforms_root() / job.platform.gpu.kernel_models)
    folders.append(store.platforms_root() / TRANSFER)
    return [m for f in folders if (m := f / "models" / store.MANIFEST).is_file()]


def run_variant(base: str, variant: Variant) -> dict[str, Any]:
    """Simulate one variant; never raises: failures become rows with ``status`` and ``why``."""
    from ..config.loader import load_job
    from ..report import summarize
    from ..serve.study import is_serving
    from ..sim import simulate

    if is_serving(base):
        from ..serve.study import run_variant as serve_variant

        return serve_variant(base, variant)
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
        sps = summary["throughput"].get("samples_per_s")
        row.update(status="ok", feasible=True, why="", iteration_time_ms=summary["iteration_time_ms"],
                   samples_per_s=sps, tokens_per_s=summary["throughput"].get("tokens_per_s"),
                   samples=round(sps * summary["iteration_time_ms"] / 1e3) if sps else None, mfu=summary.get("mfu"),
                   compute_ms=b["compute"], communication_ms=b["communication"],
                   exposed_communication_ms=b["exposed_communication"], idle_ms=b["idle"],
                   memory_gib=mem.get("total") if isinstance(mem, dict) else None,
                   gpus=summary["gpus"])
    row["wall_s"] = round(time.perf_counter() - t0, 3)
    return row


def _quiet_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


def _run_one(args: tuple[str, Variant]) -> dict[str, Any]:
    return run_variant(*args)


def _pool(base: str, todo: list[Variant], workers: int) -> Iterator[dict[str, Any]]:
    if workers <= 1 or len(todo) <= 1:
        for v in todo:
            yield run_variant(base, v)
        return
    import multiprocessing as mp

    pool = mp.get_context().Pool(min(workers, len(todo)), initializer=_quiet_worker)
    try:
        yield from pool.imap_unordered(_run_one, [(base, v) for v in todo])
        pool.close()
    finally:
        pool.terminate()  # at once: on Ctrl-C no worker goes on computing
        pool.join()


def check_scheduler(address: str, timeout_s: float = 3.0) -> None:
    """Fail fast when no Dask scheduler answers at ``address`` (``tcp://host:port``)."""
    url = urlparse(address if "://" in address else f"tcp://{address}")
    if url.hostname is None or url.port is None:
        raise ConfigError(f"expected a Dask scheduler address such as tcp://127.0.0.1:8786, got {address!r}",
                          key="--scheduler")
    try:
        socket.create_connection((url.hostname, url.port), timeout=timeout_s).close()
    except OSError as e:
        raise ConfigError(f"no Dask scheduler answers at {address} ({e.strerror or e}); expected a running "
                          "scheduler (dask scheduler) or no --scheduler to run locally", key="--scheduler") from None


def _dask(base: str, todo: list[Variant], address: str) -> Iterator[dict[str, Any]]:
    from distributed import Client
    from distributed import as_completed as dask_completed

    with Client(address, timeout="10s") as client:
        futures = client.map(run_variant, [base] * len(todo), todo, pure=False)
        try:
            for f in dask_completed(futures):
                yield f.result()
        finally:
            client.cancel(futures)


def load_rows(path: Path) -> list[dict[str, Any]]:
    """Rows already written (a truncated last line, from an interrupted study, is ignored)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def run_study(study: Study, out: Path, *, workers: int | None = None, scheduler: str | None = None,
              progress: Callable[[int, int, dict[str, Any]], None] | None = None,
              stats: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """Simulate every variant whose job is not yet in ``out/results.jsonl``; return all rows in study
    order. ``stats`` (if given) receives how many rows were ``reused`` and ``computed``. Ctrl-C
    raises :class:`Interrupted` after stopping the workers."""
    if workers is not None and workers < 1:
        raise ConfigError(f"expected --workers >= 1, got {workers}", key="--workers")
    if scheduler:
        check_scheduler(scheduler)
    base = str(study.base)
    keys = {v.id: job_key(base, v) for v in study.variants}
    path = out / "results.jsonl"
    old = {r["key"]: r for r in load_rows(path) if "key" in r}
    done: dict[str, dict[str, Any]] = {}
    for v in study.variants:
        if keys[v.id] in old:
            done[v.id] = {**old[keys[v.id]], "id": v.id, "name": v.name, **dict(v.swept)}
    todo = [v for v in study.variants if v.id not in done]
    if stats is not None:
        stats.update(reused=len(done), computed=len(todo))
    workers = workers if workers is not None else max(1, min(len(todo), os.cpu_count() or 1))
    rows: Iterable[dict[str, Any]] = (_dask(base, todo, scheduler) if scheduler else _pool(base, todo, workers))
    out.mkdir(parents=True, exist_ok=True)
    try:
        with path.open("a", encoding="utf-8") as f:
            for i, row in enumerate(rows, 1):
                row["key"] = keys[row["id"]]
                f.write(json.dumps(row, default=str) + "\n")
                f.flush()
                done[row["id"]] = row
                if progress:
                    progress(i, len(todo), row)
    except KeyboardInterrupt:
        raise interrupted(len(done), len(study.variants), path) from None
    return [done[v.id] for v in study.variants]


def text_progress(i: int, n: int, row: dict[str, Any]) -> None:
    """A one-line progress bar on stderr, drawn only on a terminal (no ``\\r`` into logs)."""
    if not sys.stderr.isatty():
        return
    width = 30
    filled = int(width * i / max(n, 1))
    t = row.get("iteration_time_ms")
    tail = f"{t:.2f} ms" if isinstance(t, int | float) else row.get("status", "")
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {i}/{n} {row['name'][:40]:40} {tail:>14}")
    if i == n:
        sys.stderr.write("\n")
    sys.stderr.flush()
