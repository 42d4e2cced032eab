"""``python -m simgpu.validate`` (``make validate``): every validation suite, one after another.

Each suite compares predictions with real measurements in ``../shared/data`` and prints its table;
the exit status is non-zero when any suite is above its thresholds. ``--only NAME`` runs one.
``--report DIR`` instead writes the accuracy pages of the documentation (:mod:`.report`): a page,
a CSV of every point and a plot per validation set, and their index.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path

from ..cli import ArgParser, check_out_dir, entry, run_command
from .report import set_names, write_report

#: suite name -> (module with ``main(argv) -> int``, its arguments); modules not present are skipped
SUITES: dict[str, tuple[str, list[str]]] = {
    "collectives": ("simgpu.validate.collectives", []),
    "calibration": ("simgpu.validate.collectives", ["--calibration"]),
    "kernels": ("simgpu.validate.kernels", []),
    "iterations": ("simgpu.validate.iterations", []),
    "mlperf": ("simgpu.validate.mlperf", []),
    "dlrm": ("simgpu.validate.dlrm", []),
    "traces": ("simgpu.validate.traces", []),
    "inference": ("simgpu.validate.inference", []),
    "silicon": ("simgpu.validate.silicon", []),
    "moe_training": ("simgpu.validate.moe_training", []),
}


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="simgpu validate", description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", metavar="NAME",
                    help=f"run only these suites ({', '.join(sorted(SUITES))}); with --report, these sets "
                         f"({', '.join(set_names())})")
    ap.add_argument("--report", metavar="DIR", type=Path,
                    help="instead write the accuracy pages, tables and plots into DIR (e.g. docs/accuracy)")
    ap.add_argument("--quick", action="store_true", help="with --report: fewer points of the slow sets")
    args = ap.parse_args(argv)
    if args.report is not None:
        bad = sorted(set(args.only or ()) - set(set_names()))
        if bad:
            ap.error(f"--only: unknown set {bad[0]!r} (expected one of {', '.join(set_names())})")
        check_out_dir(args.report, "--report")
        return write_report(args.report, args.only or (), quick=args.quick)
    bad = sorted(set(args.only or ()) - set(SUITES))
    if bad:
        ap.error(f"--only: unknown suite {bad[0]!r} (expected one of {', '.join(sorted(SUITES))})")
    status = 0
    for name in args.only or list(SUITES):
        path, suite_args = SUITES[name]
        try:
            module = importlib.import_module(path)
        except ModuleNotFoundError:
            continue
        print(f"\n=== {name} ===", flush=True)
        code = int(module.main(list(suite_args)))
        print(f"--- {name}: {'ok' if code == 0 else f'exit {code}'}", flush=True)
        status = status or code
    return status


if __name__ == "__main__":
    entry(main)
