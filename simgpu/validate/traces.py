"""Replayed step times against the real PyTorch profiler traces in ``../shared/data/traces/hta/``.

Every folder there holding Kineto traces is one job (the sampled ranks of ``trace_filter/`` are
replayed together; an Execution Trace beside its Kineto trace is paired with it). Each job is
replayed with its measured durations on the platform of its traced GPU. Per job the table gives
the traced and the replayed ``ProfilerStep`` time (median over complete steps) and their error,
and how closely the replayed GPU timeline follows the trace: the share of GPU ops replayed within
10 us of their traced start. A job with complete steps passes when its error is within
:data:`MAX_ERROR` (jobs without ``ProfilerStep`` spans are listed, not judged).
``python -m simgpu.validate.traces`` prints the table and exits 1 when a job fails.

Units: milliseconds for step times, percent for errors and shares, seconds for wall time.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ..cli import ArgParser, run_command
from ..config.loader import load_platform
from ..trace import ReplayOptions, load_traces, replay
from ..trace.load import platform_for_gpu

#: The largest accepted |replayed - traced| / traced of the median step time.
MAX_ERROR = 0.05
#: A replayed GPU op is "on time" within this many microseconds of its traced start.
ON_TIME_US = 10.0
#: Where the traces lie, relative to the repository root.
TRACES = Path("..") / "shared" / "data" / "traces" / "hta"
COLUMNS = ("job", "gpu", "platform", "ranks", "steps", "traced_ms", "replayed_ms", "error_pct",
           "on_time_pct", "unexplained_pct", "wall_s", "passed")


def default_root() -> Path:
    return Path(__file__).resolve().parents[2] / TRACES


def jobs(root: Path) -> list[tuple[str, list[Path]]]:
    """(job name, files) for every folder under ``root`` holding ``*.json`` / ``*.json.gz`` files."""
    found: dict[Path, list[Path]] = {}
    for f in sorted(root.rglob("*.json*")):
        if f.is_file() and (f.name.endswith(".json") or f.name.endswith(".json.gz")):
            found.setdefault(f.parent, []).append(f)
    return [(str(d.relative_to(root)), files) for d, files in sorted(found.items())]


def validate_job(name: str, files: Sequence[Path]) -> dict[str, object]:
    """Replay one job and return its row of the table."""
    t0 = time.perf_counter()
    traces = load_traces(files)
    gpu = traces[0][0].gpu
    found = platform_for_gpu(gpu)
    platform = found[0] if found is not None else load_platform("dgx_a100")[0]
    out = replay(traces, ReplayOptions(platform, found[0] if found else None))
    done = out.steps[out.steps["complete"]]
    if len(done):
        traced, replayed = float(done["measured_ms"].median()), float(done["replayed_ms"].median())
    else:
        traced = (out.measured_step_s or 0.0) * 1e3
        replayed = out.result.iteration_time_s * 1e3
    err = (replayed - traced) / traced if traced > 0 else float("nan")
    on_time = float(np.mean(np.abs(out.start_error_us) <= ON_TIME_US)) * 100 if len(out.start_error_us) else np.nan
    n_gpu = sum(1 for tr, _ in traces for _g in tr.gpu_ops)
    unexplained = 100.0 * sum(p.unexplained for p in out.programs) / n_gpu if n_gpu else 0.0
    return {
        "job": name, "gpu": gpu or "(not recorded)", "platform": platform.name + ("" if found else " (stand-in)"),
        "ranks": ",".join(str(tr.rank) for tr, _ in traces), "steps": len(done),
        "traced_ms": traced, "replayed_ms": replayed, "error_pct": 100 * err, "on_time_pct": on_time,
        "unexplained_pct": unexplained,
        "wall_s": time.perf_counter() - t0, "passed": bool(abs(err) <= MAX_ERROR) if len(done) else None,
    }


def validate(root: Path | None = None) -> pd.DataFrame:
    """The table of every job under ``root`` (default: the shared data folder)."""
    base = root or default_root()
    rows = [validate_job(name, files) for name, files in jobs(base)]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def format_table(table: pd.DataFrame) -> str:
    lines = [f"{'job':<36}{'GPU':<24}{'steps':>6}{'traced ms':>11}{'replayed ms':>13}{'error':>9}"
             f"{'on time':>9}{'unexpl.':>9}{'wall s':>8}"]
    for r in table.itertuples(index=False):
        verdict = "" if r.passed is None else ("" if r.passed else "  FAIL")
        on_time = "n/a" if np.isnan(r.on_time_pct) else f"{r.on_time_pct:.1f}%"
        lines.append(f"{r.job:<36}{str(r.gpu)[:23]:<24}{r.steps:>6}{r.traced_ms:>11.2f}{r.replayed_ms:>13.2f}"
                     f"{r.error_pct:>+8.2f}%{on_time:>9}{r.unexplained_pct:>8.1f}%{r.wall_s:>8.1f}{verdict}")
    lines.append(f"steps: complete ProfilerSteps, median compared (0: the whole trace, not judged); on time: GPU "
                 f"ops replayed within {ON_TIME_US:g} us of their traced start; unexpl.: GPU ops delayed more "
                 f"than the trace explains (replayed with the measured delay); threshold {100 * MAX_ERROR:g}%")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="python -m simgpu.validate.traces",
                                 description="Replay the real traces and compare step times.")
    ap.add_argument("--root", type=Path, help=f"folder of traces (default: {TRACES} beside the repository)")
    args = ap.parse_args(argv)
    root = args.root or default_root()
    if not root.is_dir():
        print(f"error: {root}: no traces folder (the shared data lies beside the repository)", file=sys.stderr)
        return 2
    table = validate(root)
    print(format_table(table))
    failed = table[table["passed"] == False]  # noqa: E712  (None means not judged)
    return 1 if len(failed) else 0


if __name__ == "__main__":
    sys.exit(main())
