"""From one rank's trace to its replay program: ops in CPU issue order with the measured times.

The CPU side is one thread per rank. Every runtime call that puts work on the GPU becomes an op,
issued when the work became ready (the end of the call, or earlier when the GPU started it
earlier); the CPU time since the previous op becomes that op's ``cpu_s`` (a separate ``host`` op
when longer than :data:`HOST_GAP_S`). Synchronising calls (device, stream and event
synchronisation, and copies that return only when the GPU copy has finished) become waits for the
GPU work they waited on; ``ProfilerStep#N`` boundaries become zero-length ``host`` markers.

The GPU side keeps each stream's order as the GPU ran it. Taking GPU ops in the order they
started, an op that started later than its launch and its stream predecessor allow waited for
another stream (``cudaStreamWaitEvent``): it depends on the op of another stream that ended just
before it started, and is issued no earlier than that op. An NCCL kernel also depends on the last
op its CPU thread launched before it (c10d makes the NCCL stream wait for the current stream). A
remaining delay between what an op waited for and its start becomes the op's ``delay_s``, time it
waits on its stream before it starts: mostly the GPU's own (launch latency, the gap between
kernels, and in older traces timestamps rounded down to whole microseconds); beyond
:data:`GAP_US` (:data:`LAUNCH_US` after a launch) it is a wait the trace does not explain, kept as
measured and counted. An op without its launch in the trace (work launched before the trace
began, or by an untraced thread) is issued with the op before it on its stream. Where two ops of
one stream overlap in the trace (branches of a CUDA graph), the first holds the stream only until
the second starts.

Units: seconds relative to the rank's first event (``origin_us``, microseconds from the trace's
``base_us``).
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .classify import CollInfo, KernelInfo, classify_kernel, collective_info, short_name
from .et import ExecutionTrace
from .kineto import Call, GpuOp, RankTrace, Span

#: Host time before an op longer than this becomes its own ``host`` op (seconds).
HOST_GAP_S = 20e-6
#: Timestamp slack: Kineto rounds to microseconds (microseconds).
TOL_US = 2.0
#: A cross-stream wait is inferred when the op starts at most this long after the other op's end (us).
WAIT_TOL_US = 10.0
#: The longest gap between two ops of a stream taken as the GPU's own gap between them (us).
GAP_US = 10.0
#: The longest delay between a launch and the start of its op taken as launch latency (us).
LAUNCH_US = 20.0
#: Issue-time step that keeps an op after the ops it depends on (us).
EPS_US = 1e-6
#: Calls that block the CPU until GPU work finishes.
SYNC_CALLS = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
                        "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize",
                        "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize"})
#: Calls that synchronise the whole device.
DEVICE_SYNC_CALLS = frozenset({"cudaDeviceSynchronize", "cuCtxSynchronize", "hipDeviceSynchronize"})


@dataclass(slots=True, eq=False)
class Item:
    """One op of a replay program; see the module docstring. ``kind`` is ``gpu``, ``collective``,
    ``sync``, ``host``, ``step_start`` or ``step_end``; GPU times are traced, from the rank's origin;
    ``delay_s`` is the measured wait of a GPU op on its stream before it started (module docstring)."""

    kind: str
    name: str
    category: str
    cpu_s: float = 0.0
    stream: int = -1
    dur_s: float = 0.0
    delay_s: float = 0.0
    start_s: float = 0.0
    end_s: float = 0.0
    deps: tuple[int, ...] = ()
    info: KernelInfo | None = None
    coll: CollInfo | None = None
    step: int = -1


@dataclass
class RankProgram:
    """The replay program of one traced rank; ``steps`` maps step number to its traced (start, end) s;
    ``end_s`` is the end of its last traced event; ``unexplained`` counts GPU ops whose delay before
    starting nothing in the trace explains."""

    rank: int
    world_size: int | None
    file: str
    gpu: str | None
    origin_us: float
    items: list[Item]
    steps: dict[int, tuple[float, float]]
    stream_names: dict[int, str]
    complete_steps: list[int]
    end_s: float = 0.0
    unexplained: int = 0
    warnings: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True, eq=False)
class _Entry:
    """A CPU-timeline event while building: ``key`` is its issue time (us), ``launch`` when its
    work was ready on the CPU; ``deps`` are entries it waits for."""

    key: float
    prio: int
    seq: int
    kind: str
    call: Call | None = None
    op: GpuOp | None = None
    first: bool = True
    launch: float = 0.0
    comm: bool = False
    wait_on: _Entry | None = None
    deps: list[_Entry] = field(default_factory=list)
    order: int = -1
    delay: float = 0.0
    trim: float = 0.0
    step: int = -1
    ctx: tuple[Span, ...] = ()


def _contexts(spans: Sequence[Span], calls: Sequence[Call]) -> dict[int, tuple[Span, ...]]:
    """For each call (by index), the CPU spans of its thread that enclose its start, outermost first."""
    by_tid: dict[int, list[Span]] = defaultdict(list)
    for s in spans:
        by_tid[s.tid].append(s)
    out: dict[int, tuple[Span, ...]] = {}
    order = sorted(range(len(calls)), key=lambda i: (calls[i].tid, calls[i].ts))
    tid: int | None = None
    j = 0
    stack: list[Span] = []
    sp: list[Span] = []
    for i in order:
        c = calls[i]
        if c.tid != tid:
            tid, j, stack, sp = c.tid, 0, [], by_tid.get(c.tid, [])
        while j < len(sp) and sp[j].ts <= c.ts:
            s = sp[j]
            j += 1
            while stack and stack[-1].end < s.ts:
                stack.pop()
            stack.append(s)
        while stack and stack[-1].end < c.ts:
            stack.pop()
        out[i] = tuple(stack)
    return out


def _ctx_args(ctx: tuple[Span, ...], et: ExecutionTrace | None) -> list[tuple[str, Any, Any, Any]]:
    """Innermost first: (name, collective args, input dims, input types), dims from the ET if missing."""
    out = []
    for s in reversed(ctx):
        dims, types = s.dims, s.types
        if dims is None and et is not None:
            dims, et_types = et.lookup(s.ids)
            types = types or et_types
        out.append((s.name, s.coll, dims, types))
    return out


def build_program(tr: RankTrace, et: ExecutionTrace | None = None) -> RankProgram:
    """The replay program of one rank's trace (see the module docstring)."""
    warn: Counter[str] = Counter(tr.warnings)
    by_corr = {c.corr: i for i, c in enumerate(tr.calls) if c.corr >= 0}
    launched: dict[int, list[GpuOp]] = defaultdict(list)
    entries: list[_Entry] = []
    for g in tr.gpu_ops:
        ci = by_corr.get(g.corr)
        if ci is None:
            entries.append(_Entry(g.ts, 1, len(entries), "gpu", op=g, launch=g.ts, comm=_is_nccl(g)))
        else:
            launched[ci].append(g)
    wanted = sorted(set(launched) | {i for i, c in enumerate(tr.calls) if c.name in SYNC_CALLS})
    ctx_list = _contexts(tr.spans, [tr.calls[i] for i in wanted])
    ctx = {ci: ctx_list[k] for k, ci in enumerate(wanted)}
    launch_keys: list[tuple[float, int]] = []
    for ci, ops in launched.items():
        c = tr.calls[ci]
        ops.sort(key=lambda g: (g.ts, g.end))
        key = min(max(ops[0].ts, c.ts), c.end)
        launch_keys.append((key, c.tid))
        for k, g in enumerate(ops):
            entries.append(_Entry(key, 1, len(entries), "gpu", call=c, op=g, first=k == 0, launch=key,
                                  comm=_is_nccl(g), ctx=ctx[ci]))
        last = entries[-1]
        if c.name.startswith(("cudaMemcpy", "hipMemcpy", "cuMemcpy")) and ops[-1].kind == "memcpy" \
                and ops[-1].end <= c.end + TOL_US:
            entries.append(_Entry(key, 1, len(entries), "sync", call=c, wait_on=last, first=False, launch=key))
    launch_keys.sort()
    for ci in wanted:
        c = tr.calls[ci]
        if ci in launched:
            continue
        lo = bisect.bisect_right(launch_keys, (c.ts, 1 << 62))
        hi = bisect.bisect_left(launch_keys, (c.end, -1))
        if any(t != c.tid for _, t in launch_keys[lo:hi]):
            warn["synchronisations overlapped by other threads' launches (kept as CPU time)"] += 1
            continue
        entries.append(_Entry(c.ts, 1, len(entries), "sync", call=c, launch=c.ts, ctx=ctx[ci]))
    end_of_trace = tr.last_ts
    # a cut file may have lost the GPU work of its last steps: their ends must be covered by both
    covered = end_of_trace if not tr.truncated else min(
        max((c.end for c in tr.calls), default=0.0), max((g.end for g in tr.gpu_ops), default=0.0))
    complete = []
    for st in tr.steps:
        entries.append(_Entry(st.ts, 0, len(entries), "step_start", step=st.number, launch=st.ts))
        entries.append(_Entry(st.end, 2, len(entries), "step_end", step=st.number, launch=st.end))
        if st.dur > 0 and st.end <= covered + TOL_US:
            complete.append(st.number)
    if len(complete) < len(tr.steps):
        warn["ProfilerStep spans that end after the last event (incomplete, not compared)"] += (
            len(tr.steps) - len(complete))
    unexplained = _schedule(entries, warn)
    _sync_deps(entries, tr.stream_syncs)
    entries.sort(key=lambda e: (e.key, e.prio, 0 if e.kind == "gpu" else 1, e.order if e.kind == "gpu" else e.seq))
    origin = min([e.key for e in entries[:1]] + [c.ts for c in tr.calls[:1]])
    items = _walk(entries, origin, tr, et, warn)
    names = _stream_names(items)
    steps = {st.number: ((st.ts - origin) * 1e-6, (st.end - origin) * 1e-6) for st in tr.steps}
    return RankProgram(tr.rank, tr.world_size, tr.file, tr.gpu, tr.base_us + origin, items, steps, names,
                       complete, (end_of_trace - origin) * 1e-6, unexplained, warn)


