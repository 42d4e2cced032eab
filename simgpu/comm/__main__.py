"""``python -m simgpu.comm``: an nccl-tests view of the simulated collectives.

Prints one row per size with ``size(B) time(us) algbw(GB/s) busbw(GB/s)``, as nccl-tests does, so
predictions can be set beside measurements. Sizes: ``8B:16GB`` (doubling), ``1MB,64MB`` or ``4096``.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence

from ..cli import ArgParser, Progress, check_out_file, entry, int_at_least, run_command
from ..errors import ConfigError

UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20, "MIB": 2**20,
         "G": 2**30, "GB": 2**30, "GIB": 2**30, "T": 2**40, "TB": 2**40}
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send_recv")


#: The largest message simulated (1 TiB): beyond it no collective has been measured.
MAX_SIZE = 2**40


def parse_size(text: str) -> int:
    """``4096``, ``8B``, ``64K``, ``1MB``, ``16GB`` (binary units, as nccl-tests' -b/-e), or ``1.5MB``
    where that is a whole number of bytes; 1 byte to :data:`MAX_SIZE`."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in UNITS:
        raise ConfigError(f"expected a size such as 4096, 8B, 64KB, 1MB or 16GB, got {text!r}", key="--sizes")
    value = float(m.group(1)) * UNITS[m.group(2).upper()]
    if value != int(value):
        raise ConfigError(f"expected a whole number of bytes, got {text!r} = {value:g} bytes", key="--sizes")
    if not 1 <= value <= MAX_SIZE:
        raise ConfigError(f"expected a size from 1 byte to 1 TiB, got {text!r}", key="--sizes")
    return int(value)


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
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="simgpu comm", description=__doc__.splitlines()[0])
    ap.add_argument("--platform", required=True, help="platform name or YAML path")
    ap.add_argument("--nodes", type=int_at_least(1), default=1)
    ap.add_argument("--gpus-per-node", type=int_at_least(1), default=None)
    ap.add_argument("--op", choices=OPS, default="all_reduce")
    ap.add_argument("--sizes", default="8B:1GB", help="e.g. 8B:16GB, 1MB,64MB or 4096")
    ap.add_argument("--algorithm", default="auto", choices=("auto", "ring", "tree", "nvls", "direct"),
                    help="auto, ring, tree, nvls or direct")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a platform key, e.g. network.nic_gbps=800")
    ap.add_argument("--csv", help="also write the rows to this CSV file")
    args = ap.parse_args(argv)
    from ..config.checks import check_world
    from ..config.loader import load_platform, parse_override
    from ..platform.topology import Topology
    from .collective import bus_bandwidth, caveats, layout, simulate_collective

    if args.csv:
        check_out_file(args.csv, "--csv")
    sizes = parse_sizes(args.sizes)
    over = [parse_override(o) for o in args.overrides]
    over = [(k.removeprefix("platform."), v) for k, v in over]
    platform, _ = load_platform(args.platform, over)
    gpn = layout(platform, args.nodes, args.gpus_per_node)
    check_world(args.nodes, gpn, key="--nodes")
    topo = Topology(platform, args.nodes, gpn)
    n = 2 if args.op == "send_recv" else topo.world
    rows = []
    with Progress() as progress:
        for i, size in enumerate(sizes):
            progress.set(f"size {i + 1} of {len(sizes)}")
            try:
                t = simulate_collective(platform, args.op, size, algorithm=args.algorithm, topology=topo)
            except ValueError as e:
                raise ConfigError(str(e), key="--algorithm") from None
            alg, bus = bus_bandwidth(args.op, n, size, t)
            rows.append((size, t * 1e6, alg, bus))
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
    entry(main)
