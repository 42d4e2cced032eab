"""Choosing the algorithm and protocol of each collective, as NCCL's tuner does, and caching plans.

With ``algorithm="auto"`` every algorithm that implements the op is planned with every protocol
the platform offers, and the pair fastest in isolation on this topology wins (so small messages
take LL, large ones Simple; small multi-node all-reduces the tree). Across nodes, where the
platform's ``collectives.tuner`` is ``nccl`` (the default), the algorithm is the one NCCL's own
tuning model picks for the node count (:mod:`simgpu.comm.tuning`) and only its protocol is chosen
by isolated time. A forced algorithm or protocol applies where it implements the op; other ops
keep their default.
"""

from __future__ import annotations

from dataclasses import replace

from ..config.platform import CollectiveSpec
from ..platform.topology import Topology
from . import algorithms  # noqa: F401  (registers the algorithms)
from .plan import ALGORITHMS, CollectivePlan, CollectiveRequest, algorithms_for
from .transfers import Transfer, TransferTable
from .tuning import Choice, choose

#: What each op uses when the requested algorithm does not implement it.
DEFAULT = {"all_to_all": "direct", "send_recv": "direct"}
#: the algorithm that runs each of NCCL's choices (the tree becomes an NVLS tree on NVLS nodes with Simple)
ALGORITHM_OF = {"ring": "ring", "tree": "tree", "nvls_tree": "tree", "nvls": "nvls", "pat": "pat",
                "collnet_direct": "collnet", "collnet_chain": "collnet"}


class Planner:
    """Plans collectives on one topology; identical requests are planned once."""

    def __init__(self, topo: Topology, spec: CollectiveSpec, algorithm: str = "auto",
                 protocol: str = "auto") -> None:
        if algorithm != "auto" and algorithm not in ALGORITHMS:
            raise ValueError(f"unknown collective algorithm {algorithm!r}; known: auto, "
                             f"{', '.join(sorted(ALGORITHMS))}")
        if protocol != "auto" and protocol not in spec.protocols:
            raise ValueError(f"unknown protocol {protocol!r}; known: auto, {', '.join(spec.protocols)}")
        self.topo, self.spec, self.algorithm, self.protocol = topo, spec, algorithm, protocol
        self._cache: dict[CollectiveRequest, CollectivePlan] = {}

    def plan(self, req: CollectiveRequest) -> CollectivePlan:
        plan = self._cache.get(req)
        if plan is None:
            plan = self._choose(req)
            spec = self.spec
            if (spec.slow_all_reduce_bytes is not None and spec.slow_all_reduce > 1 and req.op == "all_reduce"
                    and req.nbytes >= spec.slow_all_reduce_bytes):
                plan = slowed(plan, self.topo, spec.slow_all_reduce)
            self._cache[req] = plan
        return plan

    def candidates(self, req: CollectiveRequest) -> list[CollectivePlan]:
        """Every (algorithm, protocol) plan the tuner weighs for ``req``."""
        names = algorithms_for(req.op)
        if not names:
            raise ValueError(f"no algorithm implements {req.op!r}")
        if self.algorithm != "auto" and self.algorithm in names:
            names = [self.algorithm]
            if not any(p.latency_s < float("inf") for p in self._plans(req, names)):
                names = [n for n in algorithms_for(req.op) if n != self.algorithm and n != "direct"][:1] or names
        elif req.op in DEFAULT:
            names = [DEFAULT[req.op]]
        elif self.algorithm == "auto":
            names = [n for n in names if n != "direct"] or names
            nccl = self.nccl_choice(req)
            if nccl is not None and nccl.algorithm in ALGORITHM_OF:
                names = [ALGORITHM_OF[nccl.algorithm]]
        else:
            names = names[:1]
        return self._plans(req, names)

    def nccl_choice(self, req: CollectiveRequest) -> Choice | None:
        """What NCCL's tuning model picks for ``req`` where the tuner follows it (a group across
        nodes, ``collectives.tuner: nccl``); None elsewhere."""
        nodes = len({self.topo.node_of(r) for r in req.group})
        if self.spec.tuner != "nccl" or nodes < 2:
            return None
        return choose(self.topo.platform, self.topo, req.op, req.nbytes, len(req.group), nodes,
                      self.spec.usable_protocols())

    def _plans(self, req: CollectiveRequest, names: list[str]) -> list[CollectivePlan]:
        protos = [self.protocol] if self.protocol != "auto" else self.spec.usable_protocols()
        plans = []
        for name in names:
            for p in protos:
                plan = ALGORITHMS[name][0](req, self.topo, self.spec, self.spec.protocols[p])  # type: ignore[index]
                plans.append(replace(plan, protocol=p))
        return plans

    def _choose(self, req: CollectiveRequest) -> CollectivePlan:
        plans = self.candidates(req)
        if len(plans) == 1:
            return plans[0]
        return min(plans, key=lambda p: p.isolated_time(self.topo))


def slowed(plan: CollectivePlan, topo: Topology, factor: float) -> CollectivePlan:
    """``plan`` taking ``factor`` times as long to move its bytes alone on the network (its latency as
    before): every transfer's rate capped at its bytes over ``factor`` times the time the slowest
    transfer takes alone. The bytes each link carries stay the plan's."""
    if not plan.transfers:
        return plan
    moving = plan.isolated_time(topo) - plan.latency_s
    if not moving > 0:
        return plan
    span = factor * moving
    tr = plan.transfers
    if isinstance(tr, TransferTable):
        return replace(plan, transfers=tr.capped_to(span))
    return replace(plan, transfers=[Transfer(t.links, t.nbytes, min(t.max_rate, t.nbytes / span))
                                    for t in tr])
