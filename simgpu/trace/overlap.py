"""How much a kernel slows while an NCCL kernel runs beside it, measured on profiler traces.

For each compute kernel of a trace (the same name, grid, block and device), this compares
the median duration of the launches that ran at least half under an NCCL kernel of one collective
op with the median of those that ran beside none; a kernel shape counts where it has at least
:data:`MIN_LAUNCHES` of each and its free median is at least :data:`MIN_US` (shorter kernels are
dominated by launch jitter). Per collective op, the figure is the geometric mean of the ratios
weighted by the overlapped time, minus one: the slowdown for ``gpu.overlap_slowdown_by_op``.

``python -m simgpu.trace.overlap [TRACE ...]`` (default: the traces with NCCL kernels in
``../shared/data/traces/hta/``) prints a row per trace and op. NCCL kernel durations include
their wait for peers; a waiting NCCL kernel still holds its SMs, so the comparison stands.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .classify import _NCCL_KERNEL, normalise_collective
from .kineto import read_document

#: Launches needed on each side (free, under an NCCL kernel) for a kernel shape to count.
MIN_LAUNCHES = 3
#: Shortest free median duration of a kernel shape that counts, us.
MIN_US = 20.0
HTA = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces" / "hta"
#: HTA's traces with NCCL kernels beside compute (see the folder's provenance.md).
DEFAULT_TRACES = ("nccl_parser_config/nccl_data.json.gz", "trace_diff/control/control.json.gz",
                  "negative_queue_length_values_check/rank0.json.gz")


@dataclass(frozen=True)
class Slowdown:
    trace: str
    gpu: str | None
    op: str
    shapes: int
    slowdown: float


def _op_of(name: str) -> str | None:
    m = _NCCL_KERNEL.search(name)
    return normalise_collective(m.group(1)) if m else None


def _kernels(path: str | Path) -> list[tuple[tuple[str, str, str, int], float, float]]:
    """((name, grid, block, device), start us, duration us) of every kernel event of the trace."""
    doc, _ = read_document(path)
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    out = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or str(e.get("cat", "")).lower() != "kernel":
            continue
        args = e.get("args") or {}
        key = (str(e.get("name", "")), str(args.get("grid")), str(args.get("block")), int(args.get("device", -1)))
        out.append((key, float(e.get("ts", 0.0)), float(e.get("dur", 0.0))))
    return out


def gpu_name(path: str | Path) -> str | None:
    doc, _ = read_document(path)
    props = doc.get("deviceProperties") if isinstance(doc, dict) else None
    return str(props[0].get("name")) if props else None


def measure(path: str | Path) -> list[Slowdown]:
    """The slowdown per collective op that ``path``'s kernels show (see the module docstring)."""
    kernels = _kernels(path)
    nccl: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
    for (name, _, _, dev), ts, dur in kernels:
        op = _op_of(name) if "nccl" in name.lower() else None
        if op is not None:
            nccl[dev].append((ts, ts + dur, op))
    for v in nccl.values():
        v.sort()
    durs: dict[tuple[str, str, str, int], dict[str | None, list[float]]] = defaultdict(lambda: defaultdict(list))
    for key, ts, dur in kernels:
        if "nccl" in key[0].lower() or dur <= 0:
            continue
        end = ts + dur
        under: str | None = None
        for a, b, op in nccl.get(key[3], []):
            if a >= end:
                break
            if b > ts and min(b, end) - max(a, ts) >= 0.5 * dur:
                under = op
                break
        durs[key][under].append(dur)
    ratios: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for by in durs.values():
        free = by.get(None, [])
        if len(free) < MIN_LAUNCHES or float(np.median(free)) < MIN_US:
            continue
        base = float(np.median(free))
        for op, d in by.items():
            if op is not None and len(d) >= MIN_LAUNCHES:
                ratios[op].append((float(np.median(d)) / base, float(np.sum(d))))
    out = []
    for op, pairs in sorted(ratios.items()):
        r = np.array([x[0] for x in pairs])
        w = np.array([x[1] for x in pairs])
        out.append(Slowdown(str(path), gpu_name(path), op, len(pairs),
                            float(np.exp(np.average(np.log(r), weights=w)) - 1)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simgpu.trace.overlap", description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="*", type=Path, help="Kineto traces (default: HTA's with NCCL kernels)")
    args = ap.parse_args(argv)
    paths = args.traces or [HTA / p for p in DEFAULT_TRACES]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        print(f"error: {missing[0]}: not found; expected a Kineto trace file", file=sys.stderr)
        return 2
    print(f"{'trace':60s} {'gpu':22s} {'op':15s} {'shapes':>6s} {'slowdown':>9s}")
    for p in paths:
        for s in measure(p):
            print(f"{str(p)[-60:]:60s} {str(s.gpu)[:22]:22s} {s.op:15s} {s.shapes:6d} {s.slowdown:9.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
