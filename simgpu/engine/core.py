"""The discrete-event engine: CPU threads issue ops onto GPU streams; collectives meet and move bytes.

Per rank, a CPU thread walks the program in order, spending the launch overhead on each op (or the
op's own ``cpu_s``) and enqueueing it on its stream; ``host`` ops only keep the thread busy, and a
``host_wait`` blocks it until its dependencies finish. When a node's ranks outnumber its CPU
threads, the threads are time-shared and every launch takes proportionally longer. A stream runs
its ops one at a time in issue order; an op starts once it has been issued, the op before it on
the stream has finished and its explicit dependencies (cross-stream events) have finished, and
then its own ``delay_s`` (if any) has passed. A
collective starts when every member has reached it on its stream; its plan's transfers then share
the links with all other traffic through :class:`~simgpu.comm.network.FlowNetwork` (a collective
with a fixed ``duration_s``, from a trace, takes that long instead).

The event loop is SimPy's clock and event queue, driven by callbacks rather than one process per
op: the CPU thread's issue times are computed as it walks the program (it only stops at a
``host_wait``), and each op costs one event for its end, plus one for its start when it is issued
after the stream and its dependencies are ready.

A folded workload (programs for the representatives of identical ranks, see
:mod:`simgpu.engine.fold`) runs those ranks only: a collective starts when its representative
members have arrived (the others arrive at the same time, by symmetry) and moves the
representatives' share of its transfers.

The engine knows no model family and calls no kernel model: kernel durations arrive as an array.
"""

from __future__ import annotations

import gc
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Any

import numpy as np
import pandas as pd
import simpy
from simpy.events import NORMAL

from ..comm.network import AGGREGATE_FROM, FlowNetwork, _Soon, soon
from ..comm.plan import CollectiveRequest, TransferTable
from ..comm.planner import Planner
from ..errors import SimulationError
from ..graph import CollectiveCall, Op, Workload
from ..platform.topology import Topology
from ..result import LINK_RECORD_COLUMNS, LINK_STAT_COLUMNS, RECORD_COLUMNS, SimResult
from .fold import SLACK_FRACTION, FoldBroken, FoldMap


@dataclass(frozen=True)
class EngineOptions:
    """Host and overlap costs, from the platform (``sms``: the GPU's SMs); ``record_links`` keeps link
    busy intervals."""

    launch_s: float = 5e-6
    cpu_threads_per_node: int = 64
    overlap_slowdown: float = 0.0
    record_links: bool = False
    sms: int = 132
    #: per collective op (``all_reduce``, ``send_recv``, ...): the slowdown of a kernel that starts while
    #: one runs on its GPU, instead of ``overlap_slowdown`` (the largest of those running applies)
    overlap_slowdown_by_op: tuple[tuple[str, float], ...] = ()
    #: ``within_node`` / ``across_nodes``: the slowdown of a memory-bound kernel (``Workload.memory_bound``)
    #: beside a collective moving bytes within a node / across nodes, instead of the op's figure; empty:
    #: the op's figure for every kernel
    overlap_slowdown_memory: tuple[tuple[str, float], ...] = ()
    #: carry a collective's transfers alike as aggregate flows (exact, see simgpu.comm.network); off:
    #: one flow per transfer, the plain simulation the aggregates are checked against
    aggregate: bool = True
    #: try the periodic shortcut for a pipeline's identical middle micro-batches (exact where it is
    #: used, see simgpu.engine.periodic); off: every micro-batch simulated
    periodic: bool = True
    #: keep every op's issue, start and end times (``meta["op_times"]``: rank -> three arrays in program
    #: order), for the check of the shortened first iteration (simgpu.engine.steady)
    op_times: bool = False


@dataclass(slots=True)
class _Rendezvous:
    call: CollectiveCall
    needed: int  # members that arrive (the representatives among them, when folded)
    arrived: dict[int, tuple[CollectiveCall, int]] = field(default_factory=dict)  # rank -> (call, op index)
    across: bool | None = None  # the group spans nodes (found where memory-bound kernels need it)


class _Stream:
    __slots__ = ("busy", "queue", "waking")

    def __init__(self) -> None:
        self.queue: deque[int] = deque()
        self.busy = False
        self.waking = False


class _Shape:
    """What the ranks of one template share (:attr:`Program.template`; a program without one is its
    own): each op's dependents and count of distinct dependencies."""

    __slots__ = ("counts", "dependents", "deps_left", "ends_on", "left", "ops", "ranks", "starts_on", "times")

    def __init__(self, ops: list[Op]) -> None:
        n = len(ops)
        self.ops = ops
        self.ranks: list[_Rank] = []
        self.left = 0  # ranks whose records are still to be made
        #: every rank's four times per op and its dependency counts, one block for all the ranks
        #: (given back at once when the last rank's records are made), set by :meth:`allocate`
        self.times = np.zeros((4, 0, n))
        self.counts = np.zeros((0, n), dtype=np.int32)
        self.deps_left = [0] * n
        self.dependents: list[list[int]] = [[] for _ in range(n)]
        #: per op, the stream whose queue its end frees (kernels, copies, collectives), else None
        self.ends_on: list[str | None] = [o.stream if o.kind in ("kernel", "memcpy", "collective") else None
                                          for o in ops]
        #: per op, the stream its last dependency's end may start it on (every kind but host work and
        #: host_wait), else None
        self.starts_on: list[str | None] = [None if o.kind in ("host", "host_wait") else o.stream for o in ops]
        for i, op in enumerate(ops):
            deps = set(op.deps)
            self.deps_left[i] = len(deps)
            for d in deps:
                self.dependents[d].append(i)

    def allocate(self, ranks: int) -> None:
        self.times = np.full((4, ranks, len(self.ops)), math.nan)
        self.counts = np.tile(np.asarray(self.deps_left, dtype=np.int32), (ranks, 1))
        self.left = ranks


