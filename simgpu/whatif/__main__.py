"""``simgpu whatif study.yaml``: simulate every variant of a study and compare them.

Writes ``results.jsonl`` (appended as variants finish; a rerun reuses the rows whose job is
unchanged), ``results.csv`` (and ``results.parquet``), ``bars.png`` and, when a numeric key is
swept, ``lines.png`` into ``--out`` (default ``out/<study name>``), and prints the variants ranked
by iteration time, or by throughput where they process different numbers of samples. Variants run
on a local process pool (``--workers``), or on a Dask cluster given ``--scheduler tcp://host:port``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ..cli import ArgParser, check_out_dir, entry, int_at_least, run_command, safe_name
from .plots import bars, lines
from .runner import ROW_KEYS, run_study, text_progress
from .study import load_study

#: Up to this many variants that did not run are listed one by one; beyond, summarised by reason.
LISTED_FAILURES = 8


def differ_in_work(table: pd.DataFrame) -> bool:
    """Whether the feasible variants process different numbers of samples per iteration."""
    ok = table[table["feasible"]] if "feasible" in table else table
    if "samples" not in ok or ok["samples"].isna().all():
        return False
    return ok["samples"].dropna().nunique() > 1


def reason(why: str) -> str:
    """A failure's message without the file and with its numbers hidden, to group like failures."""
    text = str(why).split(": ", 1)[1] if re.match(r"^\S+\.ya?ml(:\d+)?: ", str(why)) else str(why)
    return re.sub(r"\d+(\.\d+)?", "#", text)[:110]


def failures(table: pd.DataFrame, limit: int = LISTED_FAILURES) -> list[str]:
    """Lines for the variants that did not run: each one, or when many, a count per reason."""
    bad = table[~table["feasible"]]
    if len(bad) <= limit:
        return [f"{'-':>4}  {str(r.name)[:40]:40} {r.status}: {str(r.why)[:110]}" for r in bad.itertuples()]
    groups = bad.assign(reason=bad["why"].map(reason)).groupby(["status", "reason"], sort=False)
    out = [f"{len(bad)} variants did not run, by reason:"]
    for (status, why), g in sorted(groups, key=lambda kv: -len(kv[1])):
        out.append(f"  {len(g):>5} {status}: {why}  (e.g. {g['name'].iloc[0]})")
    return out


def ranking(table: pd.DataFrame, limit: int = 20) -> str:
    """The feasible variants ranked, best first, then the others (listed or summarised)."""
    from ..serve.study import is_serving_table

    if is_serving_table(table):  # a serving study (LLM or DLRM)
        from ..serve.study import ranking as serving_ranking

        return serving_ranking(table, limit)
    by_work = differ_in_work(table)
    ok = table[table["feasible"]]
    ok = ok.sort_values("samples_per_s", ascending=False) if by_work else ok.sort_values("iteration_time_ms")
    best_t = ok["iteration_time_ms"].min() if len(ok) else float("nan")
    best_s = ok["samples_per_s"].max() if len(ok) else float("nan")
    lines_ = []
    if by_work:
        lines_.append("ranked by throughput: the variants process different numbers of samples per iteration")
    lines_.append(f"{'rank':>4}  {'variant':40} {'iter ms':>10} {'samples/s':>11} {'vs best':>8} {'exposed ms':>10} "
                  f"{'MFU':>6}")
    for i, r in enumerate(ok.head(limit).itertuples(), 1):
        mfu = f"{r.mfu:.1%}" if r.mfu == r.mfu and r.mfu is not None else "-"
        sps = f"{r.samples_per_s:11,.1f}" if r.samples_per_s == r.samples_per_s and r.samples_per_s else f"{'-':>11}"
        vs = (best_s / r.samples_per_s if by_work and r.samples_per_s else r.iteration_time_ms / best_t)
        lines_.append(f"{i:>4}  {str(r.name)[:40]:40} {r.iteration_time_ms:10.3f} {sps} {vs:8.3f} "
                      f"{r.exposed_communication_ms:10.3f} {mfu:>6}")
    if len(ok) > limit:
        lines_.append(f"{'':>4}  ... {len(ok) - limit} more in results.csv")
    lines_.extend(failures(table))
    return "\n".join(lines_)


def finish_table(rows: list[dict[str, Any]], swept: list[str]) -> pd.DataFrame:
    table = pd.DataFrame(rows)
    for col in ROW_KEYS:
        if col not in table:
            table[col] = None
    table["feasible"] = table["feasible"].fillna(False).astype(bool)
    known = ["name", *swept, *[c for c in ROW_KEYS if c != "name" and c not in swept]]
    return table[known + [c for c in table.columns if c not in known]]  # serving rows' own columns last


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
    out = args.out or Path("out") / safe_name(study.spec.name)
    check_out_dir(out)
    stats: dict[str, int] = {}
    rows = run_study(study, out, workers=args.workers, scheduler=args.scheduler,
                     progress=None if args.quiet else text_progress, stats=stats)
    swept = list(dict.fromkeys(k for v in study.variants for k, _ in v.swept))
    table = finish_table(rows, swept)
    table.to_csv(out / "results.csv", index=False)
    table.astype({c: str for c in swept}).to_parquet(out / "results.parquet", index=False)
    from ..serve.study import is_serving_table

    if not args.no_plots and table["feasible"].any() and not is_serving_table(table):
        bars(table, out / "bars.png", f"{study.spec.name}: iteration time per variant")
        lines(table, list(study.spec.grid), out / "lines.png", study.spec.name)
    print(ranking(table))
    if stats.get("reused"):
        print(f"\nreused {stats['reused']} of {len(table)} rows from {out / 'results.jsonl'} (their jobs are "
              f"unchanged); computed {stats['computed']}")
    print(f"\n{len(table)} variants ({int(table['feasible'].sum())} feasible); wrote {out}/results.csv")
    return 0


if __name__ == "__main__":
    entry(main)
