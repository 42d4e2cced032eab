"""``simgpu whatif study.yaml``: simulate every variant of a study and compare them.

Writes ``results.jsonl`` (appended as variants finish; a rerun reuses the rows whose job is
unchanged), ``results.csv`` (and ``results.parquet``), ``bars.png`` and, when a numeric key is
swept, ``lines.png`` into ``--out`` (default ``out/<study name>``), and prints the variants ranked
by iteration time, or by throughput where they process different numbers of samples. Variants run
on a local process pool (``--workers``), or on a Dask cluster given ``--scheduler tcp://host:port``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..cli import ArgParser, check_out_dir, entry, int_at_least, out_dir, run_command
from .plots import bars, lines
from .runner import finish_table, run_study, text_progress
from .study import load_study, ranking


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="simgpu whatif", description=__doc__.splitlines()[0])
    ap.add_argument("study", help="study YAML")
    ap.add_argument("--out", type=Path, help="output folder (default out/<study name>)")
    ap.add_argument("--workers", type=int_at_least(1), help="local processes (default: one per core)")
    ap.add_argument("--scheduler", help="Dask scheduler address, e.g. tcp://127.0.0.1:8786")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.out:
        check_out_dir(args.out)
    study = load_study(args.study)
    out = out_dir(args.out, study.spec.name)
    stats: dict[str, int] = {}
    rows = run_study(study, out, workers=args.workers, scheduler=args.scheduler,
                     progress=None if args.quiet else text_progress, stats=stats)
    swept = list(dict.fromkeys(k for v in study.variants for k, _ in v.swept))
    table = finish_table(rows, swept)
    table.to_csv(out / "results.csv", index=False)
    table.astype({c: str for c in swept}).to_parquet(out / "results.parquet", index=False)
    if not args.no_plots and table["feasible"].any() and study.kind == "workload":
        bars(table, out / "bars.png", f"{study.spec.name}: iteration time per variant")
        lines(table, list(study.spec.grid), out / "lines.png", study.spec.name)
    print(ranking(table, kind=study.kind))
    if stats.get("reused"):
        print(f"\nreused {stats['reused']} of {len(table)} rows from {out / 'results.jsonl'} (their jobs are "
              f"unchanged); computed {stats['computed']}")
    print(f"\n{len(table)} variants ({int(table['feasible'].sum())} feasible); wrote {out}/results.csv")
    return 0


if __name__ == "__main__":
    entry(main)
