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

Its parts: the per-rank state and the engine's own events (:mod:`simgpu.engine.state`), the
collectives' rendezvous (:mod:`simgpu.engine.rendezvous`), the records built after the run
(:mod:`simgpu.engine.records`). This file, the event loop, the CPU thread and the streams with the
slowdown of kernels beside collectives, stays a little above 500 lines: those callbacks call each
other on the engine's hottest path, some inlined into each other, and read best side by side.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Sequence
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Any

import numpy as np
import pandas as pd
import simpy
from simpy.events import NORMAL

from ..comm.flows import AGGREGATE_FROM, _Soon, soon
from ..comm.network import FlowNetwork
from ..comm.planner import Planner
from ..config.variability import Speeds
from ..errors import SimulationError
from ..graph import Op, Workload
from ..platform.topology import Topology
from ..result import LINK_RECORD_COLUMNS, LINK_STAT_COLUMNS, SimResult
from .fold import SLACK_FRACTION, FoldBroken, FoldMap
from .records import records_table, window_busy
from .rendezvous import _Collectives, rendezvous_waits
from .state import _EMPTY_COUNTS, _NO_COUNTS, _Call, _Ends, _Rank, _Rendezvous, _Shape, _Stream, _Wakes


@dataclass(frozen=True)
class EngineOptions:
    """Host and overlap costs, from the platform (``sms``: the GPU's SMs); ``record_links`` keeps every
    link's busy intervals, with whose transfers kept it busy (``record_link_ids``: those of these links
    only)."""

    launch_s: float = 5e-6
    cpu_threads_per_node: int = 64
    overlap_slowdown: float = 0.0
    record_links: bool = False
    sms: int = 132
    #: where ``record_links`` is off: the links (indices into the topology's) whose busy intervals are kept
    record_link_ids: tuple[int, ...] = ()
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
    #: order), for the check of the shortened first iteration (simgpu.engine.steady_check)
    op_times: bool = False
    #: per rank, factors on kernel times and on the CPU thread's work (the workload's ``variability``);
    #: with it, every collective's gathering is logged (``meta["rendezvous"]``); None: every GPU alike
    variability: Speeds | None = None
    #: per kind of GPU (a mixed platform: the kernel table repeated once per kind, kernel spec ``i`` of kind
    #: ``i // (kernels / kinds)``), its ``(overlap_slowdown, overlap_slowdown_by_op, overlap_slowdown_memory)``;
    #: empty: the three fields above for every kernel
    kind_overlap: tuple[tuple[float, tuple[tuple[str, float], ...], tuple[tuple[str, float], ...]], ...] = ()

    @property
    def links_recorded(self) -> bool:
        """Whether any link's busy intervals are kept."""
        return self.record_links or bool(self.record_link_ids)


