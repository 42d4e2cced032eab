"""DLRM serving in what-if studies and searches: a study whose ``base`` is a DLRM serving file.

A variant's overrides are keys of the DLRM serving file (``batcher.max_batch_samples``,
``batcher.max_queue_delay_us``, ``queries.rate_per_s``, the workload's keys through
``deployment.set``: ``deployment.set.gpus_per_node``, ``deployment.set.platform.gpu.hbm_gbytes_per_s``).
Each variant becomes one row: latency P50 / P99, queries/s, samples/s in all and per GPU, goodput,
the deployment's busy share, and whether P99 is within ``slo.latency_ms`` (``feasible``; without an
SLO every variant that serves is). :func:`candidates` is the space ``simgpu search serving`` ranks
for a DLRM: the GPUs the tables are sharded over, the batcher's batch limit and its delay.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..errors import ConfigError, SimgpuError
from ..variant import StudyKind, Variant

if TYPE_CHECKING:
    from ..config.loader import Job
    from .dlrm import DlrmServing

#: Columns of a DLRM serving row, after the study's own (id, name, status, feasible, why).
ROW_KEYS = ("latency_p50_ms", "latency_p99_ms", "queries_per_s", "samples_per_s", "samples_per_s_per_gpu",
            "goodput_queries_per_s", "busy_share", "gpus", "deployment", "wall_s")


def check_overrides(base: Path, overrides: Sequence[tuple[str, Any]], file: str) -> None:
    """Each override applied alone to the DLRM serving file must be a key of it with a value of its kind."""
    from .dlrm import load_dlrm_serving

    for key, value in overrides:
        try:
            load_dlrm_serving(base, Variant("one", ((key, value),)).as_args())
        except ConfigError as e:
            raise ConfigError(f"{json.dumps(value, default=str)}: {e.message}", file=file, key=key) from None


def job_key(base: str | Path, variant: Variant) -> str:
    """A hash of what ``variant`` simulates: the serving file after overrides and its workload's job."""
    from ..config.loader import load_job
    from ..version import __version__
    from .deploy import overrides_of
    from .dlrm import load_dlrm_serving

    parts: dict[str, Any] = {"simgpu": __version__, "serve": "dlrm"}
    try:
        serving = load_dlrm_serving(base, variant.as_args())
        parts["serving"] = serving.spec.model_dump(mode="json")
        job = load_job(serving.workload_path(), overrides_of(serving.spec.deployment))
        parts["job"] = [job.workload.model_dump(mode="json"), job.platform.model_dump(mode="json")]
    except ConfigError as e:
        parts.update(base=Path(base).read_bytes().hex(), overrides=variant.as_args(), error=str(e))
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load(base: str, variant: Variant) -> tuple[DlrmServing, Job]:
    """All that ``variant`` reads from files: the DLRM serving file after its overrides and its
    deployment's job (workload and platform validated)."""
    from .dlrm import dlrm_job, load_dlrm_serving

    serving = load_dlrm_serving(base, variant.as_args())
    return serving, dlrm_job(serving)


def run_variant(base: str, variant: Variant) -> dict[str, Any]:
    """Serve one variant; never raises: failures become rows with ``status`` and ``why``."""
    return _row(variant, lambda: load(base, variant))


def run_loaded(loaded: tuple[DlrmServing, Job], variant: Variant) -> dict[str, Any]:
    """:func:`run_variant` of a variant already loaded where the study was read: a worker on another
    machine gets the validated serving file and job, and reads no file of the study (only its own
    installation's kernel models)."""
    return _row(variant, lambda: loaded)


def _row(variant: Variant, loaded: Callable[[], tuple[DlrmServing, Job]]) -> dict[str, Any]:
    from .dlrm import build_dlrm, serve_dlrm
    from .study import failure

    t0 = time.perf_counter()
    row: dict[str, Any] = {"id": variant.id, "name": variant.name, **dict(variant.swept)}
    try:
        serving, job = loaded()
        _, s = serve_dlrm(serving, build_dlrm(serving, job=job))
    except (SimgpuError, ValueError, KeyError) as e:
        row.update(failure(e))
    else:
        th, g, lat = s["throughput"], s["goodput"], s["latency_ms"]
        ok = g is None or bool(g["p99_meets_slo"])
        row.update(status="ok" if ok else "slo", feasible=ok,
                   why="" if ok else f"P99 latency {lat['p99']:.2f} ms misses the SLO ({g['slo_latency_ms']:g} ms)",
                   latency_p50_ms=lat["p50"], latency_p99_ms=lat["p99"], queries_per_s=th["queries_per_s"],
                   samples_per_s=th["samples_per_s"], samples_per_s_per_gpu=th["samples_per_s_per_gpu"],
                   goodput_queries_per_s=None if g is None else g["queries_per_s"], busy_share=s["busy_share"],
                   gpus=s["gpus"], deployment=s["deployment"])
    row["wall_s"] = round(time.perf_counter() - t0, 3)
    return row


