"""``python -m simgpu.comm``: an nccl-tests view of the simulated collectives.

Prints one row per size with ``size(B) time(us) algbw(GB/s) busbw(GB/s)``, as nccl-tests does, so
predictions can be set beside measurements. Sizes: ``8B:16GB`` (doubling), ``1MB,64MB`` or ``4096``.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections.abc import Sequence

from ..errors import ConfigError, SimgpuError

UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20, "MIB": 2**20,
         "G": 2**30, "GB": 2**30, "GIB": 2**30, "T": 2**40, "TB": 2**40}
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send_recv")


def parse_size(text: str) -> int:
    """``4096``, ``8B``, ``64K``, ``1MB``, ``16GB`` (binary units, as nccl-tests' -b/-e)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in UNITS:
        raise ConfigError(f"expected a size such as 4096, 8B, 64KB, 1MB or 16GB, got {text!r}", key="--sizes")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])


def parse_sizes(text: str) -> list[int]:
    """A list (``a,b``), a doubling range (``a:b``), or one size."""
    out: list[int] = []
    for part in text.split(","):
        if ":" in part:
            lo, hi = (parse_size(x) for x in part.split(":", 1))
            if lo <= 0 or hi < lo:
                raise ConfigError(f"expected a range low:high with 0 < low <= high, got {part!r}", key="--sizes")
            s = lo
            while s <= hi:
                out.append(s)
                s *= 2
        else:
            out.append(parse_size(part))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simgpu.comm", description=__doc__.splitlines()[0])
    ap.add_argument("--platform", required=True, help="platform name or YAML path")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--gpus-per-node", type=int, default=None)
    ap.add_argument("--op", choices=OPS, default="all_reduce")
    ap.add_argument("--sizes", default="8B:1GB", help="e.g. 8B:16GB, 1MB,64MB or 4096")
    ap.add_argument("--algorithm", default="auto", help="auto, ring, tree or direct")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a platform key, e.g. network.nic_gbps=800")
    ap.add_argument("--csv", help="also write the rows to this CSV file")
    args = ap.parse_args(argv)
    try:
        from ..config.loader import load_platform, parse_override
        from ..platform.topology import Topology
        from .collective import bus_bandwidth, caveats, layout, simulate_collective

        over = [parse_override(o) for o in args.overrides]
        over = [(k.removeprefix("platform."), v) for k, v in over]
        platform, _ = load_platform(args.platform, over)
        gpn = layout(platform, args.nodes, args.gpus_per_node)
        sizes = parse_sizes(args.sizes)
        topo = Topology(platform, args.nodes, gpn)
        n = 2 if args.op == "send_recv" else topo.world
        rows = []
        for size in sizes:
            t = simulate_collective(platform, args.op, size, algorithm=args.algorithm, topology=topo)
            alg, bus = bus_bandwidth(args.op, n, size, t)
            rows.append((size, t * 1e6, alg, bus))
    except (SimgpuError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"# {args.op} on {platform.name}: {args.nodes} node(s) x {gpn} GPUs, algorithm {args.algorithm}")
    for line in caveats(topo, args.op):
        print(f"# note: {line}")
    print(f"{'size(B)':>14} {'time(us)':>12} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}")
    for size, us, alg, bus in rows:
        print(f"{size:>14d} {us:>12.2f} {alg:>12.2f} {bus:>12.2f}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["size(B)", "time(us)", "algbw(GB/s)", "busbw(GB/s)"])
            w.writerows((s, f"{us:.3f}", f"{a:.4f}", f"{b:.4f}") for s, us, a, b in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
