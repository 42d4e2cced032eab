"""Clocks of the harness: CUDA events on a GPU, a monotonic clock on the CPU.

:func:`measure` warms an op up, then times calls until it has enough repeats and enough total
time, and returns the median and the 10th / 90th percentiles in seconds per call. An op may need
fresh inputs before each call (a backward needs its forward): ``prepare`` runs untimed before each.

On the CPU with one torch thread the clock is that thread's CPU time (``CLOCK_THREAD_CPUTIME_ID``):
torch then runs every op on the calling thread, so the CPU time is the op's time on the core, and
time the scheduler gives other processes of a shared machine is not counted (on an idle machine
the two clocks agree). With more threads, wall time (``perf_counter``). Short ops without
``prepare`` are timed in batches of calls between two clock reads, so the clock's own cost
(about a microsecond for the thread clock) does not inflate them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Policy:
    """How long to measure one case."""

    warmup: int = 2            # untimed calls first
    min_repeats: int = 5       # timed calls at least
    max_repeats: int = 200     # and at most
    min_time_s: float = 0.03   # and until this much was measured (if under max_repeats)


@dataclass(frozen=True)
class Stats:
    """Seconds per call: median, 10th and 90th percentiles, and how many calls were timed."""

    median_s: float
    p10_s: float
    p90_s: float
    repeats: int


def cpu_clock() -> Callable[[], int]:
    """The CPU clock the harness and the end-to-end check use, in nanoseconds; see the module docstring."""
    import torch

    return time.thread_time_ns if torch.get_num_threads() == 1 else time.perf_counter_ns


def measure(run: Callable[[], object], prepare: Callable[[], object] | None, device: str,
            policy: Policy = Policy(), flush: Callable[[], object] | None = None) -> Stats:
    """Time ``run`` on ``device`` (``cpu`` or ``cuda``) under ``policy``; ``flush``, if given, runs
    untimed after ``prepare`` before every call, so that each starts from cold caches."""
    import torch

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    clock = cpu_clock()
    t0 = clock()
    for _ in range(policy.warmup):
        if prepare is not None:
            prepare()
        if flush is not None:
            flush()
        run()
    sync()
    warm_s = (clock() - t0) * 1e-9 / max(1, policy.warmup)
    # calls per clock read on the CPU: enough for ~50 us, when calls need no fresh inputs
    single = cuda or prepare is not None or flush is not None
    batch = 1 if single else int(np.clip(5e-5 / max(warm_s, 1e-9), 1, 100))
    times: list[float] = []
    events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    total = 0.0
    while len(times) + len(events) < policy.max_repeats:
        if prepare is not None:
            prepare()
        if flush is not None:
            flush()
            sync()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            events.append((start, end))
            if single or len(events) % 8 == 0:
                torch.cuda.synchronize()
                times.extend(s.elapsed_time(e) * 1e-3 for s, e in events)
                total += sum(times[-len(events):])
                events.clear()
        else:
            t0 = clock()
            for _ in range(batch):
                run()
            t = (clock() - t0) * 1e-9 / batch
            times.append(t)
            total += t * batch
        n = len(times)
        if n >= policy.min_repeats and total >= policy.min_time_s:
            break
    if events:
        torch.cuda.synchronize()
        times.extend(s.elapsed_time(e) * 1e-3 for s, e in events)
    arr = np.asarray(times)
    return Stats(float(np.median(arr)), float(np.percentile(arr, 10)), float(np.percentile(arr, 90)), len(arr))
