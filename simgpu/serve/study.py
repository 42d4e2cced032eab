"""Serving in what-if studies and searches: a study whose ``base`` is a serving file.

A variant's overrides are keys of the serving file (``scheduler.max_batch``, ``requests.rate_per_s``,
a pool's workload keys through ``deployment.set.parallelism.tp`` or a platform key through
``deployment.set.platform.network.nic_gbps``). Each variant becomes one row: TTFT / TPOT / E2E P99,
output tokens/s (in all and per GPU), goodput, and whether P99 meets the SLOs (``feasible``).
:func:`candidates` is the space ``simgpu search serving`` ranks: tensor / pipeline parallel degree,
replicas, batch limits, chunk size and, disaggregated, how the nodes split between the pools.
A DLRM serving file (its deployment a ``dlrm_inference`` workload) is a kind of its own
(:mod:`simgpu.serve.dlrm_study`), whose rows rank by samples/s per GPU under a latency SLO; both
kinds plug into the what-if studies through :data:`simgpu.serve.studies.KINDS`.
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
    from .deploy import Loaded

#: Columns of a serving row, after the study's own (id, name, status, feasible, why).
ROW_KEYS = ("ttft_p99_ms", "tpot_p99_ms", "e2e_p99_ms", "output_tokens_per_s", "output_tokens_per_s_per_gpu",
            "goodput_requests_per_s", "slo_attained", "preemptions", "gpus", "deployment", "wall_s")


def check_overrides(base: Path, overrides: Sequence[tuple[str, Any]], file: str) -> None:
    """Each override applied alone to the serving file must be a key of it with a value of its kind."""
    from .spec import load_serving

    for key, value in overrides:
        try:
            load_serving(base, Variant("one", ((key, value),)).as_args())
        except ConfigError as e:
            raise ConfigError(f"{json.dumps(value, default=str)}: {e.message}", file=file, key=key) from None


def job_key(base: str | Path, variant: Variant) -> str:
    """A hash of what ``variant`` simulates: the serving file after overrides and its pools' jobs."""
    from ..version import __version__
    from .deploy import pool_job
    from .spec import load_serving

    parts: dict[str, Any] = {"simgpu": __version__, "serve": True}
    try:
        serving = load_serving(base, variant.as_args())
        parts["serving"] = serving.spec.model_dump(mode="json")
        pools = ["prefill", "decode"] if serving.spec.disaggregated else ["deployment"]
        for pool in pools:
            job = pool_job(serving, pool)
            parts[pool] = [job.workload.model_dump(mode="json"), job.platform.model_dump(mode="json")]
        r = serving.spec.requests
        if r.kind == "trace" and r.file:
            trace = serving.resolve(r.file)
            parts["trace"] = [str(trace), trace.stat().st_size if trace.is_file() else None]
    except ConfigError as e:
        parts.update(base=Path(base).read_bytes().hex(), overrides=variant.as_args(), error=str(e))
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def failure(e: Exception) -> dict[str, Any]:
    """A variant that could not be served, as a row's status, feasibility and why: infeasible where
    the configuration does not fit or never meets its limits, invalid for other bad configurations,
    error for the rest."""
    if isinstance(e, ConfigError):
        infeasible = "does not fit" in e.message or "never" in e.message
        return {"status": "infeasible" if infeasible else "invalid", "feasible": False, "why": str(e)}
    return {"status": "error", "feasible": False, "why": f"{type(e).__name__}: {e}"}


def load(base: str, variant: Variant) -> Loaded:
    """All that ``variant`` reads from files (:class:`simgpu.serve.deploy.Loaded`): the serving file
    after its overrides, its pools' jobs and its trace's requests."""
    from .deploy import load as load_deployment
    from .spec import load_serving

    return load_deployment(load_serving(base, variant.as_args()))


def run_variant(base: str, variant: Variant) -> dict[str, Any]:
    """Serve one variant; never raises: failures become rows with ``status`` and ``why``."""
    return _row(variant, lambda: load(base, variant))


def run_loaded(loaded: Loaded, variant: Variant) -> dict[str, Any]:
    """:func:`run_variant` of a variant already loaded where the study was read: a worker on another
    machine gets the validated serving file, its pools' jobs and its trace's requests, and reads no
    file of the study (only its own installation's kernel models)."""
    return _row(variant, lambda: loaded)


def _row(variant: Variant, loaded: Callable[[], Loaded]) -> dict[str, Any]:
    from .deploy import serve_loaded

    t0 = time.perf_counter()
    row: dict[str, Any] = {"id": variant.id, "name": variant.name, **dict(variant.swept)}
    try:
        _, s = serve_loaded(loaded())
    except (SimgpuError, ValueError, KeyError) as e:
        row.update(failure(e))
    else:
        th, g = s["throughput"], s["goodput"]
        ok = bool(g["p99_meets_slo"])
        row.update(status="ok" if ok else "slo", feasible=ok,
                   why="" if ok else f"P99 TTFT {s['ttft_ms']['p99']:.0f} ms / TPOT {s['tpot_ms']['p99'] or 0:.0f} ms "
                                     f"misses the SLO ({g['slo_ttft_ms']:g} / {g['slo_tpot_ms']:g} ms)",
                   ttft_p99_ms=s["ttft_ms"]["p99"], tpot_p99_ms=s["tpot_ms"]["p99"], e2e_p99_ms=s["e2e_ms"]["p99"],
                   output_tokens_per_s=th["output_tokens_per_s"],
                   output_tokens_per_s_per_gpu=th["output_tokens_per_s_per_gpu"],
                   goodput_requests_per_s=g["requests_per_s"], slo_attained=g["attained"],
                   preemptions=s["kv_cache"]["preemptions"], gpus=s["gpus"], deployment=s["deployment"])
    row["wall_s"] = round(time.perf_counter() - t0, 3)
    return row


