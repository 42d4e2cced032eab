"""Workloads in studies: a variant simulated as one iteration and made a row (iteration time,
throughput, MFU, the compute / exposed communication / idle breakdown, memory, feasible or why not),
the hash of the job it simulates, and the ranking of the rows by iteration time (or by throughput
where the variants process different numbers of samples).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import ConfigError, SimgpuError
from ..variant import StudyKind, Variant

#: Up to this many variants that did not run are listed one by one; beyond, summarised by reason.
LISTED_FAILURES = 8


def job_key(base: str | Path, variant: Variant) -> str:
    """A hash of the job ``variant`` simulates: the validated workload and platform after its overrides,
    the platform's kernel-model manifest and the simulator's version; for a variant that does not
    load, of the files' text, its overrides and the error."""
    from ..config.loader import load_job
    from ..version import __version__

    parts: dict[str, Any] = {"simgpu": __version__}
    if variant.draws:  # rows with intervals are not those without
        parts["draws"] = variant.draws
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


def load(base: str, variant: Variant) -> Any:
    """The job of ``variant``: the workload and its platform after the overrides, validated."""
    from ..config.loader import load_job

    return load_job(base, variant.as_args())


def run_variant(base: str, variant: Variant) -> dict[str, Any]:
    """Simulate one variant; never raises: failures become rows with ``status`` and ``why``."""
    return _row(variant, lambda: load(base, variant))


def run_job(job: Any, variant: Variant) -> dict[str, Any]:
    """:func:`run_variant` of a variant already loaded where the study was read: a worker on another
    machine gets the validated workload and platform and reads no file of the study (only its own
    installation's kernel models)."""
    return _row(variant, lambda: job)


def _row(variant: Variant, job: Any) -> dict[str, Any]:
    from ..report import summarize
    from ..sim import simulate

    t0 = time.perf_counter()
    row: dict[str, Any] = {"id": variant.id, "name": variant.name}
    row.update({k: v for k, v in variant.swept})
    try:
        loaded = job()
        if variant.draws:
            from ..uncertainty import propagate

            result, spread = propagate(loaded, variant.draws)
            result.meta["uncertainty"] = spread.as_dict()
            q = spread.quantiles_s()
            row.update({f"iteration_p{k}_ms": v * 1e3 for k, v in q.items()})
        else:
            result = simulate(loaded)
        summary = summarize(result)
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


def differ_in_work(table: pd.DataFrame) -> bool:
    """Whether the feasible variants process different numbers of samples per iteration."""
    ok = table[table["feasible"]] if "feasible" in table else table
    if "samples" not in ok or ok["samples"].isna().all():
        return False
    return ok["samples"].dropna().nunique() > 1


def reason(why: str) -> str:
    """A failure's message without the file and with its numbers hidden, to group like failures."""
    text = str(why).split(": ", 1)[1] if re.match(r"^\S+\.ya?ml(:\d+)?: ", str(why)) else str(why)
    return re.sub(r"\d+(\.\d+)?", "#", text)[:110]


def failures(table: pd.DataFrame, limit: int = LISTED_FAILURES) -> list[str]:
    """Lines for the variants that did not run: each one, or when many, a count per reason."""
    bad = table[~table["feasible"]]
    if len(bad) <= limit:
        return [f"{'-':>4}  {str(r.name)[:40]:40} {r.status}: {str(r.why)[:110]}" for r in bad.itertuples()]
    groups = bad.assign(reason=bad["why"].map(reason)).groupby(["status", "reason"], sort=False)
    out = [f"{len(bad)} variants did not run, by reason:"]
    for (status, why), g in sorted(groups, key=lambda kv: -len(kv[1])):
        out.append(f"  {len(g):>5} {status}: {why}  (e.g. {g['name'].iloc[0]})")
    return out


def ranking(table: pd.DataFrame, limit: int = 20) -> str:
    """The feasible variants ranked, best first, then the others (listed or summarised)."""
    by_work = differ_in_work(table)
    ok = table[table["feasible"]]
    ok = ok.sort_values("samples_per_s", ascending=False) if by_work else ok.sort_values("iteration_time_ms")
    best_t = ok["iteration_time_ms"].min() if len(ok) else float("nan")
    best_s = ok["samples_per_s"].max() if len(ok) else float("nan")
    lines_ = []
    if by_work:
        lines_.append("ranked by throughput: the variants process different numbers of samples per iteration")
    intervals = "iteration_p10_ms" in ok and ok["iteration_p10_ms"].notna().any()
    lines_.append(f"{'rank':>4}  {'variant':40} {'iter ms':>10} {'samples/s':>11} {'vs best':>8} {'exposed ms':>10} "
                  f"{'MFU':>6}" + (f"  {'80% interval ms':>19}" if intervals else ""))
    best = ok.iloc[0] if len(ok) else None
    for i, r in enumerate(ok.head(limit).itertuples(), 1):
        mfu = f"{r.mfu:.1%}" if r.mfu == r.mfu and r.mfu is not None else "-"
        sps = f"{r.samples_per_s:11,.1f}" if r.samples_per_s == r.samples_per_s and r.samples_per_s else f"{'-':>11}"
        vs = (best_s / r.samples_per_s if by_work and r.samples_per_s else r.iteration_time_ms / best_t)
        line = (f"{i:>4}  {str(r.name)[:40]:40} {r.iteration_time_ms:10.3f} {sps} {vs:8.3f} "
                f"{r.exposed_communication_ms:10.3f} {mfu:>6}")
        if intervals and best is not None:
            line += f"  {r.iteration_p10_ms:9.3f}-{r.iteration_p90_ms:<9.3f}"
            if i > 1 and overlaps(best, r):
                line += " overlaps the best's"
        lines_.append(line)
    if len(ok) > limit:
        lines_.append(f"{'':>4}  ... {len(ok) - limit} more in results.csv")
    if intervals:
        lines_.append("(the 80% interval of each iteration time, from the study's uncertainty draws; where it "
                      "overlaps the best's, the two are not told apart by the models' known error)")
    lines_.extend(failures(table))
    return "\n".join(lines_)


def overlaps(a: Any, b: Any) -> bool:
    """Whether two rows' 80% intervals of the iteration time overlap."""
    return bool(a.iteration_p10_ms <= b.iteration_p90_ms and b.iteration_p10_ms <= a.iteration_p90_ms)


#: Workload files in studies.
KIND = StudyKind(job_key, run_variant, ranking, load, run_job)
