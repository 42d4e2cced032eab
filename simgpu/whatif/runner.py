"""Running the variants of a study: in this process, on a local process pool, or on Dask.

Each variant is simulated independently and becomes one flat row (iteration time, throughput, MFU,
the compute / exposed communication / idle breakdown, memory, feasible or why not). A variant goes
to a Dask worker loaded (:attr:`simgpu.variant.StudyKind.load`: the files it reads, validated after
its overrides), so the workers read none of the study's files and may run on other machines. Rows are
appended to ``results.jsonl`` as they finish, each keyed by a hash of the job it simulated (the
resolved workload and platform after overrides, the kernel models' manifest and the simulator's
version), so a study that was interrupted resumes where it stopped and a rerun after the base
workload or the platform changed recomputes exactly the rows whose job changed. A variant that
fails is recorded with its error and the others go on. Ctrl-C stops the workers at once; every
row already written is whole.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pandas as pd

from ..config.loader import JobKind, job_kind
from ..errors import ConfigError, Interrupted, SimgpuError, SimulationError
from ..variant import Variant
from .study import Study, study_kind

ROW_KEYS = ("id", "key", "name", "status", "feasible", "why", "iteration_time_ms", "samples_per_s", "tokens_per_s",
            "samples", "mfu", "compute_ms", "communication_ms", "exposed_communication_ms", "idle_ms", "memory_gib",
            "gpus", "wall_s")


def interrupted(done: int, total: int, path: Path) -> Interrupted:
    return Interrupted(f"interrupted: {done} of {total} variants done and kept in {path}; run the same command "
                       "again to resume")


def run_variant(base: str, variant: Variant, kind: JobKind | None = None) -> dict[str, Any]:
    """Simulate one variant of the base file (of ``kind``, else read from the file); never raises:
    failures become rows with ``status`` and ``why``."""
    return study_kind(kind or job_kind(base)).run_variant(base, variant)


def _quiet_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


def _run_one(args: tuple[str, Variant, JobKind]) -> dict[str, Any]:
    return run_variant(*args)


def _pool(base: str, kind: JobKind, todo: list[Variant], workers: int) -> Iterator[dict[str, Any]]:
    if workers <= 1 or len(todo) <= 1:
        for v in todo:
            yield run_variant(base, v, kind)
        return
    import multiprocessing as mp

    pool = mp.get_context().Pool(min(workers, len(todo)), initializer=_quiet_worker)
    try:
        yield from pool.imap_unordered(_run_one, [(base, v, kind) for v in todo])
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


_INSTALLATION: dict[str, str] = {}


def installation() -> str:
    """A digest of what a worker times variants with: the simulator's version and every shipped
    kernel model's manifest (computed once a process)."""
    if not _INSTALLATION:
        import hashlib

        from ..kernels import store
        from ..version import __version__

        h = hashlib.sha256(__version__.encode())
        for m in sorted(store.platforms_root().glob("*/models/manifest.json")):
            h.update(m.parent.parent.name.encode())
            h.update(m.read_bytes())
        _INSTALLATION["digest"] = h.hexdigest()[:16]
    return _INSTALLATION["digest"]


def run_on_worker(run: Callable[[Any, Variant], dict[str, Any]], loaded: Any, variant: Variant,
                  digest: str) -> dict[str, Any]:
    """``run(loaded, variant)`` on a Dask worker whose installation is the study's (``digest``); on
    another one, the variant's row says so instead of timing it with other kernel models."""
    mine = installation()
    if mine != digest:
        from ..version import __version__

        return {"id": variant.id, "name": variant.name, **dict(variant.swept), "status": "invalid", "feasible": False,
                "why": f"this Dask worker's simgpu (version {__version__}, kernel models {mine}) is not the study's "
                       f"(kernel models {digest}); expected the same simgpu installation on every worker",
                "wall_s": 0.0}
    return run(loaded, variant)


def _dask(base: str, kind: JobKind, todo: list[Variant], address: str) -> Iterator[dict[str, Any]]:
    from distributed import Client
    from distributed import as_completed as dask_completed

    how = study_kind(kind)
    with Client(address, timeout="10s") as client:
        loaded = []
        for v in todo:  # each variant loaded here and sent whole: the workers read none of the study's files
            try:
                loaded.append((how.load(base, v), v))
            except (SimgpuError, ValueError, KeyError):
                yield run_variant(base, v, kind)  # its row says why, as a worker's would
        digest = installation()  # the workers check theirs against it: the same kernel models time every variant
        futures = client.map(run_on_worker, [how.run_loaded] * len(loaded), [x for x, _ in loaded],
                             [v for _, v in loaded], [digest] * len(loaded), pure=False)
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
    base = str(Path(study.base).resolve())  # absolute: a worker's working folder is its own
    keys = {v.id: study_kind(study.kind).job_key(base, v) for v in study.variants}
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
    rows: Iterable[dict[str, Any]] = (_dask(base, study.kind, todo, scheduler) if scheduler
                                     else _pool(base, study.kind, todo, workers))
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
    _stop_on_a_common_failure([done[v.id] for v in todo], path)
    return [done[v.id] for v in study.variants]


def _stop_on_a_common_failure(computed: list[dict[str, Any]], path: Path) -> None:
    """Refuse a study whose variants all failed with the very same message: a reason that is not any
    variant's own (a base that does not load, a trace that does not read). Their rows are
    taken out of ``results.jsonl`` so that a rerun computes them again."""
    whys = {str(r.get("why")) for r in computed}
    if len(computed) < 2 or any(r.get("feasible") for r in computed) or len(whys) != 1:
        return
    keys = {r["key"] for r in computed}
    kept = [r for r in load_rows(path) if r.get("key") not in keys]
    path.write_text("".join(json.dumps(r, default=str) + "\n" for r in kept), encoding="utf-8")
    why = whys.pop()
    raise SimulationError(f"all {len(computed)} variants failed for the same reason, none of them its own: {why}")


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


def finish_table(rows: list[dict[str, Any]], swept: list[str]) -> pd.DataFrame:
    table = pd.DataFrame(rows)
    for col in ROW_KEYS:
        if col not in table:
            table[col] = None
    table["feasible"] = table["feasible"].fillna(False).astype(bool)
    known = ["name", *swept, *[c for c in ROW_KEYS if c != "name" and c not in swept]]
    return table[known + [c for c in table.columns if c not in known]]  # serving rows' own columns last
