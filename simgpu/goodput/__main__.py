"""``simgpu goodput goodput.yaml``: the share of a training run's wall time that is kept progress,
given how often the job fails, what a checkpoint costs and how long a restart takes.

Writes ``summary.json`` and ``goodput.png`` (goodput against the checkpoint interval, and against
the cluster size) into ``--out`` (default ``out/<name>``), and prints the best checkpoint interval
by Young, Daly and Monte Carlo with the goodput at each.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ..cli import ArgParser, check_out_dir, entry, out_dir, run_command


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="simgpu goodput", description=__doc__.splitlines()[0])
    ap.add_argument("goodput", help="goodput YAML")
    ap.add_argument("--out", type=Path, help="output folder (default out/<name>)")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    if args.out:
        check_out_dir(args.out)
    from .run import compute, table
    from .spec import load_goodput

    g = load_goodput(args.goodput)
    out = out_dir(args.out, g.spec.name)
    summary = compute(g)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if not args.no_plots:
        from .plots import goodput_plot

        goodput_plot(summary, out / "goodput.png")
    print(table(summary))
    print(f"\nwrote {out}/summary.json" + ("" if args.no_plots else f" and {out}/goodput.png"))
    return 0


if __name__ == "__main__":
    entry(main)