def _is_nccl(g: GpuOp) -> bool:
    return g.kind == "kernel" and "nccl" in g.name.lower()


def _schedule(entries: list[_Entry], warn: Counter[str]) -> int:
    """Dependencies, delays and issue times of GPU entries (see the module docstring); returns how
    many ops were delayed by more than the trace explains."""
    gpu = [e for e in entries if e.kind == "gpu" and e.op is not None]
    last_launched: dict[int, _Entry] = {}
    for e in sorted(gpu, key=lambda e: (e.launch, e.seq)):
        tid = e.call.tid if e.call is not None else None
        if tid is None:
            continue
        j = last_launched.get(tid)
        if e.comm and j is not None and j.op is not None and e.op is not None and j.op.end <= e.op.ts:
            e.deps.append(j)
        if not e.comm:
            last_launched[tid] = e
    gpu.sort(key=lambda e: (e.op.ts, e.op.end, e.seq) if e.op is not None else (0.0, 0.0, e.seq))
    prev: dict[int, _Entry] = {}
    ends: dict[int, list[tuple[float, int]]] = defaultdict(list)
    plan: list[tuple[_Entry, _Entry | None, float, str]] = []  # (entry, stream predecessor, gap, what bound it)
    for n, e in enumerate(gpu):
        g = e.op
        if g is None:
            continue
        e.order = n
        p = prev.get(g.stream)
        if e.call is None:  # not launched in the trace: issued with the op before it on its stream
            e.launch = e.key = min(g.ts, p.launch) if p is not None else g.ts
        p_end = p.op.end if p is not None and p.op is not None else float("-inf")
        if p is not None and g.ts < p_end:  # overlapping ops of one stream (CUDA graph branches)
            p.trim, p_end = min(p_end - g.ts, p.op.dur if p.op is not None else 0.0), g.ts
        ready = max([e.launch, p_end] + [d.op.end for d in e.deps if d.op is not None])
        if g.ts > ready + TOL_US:
            best: tuple[float, int] | None = None
            for stream, lst in ends.items():
                k = bisect.bisect_right(lst, (g.ts, 1 << 62))
                if stream != g.stream and k and (best is None or lst[k - 1][0] > best[0]):
                    best = lst[k - 1]
            if best is not None and g.ts - best[0] <= WAIT_TOL_US and best[0] > ready - TOL_US:
                e.deps.append(gpu[best[1]])
                ready = max(ready, best[0])
        bound = "stream" if ready == p_end else "launch" if ready == e.launch else "wait"
        plan.append((e, p, g.ts - ready, bound))
        prev[g.stream] = e
        bisect.insort(ends[g.stream], (g.end, n))
    unexplained, unexplained_us = 0, 0.0
    for e, p, gap, bound in plan:
        if gap > 0.0:
            e.delay = gap
            if gap > (LAUNCH_US if bound == "launch" else GAP_US):
                unexplained += 1
                unexplained_us += gap
        e.key = max([e.key] + [d.key + EPS_US for d in e.deps] + ([p.key] if p is not None else []))
    if unexplained:
        warn[f"GPU ops that started later than their launch, stream and inferred waits explain, replayed "
             f"with their measured delay (total {unexplained_us * 1e-3:.3f} ms)"] += unexplained
    return unexplained


