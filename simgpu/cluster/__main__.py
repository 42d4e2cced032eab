"""``simgpu cluster cluster.yaml``: several jobs sharing one cluster's links, each one's slowdown
from its neighbours, and whose traffic crosses the busiest links.

Simulates the jobs together on one topology and each alone on the same nodes; writes
``summary.json``, ``timeline.png`` (ranks grouped by job) and ``links.png`` (who used the busiest
links between switches when) into ``--out`` (default ``out/<name>``) and prints the neighbour noise
per job and the busiest links between switches.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ..cli import ArgParser, Progress, check_out_dir, entry, int_at_least, out_dir, run_command


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="simgpu cluster", description=__doc__.splitlines()[0])
    ap.add_argument("cluster", help="cluster YAML (see workloads/clusters/)")
    ap.add_argument("--out", type=Path, help="output folder (default out/<name>)")
    ap.add_argument("--links", action="store_true",
                    help="record every link's busy intervals in every run (the shared run's links between switches "
                         "are recorded anyway)")
    ap.add_argument("--top-links", type=int_at_least(0), default=8, help="busiest links shown (default 8)")
    ap.add_argument("--no-plots", action="store_true", help="do not draw timeline.png and links.png")
    args = ap.parse_args(argv)
    if args.out:
        check_out_dir(args.out)
    from .report import summarize, table
    from .run import simulate_cluster
    from .spec import load_cluster

    c = load_cluster(args.cluster)
    out = out_dir(args.out, c.spec.name)
    with Progress() as progress:
        res = simulate_cluster(c, record_links=args.links, on_stage=lambda what: progress.set(f"{c.spec.name}: {what}"))
    summary = summarize(res, args.top_links)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    wrote = [out / "summary.json"]
    if not args.no_plots:
        from .plots import link_timeline, timeline

        timeline(res, out / "timeline.png")
        wrote.append(out / "timeline.png")
        if link_timeline(res, [lk["link"] for lk in summary["links"]], out / "links.png"):
            wrote.append(out / "links.png")
    print(table(summary))
    print("\nwrote " + ", ".join(map(str, wrote[:-1])) + (" and " if len(wrote) > 1 else "") + str(wrote[-1]))
    return 0


if __name__ == "__main__":
    entry(main)
