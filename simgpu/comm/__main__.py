"""``python -m simgpu.comm``: an nccl-tests view of the simulated collectives.

Prints one row per size with ``size(B) time(us) algbw(GB/s) busbw(GB/s)``, as nccl-tests does, so
predictions can be set beside measurements. Sizes: ``8B:16GB`` (doubling), ``1MB,64MB`` or ``4096``.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from pathlib import Path

from ..cli import ArgParser, Progress, check_out_dir, check_out_file, entry, int_at_least, run_command
from ..config.platform import PlatformSpec
from ..errors import ConfigError
from ..platform.topology import Topology
from .channels import communicator
from .tuning import estimates, rule_set

UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20, "MIB": 2**20,
         "G": 2**30, "GB": 2**30, "GIB": 2**30, "T": 2**40, "TB": 2**40}
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send_recv")
#: nccl-tests' names (its binaries without ``_perf``) for the collectives whose names differ
ALIASES = {"alltoall": "all_to_all", "sendrecv": "send_recv"}


def parse_op(text: str) -> str:
    """A collective by simgpu's name or nccl-tests' (``alltoall``, ``sendrecv``, ``all_reduce_perf``)."""
    name = text.strip().lower().removesuffix("_perf")
    name = ALIASES.get(name, name)
    if name not in OPS:
        raise ConfigError(f"expected --op one of {', '.join(OPS)} (or nccl-tests' {', '.join(ALIASES)}), "
                          f"got {text!r}", key="--op")
    return name


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
    ap.add_argument("--op", default="all_reduce", help=f"{', '.join(OPS)}; or nccl-tests' names "
                    f"({', '.join(ALIASES)}, all_reduce_perf, ...)")
    ap.add_argument("--sizes", default="8B:1GB", help="e.g. 8B:16GB, 1MB,64MB or 4096")
    ap.add_argument("--algorithm", default="auto", choices=("auto", "ring", "tree", "nvls", "pat", "collnet", "direct"),
                    help="auto, ring, tree, nvls, pat, collnet or direct")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a platform key, e.g. network.nic_gbps=800")
    ap.add_argument("--csv", nargs="?", const="", metavar="PATH",
                    help="also write the rows to this CSV file (no PATH: out/comm/<platform>_<op>_<nodes>n.csv)")
    ap.add_argument("--explain", action="store_true",
                    help="per size, the algorithm, protocol and channels chosen and why (as NCCL_DEBUG_SUBSYS=TUNING)")
    args = ap.parse_args(argv)
    args.op = parse_op(args.op)
    from ..collective_run import simulate_collective
    from ..config.checks import check_network, check_world
    from ..config.loader import load_platform, platform_overrides
    from .collective import bus_bandwidth, caveats, layout

    if args.csv == "":
        from ..cli import safe_name

        folder = check_out_dir(Path("out") / "comm", "--csv")
        args.csv = str(folder / f"{safe_name(Path(args.platform).stem)}_{args.op}_{args.nodes}n.csv")
    elif args.csv:
        check_out_file(args.csv, "--csv")
    sizes = parse_sizes(args.sizes)
    over = platform_overrides(args.overrides)
    platform, platform_file = load_platform(args.platform, over)
    gpn = layout(platform, args.nodes, args.gpus_per_node)
    check_world(args.nodes, gpn, key="--nodes")
    check_network(platform, args.nodes, file=platform_file)
    topo = Topology(platform, args.nodes, gpn)
    n = 2 if args.op == "send_recv" else topo.world
    rows = []
    explained: list[str] = []
    with Progress() as progress:
        for i, size in enumerate(sizes):
            progress.set(f"size {i + 1} of {len(sizes)}")
            try:
                t = simulate_collective(platform, args.op, size, algorithm=args.algorithm, topology=topo)
            except ValueError as e:
                raise ConfigError(str(e), key="--algorithm") from None
            alg, bus = bus_bandwidth(args.op, n, size, t)
            rows.append((size, t * 1e6, alg, bus))
            if args.explain:
                explained += explain(platform, topo, args.op, size, args.algorithm)
    print(f"# {args.op} on {platform.name}: {args.nodes} node(s) x {gpn} GPUs, algorithm {args.algorithm}")
    for line in caveats(topo, args.op):
        print(f"# note: {line}")
    print(f"{'size(B)':>14} {'time(us)':>12} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}")
    for size, us, alg, bus in rows:
        print(f"{size:>14d} {us:>12.2f} {alg:>12.2f} {bus:>12.2f}")
    for line in explained:
        print(line)
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["size(B)", "time(us)", "algbw(GB/s)", "busbw(GB/s)"])
            w.writerows((s, f"{us:.3f}", f"{a:.4f}", f"{b:.4f}") for s, us, a, b in rows)
    return 0


def explain(platform: PlatformSpec, topo: Topology, op: str, size: int, algorithm: str) -> list[str]:
    """Lines saying how ``op`` of ``size`` bytes is planned: NCCL's tuning model's estimate of every
    (algorithm, protocol) it weighs, its pick and channels (as ``NCCL_DEBUG_SUBSYS=TUNING`` prints
    them), and the plan the simulation runs with its isolated time."""
    from .collective import request
    from .planner import Planner

    planner = Planner(topo, platform.collectives, algorithm)
    req = request(op, size, topo)
    plan = planner.plan(req)
    nodes = len({topo.node_of(r) for r in req.group})
    out = [f"# {op} {size} B: {len(req.group)} ranks on {nodes} node(s), NCCL {platform.collectives.nccl_version} "
           f"rules ({rule_set(platform.collectives.nccl_version)}), tuner {platform.collectives.tuner}"]
    ch = communicator(platform, len(req.group), nodes)
    out.append(f"#   channels    search {ch.search.channels} x {ch.search.bw_intra:g}/{ch.search.bw_inter:g} GB/s "
               f"({ch.rings} before duplication), collectives {ch.collective}, NVLS {ch.nvls}, CollNet chain "
               f"{ch.collnet_chain} / direct {ch.collnet_direct}, p2p {ch.p2p}"
               + (f", {ch.net_peer} per network peer" if nodes > 1 else ""))
    est = estimates(platform, topo, op, size, len(req.group), nodes, platform.collectives.usable_protocols())
    if est:
        out.append("#   NCCL model  " + "  ".join(
            f"{c.algorithm}/{c.protocol} {c.latency_us:.1f}us+{c.bandwidth_gbps:.1f}GB/s={c.time_us:.1f}us"
            for c in est))
        best = min(est, key=lambda c: c.time_us)
        used = planner.nccl_choice(req) is not None and algorithm == "auto"
        out.append(f"#   NCCL picks  {best.algorithm}/{best.protocol} on {best.channels} channels"
                   + ("" if used else " (not followed: " + ("one node, the fastest in isolation)" if nodes < 2 else
                                                           "tuner isolated or algorithm forced)")))
    why = "forced" if algorithm != "auto" else "fastest protocol in isolation" if est else "fastest in isolation"
    out.append(f"#   simulated   {plan.algorithm}/{plan.protocol or '-'} ({why}), {len(plan.transfers)} transfers, "
               f"latency {plan.latency_s * 1e6:.1f}us, alone {plan.isolated_time(topo) * 1e6:.1f}us")
    return out


if __name__ == "__main__":
    entry(main)