def _sync_deps(entries: list[_Entry], stream_syncs: dict[int, int]) -> None:
    """What each synchronising call waited for: the last op launched before it on the stream it
    synchronised (known from ``cuda_sync`` events, else the one that ended last before it returned;
    every stream for a device synchronisation); the call is issued after them."""
    by_stream: dict[int, list[_Entry]] = defaultdict(list)
    for e in entries:
        if e.kind == "gpu" and e.op is not None:
            by_stream[e.op.stream].append(e)
    launches = {stream: sorted(es, key=lambda x: (x.launch, x.seq)) for stream, es in by_stream.items()}
    times = {stream: [x.launch for x in es] for stream, es in launches.items()}
    for e in entries:
        if e.kind != "sync" or e.call is None:
            continue
        if e.wait_on is not None:
            e.deps = [e.wait_on]
        else:
            c = e.call
            last = {}
            for stream, lst in launches.items():
                k = bisect.bisect_left(times[stream], c.ts)
                if k:
                    last[stream] = lst[k - 1]
            if c.name in DEVICE_SYNC_CALLS:
                e.deps = [d for d in last.values() if d.op is not None and d.op.end <= c.end + TOL_US]
            elif c.corr in stream_syncs and stream_syncs[c.corr] in last:
                e.deps = [last[stream_syncs[c.corr]]]
            else:
                done = [d for d in last.values() if d.op is not None and d.op.end <= c.end + TOL_US]
                e.deps = [max(done, key=lambda d: (d.op.end if d.op is not None else 0.0, d.seq))] if done else []
        e.key = max([e.key] + [d.key + EPS_US for d in e.deps])