def ranking(table: pd.DataFrame, limit: int = 20) -> str:
    """Variants meeting the SLO ranked by samples/s per GPU, then those that do not."""
    ok = table[table["feasible"]]
    if len(ok):
        ok = ok.sort_values("samples_per_s_per_gpu", ascending=False)
    lines = ["ranked by samples/s per GPU among the variants whose P99 latency meets the SLO",
             f"{'rank':>4}  {'variant':44} {'GPUs':>5} {'samples/s/GPU':>14} {'samples/s':>12} {'P50 ms':>8} "
             f"{'P99 ms':>8} {'busy':>6}"]
    for i, r in enumerate(ok.head(limit).itertuples(), 1):
        lines.append(f"{i:>4}  {str(r.name)[:44]:44} {int(r.gpus):>5} {r.samples_per_s_per_gpu:14,.0f} "
                     f"{r.samples_per_s:12,.0f} {r.latency_p50_ms:8.3f} {r.latency_p99_ms:8.3f} {r.busy_share:6.1%}")
    from .study import unranked_lines

    return "\n".join(lines + unranked_lines(table, len(ok), limit))


def candidates(base: str, overrides: Sequence[str] = (), *, gpus: Sequence[int] | None = None,
               max_batch: Sequence[int] | None = None, delay_us: Sequence[float] | None = None
               ) -> tuple[list[Variant], list[dict[str, Any]]]:
    """The DLRM serving configurations to rank (GPUs per node on one node, the batcher's
    ``max_batch_samples`` and ``max_queue_delay_us``), and those pruned before any runs (with why)."""
    from ..config.checks import gpus_per_node
    from ..config.loader import load_job, parse_override
    from .deploy import overrides_of
    from .dlrm import load_dlrm_serving

    serving = load_dlrm_serving(base, list(overrides))
    spec = serving.spec
    job = load_job(serving.workload_path(), overrides_of(spec.deployment))
    gpn, node = gpus_per_node(job), job.platform.node.gpus
    counts = list(gpus) if gpus else [g for g in (1, 2, 4, 8) if g <= node] or [gpn]
    batches = list(max_batch) if max_batch else [spec.batcher.max_batch_samples]
    delays = list(delay_us) if delay_us else [spec.batcher.max_queue_delay_us]
    s = spec.queries.samples
    most = s if isinstance(s, int) else s.max
    common = tuple(parse_override(o) for o in overrides)
    keep: list[Variant] = []
    pruned: list[dict[str, Any]] = []
    for g, b, d in itertools.product(counts, batches, delays):
        name = f"{g} GPUs batch{b} delay{d:g}us"
        swept: tuple[tuple[str, Any], ...] = (("gpus", g), ("max_batch_samples", b), ("max_queue_delay_us", d))
        if g > node:
            pruned.append({"name": name, **dict(swept), "status": "invalid", "feasible": False,
                           "why": f"--gpus: expected at most the {node} GPUs of a node"})
            continue
        if b < most:
            pruned.append({"name": name, **dict(swept), "status": "invalid", "feasible": False,
                           "why": f"a query of up to {most} samples never fits a batch of {b}; expected "
                                  f"--max-batch >= {most}"})
            continue
        over = ((("deployment.set.nodes", 1), ("deployment.set.gpus_per_node", g),
                 ("batcher.max_batch_samples", b), ("batcher.max_queue_delay_us", d)))
        keep.append(Variant(name, common + over, swept))
    return keep, pruned


def write_top(serving: str, variants: list[Variant], table: pd.DataFrame, out: Path, k: int) -> list[Path]:
    """Serve the k best (most samples/s per GPU within the SLO) again and write their files."""
    from .dlrm import build_dlrm, load_dlrm_serving, serve_dlrm, write_dlrm_outputs

    by_id = {v.id: v for v in variants}
    best = table[table["feasible"]].sort_values("samples_per_s_per_gpu", ascending=False).head(k)
    dirs = []
    for i, row in enumerate(best.itertuples(), 1):
        s = load_dlrm_serving(serving, by_id[str(row.id)].as_args())
        res, summary = serve_dlrm(s, build_dlrm(s))
        d = out / f"top{i}"
        write_dlrm_outputs(res, summary, d)
        dirs.append(d)
    return dirs


#: DLRM serving files in studies.
KIND = StudyKind(job_key, run_variant, ranking, load, run_loaded, check_overrides)
