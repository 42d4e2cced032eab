"""DLRM iteration time against MLPerf Training v2.0 in ``../shared/data/iterations/mlperf-training-v2.0/``.

Every DLRM submission on A100 GPUs that a shipped platform can describe becomes one row: the
measured iteration time is the global batch over the tracked throughput (samples/s, the median of
the submission's runs), the predicted one simulates the benchmark's model on that machine. MLPerf
v2.0's DLRM is DLRM v1 on Criteo 1TB: 13 dense features, 26 one-hot tables with the reference's
row counts (ids hashed into at most 40M rows), dim 128, bottom MLP 512-256-128, dot interaction,
top MLP 1024-1024-512-256-1, SGD; every submission ran HugeCTR with fp16 matmuls and its hybrid
embedding, which is how the rows are sharded here (``plan="hybrid"``, every table hybrid, see
:mod:`simgpu.workload.dlrm.hybrid`): each table's frequent rows replicated and trained
data-parallel, the rest spread over every GPU; the frequent rows are counted by HugeCTR's rule with
its default settings (``parallelism.sharding.hybrid``), pooled vectors and the frequent rows'
gradients travel as fp16, as HugeCTR sends them.

The split needs each table's id distribution, which the measurements do not give: every table's
ids are taken as Zipf(``CRITEO_ZIPF_ALPHA`` = 1.05) over its rows. That exponent is an assumption,
not a measurement of Criteo 1TB: it is the project's default skew (``IndexDistribution.alpha``),
one of the distributions its embedding microbenchmarks run (``zipf1.05``, the middle of the
0.8-1.2 they span), chosen before looking at the results and the same for every table and row;
``--alpha`` re-runs the table under another. Small tables (a few rows to about ten thousand) are
replicated whole whatever the exponent (every row is hit many times per iteration).

The plan used before the hybrid type existed is reported alongside (``old_ms``, ``old_error``):
the planner's ``data_parallel_small`` (tables with no more rows than the global batch replicated,
the rest table-wise, uniform ids, fp16 pooled embeddings). ``--best`` also reports the fastest of
all the planner's plans on uniform ids (what a search over TorchRec-style plans would pick).

Machines: 8 A100-SXM per node on NVSwitch -> ``dgx_a100`` (1, 8 or 14 nodes); 4 A100-SXM boards
(HGX A100 4-GPU, NVLink between every pair) -> four GPUs of ``dgx_a100``; 4 A100-PCIe -> ``pcie_4gpu``;
8 A100-PCIe in one server -> ``pcie_4gpu`` with 8 GPUs on 4 PCIe switches. A30 and TPU systems have
no platform and are listed as skipped. The error is ``predicted / measured - 1``; the summary is the
geometric-mean absolute error ``exp(mean |ln(predicted / measured)|) - 1``. No threshold: reported.
``python -m simgpu.validate.mlperf`` prints the table.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..cli import ArgParser, check_out_file, run_command
from ..config.checks import check_job
from ..config.loader import Job, load_platform, validate
from ..config.workload import WorkloadSpec
from ..sim import simulate
from ..workload import World
from ..workload.dlrm.sharding import propose_plans

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "iterations" / "mlperf-training-v2.0"
#: Criteo 1TB rows per categorical feature with ids hashed into at most 40M rows (MLPerf DLRM v1).
CRITEO_1TB_ROWS = (39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10, 2208,
                   11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36)
#: The sharding of the rows, and the plan used before (reported alongside).
PLAN = "hybrid"
OLD_PLAN = "data_parallel_small"
#: Assumed Zipf exponent of every Criteo 1TB table's ids (see the module docstring).
CRITEO_ZIPF_ALPHA = 1.05


@dataclass(frozen=True)
class System:
    """One submission and the platform that stands for its machine."""

    submitter: str
    system: str
    nodes: int
    gpus_per_node: int
    accelerator: str
    global_batch: int
    measured_s: float
    runs: int
    platform: str = ""
    overrides: tuple[tuple[str, Any], ...] = field(default=())
    note: str = ""

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def _platform(accelerator: str, gpn: int) -> tuple[str, tuple[tuple[str, Any], ...], str] | str:
    """(platform, overrides, note) for an accelerator and GPUs per node, or why there is none."""
    if "A100" not in accelerator:
        return f"no platform for {accelerator}"
    if "PCIe" in accelerator:
        if gpn == 4:
            return "pcie_4gpu", (), ""
        if gpn == 8:
            return ("pcie_4gpu", (("node.gpus", 8), ("node.pcie.switches", 4)),
                    "pcie_4gpu with 8 GPUs on 4 PCIe switches")
        return f"no platform for {gpn} PCIe A100 per node"
    if gpn == 8:
        return "dgx_a100", (), ""
    if gpn == 4:
        return "dgx_a100", (), "HGX 4-GPU board as 4 GPUs of a DGX A100"
    return f"no platform for {gpn} SXM A100 per node"


def systems(root: Path = DATA) -> tuple[list[System], list[tuple[str, str]]]:
    """The DLRM submissions a platform can describe, and (system, reason) for the others."""
    df = pd.read_csv(root / "summary_dlrm_bert.csv")
    df = df[(df["benchmark"] == "dlrm") & (df["status"] == "success")]
    keep: list[System] = []
    skipped: list[tuple[str, str]] = []
    keys = ["submitter", "system", "nodes", "accel_per_node", "accelerator", "global_batch_size"]
    for (sub, name, nodes, gpn, acc, gbs), g in df.groupby(keys, sort=True):
        label = f"{sub}/{name}"
        thr = g["tracked_throughput"].dropna()
        where = _platform(str(acc), int(gpn))
        if isinstance(where, str):
            skipped.append((label, where))
            continue
        if thr.empty:
            skipped.append((label, "no tracked throughput"))
            continue
        if int(gbs) % (int(nodes) * int(gpn)):
            skipped.append((label, f"global batch {gbs} does not divide over {int(nodes) * int(gpn)} GPUs"))
            continue
        platform, over, note = where
        keep.append(System(str(sub), str(name), int(nodes), int(gpn), str(acc), int(gbs),
                           float(gbs) / float(thr.median()), len(thr), platform, over, note))
    return keep, skipped


def job(system: System, plan: str = PLAN, alpha: float = CRITEO_ZIPF_ALPHA) -> Job:
    """The MLPerf v2.0 DLRM on ``system``'s platform, validated like a workload file: with
    ``plan="hybrid"`` every table hybrid, its ids Zipf(``alpha``); otherwise the planner's ``plan``
    on uniform ids."""
    if plan == "hybrid":
        tables = [{"rows": r, "pooling_factor": 1, "distribution": {"kind": "zipf", "alpha": alpha}}
                  for r in CRITEO_1TB_ROWS]
        sharding: dict[str, Any] = {"default": "hybrid", "comm_precision": "fp16"}
    else:
        tables = [{"rows": r, "pooling_factor": 1} for r in CRITEO_1TB_ROWS]
        sharding = {"planner": plan, "comm_precision": "fp16"}
    data: dict[str, Any] = {
        "name": f"mlperf_dlrm_{system.system}", "platform": system.platform, "nodes": system.nodes,
        "gpus_per_node": system.gpus_per_node, "seed": 0,
        "model": {"kind": "dlrm", "dense_features": 13, "bottom_mlp": [512, 256, 128],
                  "top_mlp": [1024, 1024, 512, 256, 1], "embedding_dim": 128, "interaction": "dot",
                  "tables": tables},
        "training": {"batch_per_gpu": system.global_batch // system.gpus, "precision": "fp16",
                     "optimizer": "sgd", "embedding_optimizer": "sgd"},
        "parallelism": {"sharding": sharding},
    }
    source = f"mlperf:{system.submitter}/{system.system}"
    spec = validate(WorkloadSpec, data, source)
    platform, pfile = load_platform(system.platform, system.overrides)
    j = Job(spec, platform, source, pfile)
    check_job(j)
    return j


def best_plan(system: System) -> tuple[str, float]:
    """The fastest of the sharding planner's proposals on ``system`` (uniform ids) and its predicted
    seconds."""
    j = job(system, OLD_PLAN)
    world = World(system.nodes, system.gpus_per_node, j.platform.gpu.memory_gib)
    times = {p.name: simulate(job(system, p.name)).iteration_time_s for p in propose_plans(j.workload, world)}
    name = min(times, key=lambda n: (times[n], n))
    return name, times[name]


def validate_all(root: Path = DATA, limit_gpus: int | None = None, *, best: bool = False,
                 alpha: float = CRITEO_ZIPF_ALPHA) -> tuple[pd.DataFrame, list[tuple[str, str]]]:
    """One row per system (up to ``limit_gpus`` GPUs): measured and predicted milliseconds and the
    error of the hybrid plan (ids Zipf(``alpha``)), and of the plan used before (``old_``); with
    ``best``, also the fastest of the planner's plans and its error."""
    found, skipped = systems(root)
    rows = []
    for s in found:
        if limit_gpus is not None and s.gpus > limit_gpus:
            continue
        predicted = simulate(job(s, PLAN, alpha)).iteration_time_s
        old = simulate(job(s, OLD_PLAN)).iteration_time_s
        row: dict[str, Any] = {
            "system": f"{s.submitter}/{s.system}", "gpus": f"{s.nodes}x{s.gpus_per_node}",
            "accelerator": s.accelerator, "platform": s.platform, "global_batch": s.global_batch,
            "runs": s.runs, "measured_ms": s.measured_s * 1e3, "predicted_ms": predicted * 1e3,
            "error": predicted / s.measured_s - 1, "old_ms": old * 1e3, "old_error": old / s.measured_s - 1}
        if best:
            name, t = best_plan(s)
            row.update(best_plan=name, best_ms=t * 1e3, best_error=t / s.measured_s - 1)
        rows.append({**row, "note": s.note})
    return pd.DataFrame(rows), skipped


