"""``python -m simgpu.speed`` (``make bench``): the simulator's own speed and memory.

Each case (:mod:`simgpu.speed_cases`) runs in a fresh process so that its peak memory is its own.
Prints, per case, the wall time of simulating one iteration (building, kernel prediction and the
event loop; files are not written), the simulated events, events per second and the peak resident
memory.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import queue
import resource
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from .cli import ArgParser, check_out_file, entry, run_command
from .errors import ConfigError
from .speed_cases import CASES, ROOT

#: one JSON line per recorded run: {"when": ..., "cases": {name: {"wall_s", "events", "peak_mib"}}}
HISTORY = ROOT / "tests" / "benchmarks" / "history.jsonl"


#: what a case's process sends back: its figures, or why it did not finish
Outcome = tuple[float, float, int, float] | str


def _measure(name: str, out: mp.Queue[Outcome]) -> None:
    """Run one case and send back its figures; a case that would take more memory than the machine
    has available is stopped by an address-space limit there and reported, not left to swap."""
    from .config.checks import available_memory

    limit = int(available_memory() * 0.9)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    t0 = time.perf_counter()
    try:
        simulated, events = CASES[name][1]()
    except MemoryError:
        out.put(f"ran out of memory (more than the {limit / 2**30:.1f} GiB available)")
        return
    except ConfigError as e:
        out.put(f"refused: {e}")
        return
    wall = time.perf_counter() - t0
    peak_mib = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024
    out.put((wall, simulated, events, peak_mib))


def _previous() -> dict[str, dict[str, float]]:
    if not HISTORY.is_file():
        return {}
    lines = [ln for ln in HISTORY.read_text().splitlines() if ln.strip()]
    return dict(json.loads(lines[-1])["cases"]) if lines else {}


def _last_when() -> str:
    if not HISTORY.is_file():
        return "never"
    lines = [ln for ln in HISTORY.read_text().splitlines() if ln.strip()]
    return str(json.loads(lines[-1]).get("when", "?")) if lines else "never"


def _where(filename: str) -> str:
    """A profiled function's file, as ``simgpu/engine/core.py`` or ``simpy/core.py``."""
    if filename == "~":
        return "(built-in functions: len, list and dict methods, heapq, ...)"
    path = Path(filename)
    parts = path.parts
    if "site-packages" in parts:
        return "/".join(parts[parts.index("site-packages") + 1:])
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return path.name


class _Event:
    __slots__ = ("i", "r")

    def __init__(self, r: int, i: int) -> None:
        self.r, self.i = r, i


def event_floor(pending: int, events: int = 2_000_000) -> float:
    """CPU seconds an event costs a loop that does nothing but what every event of the engine does:
    pop the earliest of ``pending`` events from a heap of SimPy's ``(time, priority, id, event)``
    tuples, dispatch on its class, call one function (which only counts) and push the rank's next
    event; the least a discrete-event loop in this interpreter can cost per op."""
    import heapq
    import itertools

    eid = itertools.count()
    q = [((k * 7919) % pending / pending, 1, next(eid), _Event(k, 0)) for k in range(pending)]
    heapq.heapify(q)
    done = [0] * pending

    def finish(r: int, i: int) -> None:
        done[r] += 1

    pop, push = heapq.heappop, heapq.heappush
    t0 = time.process_time()
    for left in range(events):
        now, _, _, ev = pop(q)
        if ev.__class__ is _Event:
            finish(ev.r, ev.i)
        push(q, (now + 1e-5 * (1 + (left & 7)), 1, next(eid), _Event(ev.r, ev.i + 1)))
    return (time.process_time() - t0) / events


class _Lane:
    """One rank of :func:`op_floor`: its op times, dependency counts and stream."""

    __slots__ = ("end", "issue", "launch", "left", "queue", "start")
    end: list[float]
    issue: list[float]
    launch: list[float]
    left: list[int]
    queue: deque[int]
    start: list[float]


