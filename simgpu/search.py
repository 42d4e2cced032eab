"""``python -m simgpu.search``: find the fastest embedding sharding or parallel configuration.

``sharding WORKLOAD`` ranks the plans the sharding planner proposes for a DLRM; ``parallelism
WORKLOAD`` ranks the tensor / pipeline / data parallel splits, micro-batch sizes, recomputation and
ZeRO stages of a Transformer that satisfy the job's rules, pruning those that break a rule or do
not fit in memory before simulating any. Candidates run through the what-if runner (process pool or
Dask, resumable); the top-k are written with their summaries and timelines.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from .config.loader import load_job
from .errors import ConfigError, SimgpuError
from .whatif.runner import run_study
from .whatif.study import Study, StudySpec, Variant


def sharding_candidates(workload: str, overrides: Sequence[str] = ()) -> list[Variant]:
    """One variant per plan the sharding planner proposes for this DLRM and world."""
    from .config.checks import gpus_per_node
    from .workload.registry import World
    from .workload.sharding import propose_plans

    job = load_job(workload, overrides)
    if job.workload.model.kind != "dlrm":
        raise ConfigError("sharding search needs a DLRM workload", file=job.workload_file, key="model.kind")
    world = World(job.workload.nodes, gpus_per_node(job), gpu_memory_gib=job.platform.gpu.memory_gib)
    base = tuple(_parse(o) for o in overrides)
    out = []
    for plan in propose_plans(job.workload, world, job.platform.gpu.memory_gib):
        swept = (("plan", plan.name),)
        out.append(Variant(plan.name, base + (("parallelism.sharding", {"planner": plan.name}),), swept))
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def parallelism_candidates(workload: str, overrides: Sequence[str] = (), *, tp: Sequence[int] | None = None,
                           pp: Sequence[int] | None = None, micro_batch: Sequence[int] | None = None,
                           recompute: Sequence[str] = ("none", "selective", "full"),
                           zero: Sequence[int] = (0, 1)) -> tuple[list[Variant], list[dict[str, Any]]]:
    """The parallel configurations that pass the job's rules, and those pruned (with why)."""
    job = load_job(workload, overrides)
    if job.workload.model.kind != "transformer":
        raise ConfigError("parallelism search needs a Transformer workload", file=job.workload_file,
                          key="model.kind")
    gpn = job.workload.gpus_per_node or job.platform.node.gpus
    world = job.workload.nodes * gpn
    tps = list(tp) if tp else [d for d in _divisors(gpn)]
    pps = list(pp) if pp else [d for d in _divisors(world) if d <= job.workload.model.layers]
    gb = job.workload.training.global_batch or job.workload.training.batch_per_gpu * world
    mbs = list(micro_batch) if micro_batch else [1, 2, 4, 8]
    base = tuple(_parse(o) for o in overrides)
    keep: list[Variant] = []
    pruned: list[dict[str, Any]] = []
    for t, p, m, r, z in itertools.product(tps, pps, mbs, recompute, zero):
        if world % (t * p):
            continue
        dp = world // (t * p)
        name = f"tp{t} pp{p} dp{dp} mb{m} {r} z{z}"
        swept = (("tp", t), ("pp", p), ("dp", dp), ("micro_batch", m), ("recompute", r), ("zero", z))
        over = base + (("parallelism.tp", t), ("parallelism.pp", p), ("parallelism.dp", dp),
                       ("parallelism.zero", z), ("training.micro_batch", m), ("training.global_batch", gb),
                       ("training.recompute", r))
        variant = Variant(name, over, swept)
        try:
            load_job(workload, variant.as_args())  # the job's rules: divisibility, heads, layers
        except ConfigError as e:
            pruned.append({"name": name, **dict(swept), "status": "invalid", "feasible": False, "why": str(e)})
            continue
        keep.append(variant)
    return keep, pruned


def _parse(item: str) -> tuple[str, Any]:
    from .config.loader import parse_override

    return parse_override(item)


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


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simgpu.search", description=__doc__.splitlines()[0])
    ap.add_argument("space", choices=("sharding", "parallelism"))
    ap.add_argument("workload")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--top", type=int, default=3, help="write outputs of the k fastest")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--workers", type=int)
    ap.add_argument("--scheduler", help="Dask scheduler address")
    ap.add_argument("--tp", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--pp", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--micro-batch", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--recompute", type=lambda s: s.split(","), default=["none", "selective", "full"])
    ap.add_argument("--zero", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1])
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    from .whatif.__main__ import ranking
    from .whatif.runner import ROW_KEYS, text_progress

    try:
        pruned: list[dict[str, Any]] = []
        if args.space == "sharding":
            variants = sharding_candidates(args.workload, args.overrides)
        else:
            variants, pruned = parallelism_candidates(
                args.workload, args.overrides, tp=args.tp, pp=args.pp, micro_batch=args.micro_batch,
                recompute=args.recompute, zero=args.zero)
        if not variants:
            raise ConfigError("no candidate passes the job's rules", file=args.workload)
        name = f"search_{args.space}_{Path(args.workload).stem}"
        out = args.out or Path("out") / name
        spec = StudySpec(name=name, base=str(args.workload))
        study = Study(spec, str(args.workload), Path(args.workload), tuple(variants))
        rows = run_study(study, out, workers=args.workers, scheduler=args.scheduler,
                         progress=None if args.quiet else text_progress)
        table = pd.DataFrame(rows + pruned)
        for col in ROW_KEYS:
            if col not in table:
                table[col] = None
        table["feasible"] = table["feasible"].fillna(False).astype(bool)
        table.to_csv(out / "results.csv", index=False)
        tops = write_top(args.workload, variants, table, out, args.top)
    except SimgpuError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(ranking(table))
    print(f"\n{len(variants)} candidates simulated, {len(pruned)} pruned by the job's rules; "
          f"top {len(tops)} written to {', '.join(str(d) for d in tops)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