def _walk(entries: list[_Entry], origin: float, tr: RankTrace, et: ExecutionTrace | None,
          warn: Counter[str]) -> list[Item]:
    """Items in issue order with their CPU times and dependencies as item indices."""
    items: list[Item] = []
    index: dict[int, int] = {}
    cursor = origin
    late = 0.0  # how far a wait that ended after its call returned (timestamp rounding) put the CPU behind
    for e in entries:
        start = e.call.ts if e.call is not None and e.first else e.key
        gap = max(0.0, min(start, e.key) - cursor)
        own = max(0.0, e.key - max(cursor, start)) if e.kind == "gpu" and e.first else 0.0
        if late > 0.0:
            take_gap = min(late, gap)
            take_own = min(late - take_gap, own)
            gap, own, late = gap - take_gap, own - take_own, late - take_gap - take_own
        if gap * 1e-6 > HOST_GAP_S:
            label = short_name(e.ctx[-1].name) if e.ctx else "cpu"
            items.append(Item("host", label, "host", cpu_s=gap * 1e-6))
            own_s = own * 1e-6
        else:
            own_s = (gap + own) * 1e-6
        deps = tuple(sorted({index[id(d)] for d in e.deps if id(d) in index}))
        if len(deps) < len({id(d) for d in e.deps}):
            warn["dependencies on ops issued later dropped"] += len({id(d) for d in e.deps}) - len(deps)
        index[id(e)] = len(items)
        if e.kind == "gpu" and e.op is not None:
            items.append(_gpu_item(e, e.op, own_s, deps, origin, tr, et, warn))
            items[-1].delay_s = e.delay * 1e-6
            items[-1].dur_s -= e.trim * 1e-6
            cursor = max(cursor, e.key)
        elif e.kind == "sync" and e.call is not None:
            items.append(Item("sync", e.call.name, "host_wait", own_s, deps=deps))
            ends = [d.op.end for d in e.deps if d.op is not None]
            cursor = max(cursor, min(max([e.call.ts] + ends), e.call.end))
            if ends:
                late = max(late, max(ends) - e.call.end)
        else:
            step_name = f"ProfilerStep#{e.step}" + (" end" if e.kind == "step_end" else "")
            items.append(Item(e.kind, step_name, "step", own_s, step=e.step))
            cursor = max(cursor, e.key)
    return items


