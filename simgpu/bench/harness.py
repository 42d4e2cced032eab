"""The measuring loop: skip what is already measured, time the rest, append rows as they come.

Rows go to ``<out>/<family>.csv`` (format: :mod:`simgpu.kernels.store`) one at a time, so an
interrupted run loses at most the case in progress and a rerun resumes where it stopped. At the
end ``<out>/device.json`` summarises the device as the platform file needs it: the fastest GEMM
(TFLOP/s), the bandwidth of the largest copies and host-device copies (GB/s), the time of ops on a
few elements (the dispatch overhead, us), the machine (name, CPUs, ISA, torch build), the thread
count and the clock the times were taken with. Embedding lookups are timed from cold caches
(``flush_bytes`` written before each call), as a training step's other work leaves them.
"""

from __future__ import annotations

import json
import os
import platform as pyplatform
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..kernels import store
from ..kernels.features import FAMILY_PARAMS
from .cases import Case
from .ops import build
from .timing import Policy, Stats, measure


@dataclass(frozen=True)
class Options:
    """What to measure and how."""

    device: str
    out: Path
    seed: int = 0
    policy: Policy = field(default_factory=Policy)
    progress: bool = True
    flush_bytes: int = 128 * 2**20  # written before each call of a cold case: more than caches hold


def _row(case: Case, stats: Stats, features: dict[str, float]) -> dict[str, Any]:
    row: dict[str, Any] = {"key": case.key(), "family": case.family, "op": case.op, "dtype": case.dtype,
                           "dist": case.dist, **dict(case.params), **features}
    row.update(median_s=stats.median_s, p10_s=stats.p10_s, p90_s=stats.p90_s, repeats=stats.repeats)
    return row


def run(cases: Sequence[Case], opts: Options) -> int:
    """Measure the ``cases`` not yet in ``opts.out``; returns how many were measured now."""
    import torch

    opts.out.mkdir(parents=True, exist_ok=True)
    done = store.known_keys(opts.out)
    todo = [c for c in cases if c.key() not in done]
    bar = _Progress(len(cases), len(cases) - len(todo), opts.progress)
    scratch = torch.zeros(max(1, opts.flush_bytes // 4), dtype=torch.float32, device=opts.device)

    def flush() -> None:
        scratch.add_(1.0)  # reads and writes every line: evicts what the caches held

    for case in todo:
        bench = build(case, opts.device, opts.seed)
        cold = flush if bench.cold and opts.flush_bytes > 0 else None
        stats = measure(bench.run, bench.prepare, opts.device, opts.policy, cold)
        store.append_row(opts.out, case.family, _row(case, stats, bench.features))
        del bench
        if opts.device == "cuda":
            torch.cuda.empty_cache()
        bar.update(case)
    bar.close()
    write_device_summary(opts.out, opts.device)
    return len(todo)


class _Progress:
    """A progress bar on stderr (tqdm when it is installed and stderr is a terminal)."""

    def __init__(self, total: int, done: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, done, enabled
        self._tqdm: Any = None
        if enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self._tqdm = tqdm(total=total, initial=done, unit="case", file=sys.stderr)
            except ImportError:
                self._tqdm = None

    def update(self, case: Case) -> None:
        self.done += 1
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(f"{case.family}/{case.op}", refresh=False)
            self._tqdm.update(1)
        elif self.enabled and (self.done % 50 == 0 or self.done == self.total):
            print(f"[{self.done}/{self.total}] {case.family}/{case.op}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return pyplatform.processor() or pyplatform.machine()


def machine(device: str) -> dict[str, Any]:
    """What identifies the measured machine: device name, CPU count and vector ISA, torch build."""
    import torch

    return {"name": torch.cuda.get_device_name() if device == "cuda" else _cpu_name(), "cpus": os.cpu_count(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}


def write_device_summary(out: Path, device: str) -> Path:
    """``device.json``: the figures a platform file takes from these measurements."""
    import torch

    tables = {p.stem: pd.read_csv(p) for p in sorted(out.glob("*.csv")) if p.stem in FAMILY_PARAMS}
    summary: dict[str, Any] = {
        "device": device, **machine(device), "threads": torch.get_num_threads(),
        "clock": "cuda_events" if device == "cuda" else ("thread_cpu" if torch.get_num_threads() == 1 else "wall"),
    }
    gemm = tables.get("gemm")
    if gemm is not None and len(gemm):
        for dtype, t in gemm.groupby("dtype"):
            rate = 2 * t["m"] * t["n"] * t["k"] / t["median_s"]
            summary[f"gemm_best_tflops_{dtype}"] = float(rate.max() / 1e12)
    ew = tables.get("elementwise")
    if ew is not None and len(ew):
        copy = ew[(ew["op"] == "copy") & (ew["dtype"] == "fp32")]
        if len(copy):
            # the largest copies: memory, not cache, bandwidth (bytes read + written per second)
            big = copy.nlargest(3, "numel")
            summary["copy_largest_gbytes_per_s"] = float(np.median(big["numel"] * 8 / big["median_s"]) / 1e9)
            summary["copy_largest_bytes"] = float(big["numel"].max() * 8)
        small = ew[ew["numel"] <= 64]
        if len(small):
            summary["shortest_op_us"] = float(small["median_s"].min() * 1e6)
            summary["dispatch_us"] = float(np.median(small["median_s"]) * 1e6)
    mc = tables.get("memcpy")
    if mc is not None and len(mc):
        big = mc.nlargest(4, "nbytes")
        summary["memcpy_largest_gbytes_per_s"] = float(np.median(big["nbytes"] / big["median_s"]) / 1e9)
    path = out / "device.json"
    path.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return path
