"""``python -m simgpu.whatif study.yaml``: simulate every variant of a study and compare them.

Writes ``results.jsonl`` (appended as variants finish; a rerun resumes), ``results.csv`` (and
``results.parquet``), ``bars.png`` and, when a numeric key is swept, ``lines.png`` into ``--out``
(default ``out/<study name>``), and prints the variants ranked by iteration time. Variants run on a
local process pool (``--workers``), or on a Dask cluster given ``--scheduler tcp://host:port``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ..errors import SimgpuError
from .plots import bars, lines
from .runner import ROW_KEYS, run_study, text_progress
from .study import load_study


def ranking(table: pd.DataFrame, limit: int = 20) -> str:
    ok = table[table["feasible"]].sort_values("iteration_time_ms")
    best = ok["iteration_time_ms"].min() if len(ok) else float("nan")
    lines_ = [f"{'rank':>4}  {'variant':40} {'iter ms':>10} {'vs best':>8} {'exposed ms':>10} {'MFU':>6}"]
    for i, r in enumerate(ok.head(limit).itertuples(), 1):
        mfu = f"{r.mfu:.1%}" if r.mfu == r.mfu and r.mfu is not None else "-"
        lines_.append(f"{i:>4}  {str(r.name)[:40]:40} {r.iteration_time_ms:10.3f} {r.iteration_time_ms / best:8.3f} "
                      f"{r.exposed_communication_ms:10.3f} {mfu:>6}")
    bad = table[~table["feasible"]]
    for r in bad.itertuples():
        lines_.append(f"{'-':>4}  {str(r.name)[:40]:40} {r.status}: {str(r.why)[:90]}")
    return "\n".join(lines_)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simgpu.whatif", description=__doc__.splitlines()[0])
    ap.add_argument("study", help="study YAML")
    ap.add_argument("--out", type=Path, help="output folder (default out/<study name>)")
    ap.add_argument("--workers", type=int, help="local processes (default: one per core)")
    ap.add_argument("--scheduler", help="Dask scheduler address, e.g. tcp://127.0.0.1:8786")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    try:
        study = load_study(args.study)
        out = args.out or Path("out") / study.spec.name
        rows = run_study(study, out, workers=args.workers, scheduler=args.scheduler,
                         progress=None if args.quiet else text_progress)
    except SimgpuError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    swept = list(dict.fromkeys(k for v in study.variants for k, _ in v.swept))
    table = pd.DataFrame(rows)
    for col in ROW_KEYS:
        if col not in table:
            table[col] = None
    table = table[["name", *swept, *[c for c in ROW_KEYS if c != "name"]]]
    table.to_csv(out / "results.csv", index=False)
    table.astype({c: str for c in swept}).to_parquet(out / "results.parquet", index=False)
    if not args.no_plots and table["feasible"].any():
        bars(table, out / "bars.png", f"{study.spec.name}: iteration time per variant")
        lines(table, list(study.spec.grid), out / "lines.png", study.spec.name)
    print(ranking(table))
    print(f"\n{len(table)} variants ({int(table['feasible'].sum())} feasible); wrote {out}/results.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