def ranking(table: pd.DataFrame, limit: int = 20) -> str:
    """Variants meeting the SLOs ranked by output tokens/s per GPU, then those that do not."""
    ok = table[table["feasible"]]
    if len(ok):
        ok = ok.sort_values("output_tokens_per_s_per_gpu", ascending=False)
    lines = ["ranked by output tokens/s per GPU among the variants whose P99 TTFT and TPOT meet the SLOs",
             f"{'rank':>4}  {'variant':44} {'GPUs':>5} {'tok/s/GPU':>10} {'tok/s':>10} {'TTFT P99':>9} {'TPOT P99':>9}"]
    for i, r in enumerate(ok.head(limit).itertuples(), 1):
        lines.append(f"{i:>4}  {str(r.name)[:44]:44} {int(r.gpus):>5} {r.output_tokens_per_s_per_gpu:10,.1f} "
                     f"{r.output_tokens_per_s:10,.0f} {r.ttft_p99_ms:9.1f} {r.tpot_p99_ms or 0:9.1f}")
    return "\n".join(lines + unranked_lines(table, len(ok), limit))


def unranked_lines(table: pd.DataFrame, ranked: int, limit: int) -> list[str]:
    """The ranking's tail: how many ranked variants the table left out, then those that miss the SLO, with why."""
    lines = [f"{'':>4}  ... {ranked - limit} more in results.csv"] if ranked > limit else []
    for r in table[~table["feasible"]].head(limit).itertuples():
        lines.append(f"{'-':>4}  {str(r.name)[:44]:44} {r.status}: {str(r.why)[:110]}")
    return lines


def candidates(base: str, overrides: Sequence[str] = (), *, tp: Sequence[int] | None = None,
               pp: Sequence[int] = (1,), replicas: Sequence[int] | None = None,
               max_batch: Sequence[int] | None = None, max_tokens: Sequence[int] | None = None,
               prefill_nodes: Sequence[int] | None = None) -> tuple[list[Variant], list[dict[str, Any]]]:
    """The serving configurations to rank, and those pruned before any runs (with why)."""
    from ..config.checks import gpus_per_node
    from ..config.loader import parse_override
    from .deploy import pool_job
    from .spec import load_serving

    serving = load_serving(base, list(overrides))
    spec = serving.spec
    common = tuple(parse_override(o) for o in overrides)
    pools = ["prefill", "decode"] if spec.disaggregated else ["deployment"]
    jobs = {p: pool_job(serving, p) for p in pools}
    gpn = gpus_per_node(jobs[pools[0]])
    nodes = sum(j.workload.nodes for j in jobs.values())
    tps = list(tp) if tp else [t for t in (1, 2, 4, 8) if t <= gpn and gpn % t == 0]
    batches = list(max_batch) if max_batch else [spec.scheduler.max_batch]
    tokens = list(max_tokens) if max_tokens else [spec.scheduler.max_tokens]
    splits: list[int | None] = list(prefill_nodes) if prefill_nodes and spec.disaggregated else [None]
    keep: list[Variant] = []
    pruned: list[dict[str, Any]] = []
    for t, p, b, k, split in itertools.product(tps, pp, batches, tokens, splits):
        gpus = {pool: jobs[pool].workload.nodes * gpn for pool in pools}
        if split is not None:
            if not 0 < split < nodes:
                pruned.append({"name": f"prefill on {split} of {nodes} nodes", "status": "invalid", "feasible": False,
                               "why": f"--prefill-nodes: expected 1 to {nodes - 1}"})
                continue
            gpus = {"prefill": split * gpn, "decode": (nodes - split) * gpn}
        most = min(g // (t * p) for g in gpus.values())
        for n in (list(replicas) if replicas and split is None and not spec.disaggregated else [most]):
            name = f"tp{t} pp{p} x{n} batch{b} tokens{k}" + (f" prefill{split}/{nodes}" if split is not None else "")
            swept: tuple[tuple[str, Any], ...] = (("tp", t), ("pp", p), ("replicas", n), ("max_batch", b),
                                                   ("max_tokens", k))
            if split is not None:
                swept += (("prefill_nodes", split),)
            one_node = n * t * p <= gpn or n == most
            if n < 1 or n > most or not one_node:
                pruned.append({"name": name, **dict(swept), "status": "invalid", "feasible": False,
                               "why": f"{n} replicas of tp{t} x pp{p}: expected at most {most}, and fewer than "
                                      f"{most} only within one node of {gpn} GPUs"})
                continue
            over: list[tuple[str, Any]] = [("scheduler.max_batch", b), ("scheduler.max_tokens", k)]
            for pool in pools:
                over += [(f"{pool}.set.parallelism.tp", t), (f"{pool}.set.parallelism.pp", p),
                         (f"{pool}.set.inference.max_batch_size", b), (f"{pool}.set.inference.max_batch_tokens", k)]
                if n < most:  # fewer replicas: the GPUs of one node they fill
                    over += [(f"{pool}.set.nodes", 1), (f"{pool}.set.gpus_per_node", n * t * p)]
                if split is not None:
                    over.append((f"{pool}.set.nodes", split if pool == "prefill" else nodes - split))
            keep.append(Variant(name, common + tuple(over), swept))
    return keep, pruned


#: LLM serving files in studies.
KIND = StudyKind(job_key, run_variant, ranking, load, run_loaded, check_overrides)