class _Rank:
    """What the engine tracks for one rank while its program runs, and the times its records take.

    Each op has two records at most: on the CPU thread, its launch (a ``host`` op: its host work),
    from ``launch`` to ``issue``; a kernel, copy or collective on its stream from ``start`` to
    ``end``, a ``host_wait`` on the CPU thread from when the thread began to wait to when it went on.
    """

    __slots__ = (
        "cpu_time",
        "cursor",
        "dependents",
        "deps_left",
        "done",
        "end",
        "ends_on",
        "issue",
        "launch",
        "launch_scale",
        "ops",
        "rank",
        "start",
        "starts_on",
        "streams",
        "wait_since",
        "waiting",
    )

    def __init__(self, rank: int, ops: list[Op], shape: _Shape, k: int, launch_scale: float) -> None:
        """Rank ``rank``, the ``k``-th of its shape's (see :meth:`_Shape.allocate`)."""
        self.rank, self.ops, self.launch_scale = rank, ops, launch_scale
        # memoryviews into the shape's blocks: read and written one element at a time, as fast as
        # lists or arrays
        self.launch, self.issue, self.start, self.end = (_view(shape.times[j, k]) for j in range(4))
        self.deps_left = _view(shape.counts[k])
        self.done = bytearray(len(ops))
        self.dependents = shape.dependents
        self.ends_on, self.starts_on = shape.ends_on, shape.starts_on
        self.streams: dict[str, _Stream] = {}
        self.cursor = 0
        self.cpu_time = 0.0
        self.waiting = -1  # index of the host_wait the CPU thread is blocked on
        self.wait_since = 0.0


def _view(a: np.ndarray) -> Any:
    """A memoryview of ``a``'s elements (Python floats or ints one at a time)."""
    return memoryview(a)  # type: ignore[arg-type]


#: what a rank and its shape hold once their times and counts are given back
_NO_TIMES = _view(np.zeros(0))
_NO_COUNTS = _view(np.zeros(0, dtype=np.int32))
_EMPTY_TIMES = np.zeros((4, 0, 0))
_EMPTY_COUNTS = np.zeros((0, 0), dtype=np.int32)
#: the records' string columns, in the order of :attr:`_Columns.codes`
_CODED = ("stream", "name", "category", "phase", "kind", "model")
#: about how many records :meth:`Engine._records` sorts at once (its scratch arrays: some 60 bytes a
#: record), whole ranks at a time
_SORT_ROWS = 1 << 21


class _Call:
    """A SimPy event that calls ``engine._finish(rank, op)`` when processed: scheduled directly on
    the environment's queue as a ``Timeout`` would be, without a closure or an event of SimPy's."""

    __slots__ = ("callbacks", "i", "r")
    _ok = True

    def __init__(self, callbacks: list[Any], r: _Rank, i: int) -> None:
        self.callbacks, self.r, self.i = callbacks, r, i


class _Ends:
    """A SimPy event for a provisional memory-bound kernel's end (``engine._end(rank, op, token)``),
    scheduled as :class:`_Call` is."""

    __slots__ = ("callbacks", "i", "r", "token")
    _ok = True

    def __init__(self, callbacks: list[Any], r: _Rank, i: int, token: int) -> None:
        self.callbacks, self.r, self.i, self.token = callbacks, r, i, token


class _Wakes:
    """A SimPy event that wakes a stream whose next op is issued later (``engine._wake(rank, stream)``),
    scheduled as :class:`_Call` is."""

    __slots__ = ("callbacks", "r", "stream")
    _ok = True

    def __init__(self, callbacks: list[Any], r: _Rank, stream: _Stream) -> None:
        self.callbacks, self.r, self.stream = callbacks, r, stream


