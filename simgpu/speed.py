"""``python -m simgpu.speed`` (``make bench``): the simulator's own speed and memory.

Each case runs in a fresh process so that its peak memory is its own. Prints, per case, the wall
time of simulating one iteration (building, kernel prediction and the event loop; files are not
written), the simulated events, events per second and the peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: one JSON line per recorded run: {"when": ..., "cases": {name: {"wall_s", "events", "peak_mib"}}}
HISTORY = ROOT / "tests" / "benchmarks" / "history.jsonl"


def _workload(path: str, *overrides: str) -> Callable[[], tuple[float, int]]:
    def run() -> tuple[float, int]:
        from .config.loader import load_job
        from .sim import simulate

        r = simulate(load_job(ROOT / path, list(overrides)))
        return r.iteration_time_s, r.events
    return run


def _allreduce(platform: str, nodes: int, nbytes: int) -> Callable[[], tuple[float, int]]:
    def run() -> tuple[float, int]:
        from .comm.collective import collective_result
        from .config.loader import load_platform

        r = collective_result(load_platform(platform)[0], "all_reduce", nbytes, nodes=nodes)
        return r.iteration_time_s, r.events
    return run


CASES: dict[str, Callable[[], tuple[float, int]]] = {
    "dlrm 16 GPU (2x dgx_a100)": _workload("workloads/dlrm_2x_dgx_a100.yaml"),
    "gpt 1.3B 16 GPU (2x dgx_h100)": _workload("workloads/gpt_2x_dgx_h100.yaml"),
    "gpt 1.3B 64 GPU (8x dgx_h100)": _workload("workloads/gpt_2x_dgx_h100.yaml", "nodes=8", "parallelism.dp=64"),
    "gpt-3 175B 1024 GPU (TP8 PP16 DP8)": _workload("workloads/gpt3_175b_1024x_a100.yaml"),
    "all-reduce 1 GB, 16 GPU": _allreduce("dgx_h100", 2, 1 << 30),
    "all-reduce 1 GB, 1024 GPU": _allreduce("dgx_h100", 128, 1 << 30),
    "all-reduce 1 GB, 4096 GPU": _allreduce("dgx_h100", 512, 1 << 30),
}


def _measure(name: str, queue: mp.Queue[tuple[float, float, int, float]]) -> None:
    t0 = time.perf_counter()
    simulated, events = CASES[name]()
    wall = time.perf_counter() - t0
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queue.put((wall, simulated, events, peak_mib))


def _previous() -> dict[str, dict[str, float]]:
    if not HISTORY.is_file():
        return {}
    lines = [ln for ln in HISTORY.read_text().splitlines() if ln.strip()]
    return dict(json.loads(lines[-1])["cases"]) if lines else {}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simgpu.speed", description=__doc__.splitlines()[0])
    ap.add_argument("-k", default="", help="run only cases whose name contains this text")
    ap.add_argument("--no-record", action="store_true", help=f"do not append this run to {HISTORY.name}")
    args = ap.parse_args(argv)
    ctx = mp.get_context("spawn")
    before = _previous()
    print(f"{'case':34} {'wall s':>8} {'vs last':>8} {'simulated ms':>13} {'events':>9} {'events/s':>10} "
          f"{'peak MiB':>9}")
    cases: dict[str, dict[str, float]] = {}
    for name in CASES:
        if args.k not in name:
            continue
        q: mp.Queue[tuple[float, float, int, float]] = ctx.Queue()
        p = ctx.Process(target=_measure, args=(name, q))
        p.start()
        wall, simulated, events, peak = q.get()
        p.join()
        rate = f"{events / wall:,.0f}" if events else "-"
        last = before.get(name, {}).get("wall_s")
        ratio = f"{wall / last:7.2f}x" if last else "      -"
        print(f"{name:34} {wall:8.2f} {ratio:>8} {simulated * 1e3:13.3f} {events:9,d} {rate:>10} {peak:9.0f}",
              flush=True)
        cases[name] = {"wall_s": round(wall, 3), "events": events, "peak_mib": round(peak, 1)}
    if not args.no_record and cases:
        HISTORY.parent.mkdir(parents=True, exist_ok=True)
        merged = {**before, **cases}
        with HISTORY.open("a") as f:
            f.write(json.dumps({"when": time.strftime("%Y-%m-%dT%H:%M:%S"), "cases": merged}) + "\n")
        print(f"recorded in {HISTORY.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
