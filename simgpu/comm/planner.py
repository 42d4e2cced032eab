"""Choosing the algorithm of each collective, as NCCL's tuner does, and caching plans.

With ``algorithm="auto"`` every algorithm that implements the op is planned and the one fastest in
isolation on this topology wins (so small multi-node all-reduces take the tree, large ones the
ring). A forced algorithm applies where it implements the op; other ops keep their default.
"""

from __future__ import annotations

from ..config.platform import CollectiveSpec
from ..platform.topology import Topology
from . import algorithms  # noqa: F401  (registers the algorithms)
from .plan import ALGORITHMS, CollectivePlan, CollectiveRequest, algorithms_for

#: What each op uses when the requested algorithm does not implement it.
DEFAULT = {"all_to_all": "direct", "send_recv": "direct"}


class Planner:
    """Plans collectives on one topology; identical requests are planned once."""

    def __init__(self, topo: Topology, spec: CollectiveSpec, algorithm: str = "auto") -> None:
        if algorithm != "auto" and algorithm not in ALGORITHMS:
            raise ValueError(f"unknown collective algorithm {algorithm!r}; known: auto, "
                             f"{', '.join(sorted(ALGORITHMS))}")
        self.topo, self.spec, self.algorithm = topo, spec, algorithm
        self._cache: dict[CollectiveRequest, CollectivePlan] = {}

    def plan(self, req: CollectiveRequest) -> CollectivePlan:
        plan = self._cache.get(req)
        if plan is None:
            plan = self._cache[req] = self._choose(req)
        return plan

    def _choose(self, req: CollectiveRequest) -> CollectivePlan:
        names = algorithms_for(req.op)
        if not names:
            raise ValueError(f"no algorithm implements {req.op!r}")
        if self.algorithm != "auto" and self.algorithm in names:
            names = [self.algorithm]
        elif req.op in DEFAULT:
            names = [DEFAULT[req.op]]
        elif self.algorithm == "auto":
            names = [n for n in names if n != "direct"] or names
        else:
            names = names[:1]
        plans = [ALGORITHMS[n][0](req, self.topo, self.spec) for n in names]
        if len(plans) == 1:
            return plans[0]
        return min(plans, key=lambda p: p.isolated_time(self.topo))