class Engine:
    """Simulates one iteration of ``workload`` on ``topo``; see the module docstring."""

    def __init__(self, topo: Topology, workload: Workload, durations: np.ndarray, models: list[str],
                 planner: Planner, options: EngineOptions) -> None:
        reps = workload.replicas
        self.fold = FoldMap(topo, reps) if reps is not None else None
        expected = topo.world if reps is None else len(reps.representatives())
        if len(workload.programs) != expected:
            raise ValueError(f"workload has {len(workload.programs)} programs, {expected} expected "
                             f"({topo.world} GPUs{'' if reps is None else f', folded by {reps.factor}'})")
        if len(durations) != len(workload.kernels):
            raise ValueError("one duration per kernel spec is needed")
        self.topo, self.workload, self.planner, self.opt = topo, workload, planner, options
        self.durations = np.asarray(durations, dtype=float)
        self._durations = self.durations.tolist()  # Python floats: the clock stays a Python float
        self.models = models
        self.env = simpy.Environment()
        iterations = max(1, workload.iterations)
        # programs of several iterations: busy intervals kept to count each iteration's busy time
        # folded: the representatives' links only, the leaf uplinks already left out (simgpu.engine.fold)
        self.net = FlowNetwork(self.env, topo.capacity, record=options.record_links or iterations > 1,
                               aggregate_from=AGGREGATE_FROM if options.aggregate else 0,
                               implied=topo.implied_links() if self.fold is None else None)
        #: programs of several iterations: the bytes each iteration's ops move over each link
        self.iteration_link_bytes = np.zeros((iterations, len(topo.capacity))) if iterations > 1 else None
        self._link_sums: dict[int, tuple[object, np.ndarray, np.ndarray]] = {}  # id(transfers) -> links, bytes
        self.op_times: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._shapes: list[_Shape] = []
        self._shape_of: dict[int, _Shape] = {}
        self._queue: list[Any] = self.env._queue  # SimPy's event heap: (time, priority, id, event)
        self._eid = self.env._eid
        self._calls: list[Any] = [self._call]
        self._ends: list[Any] = [lambda ev: self._end(ev.r, ev.i, ev.token)]
        self._wakes: list[Any] = [lambda ev: self._wake(ev.r, ev.stream)]
        self._rv: dict[str, _Rendezvous] = {}
        self._needed: dict[tuple[int, ...], int] = {}  # a folded group -> its representative members
        #: a collective (op, group, bytes, root, communicator size; not an all-to-all) -> its plan's
        #: latency, the transfers it moves and its latency slack (folded): planned once
        self._plans: dict[tuple[Any, ...], tuple[float, Sequence[tuple[Sequence[int], float, float]], float]] = {}
        self._comm_active = [0] * topo.world
        self._by_op = dict(options.overlap_slowdown_by_op)
        self._ops_active: dict[int, dict[str, int]] = {}  # rank -> collective op -> running (by_op only)
        mem, bound = dict(options.overlap_slowdown_memory), workload.memory_bound
        if mem and bound is not None and len(bound) != len(workload.kernels):
            raise ValueError("one memory_bound flag per kernel spec is needed")
        #: per kernel spec: memory-bound (where memory-bound kernels have their own figures), else None
        self._mem_bound = list(bound) if mem and bound else None
        #: the slowdown of every kernel beside any collective where there is one figure for all (no
        #: figure per collective op, none for memory-bound kernels), else None (see :meth:`_slowdown`)
        self._flat = options.overlap_slowdown if not self._by_op and self._mem_bound is None else None
        #: spanning nodes -> a memory-bound kernel's slowdown beside a collective that moves bytes
        self._mem = {False: mem.get("within_node", 0.0), True: mem.get("across_nodes", 0.0)}
        self._moving: dict[int, dict[bool, int]] = {}  # rank -> spanning nodes -> collectives moving bytes
        # memory-bound kernels started beside a waiting collective: rank -> (the instant, [(op, duration,
        # slowdown, token)]), and (rank, op) -> the token of its end event that stands
        self._started: dict[int, tuple[float, list[tuple[int, float, float, int]]]] = {}
        self._live: dict[tuple[int, int], int] = {}
        self._token = 0
        self._ranks: dict[int, _Rank] = {}
        self.ops_run = 0
        self.events = 0
        #: folded: the sum of latency differences between replicas met so far (see simgpu.engine.fold)
        self.fold_slack_s = 0.0
        #: per training iteration of the programs, when its last kernel ended (over every rank)
        self.iteration_ends = [0.0] * iterations

    def run(self) -> SimResult:
        """Simulate the programs and return their records and link statistics."""
        self._simulate()
        return self._result()

    def run_time(self) -> float:
        """Simulate the programs and return only the iteration's end, s (what an iteration timer
        needs; the same figure as ``run().iteration_time_s`` without building the records' tables)."""
        return max(self.run_rank_ends().values(), default=0.0)

    def run_rank_ends(self) -> dict[int, float]:
        """Simulate the programs and return when each simulated rank's last record ends, s (where
        the stages of a pipelined inference iteration hand over: one end per stage's rank)."""
        self._simulate()
        out: dict[int, float] = {}
        for rank, r in self._ranks.items():
            ends = [np.frombuffer(a) for a in (r.issue, r.end) if len(a)]
            # fmax ignores NaN: ops without a second record
            end = float(np.fmax.reduce(np.concatenate(ends))) if ends else 0.0
            out[rank] = 0.0 if math.isnan(end) else end
        return out

    def _simulate(self) -> None:
        topo = self.topo
        share = max(1.0, topo.gpus_per_node / max(1, self.opt.cpu_threads_per_node))
        shapes: dict[object, _Shape] = {}
        of: list[_Shape] = []
        for p in self.workload.programs:
            t = p.template
            key: object
            if t is not None and len(t) == len(p.ops):
                key = id(t)
            else:  # programs without a template that agree in what the tables read share them too
                t = p.ops
                key = tuple((o.name, o.kind, o.category, o.stream, o.phase, o.kernel, o.nbytes, o.deps, o.iteration)
                            for o in t)
            shape = shapes.get(key)
            if shape is None:
                shape = shapes[key] = _Shape(t)
            of.append(shape)
            shape.left += 1
        for shape in shapes.values():
            shape.allocate(shape.left)
        for p, shape in zip(self.workload.programs, of, strict=True):
            r = self._ranks[p.rank] = _Rank(p.rank, p.ops, shape, len(shape.ranks), share)
            self._shape_of[p.rank] = shape
            shape.ranks.append(r)
        self._shapes = list(shapes.values())
        # The loop makes no reference cycles (the collector finds none after it), so the cyclic
        # collector is off while it runs: it would walk the programs and every rank's state again
        # and again for nothing.
        collecting = gc.isenabled()
        gc.disable()
        try:
            for r in self._ranks.values():
                self._walk(r)
            self._run_queue()
        finally:
            if collecting:
                gc.enable()
        self._check_finished()
        for r in self._ranks.values():
            r.deps_left = _NO_COUNTS  # every op has run: the counts are given back
        for shape in self._shapes:
            shape.counts = _EMPTY_COUNTS
        self._tally()
        if self.fold is not None and self.fold_slack_s > SLACK_FRACTION * self.env.now:
            raise FoldBroken(f"replicas sit differently on the leaf switches: their latencies differ by up to "
                             f"{self.fold_slack_s * 1e6:.1f} us in all, more than {SLACK_FRACTION:.2%} of the "
                             "iteration")
        self.net.finish()

    def _run_queue(self) -> None:
        """SimPy's ``env.run()`` until no event is left, each event processed as ``env.step()`` does
        (the clock set to its time, its callbacks called in order), the engine's own :class:`_Call`
        events called directly."""
        env, queue, finish, end, wake = self.env, self._queue, self._finish, self._end, self._wake
        while queue:
            env._now, _, _, event = heappop(queue)
            cls = event.__class__
            if cls is _Call:
                finish(event.r, event.i)
                continue
            if cls is _Soon:
                event.fn(event.arg)
                continue
            if cls is _Ends:
                end(event.r, event.i, event.token)
                continue
            if cls is _Wakes:
                wake(event.r, event.stream)
                continue
            callbacks, event.callbacks = event.callbacks, None
            for callback in callbacks:
                callback(event)
            if not event._ok and not hasattr(event, "_defused"):
                raise event._value

    # -- the CPU thread ---------------------------------------------------------------------------

    def _walk(self, r: _Rank) -> None:
        """Issue ops from the cursor on, until the program ends or a host_wait must block."""
        default = self.opt.launch_s
        ops, n = r.ops, len(r.ops)
        streams, launch, issue, scale = r.streams, r.launch, r.issue, r.launch_scale
        # the cursor and the thread's time as locals, written back before anything else may read them
        cursor, cpu = r.cursor, r.cpu_time
        while cursor < n:
            i = cursor
            op = ops[i]
            kind = op.kind
            if r.waiting != i:  # not resuming after a wait: spend the launch
                launch[i] = cpu
                cpu = cpu + (default if op.cpu_s is None else op.cpu_s) * scale
                issue[i] = cpu
                if kind == "host":
                    cursor += 1
                    self._finish_at(cpu, r, i)
                    continue
            if kind == "host_wait":
                if r.deps_left[i] > 0:
                    if r.waiting != i:
                        r.waiting, r.wait_since = i, cpu
                    r.cursor, r.cpu_time = cursor, cpu
                    return  # the last dependency's end resumes the walk
                r.start[i] = r.wait_since if r.waiting == i else cpu
                r.end[i] = cpu
                r.waiting = -1
                cursor += 1
                self._finish_at(cpu, r, i)
                continue
            stream = streams.get(op.stream)
            if stream is None:
                stream = streams[op.stream] = _Stream()
            queue = stream.queue
            queue.append(i)
            cursor += 1
            if len(queue) == 1:
                r.cursor, r.cpu_time = cursor, cpu
                self._try_start(r, stream)
        r.cursor, r.cpu_time = cursor, cpu

    def _at(self, t: float, fn: Any) -> None:
        """Call ``fn(event)`` at simulated time ``t`` (now if ``t`` has passed)."""
        delay = t - self.env.now
        self.env.timeout(delay if delay > 0 else 0.0).callbacks.append(fn)
        self.events += 1

    def _soon(self, t: float, fn: Any, arg: Any) -> None:
        """``fn(arg)`` at simulated time ``t``: the event ``_at`` would schedule, without a closure."""
        soon(self.env, t, fn, arg)
        self.events += 1

    def _finish_at(self, t: float, r: _Rank, i: int) -> None:
        """``_finish(r, i)`` at simulated time ``t`` (now if ``t`` has passed): the event ``_at`` would
        schedule (the same time and place in SimPy's queue), as a :class:`_Call`."""
        now = self.env._now
        delay = t - now
        heappush(self._queue, (now + (delay if delay > 0 else 0.0), NORMAL, next(self._eid), _Call(self._calls, r, i)))
        self.events += 1

    def _call(self, ev: _Call) -> None:
        self._finish(ev.r, ev.i)

    # -- streams ----------------------------------------------------------------------------------

    def _try_start(self, r: _Rank, stream: _Stream) -> None:
        if stream.busy or stream.waking or not stream.queue:
            return
        i = stream.queue[0]
        if r.deps_left[i] > 0:
            return  # a dependency's end will call again
        issue = r.issue[i]
        now = self.env._now
        if issue > now:
            stream.waking = True
            delay = issue - now  # where _at(issue) would schedule it
            heappush(self._queue, (now + (delay if delay > 0 else 0.0), NORMAL, next(self._eid),
                                   _Wakes(self._wakes, r, stream)))
            self.events += 1
            return
        stream.queue.popleft()
        stream.busy = True
        op = r.ops[i]
        delay = op.delay_s
        if delay > 0:  # the op's own wait on its stream (a replayed trace's measured GPU-side delay)
            self._at(now + delay, lambda _e: self._start(r, i))
        elif op.kind == "kernel":  # _start's kernel case, inlined: the most frequent path of all
            r.start[i] = now
            dur = self._durations[op.kernel]
            if op.sm_taken or self._comm_active[r.rank]:
                flat = self._flat
                if flat is not None and not op.sm_taken:  # _beside's answer where one figure holds for all
                    dur = dur * (1.0 + flat)
                else:
                    dur = self._beside(r, i, op, dur)
                    if dur < 0:
                        return
            wait = now + dur - now  # as _finish_at(now + dur) computes it
            heappush(self._queue, (now + (wait if wait > 0 else 0.0), NORMAL, next(self._eid),
                                   _Call(self._calls, r, i)))
            self.events += 1
        else:
            self._start(r, i)

    def _wake(self, r: _Rank, stream: _Stream) -> None:
        stream.waking = False
        self._try_start(r, stream)

    def _start(self, r: _Rank, i: int) -> None:
        op = r.ops[i]
        r.start[i] = self.env.now
        if op.kind == "kernel":
            dur = self._durations[op.kernel]
            if op.sm_taken or self._comm_active[r.rank]:
                dur = self._beside(r, i, op, dur)
                if dur < 0:
                    return
            self._finish_at(self.env.now + dur, r, i)
        elif op.kind == "memcpy":
            route = self.topo.host_route(r.rank, to_device=True)
            latency = self.topo.route_latency(route)
            if self.fold is not None:
                route = self.fold.route(route)
            if self.iteration_link_bytes is not None and op.nbytes > 0:
                np.add.at(self.iteration_link_bytes[op.iteration], list(route), float(op.nbytes))
            self.net.transfer(route, op.nbytes, latency).callbacks.append(
                lambda _e: self._finish(r, i))
        elif op.kind == "collective":
            self._arrive(r, i, op)
        else:
            raise SimulationError(f"rank {r.rank} op {op.name!r}: unknown kind {op.kind!r}")

    def _beside(self, r: _Rank, i: int, op: Op, dur: float) -> float:
        """Kernel ``i``'s duration ``dur`` on the SMs a communication kernel leaves (``op.sm_taken``,
        by design), or beside the collectives running on its rank; -1 where it started as a
        provisional memory-bound kernel (:meth:`_provisional`), whose end is already scheduled."""
        if op.sm_taken:
            sms = self.opt.sms
            return dur * sms / max(1, sms - op.sm_taken)
        if self._mem_bound is not None and self._mem_bound[op.kernel] and self._waiting(r.rank):
            self._provisional(r, i, dur)
            return -1.0
        return dur * (1.0 + self._slowdown(r.rank, op.kernel))

    def _slowdown(self, rank: int, kernel: int) -> float:
        """The slowdown of kernel spec ``kernel`` starting beside the collectives running on ``rank``:
        a compute-bound kernel's, the largest op figure of those running (an NCCL kernel waiting for
        its peers holds its SMs too); a memory-bound kernel's, the largest HBM share of those moving
        bytes (all members arrived), within a node or across nodes, and none beside waiting ones."""
        best: float | None = None  # the largest figure, as max() finds it
        if self._mem_bound is not None and self._mem_bound[kernel]:
            moving = self._moving.get(rank)
            if moving:
                mem = self._mem
                for a, n in moving.items():
                    if n and (best is None or mem[a] > best):
                        best = mem[a]
            return 0.0 if best is None else best
        default = self.opt.overlap_slowdown
        if not self._by_op:
            return default
        by_op = self._by_op
        for op, n in self._ops_active[rank].items():
            if n:
                v = by_op.get(op, default)
                if best is None or v > best:
                    best = v
        if best is None:
            raise ValueError(f"rank {rank}: no collective running beside its kernel")
        return best

    def _provisional(self, r: _Rank, i: int, dur: float) -> None:
        """Start memory-bound kernel ``i`` beside a collective that waits for members, who may arrive at
        this same instant later in the event queue: its end stands until one of them does
        (:meth:`_recheck`), so the result does not hang on the order of one instant's events."""
        now = self.env.now
        slow = self._slowdown(r.rank, r.ops[i].kernel)
        token = self._token = self._token + 1
        started = self._started.get(r.rank)
        if started is None or started[0] != now:
            started = self._started[r.rank] = (now, [])
        started[1].append((i, dur, slow, token))
        self._live[r.rank, i] = token
        self._end_at(now + dur * (1.0 + slow), r, i, token)

    def _end_at(self, t: float, r: _Rank, i: int, token: int) -> None:
        """``_end(r, i, token)`` at simulated time ``t``, as ``_at`` would schedule it."""
        now = self.env._now
        delay = t - now
        heappush(self._queue, (now + (delay if delay > 0 else 0.0), NORMAL, next(self._eid),
                               _Ends(self._ends, r, i, token)))
        self.events += 1

    def _end(self, r: _Rank, i: int, token: int) -> None:
        """The end of a provisional kernel, unless a later end replaced it."""
        if self._live.get((r.rank, i)) == token:
            del self._live[r.rank, i]
            self._finish(r, i)

    def _recheck(self, rv: _Rendezvous) -> None:
        """``rv`` moves bytes from now: the memory-bound kernels its members started at this instant
        beside it take its HBM share too."""
        now = self.env.now
        for rank in rv.arrived:
            started = self._started.get(rank)
            if started is None or started[0] != now:
                continue
            r = self._ranks[rank]
            for j, (i, dur, slow, token) in enumerate(started[1]):
                new = self._slowdown(rank, r.ops[i].kernel)
                if new > slow and self._live.get((rank, i)) == token:
                    token = self._token = self._token + 1
                    self._live[rank, i] = token
                    started[1][j] = (i, dur, new, token)
                    self._end_at(now + dur * (1.0 + new), r, i, token)

    def _waiting(self, rank: int) -> bool:
        """Whether a collective ``rank`` has reached still waits for members (moves no bytes yet)."""
        moving = self._moving.get(rank)
        return self._comm_active[rank] > (sum(moving.values()) if moving else 0)

    def _moves(self, rv: _Rendezvous, step: int) -> None:
        """Count ``rv``'s collective as moving bytes on its members (``step`` 1) or done (-1)."""
        if rv.across is None:
            gpn, group = self.topo.gpus_per_node, rv.call.group
            rv.across = any(m // gpn != group[0] // gpn for m in group)
        for rank in rv.arrived:
            moving = self._moving.setdefault(rank, {})
            moving[rv.across] = moving.get(rv.across, 0) + step

    def _finish(self, r: _Rank, i: int) -> None:
        r.done[i] = 1
        now = self.env._now
        name = r.ends_on[i]  # a kernel's, copy's or collective's stream
        if name is not None:
            r.end[i] = now
            stream = r.streams[name]
            stream.busy = False
        else:
            stream = None
        deps_left = r.deps_left
        starts_on = r.starts_on
        for d in r.dependents[i]:
            left = deps_left[d] - 1
            deps_left[d] = left
            if not left:
                name = starts_on[d]
                if name is not None:
                    s = r.streams.get(name)
                    # _try_start, where it would not return at once
                    if s is not None and not s.busy and not s.waking and s.queue and deps_left[s.queue[0]] <= 0:
                        self._try_start(r, s)
                elif r.waiting == d:  # the host_wait the CPU thread is blocked on
                    r.cpu_time = max(r.cpu_time, now)
                    self._walk(r)
        if stream is not None and not stream.busy and not stream.waking and stream.queue:
            j = stream.queue[0]
            if deps_left[j] <= 0:
                op = r.ops[j]
                flat = 0.0 if not self._comm_active[r.rank] else self._flat
                if op.kind == "kernel" and not op.delay_s > 0 and not op.sm_taken and r.issue[j] <= now and \
                        flat is not None:
                    # _try_start's kernel case, inline: the next kernel on the stream starts now (beside the
                    # collectives running on its rank, where one figure holds for every kernel)
                    stream.queue.popleft()
                    stream.busy = True
                    r.start[j] = now
                    dur = self._durations[op.kernel]
                    if flat:
                        dur = dur * (1.0 + flat)
                    wait = now + dur - now  # as _finish_at(now + dur) computes it
                    heappush(self._queue, (now + (wait if wait > 0 else 0.0), NORMAL, next(self._eid),
                                           _Call(self._calls, r, j)))
                    self.events += 1
                else:
                    self._try_start(r, stream)

    # -- collectives ------------------------------------------------------------------------------

    def _arrive(self, r: _Rank, i: int, op: Op) -> None:
        call = op.coll
        rank = r.rank
        if call is None:
            raise SimulationError(f"rank {rank} op {op.name!r} is a collective without a call")
        if rank not in call.group:
            raise SimulationError(f"rank {rank} issues collective {call.key!r} but is not in its group")
        rv = self._rv.get(call.key)
        if rv is None:
            if self.fold is None:
                needed = len(call.group)
            else:
                needed = self._needed.get(call.group, -1)
                if needed < 0:
                    needed = self._needed[call.group] = sum(1 for m in call.group if self.fold.replicas.is_rep(m))
            rv = self._rv[call.key] = _Rendezvous(call, needed)
        elif rv.call is not call and ((rv.call.op, rv.call.group) != (call.op, call.group) or (
                call.send_bytes is None and rv.call.nbytes != call.nbytes)):  # members sharing a call agree
            raise SimulationError(f"collective {call.key!r}: rank {rank} issues {call.op} of "
                                  f"{call.nbytes} B over {len(call.group)} ranks, another member "
                                  f"{rv.call.op} of {rv.call.nbytes} B over {len(rv.call.group)}")
        rv.arrived[rank] = (call, i)
        self._comm_active[rank] += 1
        if self._by_op:
            active = self._ops_active.setdefault(rank, {})
            active[call.op] = active.get(call.op, 0) + 1
        if len(rv.arrived) < rv.needed:
            return
        if self._mem_bound is not None:
            self._moves(rv, 1)
            self._recheck(rv)
        if rv.call.duration_s is not None:
            self._soon(self.env.now + rv.call.duration_s, self._complete, rv)
            return
        c = rv.call
        key = None if c.op == "all_to_all" else (c.op, c.group, c.nbytes, c.root, c.comm_size)
        got = self._plans.get(key) if key is not None else None
        if got is None:  # (the request is one of the same fields where the op is not an all-to-all)
            req = self._request(rv)
            plan = self.planner.plan(req)
            items: Sequence[tuple[Sequence[int], float, float]]
            if self.fold is None:
                items, slack = plan.transfers, 0.0  # (links, nbytes, max_rate) each
            else:
                items = self.fold.transfers(self.planner, req, plan)
                slack = self.fold.latency_slack(self.planner, req, plan)
            got = (plan.latency_s, items, slack)
            if key is not None:
                self._plans[key] = got
        latency, items, slack = got
        if self.fold is not None:
            self.fold_slack_s += slack
        if self.iteration_link_bytes is not None:
            self._count_bytes(items, op.iteration)

        # through the event queue even without latency, so a collective never ends inside the walk
        self._soon(self.env.now + latency, self._move, (rv, items))

    def _move(self, arg: tuple[_Rendezvous, Sequence[tuple[Sequence[int], float, float]]]) -> None:
        rv, items = arg
        if not items:
            self._complete(rv)
            return
        self.net.transfer_group_then(items, self._complete, rv)

    def _count_bytes(self, items: Sequence[tuple[Sequence[int], float, float]], iteration: int) -> None:
        """Add the bytes ``items`` move over each link to ``iteration``'s (each transfer its bytes on
        every link of its route, as the network counts them); per set of transfers, worked out once."""
        got = self._link_sums.get(id(items))
        if got is None or got[0] is not items:
            if isinstance(items, TransferTable):
                flat = np.asarray(items.flat, dtype=np.int64)
                weights = np.repeat(np.asarray(items.nbytes, dtype=float), np.asarray(items.lens, dtype=np.int64))
            else:
                flat = np.asarray([lid for links, _, _ in items for lid in links], dtype=np.int64)
                weights = np.asarray([b for links, b, _ in items for _ in links], dtype=float)
            keep = weights > 0
            sums = np.bincount(flat[keep], weights[keep], minlength=len(self.topo.capacity))
            used = np.flatnonzero(sums)
            got = self._link_sums[id(items)] = (items, used, sums[used])
        self.iteration_link_bytes[iteration, got[1]] += got[2]  # type: ignore[index]

    def _complete(self, rv: _Rendezvous) -> None:
        del self._rv[rv.call.key]  # done: only the rendezvous not yet complete are kept
        if self._mem_bound is not None:
            self._moves(rv, -1)
        for rank in rv.call.group:
            if rank not in rv.arrived:
                continue  # another replica's member (folded)
            call, i = rv.arrived[rank]
            self._comm_active[rank] -= 1
            if self._by_op:
                self._ops_active[rank][call.op] -= 1
            self._finish(self._ranks[rank], i)

    def _request(self, rv: _Rendezvous) -> CollectiveRequest:
        c = rv.call
        matrix = None
        if c.op == "all_to_all" and any(a.send_bytes is not None for a, _ in rv.arrived.values()):
            if self.fold is not None and self.fold.spans_replicas(c.group):
                raise FoldBroken(f"{c.key}: an uneven all-to-all across replicas")
            rows = []
            for r in c.group:
                a = rv.arrived[r][0]
                rows.append(tuple(a.send_bytes) if a.send_bytes is not None
                            else tuple([a.nbytes // len(c.group)] * len(c.group)))
            matrix = tuple(rows)
        return CollectiveRequest(c.op, c.group, c.nbytes if matrix is None else 0, matrix, c.root, c.comm_size)

    # -- results ----------------------------------------------------------------------------------

    def _check_finished(self) -> None:
        for r in self._ranks.values():
            if all(r.done):
                continue
            for op, done in zip(r.ops, r.done, strict=True):
                if not done:
                    detail = ""
                    if op.coll is not None and op.coll.key in self._rv:
                        rv = self._rv[op.coll.key]
                        missing = sorted(set(op.coll.group) - set(rv.arrived))
                        detail = f"; members never reached it: {missing[:8]}"
                    raise SimulationError(f"deadlock: rank {r.rank} never finished op {op.name!r}{detail}")

    def _tally(self) -> None:
        """Once every op has finished: ``ops_run`` (kernels, copies and collectives run) and each
        iteration's last kernel end, from the ranks' times."""
        ends = self.iteration_ends
        for shape in self._shapes:
            if not shape.ranks:
                continue
            kinds = [op.kind for op in shape.ops]
            self.ops_run += len(shape.ranks) * sum(k in ("kernel", "memcpy", "collective") for k in kinds)
            kernels = np.asarray([i for i, k in enumerate(kinds) if k == "kernel"], dtype=np.int64)
            if not len(kernels):
                continue
            it = np.asarray([shape.ops[i].iteration for i in kernels], dtype=np.int64)
            last = np.concatenate([np.frombuffer(r.end)[kernels] for r in shape.ranks]).reshape(len(shape.ranks), -1)
            last = last.max(axis=0)  # per kernel op, over the ranks
            for j in np.unique(it):
                ends[j] = max(ends[j], float(last[it == j].max()))

    def _records(self) -> pd.DataFrame:
        """The records table (:data:`RECORD_COLUMNS`) from every rank's times, in the order of
        ``sort_values(["rank", "stream", "start_s", "end_s"], kind="stable")`` over the records as
        they happened: within a rank's stream, records happen in program order (a stream runs its
        ops in issue order; the CPU thread walks the program, an op's launch before its host_wait).
        Each template's columns are worked out once, as codes into one table of strings; the string
        columns are categoricals (per column, the strings it holds in sorted order, and one small
        integer code per record), ``rank`` is int32, the times float64 and ``nbytes`` int64. The
        columns are allocated once and filled a template at a time, a bounded number of its ranks
        at a time: their records sorted in one go, each rank's on their own; a template's times are
        let go once its ranks' rows are filled. Called once, after the run."""
        strings: dict[str, int] = {}

        def code(x: str) -> int:
            c = strings.get(x)
            if c is None:
                c = strings[x] = len(strings)
            return c

        host, cpu, launch, network = code("host"), code("cpu"), code("launch"), code("network")
        models = [code(m) for m in self.models]
        shapes = [shape for shape in self._shapes if shape.ranks]
        tables = [_Columns(shape.ops, code, host, cpu, launch, network, models) for shape in shapes]
        rows = {id(shape): len(t.seq) for shape, t in zip(shapes, tables, strict=True)}
        offset: dict[int, int] = {}  # rank -> its first row: ranks in order, each with its records
        total = 0
        for r in sorted(self._ranks.values(), key=lambda r: r.rank):
            offset[r.rank] = total
            total += rows[id(self._shape_of[r.rank])]
        table = list(strings)
        # per string column: its categories (the strings it holds, sorted) and each table code's
        # place among them, in the smallest integer type that holds them
        cats: list[list[str]] = []
        remaps: list[np.ndarray] = []
        for c in range(len(_CODED)):
            used = np.unique(np.concatenate([t.codes[c] for t in tables])) if tables else np.zeros(0, dtype=np.int32)
            names = sorted({table[u] for u in used.tolist() if table[u] is not None})
            place = {s: i for i, s in enumerate(names)}
            dtype = _code_dtype(len(names))
            remap = np.full(len(table), -1, dtype=dtype)
            for u in used.tolist():
                if table[u] is not None:
                    remap[u] = place[table[u]]
            cats.append(names)
            remaps.append(remap)
        rank = np.empty(total, dtype=np.int32)
        start, end = np.empty(total), np.empty(total)
        nbytes = np.empty(total, dtype=np.int64)
        coded = [np.empty(total, dtype=remap.dtype) for remap in remaps]
        for shape, t in zip(shapes, tables, strict=True):
            n = len(t.seq)
            local_codes = [remap[t.codes[c]] for c, remap in enumerate(remaps)]  # this template's records
            stream_place = local_codes[0].astype(np.int64)  # sorted position of the stream's name
            times = shape.times
            if self.opt.op_times:  # the block is kept for the check that asked for it
                for k_, r in enumerate(shape.ranks):
                    self.op_times[r.rank] = (times[1][k_], times[2][k_], times[3][k_])
            ranks = shape.ranks
            step = max(1, _SORT_ROWS // max(1, n))
            for a in range(0, len(ranks), step):
                part = ranks[a:a + step]
                k = len(part)
                first = np.concatenate([times[0, a:a + k], times[2, a:a + k][:, t.second]], axis=1).ravel()
                last = np.concatenate([times[1, a:a + k], times[3, a:a + k][:, t.second]], axis=1).ravel()
                # every rank's records sorted on their own: the rank (its row of the block) first
                perm = np.lexsort((np.tile(t.seq, k), last, first, np.tile(stream_place, k),
                                   np.repeat(np.arange(k), n)))
                where = _rows(np.asarray([offset[r.rank] for r in part], dtype=np.int64), n)
                rank[where] = np.repeat(np.asarray([r.rank for r in part], dtype=np.int32), n)
                start[where] = first[perm]
                end[where] = last[perm]
                del first, last
                local = perm % n
                del perm
                for out, values in zip(coded, local_codes, strict=True):
                    out[where] = values[local]
                nbytes[where] = t.codes[len(_CODED)][local]
                del local, where
            for r in ranks:
                r.launch = r.issue = r.start = r.end = _NO_TIMES  # the records hold them now
            shape.times = times = _EMPTY_TIMES
        columns: dict[str, Any] = {"rank": rank, "start_s": start, "end_s": end, "nbytes": nbytes}
        for col, codes, names in zip(_CODED, coded, cats, strict=True):
            columns[col] = pd.Categorical.from_codes(codes, categories=names, validate=False)
        return pd.DataFrame(columns, columns=list(RECORD_COLUMNS), copy=False)

    def _result(self) -> SimResult:
        records = self._records()
        used = np.flatnonzero(self.net.link_bytes > 0)
        links = self.topo.links
        stats = pd.DataFrame({
            "link": [links[i].name for i in used],
            "link_kind": [links[i].kind for i in used],
            "capacity_gbytes_per_s": self.topo.capacity[used] / 1e9,
            "nbytes": self.net.link_bytes[used],
            "busy_s": self.net.link_busy_s[used],
        }, columns=list(LINK_STAT_COLUMNS))
        link_records = None
        if self.opt.record_links:
            spans = sorted(self.net.intervals, key=lambda x: (x[1], x[0]))
            link_records = pd.DataFrame([(links[i].name, links[i].kind, s, e) for i, s, e in spans],
                                        columns=list(LINK_RECORD_COLUMNS))
        iteration = float(records["end_s"].max()) if len(records) else 0.0
        events = self.ops_run + self.events + self.net.transfers + self.net.reschedules
        meta: dict[str, Any] = {} if self.fold is None else {"fold_slack_s": self.fold_slack_s}
        if len(self.iteration_ends) > 1:
            meta["iteration_ends_s"] = list(self.iteration_ends)
            # per iteration, per link of link_stats (lists: meta compares and serialises as plain values)
            meta["iteration_link_bytes"] = self.iteration_link_bytes[:, used].tolist()  # type: ignore[index]
            meta["iteration_link_busy_s"] = self._window_busy(used).tolist()
        if self.opt.op_times:
            meta["op_times"] = self.op_times
        return SimResult(records, stats, iteration, events, meta, link_records)


    def _window_busy(self, used: np.ndarray) -> np.ndarray:
        """Per iteration (the window from the previous iteration's end, 0 for the first, to its own),
        each of the links ``used``'s busy time within it, from the network's busy intervals."""
        ends = np.asarray(self.iteration_ends, dtype=float)
        out = np.zeros((len(ends), len(used)))
        if not self.net.intervals or not len(used):
            return out
        spans = np.asarray(self.net.intervals, dtype=float)
        col = np.full(len(self.topo.capacity), -1, dtype=np.int64)
        col[used] = np.arange(len(used))
        where = col[spans[:, 0].astype(np.int64)]
        spans, where = spans[where >= 0], where[where >= 0]
        lo = np.concatenate([[0.0], ends[:-1]])
        for k in range(len(ends)):
            d = np.clip(np.minimum(spans[:, 2], ends[k]) - np.maximum(spans[:, 1], lo[k]), 0.0, None)
            out[k] = np.bincount(where, d, minlength=len(used))
        return out


class _Columns:
    """A template's records as codes (see :meth:`Engine._records`): per record, its columns
    (``codes``: stream, name, category, phase, kind, model as string codes; nbytes), and ``seq``, its
    place among its rank's records as they happen. A rank's records are its ops' CPU thread records
    (launch, or a host op's work) in program order, then the second records of the ops ``second``
    (the stream's, or a host_wait's)."""

    __slots__ = ("codes", "second", "seq")

    def __init__(self, ops: list[Op], code: Any, host: int, cpu: int, launch: int, network: int,
                 models: list[int]) -> None:
        two = [i for i, op in enumerate(ops) if op.kind != "host"]
        cols: list[list[int]] = [[] for _ in range(7)]
        stream, name, category, phase, kind, model, nbytes = cols
        for op in ops:  # the CPU thread's record: the launch, or a host op's work
            h = op.kind == "host"
            stream.append(cpu)
            name.append(code(op.name))
            category.append(code(op.category) if h else launch)
            phase.append(code(op.phase))
            kind.append(host if h else launch)
            model.append(host)
            nbytes.append(0)
        for i in two:  # the stream's record, or a host_wait's on the CPU thread
            op = ops[i]
            w = op.kind == "host_wait"
            stream.append(cpu if w else code(op.stream))
            name.append(code(op.name))
            category.append(code(op.category))
            phase.append(code(op.phase))
            kind.append(code(op.kind))
            model.append(host if w else models[op.kernel] if op.kind == "kernel" else network)
            nbytes.append(0 if w else op.nbytes)
        self.second = np.asarray(two, dtype=np.int64)
        self.codes = [np.asarray(c, dtype=np.int32) for c in cols[:6]] + [np.asarray(nbytes, dtype=np.int64)]
        self.seq = np.concatenate([2 * np.arange(len(ops), dtype=np.int64), 2 * self.second + 1])


def _rows(firsts: np.ndarray, n: int) -> np.ndarray:
    """The table rows of ranks with ``n`` records each whose first rows are ``firsts``, in turn."""
    return np.repeat(firsts, n) + np.tile(np.arange(n, dtype=np.int64), len(firsts))


def _code_dtype(n: int) -> Any:
    """The smallest signed integer type that holds the codes of ``n`` categories (and -1)."""
    return np.int8 if n < 2**7 else np.int16 if n < 2**15 else np.int32
