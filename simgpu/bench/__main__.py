"""``python -m simgpu.bench``: measure torch ops over a sweep of shapes into a platform's folder.

    python -m simgpu.bench --device cpu --ops all --out platforms/cpu_host/microbench/
    python -m simgpu.bench --device cuda --ops gemm,bmm,embedding --out platforms/h200/microbench/

Rows already in ``--out`` are skipped, so a rerun resumes an interrupted sweep; ``--list`` prints
the cases and how many are left without measuring.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from ..cli import ArgParser, check_out_dir, entry, run_command
from ..errors import ConfigError, SimgpuError


def parser() -> ArgParser:
    ap = ArgParser(prog="python -m simgpu.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), required=True, help="where the ops run")
    ap.add_argument("--ops", default="all", help="comma list of op groups or 'all' (see --list)")
    ap.add_argument("--out", required=True, help="output folder, e.g. platforms/<name>/microbench/")
    ap.add_argument("--seed", type=int, default=0, help="seed of the shape sweep and the inputs")
    ap.add_argument("--scale", choices=("cpu", "cuda"), help="size limits of the sweep (default: the device's)")
    ap.add_argument("--shapes", type=int, help="shapes per group (default: the scale's)")
    ap.add_argument("--max-mbytes", type=float, help="cap on the memory one case touches, MB (default: the scale's)")
    ap.add_argument("--dtypes", help="only these dtypes, e.g. fp32,bf16")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    ap.add_argument("--min-time", type=float, default=0.03, help="seconds of timed calls per case at least")
    ap.add_argument("--flush-mbytes", type=float, default=128,
                    help="MB written before each call of a cold-cache case (embedding lookups); 0: none")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    args = parser().parse_args(argv)
    try:
        import dataclasses

        from .cases import SCALES, parse_groups, sweep
        from .harness import Options, run
        from .timing import Policy

        groups = parse_groups(args.ops)
        scale = SCALES[args.scale or args.device]
        if args.shapes is not None:
            if args.shapes < 4:
                raise ConfigError(f"expected --shapes >= 4, got {args.shapes}", key="--shapes")
            scale = dataclasses.replace(scale, shapes=args.shapes)
        if args.max_mbytes is not None:
            if args.max_mbytes <= 0:
                raise ConfigError(f"expected --max-mbytes > 0, got {args.max_mbytes}", key="--max-mbytes")
            scale = dataclasses.replace(scale, max_bytes=args.max_mbytes * 1e6)
        dtypes = frozenset(d.strip() for d in args.dtypes.split(",")) if args.dtypes else None
        cases = sweep(groups, scale, args.seed, dtypes)
        if not cases:
            raise ConfigError("the sweep is empty (check --ops and --dtypes)", key="--dtypes")
        out = Path(args.out)
        if not args.list:
            check_out_dir(out)
        if args.list:
            from ..kernels.store import known_keys

            done = known_keys(out) if out.is_dir() else set()
            for c in cases:
                print(("done " if c.key() in done else "todo ") + c.key())
            print(f"{len(cases)} cases, {sum(c.key() in done for c in cases)} done", file=sys.stderr)
            return 0
        import torch

        if args.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("--device cuda but torch sees no CUDA device", key="--device")
        if args.threads is not None:
            if args.threads < 1:
                raise ConfigError(f"expected --threads >= 1, got {args.threads}", key="--threads")
            torch.set_num_threads(args.threads)
        if args.min_time <= 0:
            raise ConfigError(f"expected --min-time > 0, got {args.min_time}", key="--min-time")
        if args.flush_mbytes < 0:
            raise ConfigError(f"expected --flush-mbytes >= 0, got {args.flush_mbytes}", key="--flush-mbytes")
        opts = Options(args.device, out, args.seed, Policy(min_time_s=args.min_time), not args.quiet,
                       int(args.flush_mbytes * 1e6))
        n = run(cases, opts)
    except SimgpuError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"measured {n} case(s); {len(cases)} in the sweep; wrote {out}")
    return 0


if __name__ == "__main__":
    entry(main)
