"""``simgpu run workload.yaml``: simulate one iteration, print a summary, write outputs.

The output folder is ``--out``, else ``out/<workload name>``, and a run with ``--set`` overrides
gets its own folder inside it, named after the overrides (``out/<name>/network.nic_gbps=800``), so
a what-if never writes over its baseline. ``--no-trace``, ``--records none`` and ``--trace-window``
keep the files of a big run small.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from .cli import ArgParser, Progress, check_out_dir, entry, int_at_least, run_command, safe_name
from .errors import ConfigError


def window(text: str) -> tuple[float, float]:
    """``START:END`` in milliseconds (either may be empty: from the start, to the end)."""
    lo, sep, hi = text.partition(":")
    try:
        if not sep:
            raise ValueError
        a = float(lo) if lo.strip() else 0.0
        b = float(hi) if hi.strip() else float("inf")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START:END in ms (e.g. 0:5 or 10:), got {text!r}") from None
    if not (a >= 0 and b > a):
        raise argparse.ArgumentTypeError(f"expected 0 <= START < END, got {text!r}")
    return a * 1e-3, b * 1e-3


def parser() -> ArgParser:
    ap = ArgParser(prog="simgpu run", description="Simulate one training iteration of a workload.")
    ap.add_argument("workload", help="workload YAML file (see workloads/)")
    ap.add_argument("--out", help="output folder (default: out/<workload name>, and with --set a folder inside "
                    "it named after the overrides)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key: platform.network.nic_gbps=800, training.batch_per_gpu=8, ...")
    ap.add_argument("--seed", type=int, help="seed of the run's random generator: the DLRM tables drawn by "
                    "model.generate and their id distributions (overrides the workload's seed)")
    ap.add_argument("--links", action="store_true", help="record link busy intervals and draw them")
    ap.add_argument("--records", choices=("csv", "parquet", "none"), help="records file format, or none (default csv)")
    ap.add_argument("--format", choices=("csv", "parquet"), help=argparse.SUPPRESS)  # the older name of --records
    ap.add_argument("--no-trace", action="store_true", help="do not write trace.json")
    ap.add_argument("--trace-window", type=window, metavar="START:END",
                    help="write only the intervals overlapping this window (ms) to trace.json and the records")
    ap.add_argument("--quiet", action="store_true", help="print only the iteration time")
    ap.add_argument("--no-fold", action="store_true",
                    help="simulate every rank, even where identical ranks could be simulated once")
    ap.add_argument("--no-periodic", action="store_true",
                    help="simulate every micro-batch, even where a pipeline's steady state could be repeated")
    ap.add_argument("--no-steady-cut", action="store_true",
                    help="simulate both iterations of a steady state in full, even where the first could be cut "
                         "to its last micro-batch")
    ap.add_argument("--uncertainty", type=int, default=0, metavar="N",
                    help="also run N correlated draws of the kernel, collective and host errors through the engine "
                         "with the run's seed: P10/P50/P90 of the iteration and what spreads it (docs/uncertainty.md; "
                         "default 0: none)")
    ap.add_argument("--max-link-rows", type=int_at_least(0), default=24, help=argparse.SUPPRESS)
    return ap


def default_out(name: str, overrides: Sequence[str]) -> Path:
    """``out/<name>``, and for a run with overrides ``out/<name>/<the overrides>``."""
    base = Path("out") / safe_name(name)
    if not overrides:
        return base
    slug = ",".join(o.strip().removeprefix("platform.").removeprefix("workload.") for o in overrides)
    return base / safe_name(slug)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    args = parser().parse_args(argv)
    from .config.loader import job_kind, load_job
    from .report import format_summary, summarize, write_outputs
    from .report.outputs import RecordsFormat
    from .sim import simulate

    records: RecordsFormat = args.records or args.format or "csv"
    if args.uncertainty < 0:
        raise ConfigError(f"--uncertainty: expected a number of draws >= 0, got {args.uncertainty}")
    if args.out:
        check_out_dir(args.out)
    overrides = list(args.overrides) + ([f"seed={args.seed}"] if args.seed is not None else [])
    kind = job_kind(args.workload, what="workload")
    if kind != "workload":
        verb = {"study": "whatif", "cluster": "cluster"}.get(kind, "serve")
        raise ConfigError(f"is a {kind.replace('_', ' ')} file; expected a workload YAML (simgpu {verb} "
                          f"{args.workload} runs it)", file=args.workload)
    job = load_job(args.workload, overrides)
    out = Path(args.out) if args.out else default_out(job.workload.name, overrides)
    check_out_dir(out)
    with Progress() as progress:
        t0 = time.perf_counter()
        options = dict(record_links=args.links, fold=not args.no_fold, periodic=not args.no_periodic,
                       steady_cut=not args.no_steady_cut)
        if args.uncertainty:
            from .uncertainty import propagate

            progress.set(f"{job.workload.name}: the point run and {args.uncertainty} draws")
            result, spread = propagate(job, args.uncertainty, **options)
            result.meta["uncertainty"] = spread.as_dict()
        else:
            result = simulate(job, on_stage=lambda what: progress.set(f"{job.workload.name}: {what}"),
                              **options)
        wall = time.perf_counter() - t0
        paths = write_outputs(result, out, links=args.links, records_format=records, trace=not args.no_trace,
                              window_s=args.trace_window, progress=progress.set)
    if args.quiet:
        print(f"{result.iteration_time_s * 1e3:.3f} ms")
        return 0
    print(format_summary(summarize(result)))
    if args.seed is not None and getattr(job.workload.model, "generate", None) is None:
        print("note: --seed seeds the DLRM tables drawn by model.generate; this workload draws none, so the seed "
              "changes nothing")
    print(f"\nsimulated {result.events:,} events in {wall:.2f} s; wrote "
          + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    entry(main)
