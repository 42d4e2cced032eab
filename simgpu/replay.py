"""``python -m simgpu.replay TRACE... --out DIR``: replay PyTorch profiler traces, or ask what-if.

Given one Kineto trace per rank (and optionally their Execution Traces), replays one iteration with
the measured durations and writes the same outputs as ``simgpu.run``, printing the traced and the
replayed step time (``measured_step_time_ms`` and ``iteration_time_ms`` in ``summary.json``).
Asking a what-if (``--platform`` another than the traced one, ``--set`` platform keys, ``--world``,
or ``--what-if``) re-times collectives with the collective model from their sizes and, on another
GPU, compute kernels by the GPUs' ratios.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .cli import ArgParser, Progress, check_out_dir, entry, int_at_least, out_dir, run_command
from .errors import ConfigError
from .run import window

if TYPE_CHECKING:
    from .config.platform import PlatformSpec


def parser() -> ArgParser:
    ap = ArgParser(prog="simgpu replay", description="Replay PyTorch profiler (Kineto) traces; "
                                 "ask what-if questions about them.")
    ap.add_argument("traces", nargs="+", help="Kineto trace per rank (.json or .json.gz); Execution Traces may "
                    "be given among them")
    ap.add_argument("--et", action="append", default=[], metavar="FILE", help="an Execution Trace (repeatable)")
    ap.add_argument("--platform", help="platform to simulate on (default: the traced GPU's platform)")
    ap.add_argument("--trace-platform", help="platform the traces were taken on (default: by the traced GPU's name)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a platform key (what-if): network.nic_gbps=800, gpu.hbm_gbytes_per_s=4800")
    ap.add_argument("--world", type=int_at_least(1), help="what-if: ranks of the job (data parallel)")
    ap.add_argument("--what-if", action="store_true", help="re-time collectives by the collective model")
    ap.add_argument("--step", type=int_at_least(0), help="the ProfilerStep number to report (default: median)")
    ap.add_argument("--out", help="output folder (default: out/replay-<first trace>)")
    ap.add_argument("--links", action="store_true", help="record link busy intervals and draw them")
    ap.add_argument("--records", choices=("csv", "parquet", "none"), help="records file format, or none (default csv)")
    ap.add_argument("--format", choices=("csv", "parquet"), help=argparse.SUPPRESS)  # the older name of --records
    ap.add_argument("--no-trace", action="store_true", help="do not write trace.json")
    ap.add_argument("--trace-window", type=window, metavar="START:END",
                    help="write only the intervals overlapping this window (ms) to trace.json and the records")
    ap.add_argument("--allow-truncated", action="store_true",
                    help="replay a cut trace up to its last whole event (refused by default)")
    ap.add_argument("--quiet", action="store_true", help="print only the replayed and traced step times")
    return ap


def _platforms(args: argparse.Namespace, traced_gpu: str | None
               ) -> tuple[PlatformSpec, PlatformSpec | None, bool, list[str]]:
    """(target platform, source platform or None, what-if?, notes)."""
    from .config.loader import load_platform, parse_override
    from .trace.load import platform_for_gpu

    notes: list[str] = []
    source = load_platform(args.trace_platform)[0] if args.trace_platform else None
    if source is None:
        found = platform_for_gpu(traced_gpu)
        source = found[0] if found else None
    over = []
    for item in args.overrides:
        key, value = parse_override(item)
        over.append((key.removeprefix("platform."), value))
    if args.platform:
        target = load_platform(args.platform, over)[0]
    elif source is not None:
        target = load_platform(args.trace_platform or source.name, over)[0]
    else:
        target = load_platform("dgx_a100", over)[0]
        notes.append(f"no platform describes the traced GPU {traced_gpu!r}; simulating on dgx_a100 "
                     "(measured times are kept; pass --trace-platform for a what-if)")
    what_if = bool(args.what_if or args.world or over or (source is not None and target.name != source.name)
                   or (source is None and args.platform))
    return target, source, what_if, notes


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    args = parser().parse_args(argv)
    from .report import format_summary, summarize, write_outputs
    from .trace import ReplayOptions, load_traces, replay

    if args.out:
        check_out_dir(args.out)
    for path in [*args.traces, *args.et]:
        if Path(path).is_dir():
            raise ConfigError("is a folder; expected a PyTorch profiler (Kineto) JSON trace", file=str(path))
    t0 = time.perf_counter()
    traces = load_traces(args.traces, args.et)
    cut = [t for t, _ in traces if t.truncated]
    if cut and not args.allow_truncated:
        raise ConfigError("the file is truncated (cut JSON or gzip stream); expected a whole trace, or "
                          "--allow-truncated to replay it up to its last whole event", file=cut[0].file)
    target, source, what_if, notes = _platforms(args, traces[0][0].gpu)
    if args.world:
        from .config.checks import check_world

        gpn = min(args.world, target.node.gpus)
        check_world(-(-args.world // gpn), gpn, key="--world")
    opts = ReplayOptions(target, source, what_if, args.world, step=args.step, record_links=args.links)
    stem = Path(args.traces[0]).name.split(".")[0]
    out = out_dir(args.out, f"replay-{stem}")
    with Progress() as progress:
        progress.set("replaying")
        outcome = replay(traces, opts)
        outcome.result.meta.setdefault("run", {})["overrides"] = list(args.overrides)
        wall = time.perf_counter() - t0
        paths = write_outputs(outcome.result, out, links=args.links, records_format=args.records or args.format
                              or "csv", trace=not args.no_trace, window_s=args.trace_window,
                              progress=progress.set)
    t_ms = outcome.result.iteration_time_s * 1e3
    m_ms = (outcome.measured_step_s or 0.0) * 1e3
    label = "what-if" if what_if else "replayed"
    step = f"ProfilerStep#{outcome.step}" if outcome.step is not None else "whole trace (no ProfilerStep)"
    line = f"{step}: traced {m_ms:.3f} ms, {label} {t_ms:.3f} ms ({_pct(t_ms, m_ms)})"
    if args.quiet:
        print(line)
        return 0
    print(format_summary(summarize(outcome.result)))
    if len(outcome.steps):
        print("steps (ms)           traced   " + label)
        for row in outcome.steps.itertuples(index=False):
            flag = "" if row.complete else "  (incomplete)"
            print(f"  ProfilerStep#{row.step:<8}{row.measured_ms:>10.3f}{row.replayed_ms:>10.3f}{flag}")
        done = outcome.steps[outcome.steps["complete"]]
        if len(done):
            med_m, med_r = float(done["measured_ms"].median()), float(done["replayed_ms"].median())
            print(f"  median{'':<14}{med_m:>10.3f}{med_r:>10.3f}  ({_pct(med_r, med_m)})")
    err = outcome.start_error_us
    if len(err):
        close = 100.0 * float((abs(err) <= 10.0).mean())
        print(f"GPU ops replayed within 10 us of their traced start: {close:.1f}% of {len(err):,} "
              f"(largest difference {float(abs(err).max()):.1f} us)")
    for note in notes:
        print(f"note: {note}")
    for msg, count in sorted(outcome.warnings.items()):
        print(f"warning: {msg}: {count}")
    print(f"\n{line}")
    wrote = ", ".join(str(p) for p in paths.values())
    print(f"replayed {outcome.result.events:,} events in {wall:.2f} s; wrote {wrote}")
    return 0


def _pct(value: float, ref: float) -> str:
    return f"{100.0 * (value - ref) / ref:+.2f}%" if ref > 0 else "n/a"


if __name__ == "__main__":
    entry(main)