def geomean_error(table: pd.DataFrame, column: str = "predicted_ms") -> float:
    """``exp(mean |ln(predicted / measured)|) - 1`` over the rows of ``table``."""
    if table.empty:
        return float("nan")
    return float(np.exp(np.mean(np.abs(np.log(table[column] / table["measured_ms"])))) - 1)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="python -m simgpu.validate.mlperf", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--max-gpus", type=int, help="leave out systems with more GPUs")
    ap.add_argument("--best", action="store_true", help="also simulate every plan the planner proposes")
    ap.add_argument("--alpha", type=float, default=CRITEO_ZIPF_ALPHA,
                    help=f"Zipf exponent of every table's ids (default {CRITEO_ZIPF_ALPHA}, an assumption)")
    ap.add_argument("--csv", help="write the table here")
    args = ap.parse_args(argv)
    if args.csv:
        check_out_file(args.csv, "--csv")
    if not args.data.is_dir():
        print(f"error: no measurements at {args.data}", file=sys.stderr)
        return 2
    table, skipped = validate_all(args.data, args.max_gpus, best=args.best, alpha=args.alpha)
    with pd.option_context("display.width", 250, "display.max_colwidth", 48):
        shown = table.assign(**{c: table[c].map("{:+.1%}".format) for c in ("error", "old_error", "best_error")
                                if c in table})
        print(shown.to_string(index=False, float_format="{:.3f}".format))
    for label, why in skipped:
        print(f"skipped {label}: {why}")
    for name, g in [("all", table), *table.groupby(["platform", "gpus"])]:
        label = name if isinstance(name, str) else " ".join(map(str, name))
        extra = f"  old plan {geomean_error(g, 'old_ms'):.1%}"
        extra += f"  best plan {geomean_error(g, 'best_ms'):.1%}" if args.best else ""
        print(f"{label:14} rows {len(g):3d}  geomean |error| {geomean_error(g):.1%}{extra}")
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