def op_floor(ranks: int, ops: int) -> float:
    """CPU seconds an op costs the least engine that keeps what simgpu's keeps per op: each of
    ``ranks`` ranks' CPU thread launches ``ops`` kernels onto one stream (launch and issue times
    written), each kernel depending on the one before it (a dependency counter); a kernel starts
    when the stream is free and its counter is zero (start time written, its end pushed on a heap of
    SimPy's tuples); its end (popped, dispatched on its class) writes its end time, counts down its
    dependent and starts the stream's next kernel. No collectives, no network, no records."""
    import heapq
    import itertools

    eid = itertools.count()
    pop, push = heapq.heappop, heapq.heappush
    dur = [1e-5 * (1 + (i & 7)) for i in range(ops)]
    dependents = [[i + 1] if i + 1 < ops else [] for i in range(ops)]
    q: list[tuple[float, int, int, _Event]] = []
    lanes: list[_Lane] = []
    t0 = time.process_time()
    for k in range(ranks):
        r = _Lane()
        r.launch, r.issue, r.start, r.end = [0.0] * ops, [0.0] * ops, [0.0] * ops, [0.0] * ops
        r.left, r.queue = [0] + [1] * (ops - 1), deque()
        lanes.append(r)
        cpu = (k * 7919) % ranks / ranks * 1e-5
        for i in range(ops):
            r.launch[i] = cpu
            cpu += 5e-6
            r.issue[i] = cpu
            r.queue.append(i)
    for k, r in enumerate(lanes):
        r.queue.popleft()  # the first kernel, started by hand with its rank's index on its event
        r.start[0] = 0.0
        push(q, (dur[0], 1, next(eid), _Event(k, 0)))
    events = 0
    while q:
        now, _, _, ev = pop(q)
        if ev.__class__ is _Event:
            r, i = lanes[ev.r], ev.i
            r.end[i] = now
            left = r.left
            for d in dependents[i]:
                left[d] -= 1
            if r.queue:
                j = r.queue[0]
                if left[j] <= 0:
                    r.queue.popleft()
                    r.start[j] = now
                    push(q, (now + dur[j], 1, next(eid), _Event(ev.r, j)))
        events += 1
    return (time.process_time() - t0) / events