class Engine(_Collectives):
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
        self.net = FlowNetwork(self.env, topo.capacity, record=iterations > 1,
                               aggregate_from=AGGREGATE_FROM if options.aggregate else 0,
                               implied=topo.implied_links() if self.fold is None else None,
                               owners=options.record_links or options.record_link_ids)
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
        figs = options.kind_overlap or ((options.overlap_slowdown, options.overlap_slowdown_by_op,
                                         options.overlap_slowdown_memory),)
        self._kind_size = max(1, len(workload.kernels) // len(figs))  # kernel specs of one kind of GPU
        self._defaults, self._by_ops = [f[0] for f in figs], [dict(f[1]) for f in figs]
        self._by_op = {k: v for d in self._by_ops for k, v in d.items()}  # any figure per op: ops tracked
        self._ops_active: dict[int, dict[str, int]] = {}  # rank -> collective op -> running (by_op only)
        mems = [dict(f[2]) for f in figs]
        mem, bound = {k: v for m in mems for k, v in m.items()}, workload.memory_bound
        if mem and bound is not None and len(bound) != len(workload.kernels):
            raise ValueError("one memory_bound flag per kernel spec is needed")
        #: per kernel spec: memory-bound (where memory-bound kernels have their own figures), else None
        self._mem_bound = list(bound) if mem and bound else None
        #: the slowdown of every kernel beside any collective where there is one figure for all (no
        #: figure per collective op, none for memory-bound kernels), else None (see :meth:`_slowdown`)
        self._flat = (self._defaults[0] if not self._by_op and self._mem_bound is None and len(set(self._defaults)) == 1
                      else None)
        #: per kind, spanning nodes -> a memory-bound kernel's slowdown beside a collective that moves bytes
        self._mems = [{False: m.get("within_node", 0.0), True: m.get("across_nodes", 0.0)} for m in mems]
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
        #: with variability: per collective gathered, (its iteration, op, name, when the last member
        #: arrived, [(member, arrival)]) (see :mod:`simgpu.engine.rendezvous`)
        self.gathered: list[tuple[int, str, str, float, list[tuple[int, float]]]] | None = (
            [] if options.variability is not None else None)

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
            if self.opt.variability is not None:
                self._vary(r)
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

    def _vary(self, r: _Rank) -> None:
        """Rank ``r``'s factors from ``variability``: on its CPU thread's work, and per op on its kernels."""
        v = self.opt.variability
        assert v is not None
        if self.fold is not None:
            raise ValueError("variability needs every rank simulated: a folded workload was given")
        r.launch_scale *= v.host[r.rank]
        compute, memory = v.compute[r.rank], v.memory[r.rank]
        jitter = v.jitter(r.rank, len(r.ops))
        if compute == 1.0 and memory == 1.0 and jitter is None:
            return
        f = np.full(len(r.ops), compute)
        if memory != 1.0:
            bound = self.workload.memory_bound
            if bound is None:
                raise ValueError("a slow memory needs the workload's memory_bound flags")
            f[[i for i, op in enumerate(r.ops) if op.kind == "kernel" and bound[op.kernel]]] *= memory
        if jitter is not None:
            f *= jitter
        r.factor = f.tolist()

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
            if r.factor is not None:
                dur = dur * r.factor[i]
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
            if r.factor is not None:
                dur = dur * r.factor[i]
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
            self.net.transfer(route, op.nbytes, latency, owner=op.name).callbacks.append(
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
        kind = kernel // self._kind_size
        if self._mem_bound is not None and self._mem_bound[kernel]:
            moving = self._moving.get(rank)
            if moving:
                mem = self._mems[kind]
                for a, n in moving.items():
                    if n and (best is None or mem[a] > best):
                        best = mem[a]
            return 0.0 if best is None else best
        default = self._defaults[kind]
        if not self._by_op:
            return default
        by_op = self._by_ops[kind]
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
                    if r.factor is not None:
                        dur = dur * r.factor[j]
                    if flat:
                        dur = dur * (1.0 + flat)
                    wait = now + dur - now  # as _finish_at(now + dur) computes it
                    heappush(self._queue, (now + (wait if wait > 0 else 0.0), NORMAL, next(self._eid),
                                           _Call(self._calls, r, j)))
                    self.events += 1
                else:
                    self._try_start(r, stream)

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

    def _result(self) -> SimResult:
        records = records_table(self._shapes, self._ranks, self._shape_of, self.models,
                                self.op_times if self.opt.op_times else None)
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
        if self.net.owners is not None:
            spans = sorted(self.net.owners.intervals, key=lambda x: (x[2], x[0], x[1]))
            link_records = pd.DataFrame([(links[i].name, links[i].kind, s, e, o) for i, o, s, e in spans],
                                        columns=list(LINK_RECORD_COLUMNS))
        iteration = float(records["end_s"].max()) if len(records) else 0.0
        events = self.ops_run + self.events + self.net.transfers + self.net.reschedules
        meta: dict[str, Any] = {} if self.fold is None else {"fold_slack_s": self.fold_slack_s}
        if len(self.iteration_ends) > 1:
            meta["iteration_ends_s"] = list(self.iteration_ends)
            # per iteration, per link of link_stats (lists: meta compares and serialises as plain values)
            meta["iteration_link_bytes"] = self.iteration_link_bytes[:, used].tolist()  # type: ignore[index]
            meta["iteration_link_busy_s"] = window_busy(self.net.intervals, self.iteration_ends, used,
                                                        len(self.topo.capacity)).tolist()
        if self.opt.op_times:
            meta["op_times"] = self.op_times
        if self.gathered is not None:
            meta["rendezvous"] = rendezvous_waits(self.gathered, len(self.iteration_ends) - 1)
        return SimResult(records, stats, iteration, events, meta, link_records)
