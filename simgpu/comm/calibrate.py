"""Calibrating a platform's link parameters from the user's own nccl-tests measurements.

``python -m simgpu.comm.calibrate --platform P --nodes N results.log`` reads nccl-tests output
(the data rows: size, count, type, redop, root, time, algbw, busbw, ...), finds which class of link
bounds the measured collective (the network across nodes, else NVLink, else PCIe), fits that
class's achievable bandwidth fraction and one-way latency to the measured times (least squares
on log time), prints the error before and after, and writes the platform file with the fitted
values (``--out``; the original is left alone unless ``--out`` names it).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..config.loader import load_platform, platform_path
from ..config.platform import PlatformSpec
from ..errors import ConfigError, SimgpuError
from ..platform.topology import Topology
from .collective import request, simulate_collective
from .planner import Planner

SEARCH_SIZES = 12
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")


def parse_nccl_tests(text: str) -> tuple[np.ndarray, np.ndarray]:
    """(sizes in bytes, out-of-place times in us) of the data rows of nccl-tests output."""
    sizes, times = [], []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        m = ROW.match(line)
        if m and float(m.group(6)) > 0:
            sizes.append(int(m.group(1)))
            times.append(float(m.group(6)))
    return np.array(sizes, dtype=np.int64), np.array(times)


@dataclass(frozen=True)
class Fit:
    """The fitted parameters (dotted platform keys -> values) and the errors before and after."""

    params: dict[str, float]
    error_before: float
    error_after: float


def bottleneck_keys(platform: PlatformSpec, nodes: int) -> tuple[str, str]:
    """The (efficiency, latency) keys of the link class that bounds a collective."""
    if nodes > 1:
        return "network.efficiency", "network.latency_us"
    if platform.node.nvlink is not None:
        return "node.nvlink.efficiency", "node.nvlink.latency_us"
    return "node.pcie.efficiency", "node.pcie.latency_us"


def _error(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.exp(np.mean(np.abs(np.log(pred / meas)))) - 1)


def fit(platform_ref: str, op: str, sizes: np.ndarray, times_us: np.ndarray, *, nodes: int = 1,
        gpus_per_node: int | None = None) -> Fit:
    """Fit the bounding link class's efficiency and latency to measured ``times_us``."""
    base, _ = load_platform(platform_ref)
    eff_key, lat_key = bottleneck_keys(base, nodes)

    def predict(eff: float, lat: float, exact: bool = False, subset: np.ndarray | None = None) -> np.ndarray:
        p, _ = load_platform(platform_ref, [(eff_key, eff), (lat_key, lat)])
        topo = Topology(p, nodes, gpus_per_node)
        if exact:
            return np.array([simulate_collective(p, op, int(s), topology=topo) for s in sizes]) * 1e6  # type: ignore[arg-type]
        # the search uses each plan's time alone on the network: the engine's answer for one
        # collective, without its events
        planner = Planner(topo, p.collectives)
        chosen = sizes if subset is None else sizes[subset]
        return np.array([planner.plan(request(op, int(s), topo)).isolated_time(topo) for s in chosen]) * 1e6

    # the search looks at up to SEARCH_SIZES sizes spread evenly in log size
    pick = np.unique(np.linspace(0, len(sizes) - 1, min(len(sizes), SEARCH_SIZES)).round().astype(int))

    def loss(x: tuple[float, float]) -> float:
        return float(np.mean(np.abs(np.log(predict(*x, subset=pick) / times_us[pick]))))

    start = (_get(base, eff_key), _get(base, lat_key))
    before = _error(predict(*start, exact=True), times_us)
    # a coarse grid (efficiency geometric, latency linear), then two finer grids around the best
    effs = np.geomspace(0.25, 1.0, 7)
    lats = np.linspace(0.0, max(4 * start[1], 40.0), 7)
    x = min([start] + [(e, la) for e in effs for la in lats], key=loss)
    for _ in range(3):
        de, dl = (effs[1] / effs[0]) ** 0.5, (lats[1] - lats[0]) / 2
        effs = np.clip(x[0] * de ** np.linspace(-1, 1, 3), 0.02, 1.0)
        lats = np.clip(x[1] + dl * np.linspace(-1, 1, 3), 0.0, None)
        x = min(((e, la) for e in effs for la in lats), key=loss)
    after = _error(predict(x[0], x[1], exact=True), times_us)
    if after > before:  # the search's shortcut misled it: keep what the platform had
        x, after = start, before
    return Fit({eff_key: round(float(x[0]), 4), lat_key: round(float(x[1]), 3)}, before, after)


def _get(spec: PlatformSpec, dotted: str) -> float:
    cur: Any = spec
    for part in dotted.split("."):
        cur = getattr(cur, part)
    return float(cur)


def write_platform(platform_ref: str, params: dict[str, float], out: Path) -> None:
    """The platform's YAML with ``params`` set, written to ``out``."""
    data = yaml.safe_load(platform_path(platform_ref).read_text())
    for dotted, value in params.items():
        cur = data
        *head, last = dotted.split(".")
        for h in head:
            cur = cur[h]
        cur[last] = value
    out.write_text("# calibrated by python -m simgpu.comm.calibrate from nccl-tests measurements\n"
                   + yaml.safe_dump(data, sort_keys=False))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simgpu.comm.calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("measurements", help="nccl-tests output (text)")
    ap.add_argument("--platform", required=True)
    ap.add_argument("--op", default="all_reduce",
                    choices=("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
                             "send_recv"))
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--gpus-per-node", type=int)
    ap.add_argument("--out", type=Path, help="write the calibrated platform here")
    args = ap.parse_args(argv)
    try:
        path = Path(args.measurements)
        if not path.is_file():
            raise ConfigError("measurements file not found", file=str(path))
        sizes, times = parse_nccl_tests(path.read_text())
        if len(sizes) < 3:
            raise ConfigError("expected at least 3 nccl-tests data rows (size count type redop root time ...)",
                              file=str(path))
        result = fit(args.platform, args.op, sizes, times, nodes=args.nodes, gpus_per_node=args.gpus_per_node)
        if args.out:
            write_platform(args.platform, result.params, args.out)
    except SimgpuError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{len(sizes)} sizes, {args.op} on {args.platform} ({args.nodes} node(s))")
    for k, v in result.params.items():
        print(f"  {k} = {v}")
    print(f"geomean error before {result.error_before:.1%}, after {result.error_after:.1%}")
    if args.out:
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
