"""Collective predictions against nccl-tests measurements in ``../shared/data/collectives/``.

Every sweep there (one source, collective, GPU count and node count over message sizes) is mapped
to a platform file that describes that machine from datasheet figures, simulated size by size,
and scored by the geometric-mean absolute error of time: ``exp(mean(|ln(predicted/measured)|)) - 1``,
separately for messages of at least 1 MB and below. ``python -m simgpu.validate.collectives``
prints the table; the tests enforce the thresholds per category.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..cli import ArgParser, check_out_file, run_command
from ..collective_run import simulate_collective
from ..comm.calibrate import fit, parse_nccl_tests
from ..config.loader import load_platform
from ..platform.topology import Topology

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "collectives"
MB = 1 << 20
#: Thresholds per category (fraction), for >= 1 MB and < 1 MB (None: reported only).
THRESHOLDS: dict[str, tuple[float | None, float | None]] = {
    "one_node": (0.15, None), "two_node": (0.20, 0.35), "pcie": (0.20, None), "ten_node": (0.10, None),
    "pairwise": (0.15, None), "report": (None, None)}
#: Sweeps still above their threshold, with the error the model reaches today (the tests fail if
#: any gets worse by more than GAP_SLACK, and report the ones that drop under the threshold).
KNOWN_GAPS: dict[tuple[str, str], float] = {
    # PCIe without peer-to-peer: NCCL's shared-memory transport moves 7-10 GB/s per GPU when a GPU
    # both sends and receives through host memory, on PCIe Gen3 and Gen4 alike (11 GB/s one way),
    # and 2.7 GB/s across sockets; the model stages at the PCIe rate. Its shape is right: fitted
    # on half the sizes, the other half comes within 5-8% (python -m simgpu.validate.collectives
    # --calibration)
    ("autodl:autodl_2x2080Ti_PCIe3_noP2P_nccl_tests:all_gather", "ge"): 0.830,
    ("autodl:autodl_2x2080Ti_PCIe3_noP2P_nccl_tests:all_reduce", "ge"): 0.519,
    ("autodl:autodl_2x2080Ti_PCIe3_noP2P_nccl_tests:alltoall", "ge"): 0.425,
    ("eugenesiow:A40_NODE_PCIe_2gpu:all_reduce", "ge"): 2.333,
    ("eugenesiow:A40_SYS_PCIe_4gpu:all_reduce", "ge"): 3.567,
    ("eugenesiow:DGXA100_P2Pdisabled_4gpu:all_reduce", "ge"): 0.231,
    # fabrics reached through a network plugin (EFA on p4de and p5, GPUDirect-TCPXO on A3 Mega)
    # run mid-size all-reduces (2-64 MB) at 0.55-0.65 of the predicted speed, beyond NCCL's own tree
    # derating, where the RoCE machine (OCI, NCCL's native transport) is within 13%; the EKS
    # excerpt is the same p5 pair as the full p5 sweep (which is within 20%) under older NCCL and
    # plugin versions, up to 2x slower; TCPXO's latency and its tuner plugin's choices are not public
    ("aws:aws_p4de_2x8xA100-80GB_all_reduce_perf:all_reduce", "ge"): 0.257,
    ("aws:aws_p5_2x8xH100_eks_all_reduce_perf_excerpt:all_reduce", "ge"): 0.914,
    ("gcp:gcp_a3mega_2x8xH100_all_reduce_perf:all_reduce", "ge"): 0.295,
    ("gcp:gcp_a3mega_2x8xH100_all_reduce_perf:all_reduce", "lt"): 0.485,
    # the second H100 cluster's eight-GPU alltoall is bimodal across its 131 node pairs: those at full
    # rate (23.6 GB/s busbw at every size) are within 7%, the rest slow down with the message to a
    # quarter of it at 16 GiB (7.2 GB/s median there), as no NIC or fabric figure of the platform does
    ("h100-cluster00:2x8:alltoall", "ge"): 0.572,
}
GAP_SLACK = 0.02
OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
       "alltoall": "all_to_all", "sendrecv": "send_recv", "broadcast": "broadcast", "reduce": "reduce"}


@dataclass(frozen=True)
class Sweep:
    """One measured sweep and the machine it ran on."""

    name: str
    category: str
    platform: str
    nodes: int
    gpus_per_node: int
    op: str
    sizes: tuple[int, ...]
    measured_us: tuple[float, ...]
    overrides: tuple[tuple[str, Any], ...] = field(default=())
    note: str = ""
    #: where the sweep is the median of several runs (node pairs): each run's times, size by size
    #: (NaN where a run lacks a size), to report the spread of the error across them
    runs: tuple[tuple[float, ...], ...] = field(default=())


#: platform overrides: one process drives every GPU of the node; peer-to-peer (and NVLink) off
ONE: tuple[tuple[str, Any], ...] = (("collectives.single_process", True),)
NO_P2P: tuple[tuple[str, Any], ...] = (("node.nvlink", None), ("node.pcie.p2p", False))


def _published(root: Path) -> list[Sweep]:
    df = pd.read_csv(root / "nccl-tests-published" / "parsed_nccl_tests.csv")
    df["case"] = df["case"].fillna("")
    cases: dict[tuple[str, str], tuple[str, str, int, int, tuple[tuple[str, Any], ...]]] = {
        # (file prefix, case) -> (category, platform, nodes, gpus per node, overrides)
        ("aws_p4de", ""): ("two_node", "aws_p4de", 2, 8, ()),
        ("aws_p5_2x8xH100_all", ""): ("two_node", "aws_p5", 2, 8, ()),
        ("aws_p5_2x8xH100_eks", ""): ("two_node", "aws_p5", 2, 8, ()),
        ("gcp_a3mega", ""): ("two_node", "gcp_a3mega", 2, 8, ()),
        ("oci_", ""): ("two_node", "oci_bm_gpu4_8", 2, 8, ()),
        # these ran one process for all GPUs (nccl-tests -g N, as their logs say)
        ("autodl", ""): ("pcie", "rtx2080ti_2gpu", 1, 2, ONE),
        ("eugenesiow", "A40_NV4_2gpu"): ("one_node", "a40_4gpu", 1, 2, ONE),
        ("eugenesiow", "A40_NODE_PCIe_2gpu"): ("pcie", "a40_4gpu", 1, 2, ONE + NO_P2P),
        ("eugenesiow", "A40_SYS_PCIe_4gpu"): ("pcie", "a40_4gpu", 1, 4, ONE + NO_P2P),
        ("eugenesiow", "DGXA100_NVSwitch_4gpu"): ("one_node", "dgx_a100", 1, 4, ONE),
        ("eugenesiow", "DGXA100_P2Pdisabled_4gpu"): ("pcie", "dgx_a100", 1, 4, ONE + NO_P2P),
        ("lipplus", ""): ("one_node", "dgx_a100", 1, 8, ONE),
        # sources the provenance marks as unidentified: reported, not scored
        ("unknownrepo_1x8", ""): ("report", "dgx_h100", 1, 8, ONE),
        ("unknownrepo_2x8", ""): ("report", "dgx_h100", 2, 8, ()),
    }
    out = []
    for (file, case, coll), g in df.groupby(["file", "case", "collective"], sort=True):
        match = [v for (prefix, c), v in cases.items() if str(file).startswith(prefix) and c == case]
        if not match:
            continue
        category, platform, nodes, gpn, over = match[0]
        g = g.sort_values("size_B")
        g = g[(g["oop_time_us"] > 0) & (g["size_B"] > 0)]
        name = f"{str(file).split('_')[0]}:{case or Path(str(file)).stem}:{coll}"
        out.append(Sweep(name, category, platform, nodes, gpn, OPS[str(coll)], tuple(int(x) for x in g["size_B"]),
                         tuple(float(x) for x in g["oop_time_us"]), over))
    h200 = pd.read_csv(root / "nccl-tests-published" / "stas00_8xH200_torch_all_reduce_bench.csv")
    h200 = h200[h200["algbw_GBps"] > 0]
    out.append(Sweep("stas00:8xH200:all_reduce", "one_node", "dgx_h200", 1, 8, "all_reduce",
                     tuple(int(x) for x in h200["payload_bytes"]),
                     tuple(float(s / (a * 1e9) * 1e6) for s, a in zip(h200["payload_bytes"], h200["algbw_GBps"])),
                     note="torch.distributed benchmark; time from algbw"))
    return out


#: the platform each cluster of nccl-tests-h100-cluster is described by (its provenance.md)
H100_CLUSTERS = {"example-cluster00": ("h100-cluster00", "h100_ndr_cluster00"),
                 "example-cluster01": ("h100-cluster", "h100_ndr_cluster")}


def _h100_cluster(root: Path) -> list[Sweep]:
    folder = root / "nccl-tests-h100-cluster"
    df = pd.read_csv(folder / "parsed_nccl_tests.csv")
    df = df[(df["oop_time_us"] > 0) & df["path"].str.contains("/(?:single-node|pairwise)/")]
    df = df.assign(cluster=df["path"].str.extract(r"(example-cluster\d+)", expand=False))
    out = []
    for (cluster, coll, nranks, nnodes), g in df.groupby(["cluster", "collective", "nranks", "nnodes"], sort=True):
        gpn = int(nranks) // int(nnodes)
        prefix, platform = H100_CLUSTERS[str(cluster)]
        # node pairs and repeated runs: the median time per size, and every run kept for the spread
        table = g.pivot_table(index="size_B", columns="path", values="oop_time_us", aggfunc="median").sort_index()
        med = table.median(axis=1)
        if nnodes == 1:  # one node: NVLink only, described by the DGX H100 file (as before)
            category, platform = "one_node", "dgx_h100"
        else:
            category = "pairwise"
        out.append(Sweep(f"{prefix}:{nnodes}x{gpn}:{coll}", category, platform, int(nnodes), gpn, OPS[str(coll)],
                         tuple(int(x) for x in med.index), tuple(float(x) for x in med.values),
                         note=f"median of {table.shape[1]} logs",
                         runs=tuple(tuple(float(x) for x in table[c]) for c in table.columns)))
    out += _ten_nodes(folder)
    return out


def split_tests(text: str) -> dict[str, str]:
    """nccl-tests output of several tests in one log, by collective (``all_reduce``, ``alltoall``, ...)."""
    parts: dict[str, str] = {}
    name = None
    for line in text.splitlines(keepends=True):
        m = re.match(r"# Collective test starting: (\w+)_perf", line)
        if m:
            name = m.group(1)
        if name is not None:
            parts[name] = parts.get(name, "") + line
    return parts


def _ten_nodes(folder: Path) -> list[Sweep]:
    """The ten-node runs (one log per GPUs-per-node, five collectives each), one process per GPU."""
    out = []
    logs = sorted((folder / "benchmarks").glob("*/nccl-benchmark-results/multi-node/nccl_N*_G*.log"))
    for log in logs:
        m = re.fullmatch(r"nccl_N(\d+)_G(\d+)\.log", log.name)
        cluster = next(p for p in log.parts if p.startswith("example-cluster"))
        if m is None or cluster not in H100_CLUSTERS:
            continue
        nodes, gpn = int(m.group(1)), int(m.group(2))
        prefix, platform = H100_CLUSTERS[cluster]
        for coll, text in sorted(split_tests(log.read_text()).items()):
            sizes, times = parse_nccl_tests(text)
            if coll in OPS and len(sizes):
                out.append(Sweep(f"{prefix}:{nodes}x{gpn}:{coll}", "ten_node" if nodes == 10 else "report", platform,
                                 nodes, gpn, OPS[coll], tuple(int(x) for x in sizes), tuple(float(x) for x in times),
                                 note=log.name))
    return out


def _vtrain(root: Path, stride_mb: int) -> list[Sweep]:
    df = pd.read_csv(root / "vtrain-allreduce-lut" / "allreduce_lut_parsed.csv")
    df = df[(df["size_B"] // MB) % stride_mb == 0]
    out = []
    for (gpu, n), g in df.groupby(["gpu", "nranks"], sort=True):
        g = g.sort_values("size_B")
        platform = "dgx_a100" if gpu == "A100" else "dgx1_v100"
        out.append(Sweep(f"vtrain:{gpu}x{n}:all_reduce", "one_node", platform, 1, int(n), "all_reduce",
                         tuple(int(x) for x in g["size_B"]), tuple(float(x) for x in g["oop_time_us"])))
    return out


def sweeps(root: Path = DATA, vtrain_stride_mb: int = 64) -> list[Sweep]:
    """Every sweep in the data folder, mapped to its platform."""
    if not root.is_dir():
        raise FileNotFoundError(f"no collective measurements at {root}")
    return _published(root) + _h100_cluster(root) + _vtrain(root, vtrain_stride_mb)


def predict(sweep: Sweep, overrides: Sequence[tuple[str, Any]] = ()) -> np.ndarray:
    """Predicted microseconds for every size of ``sweep``."""
    platform, _ = load_platform(sweep.platform, list(sweep.overrides) + list(overrides))
    topo = Topology(platform, sweep.nodes, sweep.gpus_per_node)
    return np.array([simulate_collective(platform, sweep.op, s, topology=topo) * 1e6  # type: ignore[arg-type]
                     for s in sweep.sizes])


def geomean_error(pred: np.ndarray, meas: np.ndarray) -> float:
    """``exp(mean(|ln(pred/meas)|)) - 1``: 0.1 means off by 10% on (geometric) average."""
    if len(pred) == 0:
        return float("nan")
    return float(np.exp(np.mean(np.abs(np.log(np.asarray(pred) / np.asarray(meas))))) - 1)


def score(sweep: Sweep, pred: np.ndarray) -> dict[str, Any]:
    sizes = np.array(sweep.sizes)
    meas = np.array(sweep.measured_us)
    big, small = sizes >= MB, sizes < MB
    row = {"sweep": sweep.name, "category": sweep.category, "platform": sweep.platform, "op": sweep.op,
           "gpus": f"{sweep.nodes}x{sweep.gpus_per_node}", "sizes": len(sizes),
           "err_ge_1MB": geomean_error(pred[big], meas[big]) if big.any() else float("nan"),
           "err_lt_1MB": geomean_error(pred[small], meas[small]) if small.any() else float("nan"),
           "runs": len(sweep.runs) or 1, "run_err_p10": float("nan"), "run_err_p50": float("nan"),
           "run_err_p90": float("nan")}
    if sweep.runs:  # the signed error of each run (node pair): predicted / measured - 1, geometric over sizes
        errs = []
        for run in sweep.runs:
            t = np.array(run)
            ok = big & np.isfinite(t) & (t > 0)
            if ok.any():
                errs.append(float(np.exp(np.mean(np.log(pred[ok] / t[ok])))) - 1)
        if errs:
            for q in (10, 50, 90):
                row[f"run_err_p{q}"] = float(np.quantile(errs, q / 100))
    return row


def validate(root: Path = DATA, vtrain_stride_mb: int = 64) -> pd.DataFrame:
    """One row per sweep with its errors; see the module docstring."""
    return pd.DataFrame([score(s, predict(s)) for s in sweeps(root, vtrain_stride_mb)])


def calibration_holdout(sweep: Sweep) -> dict[str, Any]:
    """Calibrate on every other size of ``sweep`` (:func:`simgpu.comm.calibrate.fit`) and score the
    sizes left out, before and after (``before``, ``after``; ``fit_*``: the sizes fitted on)."""
    sizes, meas = np.array(sweep.sizes), np.array(sweep.measured_us)
    result = fit(sweep.platform, sweep.op, sizes[::2], meas[::2], nodes=sweep.nodes,
                 gpus_per_node=sweep.gpus_per_node, overrides=list(sweep.overrides))
    held = Sweep(sweep.name, sweep.category, sweep.platform, sweep.nodes, sweep.gpus_per_node, sweep.op,
                 tuple(int(x) for x in sizes[1::2]), tuple(float(x) for x in meas[1::2]), sweep.overrides)
    return {"sweep": sweep.name, "category": sweep.category, "held_out": len(held.sizes),
            "fit_before": result.error_before, "fit_after": result.error_after,
            "before": geomean_error(predict(held), meas[1::2]),
            "after": geomean_error(predict(held, list(result.params.items())), meas[1::2]),
            "params": ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in result.params.items())}


def failures(table: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(sweeps above threshold that are not known gaps or got worse, known gaps above threshold)."""
    bad, known = [], []
    for row in table.itertuples():
        big, small = THRESHOLDS[str(row.category)]
        for kind, err, limit in (("ge", row.err_ge_1MB, big), ("lt", row.err_lt_1MB, small)):
            if limit is None or err != err or err <= limit:
                continue
            line = f"{row.sweep}: {err:.1%} {'>=' if kind == 'ge' else '<'} 1 MB (limit {limit:.0%})"
            gap = KNOWN_GAPS.get((str(row.sweep), kind))
            if gap is not None and err <= gap + GAP_SLACK:
                known.append(line)
            else:
                bad.append(line + ("" if gap is None else f", worse than the known {gap:.1%}"))
    return bad, known


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="python -m simgpu.validate.collectives", description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--stride-mb", type=int, default=16, help="vTrain sweeps: every n-th MB size (the tests use 16)")
    ap.add_argument("--csv", help="write the table here")
    ap.add_argument("--calibration", action="store_true",
                    help="instead: calibrate on every other size of each scored sweep, score the rest (minutes)")
    args = ap.parse_args(argv)
    if args.csv:
        check_out_file(args.csv, "--csv")
    if not args.data.is_dir():
        print(f"error: no measurements at {args.data}", file=sys.stderr)
        return 2
    if args.calibration:
        table = pd.DataFrame([calibration_holdout(s) for s in sweeps(args.data, args.stride_mb)
                              if s.category != "report" and len(s.sizes) >= 6])
        summary = [f"{cat:9} sweeps {len(g):3d}  held-out error after calibration: median {g['after'].median():.1%}, "
                   f"within 8% {int((g['after'] <= 0.08).sum())} of {len(g)}" for cat, g in table.groupby("category")]
    else:
        table = validate(args.data, args.stride_mb)
        summary = [f"{cat:9} sweeps {len(g):3d}  median error >=1MB {g['err_ge_1MB'].median():.1%}  "
                   f"<1MB {g['err_lt_1MB'].median():.1%}" for cat, g in table.groupby("category")]
    with pd.option_context("display.width", 200, "display.max_rows", 200, "display.max_colwidth", 120,
                           "display.float_format", "{:.1%}".format):
        print(table.to_string(index=False))
    print("\n".join(summary))
    if args.csv:
        table.to_csv(args.csv, index=False)
    if args.calibration:
        return 0
    bad, known = failures(table)
    if known:
        print("\n".join(["known gaps (above threshold, not worse than recorded):"] + known))
    print("\n".join(["above threshold:"] + bad) if bad else "no sweep is above its threshold beyond the known gaps")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
