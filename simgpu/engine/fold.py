"""Identical data-parallel replicas simulated once: the network seen from one replica.

A folded workload (:class:`~simgpu.workload.graph.Replicas`) holds the programs of one replica.
The other replicas run the same ops at the same times (the job is symmetric under the shift that
maps each replica onto the next), so the engine only needs the representative ranks, plus the
network as they see it: their own traffic and their share of every collective that spans replicas.

This module owns that view. The shift maps nodes onto nodes (a replica is whole nodes), hence each
node's links onto the same links of the image node. Each link of a representative node stands for
its ``factor`` images. A collective over ranks of several replicas (a data-parallel all-reduce)
is planned over the whole group as usual; if its set of transfers is invariant under the shift
(a ring whose order follows the replicas), every link of an orbit carries the same load, so the
transfers are mapped onto the representative links and each orbit is kept once (a coflow that
is its own image keeps each link ``1 / factor`` of the times it crosses the orbit). Max-min fair
sharing on this quotient gives exactly the rates of the full network under symmetry.

The leaf-to-spine links are shared by replicas and are not mapped; they are left out, which is
exact only when they cannot limit anything: on a core that is not oversubscribed, every flow
through a leaf uplink also crosses one of that leaf's NIC links, whose capacities sum to the
uplink's. On an oversubscribed core the fold is not used (:func:`fold_blocker`). A plan that is
not invariant (a double binary tree across replicas, whose shape does not follow the shift) raises
:class:`FoldBroken`, and :func:`simgpu.simulate` then simulates every rank.

Leaf switches need not line up with replicas (a DGX A100 SuperPOD has 20 nodes per leaf, a GPT-3
replica 8 nodes per stage): a pipeline transfer may cross the spine in one replica and not in
another. The bandwidths are the same (the spine never limits), only the spine's latency differs.
For each collective inside the representative replica whose image in some other replica sits
differently on the leaves, :meth:`FoldMap.latency_slack` plans that image too: it must be the same
plan up to the latency, and the difference is added to a budget. Each collective is one step of
any chain of dependent work, so the budget bounds how far any replica's timeline can drift from
the representative's; the engine gives up the fold when it exceeds :data:`SLACK_FRACTION` of the
iteration.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from ..comm.plan import CollectivePlan, CollectiveRequest
from ..comm.planner import Planner
from ..errors import SimulationError
from ..platform.topology import Topology
from ..workload.graph import Replicas

#: The most the latency differences between replicas may add up to, as a fraction of the iteration.
SLACK_FRACTION = 0.005


class FoldBroken(SimulationError):
    """The folded simulation met something that is not symmetric across replicas."""


def fold_blocker(topo: Topology, replicas: Replicas) -> str | None:
    """Why ``replicas`` cannot be folded on ``topo`` (None: they can)."""
    if replicas.world != topo.world:
        return f"the replicas span {replicas.world} ranks, the topology {topo.world} GPUs"
    if replicas.unit % topo.gpus_per_node or replicas.block % topo.gpus_per_node:
        return "a replica is not a whole number of nodes"
    if topo.nodes > 1 and topo.platform.network.oversubscription > 1 and len(topo.spine_links()) > 0:
        return "the network core is oversubscribed (the spine is shared by replicas and may limit them)"
    return None


class FoldMap:
    """Link maps of a folded topology: onto the representative nodes, and one replica on."""

    def __init__(self, topo: Topology, replicas: Replicas) -> None:
        reason = fold_blocker(topo, replicas)
        if reason is not None:
            raise ValueError(f"cannot fold: {reason}")
        self.topo, self.replicas = topo, replicas
        self.factor = replicas.factor
        gpn, per = topo.gpus_per_node, topo.links_per_node
        n_links = len(topo.links)
        node_links = topo.nodes * per
        rep_node = np.array([replicas.rep(n * gpn) // gpn for n in range(topo.nodes)], dtype=np.int64)
        next_node = np.array([replicas.shift(n * gpn) // gpn for n in range(topo.nodes)], dtype=np.int64)
        ids = np.arange(node_links, dtype=np.int64)
        node, local = np.divmod(ids, per)
        #: link id -> the representative node's link (-1: a spine link, left out)
        self.to_rep = np.full(n_links, -1, dtype=np.int64)
        self.to_rep[:node_links] = rep_node[node] * per + local
        #: link id -> the same link one replica on (-1: a spine link)
        self.to_next = np.full(n_links, -1, dtype=np.int64)
        self.to_next[:node_links] = next_node[node] * per + local
        self._rep_links = self.to_rep == np.arange(n_links)
        self._cache: dict[tuple[int, bool], list[tuple[tuple[int, ...], float]]] = {}
        self._slack: dict[CollectiveRequest, float] = {}
        #: each node's leaf pod: where images of a group sit differently, latencies may differ
        net = topo.platform.network
        self._pod = np.arange(topo.nodes) // net.nodes_per_leaf if topo.nodes > 1 else np.zeros(1, dtype=np.int64)
        self.pods_aligned = bool(np.all(
            [len({int(self._pod[next_node[n]]) for n in np.flatnonzero(self._pod == p)}) == 1
             and len({int(self._pod[n]) for n in np.flatnonzero(self._pod[next_node] == p)}) == 1
             for p in np.unique(self._pod)]))

    def spans_replicas(self, group: Sequence[int]) -> bool:
        return not all(self.replicas.is_rep(r) for r in group)

    def transfers(self, plan: CollectivePlan, group: Sequence[int]) -> list[tuple[tuple[int, ...], float]]:
        """``plan``'s transfers as the representative replica's network carries them."""
        spans = self.spans_replicas(group)
        key = (id(plan), spans)
        out = self._cache.get(key)
        if out is None:
            out = self._cache[key] = self._quotient(plan, group) if spans else [
                (self._local(t.links), t.nbytes) for t in plan.transfers]
        return out

    def latency_slack(self, planner: Planner, req: CollectiveRequest, plan: CollectivePlan) -> float:
        """How much later or earlier ``req`` may finish in another replica than in the
        representative one (0 when every image sits on the leaves as it does); raises
        :class:`FoldBroken` if an image is planned differently in anything but its latency."""
        if self.pods_aligned or self.spans_replicas(req.group):
            return 0.0
        slack = self._slack.get(req)
        if slack is not None:
            return slack
        rep, gpn = self.replicas, self.topo.gpus_per_node
        mine = self._pattern(req.group)
        slack, seen = 0.0, {mine}
        for k in range(1, self.factor):
            group = tuple(rep.shift(r, k) for r in req.group)
            pattern = self._pattern(group)
            if pattern in seen:
                continue
            seen.add(pattern)
            image = planner.plan(CollectiveRequest(req.op, group, req.nbytes, req.send_matrix, req.root))
            same = (image.algorithm, image.protocol) == (plan.algorithm, plan.protocol) and sorted(
                self._onto_rep(t.links) for t in image.transfers) == sorted(
                self._onto_rep(t.links) for t in plan.transfers)
            if not same:
                raise FoldBroken(f"{req.op} over ranks {req.group[:4]}: another replica, placed differently on "
                                 f"the leaf switches ({gpn} GPUs per node), is planned differently")
            slack = max(slack, abs(image.latency_s - plan.latency_s))
        self._slack[req] = slack
        return slack

    def _pattern(self, group: Sequence[int]) -> tuple[int, ...]:
        """Which members share a leaf pod, as first-seen labels."""
        labels: dict[int, int] = {}
        return tuple(labels.setdefault(int(self._pod[r // self.topo.gpus_per_node]), len(labels)) for r in group)

    def _onto_rep(self, links: Sequence[int]) -> tuple[int, ...]:
        return tuple(sorted(int(self.to_rep[lk]) for lk in links if self.to_rep[lk] >= 0))

    def route(self, links: Sequence[int]) -> tuple[int, ...]:
        """A representative rank's own route, without the spine links."""
        return self._local(links)

    def _local(self, links: Sequence[int]) -> tuple[int, ...]:
        keep = self._rep_links
        out = tuple(int(lk) for lk in links if keep[lk])
        if len(out) != sum(1 for lk in links if self.to_rep[lk] >= 0):
            raise FoldBroken("a representative's transfer crosses another replica's links")
        return out

    def _quotient(self, plan: CollectivePlan, group: Sequence[int]) -> list[tuple[tuple[int, ...], float]]:
        rep = self.replicas
        members = set(group)
        if {rep.shift(r) for r in group} != members:
            raise FoldBroken(f"{plan.algorithm}: group {tuple(group)[:8]}... does not map onto itself "
                             "from one replica to the next")
        to_next, to_rep = self.to_next, self.to_rep

        def canon(links: np.ndarray) -> tuple[int, ...]:  # the links as a sorted multiset, spine left out
            return tuple(sorted(int(x) for x in links if x >= 0 and to_rep[x] >= 0))

        items = Counter((canon(np.asarray(t.links, dtype=np.int64)), float(t.nbytes)) for t in plan.transfers)
        out: list[tuple[tuple[int, ...], float]] = []
        seen: set[tuple[tuple[int, ...], float]] = set()
        for item, count in items.items():
            if item in seen:
                continue
            orbit = [item]
            links = np.asarray(item[0], dtype=np.int64)
            while True:  # the transfer's images, one replica on at a time, until it comes back
                links = to_next[links]
                image = (canon(links), item[1])
                if image == item:
                    break
                if items.get(image) != count or len(orbit) >= self.factor:
                    raise FoldBroken(f"{plan.algorithm} ({plan.protocol}) over {len(group)} ranks is not "
                                     "the same seen from every replica")
                orbit.append(image)
            seen.update(orbit)
            times = self.factor // len(orbit)  # how often the image maps onto each representative link
            mapped = Counter(int(x) for x in to_rep[np.asarray(item[0], dtype=np.int64)])
            if self.factor % len(orbit) or any(c % times for c in mapped.values()):
                raise FoldBroken(f"{plan.algorithm} ({plan.protocol}): a transfer does not divide evenly "
                                 "among the replicas")
            quotient = tuple(sorted(lk for lk, c in mapped.items() for _ in range(c // times)))
            out += [(quotient, item[1])] * count
        return out
