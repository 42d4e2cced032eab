"""The discrete-event engine: CPU threads issue ops onto GPU streams; collectives meet and move bytes.

Per rank, a CPU thread walks the program in order, spending the launch overhead on each op (CPU
threads of a node are a shared pool when ranks outnumber them) and enqueueing it on its stream.
A stream is a SimPy resource: an op holds it from start to end, so a stream runs its ops in issue
order, and an op also waits for its explicit dependencies (cross-stream events). A collective
starts when every member has reached it on its comm stream; its plan's transfers then share the
links with all other traffic through :class:`~simgpu.comm.network.FlowNetwork`.

The engine knows no model family and calls no kernel model: kernel durations arrive as an array.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import simpy

from ..comm.network import FlowNetwork
from ..comm.plan import CollectivePlan, CollectiveRequest
from ..comm.planner import Planner
from ..errors import SimulationError
from ..platform.topology import Topology
from ..workload.graph import CollectiveCall, Op, Workload
from .result import LINK_RECORD_COLUMNS, LINK_STAT_COLUMNS, RECORD_COLUMNS, SimResult


@dataclass(frozen=True)
class EngineOptions:
    """Host and overlap costs, from the platform; ``record_links`` keeps link busy intervals."""

    launch_s: float = 5e-6
    cpu_threads_per_node: int = 64
    overlap_slowdown: float = 0.0
    record_links: bool = False


@dataclass
class _Rendezvous:
    call: CollectiveCall
    done: simpy.Event
    arrived: dict[int, CollectiveCall] = field(default_factory=dict)


class Engine:
    """Simulates one iteration of ``workload`` on ``topo``; see the module docstring."""

    def __init__(self, topo: Topology, workload: Workload, durations: np.ndarray, models: list[str],
                 planner: Planner, options: EngineOptions) -> None:
        if len(workload.programs) != topo.world:
            raise ValueError(f"workload has {len(workload.programs)} ranks, topology {topo.world} GPUs")
        if len(durations) != len(workload.kernels):
            raise ValueError("one duration per kernel spec is needed")
        self.topo, self.workload, self.planner, self.opt = topo, workload, planner, options
        self.durations = np.asarray(durations, dtype=float)
        self.models = models
        self.env = simpy.Environment()
        self.net = FlowNetwork(self.env, topo.capacity, record=options.record_links)
        self.records: list[tuple[Any, ...]] = []
        self._rv: dict[str, _Rendezvous] = {}
        self._comm_active = np.zeros(topo.world, dtype=np.int64)
        self._done: list[list[simpy.Event]] = []
        self._streams: list[dict[str, simpy.Resource]] = []
        self.ops_run = 0

    def run(self) -> SimResult:
        env, topo = self.env, self.topo
        pools: dict[int, simpy.Resource | None] = {}
        for node in range(topo.nodes):
            contended = self.opt.cpu_threads_per_node < topo.gpus_per_node
            pools[node] = simpy.Resource(env, self.opt.cpu_threads_per_node) if contended else None
        for prog in self.workload.programs:
            self._done.append([env.event() for _ in prog.ops])
            self._streams.append({})
            env.process(self._cpu(prog.rank, prog.ops, pools[topo.node_of(prog.rank)]))
        env.run()
        self._check_finished()
        self.net.finish()
        return self._result()

    # -- processes ------------------------------------------------------------------------------

    def _cpu(self, rank: int, ops: list[Op], pool: simpy.Resource | None) -> Generator[Any, Any, None]:
        env, launch = self.env, self.opt.launch_s
        done = self._done[rank]
        streams = self._streams[rank]
        rec = self.records.append
        for i, op in enumerate(ops):
            if pool is not None:
                req = pool.request()
                yield req
            t0 = env.now
            if launch > 0:
                yield env.timeout(launch)
            if pool is not None:
                pool.release(req)
            rec((rank, "cpu", op.name, "launch", op.phase, "launch", t0, env.now, 0, "host"))
            if op.kind == "host_wait":
                t0 = env.now
                pending = [done[d] for d in op.deps if not done[d].triggered]
                if pending:
                    yield env.all_of(pending)
                rec((rank, "cpu", op.name, op.category, op.phase, "host_wait", t0, env.now, 0, "host"))
                done[i].succeed()
                continue
            stream = streams.get(op.stream)
            if stream is None:
                stream = streams[op.stream] = simpy.Resource(env, 1)
            env.process(self._op(rank, i, op, stream, stream.request()))

    def _op(self, rank: int, i: int, op: Op, stream: simpy.Resource,
            req: simpy.resources.resource.Request) -> Generator[Any, Any, None]:
        env = self.env
        done = self._done[rank]
        yield req
        pending = [done[d] for d in op.deps if not done[d].triggered]
        if pending:
            yield env.all_of(pending) if len(pending) > 1 else pending[0]
        start = env.now
        model = ""
        if op.kind == "kernel":
            dur = self.durations[op.kernel]
            if self._comm_active[rank]:
                dur *= 1.0 + self.opt.overlap_slowdown
            model = self.models[op.kernel]
            yield env.timeout(dur)
        elif op.kind == "memcpy":
            route = self.topo.host_route(rank, to_device=True)
            model = "network"
            yield self.net.transfer(route, op.nbytes, self.topo.route_latency(route))
        elif op.kind == "collective":
            model = "network"
            yield from self._collective(rank, op)
        else:
            raise SimulationError(f"rank {rank} op {op.name!r}: unknown kind {op.kind!r}")
        stream.release(req)
        self.ops_run += 1
        self.records.append((rank, op.stream, op.name, op.category, op.phase, op.kind, start, env.now,
                             op.nbytes, model))
        done[i].succeed()

    def _collective(self, rank: int, op: Op) -> Generator[Any, Any, None]:
        call = op.coll
        if call is None:
            raise SimulationError(f"rank {rank} op {op.name!r} is a collective without a call")
        if rank not in call.group:
            raise SimulationError(f"rank {rank} issues collective {call.key!r} but is not in its group")
        rv = self._rv.get(call.key)
        if rv is None:
            rv = self._rv[call.key] = _Rendezvous(call, self.env.event())
        elif (rv.call.op, rv.call.group) != (call.op, call.group) or (
                call.send_bytes is None and rv.call.nbytes != call.nbytes):
            raise SimulationError(f"collective {call.key!r}: rank {rank} issues {call.op} of "
                                  f"{call.nbytes} B over {len(call.group)} ranks, another member "
                                  f"{rv.call.op} of {rv.call.nbytes} B over {len(rv.call.group)}")
        rv.arrived[rank] = call
        self._comm_active[rank] += 1
        if len(rv.arrived) == len(call.group):
            self.env.process(self._execute(self.planner.plan(self._request(rv)), rv.done))
        yield rv.done
        self._comm_active[rank] -= 1

    def _request(self, rv: _Rendezvous) -> CollectiveRequest:
        c = rv.call
        matrix = None
        if c.op == "all_to_all" and any(a.send_bytes is not None for a in rv.arrived.values()):
            rows = []
            for r in c.group:
                sb = rv.arrived[r].send_bytes
                rows.append(tuple(sb) if sb is not None else tuple([rv.arrived[r].nbytes // len(c.group)]
                                                                   * len(c.group)))
            matrix = tuple(rows)
        return CollectiveRequest(c.op, c.group, c.nbytes if matrix is None else 0, matrix, c.root)

    def _execute(self, plan: CollectivePlan, done: simpy.Event) -> Generator[Any, Any, None]:
        if plan.latency_s > 0:
            yield self.env.timeout(plan.latency_s)
        events = [self.net.transfer(t.links, t.nbytes) for t in plan.transfers]
        if events:
            yield self.env.all_of(events)
        done.succeed()

    # -- results --------------------------------------------------------------------------------

    def _check_finished(self) -> None:
        for prog, done in zip(self.workload.programs, self._done, strict=True):
            for op, ev in zip(prog.ops, done, strict=True):
                if not ev.triggered:
                    detail = ""
                    if op.coll is not None and op.coll.key in self._rv:
                        rv = self._rv[op.coll.key]
                        missing = sorted(set(op.coll.group) - set(rv.arrived))
                        detail = f"; members never reached it: {missing[:8]}"
                    raise SimulationError(f"deadlock: rank {prog.rank} never finished op {op.name!r}"
                                          f"{detail}")

    def _result(self) -> SimResult:
        records = pd.DataFrame.from_records(self.records, columns=list(RECORD_COLUMNS))
        records = records.sort_values(["rank", "stream", "start_s", "end_s"], kind="stable").reset_index(drop=True)
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
        events = self.ops_run + self.net.transfers + self.net.reschedules
        return SimResult(records, stats, iteration, events, {}, link_records)
