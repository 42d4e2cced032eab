"""How often the predicted 80% interval holds the measured value: coverage per validation set.

Two sets so far. The vTrain single-node iterations (:mod:`simgpu.validate.iterations`): each row's
interval is P10 to P90 of ``--uncertainty`` draws through the engine (:func:`simgpu.uncertainty.propagate`).
The nccl-tests collectives (:mod:`simgpu.validate.collectives`): a sweep's one source is its fabric,
so P10 and P90 are the sweep simulated with the fabric's factor at ``z = -1.2816`` and ``+1.2816``
(the lower and the higher of the two: where NCCL's tuning picks another algorithm, the time need
not rise with the factor). A good interval holds 70-90% of the measured values
(:data:`LOW`, :data:`HIGH`) and is no wider than it must be (the median P90 / P10 is reported).
``--fabrics`` prints the collective spreads of :data:`simgpu.uncertainty.sources.FABRIC_SIGMA` from the
validation's residuals.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..cli import ArgParser, run_command
from ..config.loader import load_platform
from ..uncertainty import Spread, propagate, spread
from ..uncertainty.sources import Z90
from . import collectives as vc
from . import iterations as vi

#: The share of measured values an 80% interval must hold on each set.
LOW, HIGH = 0.70, 0.90
#: The fabric each category of collective sweeps measures.
FABRIC_OF = {"one_node": "nvlink", "pcie": "pcie", "two_node": "network", "pairwise": "network",
             "ten_node": "network"}
#: Draws per vTrain row.
DRAWS = 16


def _fabric(sweep: vc.Sweep) -> str:
    """The fabric of ``sweep`` (a one-node sweep with NVLink switched off runs on PCIe)."""
    fabric = FABRIC_OF[sweep.category]
    if fabric == "nvlink" and ("node.nvlink", None) in sweep.overrides:
        return "pcie"
    return fabric


def collective_points(root: Path = vc.DATA, stride_mb: int = 16) -> pd.DataFrame:
    """Every scored nccl-tests point: sweep, category, fabric, size, predicted and measured us."""
    rows = []
    for s in vc.sweeps(root, stride_mb):
        if s.category not in FABRIC_OF:
            continue
        for size, pred, meas in zip(s.sizes, vc.predict(s), s.measured_us, strict=True):
            rows.append((s.name, s.category, _fabric(s), size, pred, meas))
    return pd.DataFrame(rows, columns=["sweep", "category", "fabric", "size_B", "predicted_us", "measured_us"])


def fabric_spread(points: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """Per fabric, ``(sigma >= 1 MiB, sigma < 1 MiB)``: the 80th percentile of ``|ln(pred / meas)|``
    over its points of that size over ``Z90`` (a symmetric interval of that half-width holds 80% of
    them); a bucket of fewer than 10 points takes the network's."""
    e = np.abs(np.log(points["predicted_us"] / points["measured_us"]))
    big = points["size_B"] >= vc.MB
    out: dict[str, list[float]] = {}
    for fabric in ("network", "nvlink", "pcie"):
        mine = points["fabric"] == fabric
        out[fabric] = []
        for bucket in (big, ~big):
            sel = e[mine & bucket]
            if len(sel) >= 10:
                out[fabric].append(round(float(np.quantile(sel, 0.8)) / Z90, 3))
            else:
                out[fabric].append(out["network"][len(out[fabric])])
    return {k: (v[0], v[1]) for k, v in out.items()}


def _scaled(sweep: vc.Sweep, fabric: str, sp: Spread, z: float) -> list[tuple[str, Any]]:
    """Overrides that scale ``fabric`` of ``sweep``'s platform by its factors at ``z``."""
    platform, _ = load_platform(sweep.platform, list(sweep.overrides))
    big, small = sp.collective(fabric)
    b, lat = float(np.exp(big * z)), float(np.exp(small * z))
    if fabric == "nvlink" and platform.node.nvlink is not None:
        nv = platform.node.nvlink
        return [("node.nvlink.gbytes_per_s", nv.gbytes_per_s / b), ("node.nvlink.latency_us", nv.latency_us * lat)]
    if fabric == "network":
        return [("network.nic_gbps", platform.network.nic_gbps / b),
                ("network.latency_us", platform.network.latency_us * lat)]
    pcie = platform.node.pcie
    out: list[tuple[str, Any]] = [("node.pcie.gbytes_per_s", pcie.gbytes_per_s / b),
                                  ("node.pcie.latency_us", pcie.latency_us * lat)]
    if pcie.staged_gbytes_per_s is not None:
        out.append(("node.pcie.staged_gbytes_per_s", pcie.staged_gbytes_per_s / b))
    return out


def collective_coverage(root: Path = vc.DATA, sp: Spread | None = None, stride_mb: int = 16) -> pd.DataFrame:
    """Every scored nccl-tests point with its P10 and P90 (us) and whether the measured time is inside."""
    sp = sp or Spread()
    rows = []
    for s in vc.sweeps(root, stride_mb):
        if s.category not in FABRIC_OF:
            continue
        fabric = _fabric(s)
        a, b = vc.predict(s, _scaled(s, fabric, sp, -Z90)), vc.predict(s, _scaled(s, fabric, sp, Z90))
        lo, hi = np.minimum(a, b), np.maximum(a, b)  # auto's algorithm may change with the factor
        for size, p10, p90, meas in zip(s.sizes, lo, hi, s.measured_us, strict=True):
            rows.append((s.name, s.category, fabric, size, p10, p90, meas))
    df = pd.DataFrame(rows, columns=["sweep", "category", "fabric", "size_B", "p10_us", "p90_us", "measured_us"])
    df["inside"] = (df["measured_us"] >= df["p10_us"]) & (df["measured_us"] <= df["p90_us"])
    return df


