"""``python -m simgpu.run workload.yaml``: simulate one iteration, print a summary, write outputs."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .errors import SimgpuError


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="simgpu run", description="Simulate one training iteration of a workload.")
    ap.add_argument("workload", help="workload YAML file (see workloads/)")
    ap.add_argument("--out", help="output folder (default: out/<workload name>)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key: platform.network.nic_gbps=800, training.batch_per_gpu=8, ...")
    ap.add_argument("--seed", type=int, help="the run's seed (overrides the workload's)")
    ap.add_argument("--links", action="store_true", help="record link busy intervals and draw them")
    ap.add_argument("--format", choices=("csv", "parquet"), default="csv", help="records file format")
    ap.add_argument("--quiet", action="store_true", help="print only the iteration time")
    ap.add_argument("--no-fold", action="store_true",
                    help="simulate every rank, even where identical ranks could be simulated once")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        from .config.loader import load_job
        from .report import format_summary, summarize, write_outputs
        from .sim import simulate

        overrides = list(args.overrides) + ([f"seed={args.seed}"] if args.seed is not None else [])
        job = load_job(args.workload, overrides)
        t0 = time.perf_counter()
        result = simulate(job, record_links=args.links, fold=not args.no_fold)
        wall = time.perf_counter() - t0
        out = Path(args.out) if args.out else Path("out") / job.workload.name
        paths = write_outputs(result, out, links=args.links, records_format=args.format)
    except SimgpuError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.quiet:
        print(f"{result.iteration_time_s * 1e3:.3f} ms")
        return 0
    print(format_summary(summarize(result)))
    print(f"\nsimulated {result.events:,} events in {wall:.2f} s; wrote "
          + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
