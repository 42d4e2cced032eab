"""``python -m simgpu.validate`` (``make validate``): every validation suite, one after another.

Each suite compares predictions with real measurements in ``../shared/data`` and prints its table;
the exit status is non-zero when any suite is above its thresholds. ``--only NAME`` runs one.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: suite name -> module with ``main(argv) -> int``; modules not present are skipped
SUITES = {
    "collectives": "simgpu.validate.collectives",
    "kernels": "simgpu.validate.kernels",
    "iterations": "simgpu.validate.iterations",
    "mlperf": "simgpu.validate.mlperf",
    "traces": "simgpu.validate.traces",
}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simgpu.validate", description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(SUITES), action="append", help="run only these suites")
    args = ap.parse_args(argv)
    status = 0
    for name in args.only or list(SUITES):
        try:
            module = importlib.import_module(SUITES[name])
        except ModuleNotFoundError:
            continue
        print(f"\n=== {name} ===", flush=True)
        code = int(module.main([]))
        print(f"--- {name}: {'ok' if code == 0 else f'exit {code}'}", flush=True)
        status = status or code
    return status


if __name__ == "__main__":
    sys.exit(main())