def _draws(args: tuple[dict[str, Any], int, float | None]) -> tuple[float, float, float, float]:
    """Point, P10, P50 and P90 (ms) of one vTrain row's workload, with a kernel scale (None: the shipped one)."""
    data, draws, kernel_scale = args
    job = vi._job(data, vi.PLATFORM)
    sp = spread(job.platform)
    if kernel_scale is not None:
        sp = sp.scaled(kernel=kernel_scale)
    point, u = propagate(job, draws, spread=sp)
    q = u.quantiles_s()
    return point.iteration_time_s * 1e3, q[10] * 1e3, q[50] * 1e3, q[90] * 1e3


def iteration_coverage(cases: pd.DataFrame, draws: int = DRAWS, kernel_scale: float | None = None,
                       workers: int | None = None) -> pd.DataFrame:
    """``cases`` (vTrain rows) with ``predicted_ms``, ``p10_ms``, ``p50_ms``, ``p90_ms`` and ``inside``."""
    jobs = [(vi.workload(r), draws, kernel_scale) for r in cases.itertuples()]
    got = vi.simulate_all(_draws, jobs, workers)
    out = cases.copy()
    for i, name in enumerate(("predicted_ms", "p10_ms", "p50_ms", "p90_ms")):
        out[name] = [g[i] for g in got]
    out["inside"] = (out["measured_ms"] >= out["p10_ms"]) & (out["measured_ms"] <= out["p90_ms"])
    return out


def scores(df: pd.DataFrame, lo: str, hi: str) -> dict[str, float]:
    """Coverage (share inside), median P90 / P10, and the shares below and above the interval."""
    meas = df["measured_ms" if "measured_ms" in df else "measured_us"]
    return {"points": float(len(df)), "coverage": float(df["inside"].mean()),
            "below": float((meas < df[lo]).mean()), "above": float((meas > df[hi]).mean()),
            "median_p90_over_p10": float((df[hi] / df[lo]).median())}


def _line(name: str, s: dict[str, float]) -> str:
    return (f"{name:<22} points {s['points']:5.0f}  coverage {s['coverage']:6.1%}  (below {s['below']:5.1%}, above "
            f"{s['above']:5.1%})  median P90/P10 {s['median_p90_over_p10']:.3f}")


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="python -m simgpu.validate.coverage", description=__doc__.split("\n")[0])
    ap.add_argument("--set", choices=("vtrain", "collectives", "splitwise"), action="append",
                    help="the sets to score (default vtrain and collectives)")
    ap.add_argument("--sample", type=int, default=1, help="vTrain rows per (GPUs, tp, pp, micro-batch) stratum "
                    "(default 1; 0: every row)")
    ap.add_argument("--draws", type=int, default=DRAWS, help=f"draws per vTrain row (default {DRAWS})")
    ap.add_argument("--kernel-scale", type=float, help="the kernels' calibration scale (default: the shipped one)")
    ap.add_argument("--fabrics", action="store_true", help="instead, print the collective spread per fabric")
    ap.add_argument("--workers", type=int)
    args = ap.parse_args(argv)
    if not vc.DATA.is_dir() or not (vi.DATA / vi.CSV).is_file():
        print(f"error: measurements not found under {vc.DATA.parent}", file=sys.stderr)
        return 2
    if args.fabrics:
        for fabric, (big, small) in fabric_spread(collective_points()).items():
            print(f"{fabric:<8} sigma >= 1 MiB {big:.3f}   < 1 MiB {small:.3f}")
        return 0
    sets = args.set or ["vtrain", "collectives"]
    if "vtrain" in sets:
        cases = vi.load_cases()
        if args.sample:
            cases = vi.stratified_sample(cases, args.sample)
        scale = Spread().scales["kernel"] if args.kernel_scale is None else args.kernel_scale
        df = iteration_coverage(cases, args.draws, args.kernel_scale, args.workers)
        print(_line(f"vtrain (kernel x{scale:g})", scores(df, "p10_ms", "p90_ms")))
        point_err = float(np.expm1(np.mean(np.abs(np.log(df["predicted_ms"] / df["measured_ms"])))))
        print(f"{'':<22} point geomean |error| {point_err:.1%}")
    if "splitwise" in sets:
        from ..kernels.importers import data_root
        from .coverage_serving import splitwise_coverage

        df = splitwise_coverage(data_root(), args.draws)
        print(_line("splitwise", scores(df, "p10_ms", "p90_ms")))
        for what, g in df.groupby("what"):
            print(_line(f"  {what}", scores(g, "p10_ms", "p90_ms")))
    if "collectives" in sets:
        df = collective_coverage()
        print(_line("collectives", scores(df, "p10_us", "p90_us")))
        for fabric, g in df.groupby("fabric"):
            print(_line(f"  {fabric}", scores(g, "p10_us", "p90_us")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
