"""``simgpu`` console script: ``simgpu run workload.yaml ...``, ``simgpu replay trace.json ...``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

COMMANDS = {"run": "simgpu.run", "replay": "simgpu.replay"}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or args[0] not in COMMANDS:
        print("usage: simgpu {" + ",".join(COMMANDS) + "} ...\n  run     simulate one training iteration "
              "of a workload YAML (python -m simgpu.run -h for options)\n  replay  replay PyTorch profiler "
              "traces, or ask what-if (python -m simgpu.replay -h)", file=sys.stderr if args else sys.stdout)
        return 0 if not args or args[0] in ("-h", "--help") else 2
    import importlib

    return int(importlib.import_module(COMMANDS[args[0]]).main(args[1:]))


if __name__ == "__main__":
    sys.exit(main())
