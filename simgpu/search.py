"""``simgpu search``: find the fastest embedding sharding or parallel configuration.

``serving SERVING.yaml`` ranks serving configurations (TP / PP, replicas, ``--max-batch``,
``--max-tokens`` chunk sizes, ``--prefill-nodes`` of a disaggregated deployment) by output tokens/s
per GPU among those whose P99 TTFT and TPOT meet the file's SLOs (:mod:`simgpu.serve.study`); a
DLRM serving file, its ``--gpus`` (the GPUs its tables are sharded over), ``--max-batch`` (the
batcher's samples) and ``--delay-us`` by samples/s per GPU among those whose P99 latency meets the
file's SLO (:mod:`simgpu.serve.dlrm_study`).

``stages WORKLOAD`` balances a pipeline's blocks per stage (``parallelism.stage_layers``) over GPUs of
different speeds, from the even split's compute per stage (:mod:`simgpu.stages`).

``sharding WORKLOAD`` ranks the plans the sharding planner proposes for a DLRM; ``parallelism
WORKLOAD`` ranks the tensor / pipeline / data parallel splits, micro-batch sizes, recomputation and
ZeRO stages of a Transformer. Candidates keep the workload's global batch (the same work) and are
written in the workload's own keys (``batch_per_gpu`` or ``micro_batch``; ``global_batch`` or
``grad_accumulation``); those that break a rule of the job or do not fit in GPU memory are pruned
before any is simulated and counted by reason. Candidates run through the what-if runner (process
pool or Dask; rows keyed by their job's content, so a rerun reuses what is unchanged); the top-k
are written with their summaries and timelines.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from .cli import ArgParser, check_out_dir, choice_list, entry, int_at_least, int_list, out_dir, run_command
from .config.loader import Job, JobKind, job_kind, load_job, parse_override, read_yaml
from .errors import ConfigError
from .variant import Variant
from .whatif.runner import run_study
from .whatif.study import Study, StudySpec


def sharding_candidates(workload: str, overrides: Sequence[str] = ()) -> list[Variant]:
    """One variant per plan the sharding planner proposes for this DLRM and world."""
    from .config.checks import gpus_per_node
    from .workload import World
    from .workload.dlrm.sharding import propose_plans

    job = load_job(workload, overrides)
    if job.workload.model.kind != "dlrm":
        raise ConfigError("sharding search needs a DLRM workload", file=job.workload_file, key="model.kind")
    world = World(job.workload.nodes, gpus_per_node(job), gpu_memory_gib=job.platform.gpu.memory_gib)
    base = tuple(parse_override(o) for o in overrides)
    out = []
    for plan in propose_plans(job.workload, world, job.platform.gpu.memory_gib):
        swept = (("plan", plan.name),)
        out.append(Variant(plan.name, base + (("parallelism.sharding", {"planner": plan.name}),), swept))
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _given(data: dict[str, Any], section: str, key: str, overrides: Sequence[tuple[str, Any]]) -> bool:
    """Whether the workload (after overrides) gives ``section.key`` a value."""
    value = (data.get(section) or {}).get(key)
    for k, v in overrides:
        if k.removeprefix("workload.") == f"{section}.{key}":
            value = v
    return value is not None


def parallelism_candidates(workload: str, overrides: Sequence[str] = (), *, tp: Sequence[int] | None = None,
                           pp: Sequence[int] | None = None, micro_batch: Sequence[int] | None = None,
                           recompute: Sequence[str] = ("none", "selective", "full"),
                           zero: Sequence[int] | None = None) -> tuple[list[Variant], list[dict[str, Any]]]:
    """The parallel configurations that pass the job's rules, and those pruned (with why).

    Every candidate keeps the job's global batch; it is expressed in the keys the workload uses."""
    job = load_job(workload, overrides)
    if job.workload.model.kind != "transformer":
        raise ConfigError("parallelism search needs a Transformer workload", file=job.workload_file,
                          key="model.kind")
    data, _ = read_yaml(workload, "workload")
    base = tuple(parse_override(o) for o in overrides)
    w, tr, par = job.workload, job.workload.train, job.workload.parallelism
    gpn = w.gpus_per_node or job.platform.node.gpus
    world = w.nodes * gpn
    dp0 = par.dp or world // (par.tp * par.pp * par.cp)
    gb = tr.global_batch or tr.batch_per_gpu * dp0 * (tr.grad_accumulation or 1)
    batch_key = "training.micro_batch" if _given(data, "training", "micro_batch", base) else "training.batch_per_gpu"
    uses_ga = _given(data, "training", "grad_accumulation", base)
    uses_gb = _given(data, "training", "global_batch", base)
    sets_dp = _given(data, "parallelism", "dp", base)
    fsdp = par.fsdp
    tps = list(tp) if tp else _divisors(gpn)
    pps = list(pp) if pp else [d for d in _divisors(world) if d <= w.model.layers]  # type: ignore[union-attr]
    mbs = list(micro_batch) if micro_batch else [1, 2, 4, 8]
    zeros: list[int | None] = list(zero) if zero else ([None] if fsdp else [0, 1])
    keep: list[Variant] = []
    pruned: list[dict[str, Any]] = []
    for t, p, m, r, z in itertools.product(tps, pps, mbs, recompute, zeros):
        if world % (t * p * par.cp):
            continue
        dp = world // (t * p * par.cp)
        name = f"tp{t} pp{p} dp{dp} mb{m} {r}" + (f" z{z}" if z is not None else "")
        swept: tuple[tuple[str, Any], ...] = (("tp", t), ("pp", p), ("dp", dp), ("micro_batch", m), ("recompute", r))
        if z is not None:
            swept += (("zero", z),)
        if gb % (m * dp):
            pruned.append({"name": name, **dict(swept), "status": "invalid", "feasible": False,
                           "why": f"training.global_batch: the global batch {gb} is not a multiple of micro_batch "
                                  f"x dp = {m} x {dp}"})
            continue
        over: tuple[tuple[str, Any], ...] = (("parallelism.tp", t), ("parallelism.pp", p), (batch_key, m),
                                             ("training.recompute", r))
        if sets_dp:
            over += (("parallelism.dp", dp),)
        if z is not None:
            over += (("parallelism.zero", z),)
        if uses_gb:
            over += (("training.global_batch", gb),)
        elif uses_ga or gb != m * dp:
            over += (("training.grad_accumulation", gb // (m * dp)),)
        variant = Variant(name, base + over, swept)
        try:
            cand = load_job(workload, variant.as_args())  # the job's rules: divisibility, heads, layers, world
        except ConfigError as e:
            pruned.append({"name": name, **dict(swept), "status": "invalid", "feasible": False, "why": str(e)})
            continue
        why = memory_misfit(cand)
        if why:
            pruned.append({"name": name, **dict(swept), "status": "infeasible", "feasible": False, "why": why})
            continue
        keep.append(variant)
    return keep, pruned


def fitting(workload: str, variants: list[Variant]) -> tuple[list[Variant], list[dict[str, Any]]]:
    """The variants that pass the job's rules and fit in GPU memory, and those pruned (with why)."""
    keep: list[Variant] = []
    pruned: list[dict[str, Any]] = []
    for v in variants:
        try:
            why = memory_misfit(load_job(workload, v.as_args()))
        except ConfigError as e:
            pruned.append({"name": v.name, **dict(v.swept), "status": "invalid", "feasible": False, "why": str(e)})
            continue
        if why:
            pruned.append({"name": v.name, **dict(v.swept), "status": "infeasible", "feasible": False, "why": why})
            continue
        keep.append(v)
    return keep, pruned


def memory_misfit(job: Job) -> str | None:
    """Why a Transformer job does not fit in GPU memory (the builder's own per-stage estimate, without
    building its programs), or None."""
    from .config.checks import gpus_per_node
    from .workload import World
    from .workload.transformer.memory import stage_memory
    from .workload.transformer.shapes import make_setup

    world = World(job.workload.nodes, gpus_per_node(job), job.platform.gpu.memory_gib)
    try:
        setup = make_setup(job.workload, world)
    except (ValueError, TypeError):
        return None
    cap = job.platform.gpu.memory_gib * 2**30
    for stage in range(setup.layout.pp):
        need = stage_memory(setup, stage).total
        if need > cap:
            return (f"model: does not fit in GPU memory: stage {stage} needs {need / 2**30:.1f} GiB per GPU but a "
                    f"{job.platform.gpu.name} has {job.platform.gpu.memory_gib:g} GiB")
    return None


def reasons(pruned: list[dict[str, Any]], limit: int = 6) -> list[tuple[int, str]]:
    """The most common reasons candidates were pruned: (count, the first such message), messages
    grouped with their numbers hidden and shown without the file."""
    def strip(why: str) -> str:
        return why.split(": ", 1)[1] if re.match(r"^\S+\.ya?ml(:\d+)?: ", why) else why

    first: dict[str, str] = {}
    counts: Counter[str] = Counter()
    for p in pruned:
        text = strip(str(p["why"]))
        group = re.sub(r"\b\d+(\.\d+)?\b", "#", text)
        first.setdefault(group, f"{text[:140]} (e.g. {p['name']})")
        counts[group] += 1
    return [(n, first[g]) for g, n in counts.most_common(limit)]


def write_top(workload: str, variants: list[Variant], table: pd.DataFrame, out: Path, k: int) -> list[Path]:
    """Simulate the k fastest again and write their outputs (summary, timeline, trace)."""
    from .report import write_outputs
    from .sim import simulate

    by_id = {v.id: v for v in variants}
    best = table[table["feasible"]].sort_values("iteration_time_ms").head(k)
    dirs = []
    for i, row in enumerate(best.itertuples(), 1):
        v = by_id[str(row.id)]
        d = out / f"top{i}"
        write_outputs(simulate(load_job(workload, v.as_args())), d)
        dirs.append(d)
    return dirs


def write_top_serving(serving: str, variants: list[Variant], table: pd.DataFrame, out: Path, k: int) -> list[Path]:
    """Serve the k best (most output tokens/s per GPU within the SLOs) again and write their files."""
    from .serve.deploy import build, serve
    from .serve.outputs import write_outputs
    from .serve.spec import load_serving

    by_id = {v.id: v for v in variants}
    best = table[table["feasible"]].sort_values("output_tokens_per_s_per_gpu", ascending=False).head(k)
    dirs = []
    for i, row in enumerate(best.itertuples(), 1):
        s = load_serving(serving, by_id[str(row.id)].as_args())
        res, summary = serve(s, build(s))
        d = out / f"top{i}"
        write_outputs(res, summary, d, slo=(s.spec.slo.ttft_ms, s.spec.slo.tpot_ms),
                      gantt_iterations=s.spec.outputs.gantt_iterations)
        dirs.append(d)
    return dirs


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="simgpu search", description=__doc__.splitlines()[0])
    ap.add_argument("space", choices=("sharding", "parallelism", "serving", "stages"))
    ap.add_argument("workload")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--top", type=int_at_least(0), default=3, help="write outputs of the k fastest")
    ap.add_argument("--out", type=Path, help="output folder (default out/search_<space>_<workload>)")
    ap.add_argument("--workers", type=int_at_least(1), help="local processes (default: one per core)")
    ap.add_argument("--scheduler", help="Dask scheduler address")
    ap.add_argument("--tp", type=int_list(1), help="tensor-parallel degrees to try, e.g. 1,2,4,8")
    ap.add_argument("--pp", type=int_list(1), help="pipeline-parallel degrees to try")
    ap.add_argument("--micro-batch", type=int_list(1), help="micro-batch sizes to try (default 1,2,4,8)")
    ap.add_argument("--recompute", type=choice_list(("none", "selective", "full")),
                    default=["none", "selective", "full"], help="recomputation modes to try")
    ap.add_argument("--zero", type=int_list(0), help="ZeRO stages to try (default 0,1)")
    ap.add_argument("--replicas", type=int_list(1), help="serving: replicas to try (default: as many as fit)")
    ap.add_argument("--max-batch", type=int_list(1), help="serving: scheduler.max_batch values to try")
    ap.add_argument("--max-tokens", type=int_list(1), help="serving: token budgets (chunk sizes) to try")
    ap.add_argument("--prefill-nodes", type=int_list(1), help="serving, disaggregated: nodes of the prefill pool")
    ap.add_argument("--gpus", type=int_list(1), help="DLRM serving: GPUs (of one node) to try (default 1,2,4,8)")
    ap.add_argument("--delay-us", type=int_list(0), help="DLRM serving: batcher.max_queue_delay_us values to try")
    ap.add_argument("--uncertainty", type=int_at_least(0), default=0, metavar="N",
                    help="workload searches: N correlated draws per candidate; the ranking gives each one's 80%% "
                         "interval and marks those that overlap the best's (docs/uncertainty.md)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    from .whatif.runner import finish_table, text_progress
    from .whatif.study import ranking

    if args.zero and any(z > 3 for z in args.zero):
        raise ConfigError(f"expected ZeRO stages among 0, 1, 2, 3, got {args.zero}", key="--zero")
    if args.out:
        check_out_dir(args.out)
    if args.uncertainty and args.space == "serving":
        raise ConfigError("uncertainty draws are for workload searches (sharding, parallelism, stages); expected no "
                          "--uncertainty for serving", key="--uncertainty")
    pruned: list[dict[str, Any]] = []
    info: dict[str, Any] = {}  # stages: what the candidates were derived from
    kind: JobKind = job_kind(args.workload, what="serving") if args.space == "serving" else "workload"
    dlrm = kind == "dlrm_serving"
    if dlrm:
        from .serve.dlrm_study import candidates as dlrm_candidates

        variants, pruned = dlrm_candidates(args.workload, args.overrides, gpus=args.gpus, max_batch=args.max_batch,
                                           delay_us=args.delay_us)
    elif args.space == "serving":
        from .serve.study import candidates

        variants, pruned = candidates(args.workload, args.overrides, tp=args.tp, pp=args.pp or (1,),
                                      replicas=args.replicas, max_batch=args.max_batch, max_tokens=args.max_tokens,
                                      prefill_nodes=args.prefill_nodes)
    elif args.space == "sharding":
        variants = sharding_candidates(args.workload, args.overrides)
    elif args.space == "stages":
        from .stages import stage_candidates

        variants, info = stage_candidates(args.workload, args.overrides)
        variants, pruned = fitting(args.workload, variants)
    else:
        variants, pruned = parallelism_candidates(
            args.workload, args.overrides, tp=args.tp, pp=args.pp, micro_batch=args.micro_batch,
            recompute=args.recompute, zero=args.zero)
    if not variants:
        why = "; ".join(f"{n} x {r}" for n, r in reasons(pruned, 3)) or "no candidate fills the world"
        raise ConfigError(f"none of {len(pruned)} candidates passes the job's rules: {why}; expected other "
                          "--tp / --pp / --micro-batch values or --set overrides", file=args.workload)
    if args.uncertainty:
        variants = [replace(v, draws=args.uncertainty) for v in variants]
    name = f"search_{args.space}_{Path(args.workload).stem}"
    out = out_dir(args.out, name)
    spec = StudySpec(name=name, base=str(args.workload))
    study = Study(spec, str(args.workload), Path(args.workload), tuple(variants), kind)
    stats: dict[str, int] = {}
    rows = run_study(study, out, workers=args.workers, scheduler=args.scheduler,
                     progress=None if args.quiet else text_progress, stats=stats)
    swept = list(dict.fromkeys(k for v in variants for k, _ in v.swept))
    table = finish_table(rows, swept)
    table.to_csv(out / "results.csv", index=False)
    if pruned:
        pd.DataFrame(pruned).to_csv(out / "pruned.csv", index=False)
    if dlrm:
        from .serve.dlrm_study import write_top as write_top_dlrm

        tops = write_top_dlrm(args.workload, variants, table, out, args.top)
    elif args.space == "serving":
        tops = write_top_serving(args.workload, variants, table, out, args.top)
    else:
        tops = write_top(args.workload, variants, table, out, args.top)
    print(ranking(table, kind=kind))
    if args.space == "stages":
        from .stages import stage_lines

        print("\n".join(stage_lines(table, info)))
    if pruned:
        print(f"\n{len(pruned)} candidates pruned by the job's rules (listed in {out / 'pruned.csv'}):")
        for n, r in reasons(pruned):
            print(f"  {n:>5} x {r}")
    if stats.get("reused"):
        print(f"\nreused {stats['reused']} of {len(table)} rows from {out / 'results.jsonl'} (their jobs are "
              f"unchanged); computed {stats['computed']}")
    print(f"\n{len(variants)} candidates ranked, {len(pruned)} pruned; "
          + (f"top {len(tops)} written to {', '.join(str(d) for d in tops)}" if tops else "none written"))
    return 0


if __name__ == "__main__":
    entry(main)