def profile(name: str, top: int = 15) -> str:
    """cProfile of one case in this process: own time by file, then the functions with the most
    cumulative time."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    CASES[name][1]()
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values())
    by_file: dict[str, float] = {}
    for (filename, _, _), (_, _, own, _, _) in stats.items():
        where = _where(filename)
        by_file[where] = by_file.get(where, 0.0) + own
    lines = [f"{total:.1f} s profiled; own time by file:"]
    for where, t in sorted(by_file.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {t:7.2f} s {t / total:6.1%}  {where}")
    lines.append("functions by cumulative time:")
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][3])
    for (filename, line, func), (_, calls, _, cum, _) in ranked[:top]:
        lines.append(f"  {cum:7.2f} s {calls:>10,d} calls  {_where(filename)}:{line} {func}")
    return "\n".join(lines)


def _family(name: str) -> str:
    """The scaling plot's line of case ``name``: the GPT-3 sizes folded, the GPT-3 sizes with every
    rank simulated, and one line per other family; a case of its own (GPT-3 at another batch or
    network, a single all-reduce) is a point labelled with its name."""
    if name.startswith("gpt-3"):
        if name.endswith("every rank"):
            return "GPT-3 175B, every rank simulated"
        return "GPT-3 175B (TP8 PP16, replicas folded)" if "(TP8 PP16" in name else name
    if name.startswith("all-reduce"):
        return "all-reduce 1 GB" if name.startswith("all-reduce 1 GB") else name
    if "steady state" in name or "isolated" in name:
        return name
    first = name.split(" ", 1)[0]
    return {"gpt": "GPT 1.3B", "dlrm": "DLRM", "all-to-all": "all-to-all 64 KiB-1 GiB (4 sizes)"}.get(first, name)


def plot_scaling(path: Path, history: dict[str, dict[str, float]]) -> None:
    """Wall time against GPUs of the recorded cases, one line per family of cases."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families: dict[str, list[tuple[int, float]]] = {}
    for name, (gpus, _) in CASES.items():
        if name in history:
            if name.startswith("study"):
                continue
            families.setdefault(_family(name), []).append((gpus, float(history[name]["wall_s"])))
    fig, ax = plt.subplots(figsize=(9.6, 4.6))
    for family, points in sorted(families.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="s" if len(points) == 1 else "o",
                linestyle="-" if len(points) > 1 else "none", label=family)
    ax.set_xscale("log", base=2)
    ticks = sorted({g for g, _ in CASES.values()})
    ax.set_xticks(ticks, [f"{g:,}" for g in ticks], fontsize=7)
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel("GPUs simulated")
    ax.set_ylabel("wall time of one iteration (s, one core)")
    ax.grid(True, which="both", linewidth=0.3, alpha=0.5)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title("simgpu's own cost (make bench)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def speed_page(page: Path, history: dict[str, dict[str, float]], when: str) -> None:
    """Write the documentation's Speed page (``page``) and its scaling plot beside it from the
    recorded figures of every case (:data:`HISTORY`'s last run merged with this one's)."""
    image = page.with_name(page.stem + "-scaling.png")
    plot_scaling(image, history)
    lines = ["# Speed", "",
             f"Generated by `make bench` (`python -m simgpu.speed --report {page.as_posix()}`) from the figures "
             f"recorded in `tests/benchmarks/history.jsonl` (last run {when}): each case is timed in a fresh "
             "process on one core of a 2-core machine; wall seconds of one simulated iteration (or study, or "
             "collective), the engine's events, and the peak resident memory. How each figure came about and "
             "where the time goes: [performance](performance.md).", "",
             f"![wall time against GPUs]({image.name})", "",
             "| case | GPUs | wall s | events | events/s | peak MiB |", "|---|---|---|---|---|---|"]
    for name, (gpus, _) in CASES.items():
        fig = history.get(name)
        if fig is None:
            lines.append(f"| {name} | {gpus:,} | not measured | | | |")
            continue
        wall, events = float(fig["wall_s"]), int(fig.get("events", 0))
        rate = f"{events / wall:,.0f}" if events and wall > 0 else "-"
        lines.append(f"| {name} | {gpus:,} | {wall:.2f} | {events:,} | {rate} | {float(fig.get('peak_mib', 0)):,.0f} |")
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("\n".join(lines) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    ap = ArgParser(prog="simgpu speed", description=__doc__.splitlines()[0])
    ap.add_argument("-k", default="", help="run only cases whose name contains this text")
    ap.add_argument("--no-record", action="store_true", help=f"do not append this run to {HISTORY.name}")
    ap.add_argument("--profile", action="store_true",
                    help="instead of timing, profile the (first) matching case and print the top functions")
    ap.add_argument("--floor", action="store_true",
                    help="instead of the cases, time a bare event loop (heap, dispatch, one call) per event")
    ap.add_argument("--plot", metavar="PNG", help="draw wall time against GPUs from the last recorded run (with "
                    "-k: after running the matching cases, with their new times; without: no case is run)")
    ap.add_argument("--report", metavar="PAGE", type=Path,
                    help="also write the documentation's Speed page (markdown) and its plot beside it from the "
                         "recorded figures, after running the cases (with --no-cases: without running any)")
    ap.add_argument("--no-cases", action="store_true", help="run no case (with --report or --plot)")
    args = ap.parse_args(argv)
    if args.report:
        check_out_file(args.report, "--report")
    if args.plot:
        check_out_file(args.plot, "--plot")
    if args.profile:
        name = next((n for n in CASES if args.k in n), None)
        if name is None:
            raise ConfigError(f"no case matches {args.k!r}; expected part of a case name: {', '.join(CASES)}",
                              key="-k")
        print(f"profile of {name}\n{profile(name)}")
        return 0
    if args.floor:
        for pending in (2_048, 32_768):
            per = event_floor(pending)
            print(f"bare event loop, {pending:,} events pending: {per * 1e9:,.0f} ns an event "
                  f"({per * 1e6:.1f} s a million events)")
        for ranks, ops in ((2_048, 400), (32_768, 60)):
            per = op_floor(ranks, ops)
            print(f"least engine, {ranks:,} ranks' streams: {per * 1e9:,.0f} ns an op "
                  f"({per * 1e6:.1f} s a million ops)")
        return 0
    ctx = mp.get_context("spawn")
    before = _previous()
    if (args.plot and not args.k) or args.no_cases:
        if args.plot:
            plot_scaling(Path(args.plot), before)
            print(f"wrote {args.plot}")
        if args.report:
            speed_page(args.report, before, _last_when())
            print(f"wrote {args.report}")
        return 0
    print(f"{'case':40} {'wall s':>8} {'vs last':>8} {'simulated ms':>13} {'events':>9} {'events/s':>10} "
          f"{'peak MiB':>9}")
    cases: dict[str, dict[str, float]] = {}
    for name in CASES:
        if args.k not in name:
            continue
        q: mp.Queue[Outcome] = ctx.Queue()
        p = ctx.Process(target=_measure, args=(name, q))
        p.start()
        while True:
            try:
                outcome = q.get(timeout=1.0)
                break
            except queue.Empty:
                if not p.is_alive():
                    outcome = f"its process ended with exit code {p.exitcode}"
                    break
        p.join()
        if isinstance(outcome, str):
            print(f"{name:40} {'-':>8} {'-':>8}   not measured: {outcome}", flush=True)
            continue
        wall, simulated, events, peak = outcome
        rate = f"{events / wall:,.0f}" if events else "-"
        last = before.get(name, {}).get("wall_s")
        ratio = f"{wall / last:7.2f}x" if last else "      -"
        print(f"{name:40} {wall:8.2f} {ratio:>8} {simulated * 1e3:13.3f} {events:9,d} {rate:>10} {peak:9.0f}",
              flush=True)
        cases[name] = {"wall_s": round(wall, 3), "events": events, "peak_mib": round(peak, 1)}
    if not args.no_record and cases:
        HISTORY.parent.mkdir(parents=True, exist_ok=True)
        merged = {**before, **cases}
        with HISTORY.open("a") as f:
            f.write(json.dumps({"when": time.strftime("%Y-%m-%dT%H:%M:%S"), "cases": merged}) + "\n")
        print(f"recorded in {HISTORY.relative_to(ROOT)}")
    if args.plot:
        plot_scaling(Path(args.plot), {**before, **cases})
        print(f"wrote {args.plot}")
    if args.report:
        speed_page(args.report, {**before, **cases}, _last_when())
        print(f"wrote {args.report}")
    return 0


if __name__ == "__main__":
    entry(main)
