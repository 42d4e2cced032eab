"""Collectives on the engine: a rendezvous waits for every member (the representatives, folded),
then the collective's plan moves its transfers over the flow network and its members finish
together; the memory-bound kernels beside it take its HBM share (:class:`_Collectives`, a part of
:class:`~simgpu.engine.core.Engine`, whose state it reads)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import simpy

from ..comm.network import FlowNetwork
from ..comm.plan import CollectiveRequest
from ..comm.planner import Planner
from ..comm.transfers import TransferTable
from ..errors import SimulationError
from ..graph import Op
from ..platform.topology import Topology
from .fold import FoldBroken, FoldMap
from .state import _Rank, _Rendezvous


class _Collectives:
    """The engine's collectives: how a rendezvous gathers its members, plans, moves and completes."""

    # the engine's state and methods these read (:class:`~simgpu.engine.core.Engine` sets them)
    topo: Topology
    env: simpy.Environment
    planner: Planner
    net: FlowNetwork
    fold: FoldMap | None
    fold_slack_s: float
    iteration_link_bytes: np.ndarray | None
    _rv: dict[str, _Rendezvous]
    _needed: dict[tuple[int, ...], int]
    _plans: dict[tuple[Any, ...], tuple[float, Sequence[tuple[Sequence[int], float, float]], float]]
    _link_sums: dict[int, tuple[object, np.ndarray, np.ndarray]]
    _comm_active: list[int]
    _by_op: dict[str, float]
    _ops_active: dict[int, dict[str, int]]
    _mem_bound: list[bool] | None
    _moving: dict[int, dict[bool, int]]
    _started: dict[int, tuple[float, list[tuple[int, float, float, int]]]]
    _live: dict[tuple[int, int], int]
    _token: int
    _ranks: dict[int, _Rank]
    gathered: list[tuple[int, str, str, float, list[tuple[int, float]]]] | None
    _slowdown: Callable[[int, int], float]
    _end_at: Callable[[float, _Rank, int, int], None]
    _soon: Callable[[float, Any, Any], None]
    _finish: Callable[[_Rank, int], None]

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
        if self.gathered is not None:  # who arrived when (each member's stream reached the collective)
            self.gathered.append((op.iteration, call.op, op.name, self.env.now,
                                  [(m, self._ranks[m].start[j]) for m, (_, j) in rv.arrived.items()]))
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
        self.net.transfer_group_then(items, self._complete, rv, rv.call.key)

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


#: how many collectives and ranks :func:`rendezvous_waits` keeps
TOP = 5


def rendezvous_waits(gathered: list[tuple[int, str, str, float, list[tuple[int, float]]]], iteration: int
                     ) -> dict[str, Any]:
    """What the collectives of ``iteration`` (the last of the programs) waited for: per rank, the time
    its stream spent at rendezvous (from its arrival at a collective to the arrival of the collective's
    last member, when the collective starts), summed; and the :data:`TOP` collectives slowest to gather
    (from their first member's arrival to their last's), each with the rank that arrived last."""
    wait: dict[int, float] = {}
    rows = []
    for it, op, name, at, members in gathered:
        if it != iteration:
            continue
        for m, t in members:
            wait[m] = wait.get(m, 0.0) + (at - t)
        first = min(t for _, t in members)
        last = max(members, key=lambda x: (x[1], -x[0]))[0]
        rows.append((at - first, name, op, last, len(members)))
    rows.sort(key=lambda x: -x[0])
    return {"wait_s": {int(m): float(w) for m, w in sorted(wait.items())},
            "collectives": len(rows),
            "slowest": [{"name": n, "op": o, "gather_s": float(g), "last_rank": int(r), "members": k}
                        for g, n, o, r, k in rows[:TOP]]}
