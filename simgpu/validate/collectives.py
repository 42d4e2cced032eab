"""Collective predictions against nccl-tests measurements in ``../shared/data/collectives/``.

Every sweep there (one source, collective, GPU count and node count over message sizes) is mapped
to a platform file that describes that machine from datasheet figures, simulated size by size,
and scored by the geometric-mean absolute error of time: ``exp(mean(|ln(predicted/measured)|)) - 1``,
separately for messages of at least 1 MB and below. ``python -m simgpu.validate.collectives``
prints the table; the tests enforce the thresholds per category.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..comm.calibrate import fit
from ..comm.collective import simulate_collective
from ..config.loader import load_platform
from ..platform.topology import Topology

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "collectives"
MB = 1 << 20
#: Thresholds per category (fraction), for >= 1 MB and < 1 MB (None: reported only).
THRESHOLDS: dict[str, tuple[float | None, float | None]] = {
    "one_node": (0.15, None), "two_node": (0.20, 0.35), "pcie": (0.20, None), "report": (None, None)}
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


def _h100_cluster(root: Path) -> list[Sweep]:
    df = pd.read_csv(root / "nccl-tests-h100-cluster" / "parsed_nccl_tests.csv")
    df = df[df["oop_time_us"] > 0]
    out = []
    for (coll, nranks, nnodes), g in df.groupby(["collective", "nranks", "nnodes"], sort=True):
        gpn = int(nranks) // int(nnodes)
        # node pairs and repeated runs: the median time per size
        med = g.groupby("size_B")["oop_time_us"].median().sort_index()
        spread = g.groupby("size_B")["oop_time_us"].agg(lambda s: s.quantile(0.9) / s.quantile(0.1)).max()
        # the cluster's NIC is not stated: its two-node sweeps are reported, not scored
        category = "one_node" if nnodes == 1 else "report"
        out.append(Sweep(f"h100-cluster:{nnodes}x{gpn}:{coll}", category, "dgx_h100", int(nnodes), gpn, OPS[str(coll)],
                         tuple(int(x) for x in med.index), tuple(float(x) for x in med.values),
                         note=f"median of {g['path'].nunique()} logs; p90/p10 up to {spread:.2f}"))
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
    return {"sweep": sweep.name, "category": sweep.category, "platform": sweep.platform, "op": sweep.op,
            "gpus": f"{sweep.nodes}x{sweep.gpus_per_node}", "sizes": len(sizes),
            "err_ge_1MB": geomean_error(pred[big], meas[big]) if big.any() else float("nan"),
            "err_lt_1MB": geomean_error(pred[small], meas[small]) if small.any() else float("nan")}


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
            "params": ", ".join(f"{k}={v:g}" for k, v in result.params.items())}


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
    ap = argparse.ArgumentParser(prog="python -m simgpu.validate.collectives", description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--stride-mb", type=int, default=16, help="vTrain sweeps: every n-th MB size (the tests use 16)")
    ap.add_argument("--csv", help="write the table here")
    ap.add_argument("--calibration", action="store_true",
                    help="instead: calibrate on every other size of each scored sweep, score the rest (minutes)")
    args = ap.parse_args(argv)
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