def _gpu_item(e: _Entry, g: GpuOp, cpu_s: float, deps: tuple[int, ...], origin: float, tr: RankTrace,
              et: ExecutionTrace | None, warn: Counter[str]) -> Item:
    args = _ctx_args(e.ctx, et)
    top = args[0] if args else (None, None, None, None)
    info = classify_kernel(g.name, g.kind, top[0], top[2], top[3])
    it = Item("gpu", short_name(g.name), info.category, cpu_s=cpu_s, stream=g.stream, dur_s=g.dur * 1e-6,
              start_s=(g.ts - origin) * 1e-6, end_s=(g.end - origin) * 1e-6, deps=deps, info=info)
    if info.cls == "comm":
        it.kind = "collective"
        it.coll = collective_info(g.name, g.stream, g.coll, args, tr.rank, tr.world_size, tr.pg_config)
        it.category = it.coll.op
        if not it.coll.known_op:
            warn["NCCL kernels of unknown collective (taken as all_reduce)"] += 1
    elif not info.known:
        warn["kernels of unknown class (scaled by memory bandwidth in a what-if)"] += 1
    return it


def _stream_names(items: list[Item]) -> dict[int, str]:
    """``compute`` for the busiest kernel stream, ``comm`` / ``comm2``... for NCCL streams, else ``stream<id>``."""
    busy: Counter[int] = Counter()
    nccl: Counter[int] = Counter()
    for it in items:
        if it.kind == "gpu":
            busy[it.stream] += 1
        elif it.kind == "collective":
            nccl[it.stream] += 1
    names: dict[int, str] = {}
    for k, (s, _) in enumerate(sorted(nccl.items(), key=lambda kv: (-kv[1], kv[0]))):
        names[s] = "comm" if k == 0 else f"comm{k + 1}"
    rest = [s for s, _ in sorted(busy.items(), key=lambda kv: (-kv[1], kv[0])) if s not in names]
    for k, s in enumerate(rest):
        names[s] = "compute" if k == 0 else f"stream{s}"
    return names
