"""Identical ranks simulated once: the network seen from the representative ranks.

A folded workload (:class:`~simgpu.graph.Replicas`) holds the programs of the
representative ranks only. The others run the same ops at the same times (the job is symmetric
under the shifts that map ranks onto each other: one data-parallel replica onto the next, one
tensor-parallel rank onto the next inside a node), so the engine only needs the representatives,
plus the network as they see it: their traffic and their share of every collective.

This module owns that view. Each shift of ranks is also a permutation of the topology's links: a
shift of whole nodes maps each node's links onto the image node's; a shift of GPUs inside every
node maps a GPU's NVLink and PCIe links onto the image GPU's, a PCIe switch onto the switch of
its GPUs' images and a NIC onto the NIC of its GPUs' images (:func:`local_shift_unit` finds the
smallest shift for which that is consistent, e.g. a switch's worth of GPUs). Every link is mapped
onto one representative of its orbit (the lowest id), every link orbit holding one link per
image. A collective is planned over its whole group as usual; its transfers, mapped onto the
representative links, are kept once per orbit: a collective whose group each shift of a subgroup
``H`` maps onto itself (a data-parallel reduce-scatter under the data-parallel shifts, a
tensor-parallel all-reduce under the tensor-parallel ones) must have a set of transfers that ``H``
maps onto itself too (a ring does; a double binary tree across replicas does not), and each link
then carries ``1 / |H|`` of the times its orbit is crossed. Max-min fair sharing on this quotient
gives exactly the rates of the full network under symmetry, contention included.

The leaf-to-spine links are shared by the replicas and are not mapped by a shift of whole nodes
(leaves need not line up with replicas); they are left out, which is exact only when they cannot
limit anything: on a core that is not oversubscribed, every flow through a leaf uplink also
crosses one of that leaf's NIC links, whose capacities sum to the uplink's. On an oversubscribed
core (or a dragonfly's) whole nodes are not folded (:func:`fold_blocker`). Ranks inside nodes still
are (:func:`inside_nodes_only` gives the levels that may fold there), the links between switches
kept in the folded network: on a rail-optimised fat tree a shift of GPUs inside every node moves
each NIC onto the image NIC, so each rail's leaf onto the image rail's leaf of the same pod and its
spine links onto the image leaf's, every one moved by every shift, as the nodes' own links are;
where every NIC of a node is on one switch (a plain fat tree's leaf, a dragonfly's switch), each
shift leaves every switch in place, and every link between switches (:func:`_spine_perm`). A
link's orbit then holds fewer links than there are shifts, and every image of a transfer that
crosses it crosses that one link: where a transfer's images under all the shifts are ``n`` and it
crosses a link orbit of ``o`` links ``c`` times, each link of the orbit carries ``n c / o`` times its
flow, and so does the representative link in the quotient (for an orbit of every shift's image,
``o`` is the number of shifts and this is the count kept below). A plan that is not invariant
raises :class:`FoldBroken`, and :func:`simgpu.simulate` then simulates every rank.

Leaf switches need not line up with replicas (a DGX A100 SuperPOD has 20 nodes per leaf, a GPT-3
replica 8 nodes per stage): a pipeline transfer may cross the spine in one replica and not in
another. The bandwidths are the same (the spine never limits), only the spine's latency differs.
For each collective whose image in some other replica sits differently on the leaves,
:meth:`FoldMap.latency_slack` plans that image too: it must be the same plan up to the latency,
and the difference is added to a budget. Each collective is one step of any chain of dependent
work, so the budget bounds how far any replica's timeline can drift from the representative's;
the engine gives up the fold when it exceeds :data:`SLACK_FRACTION` of the iteration.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..comm.plan import CollectivePlan, CollectiveRequest
from ..comm.planner import Planner
from ..errors import SimulationError
from ..graph import Replicas
from ..platform.topology import Topology

#: The most the latency differences between replicas may add up to, as a fraction of the iteration.
SLACK_FRACTION = 0.005


class FoldBroken(SimulationError):
    """The folded simulation met something that is not symmetric across replicas; ``inside_nodes``:
    only the shifts of GPUs inside nodes are at fault (folding whole nodes may still hold)."""

    def __init__(self, message: str, *, inside_nodes: bool = False) -> None:
        super().__init__(message)
        self.inside_nodes = inside_nodes


def _local_link_perm(topo: Topology, block: int, unit: int) -> np.ndarray | None:
    key = ("local_link_perm", block, unit)
    if key not in topo.memo:
        topo.memo[key] = _induced_link_perm(topo, block, unit)
    return topo.memo[key]  # type: ignore[return-value]


def _spine_perm(topo: Topology, block: int, unit: int) -> np.ndarray | None:
    """The permutation of the links between leaves and the spine (ids from the nodes' links on, as
    offsets from there) that shifting every node's GPUs by ``unit`` within blocks of ``block``
    induces: on a rail-optimised fat tree each NIC goes onto the image NIC, so each rail's leaf onto
    the image rail's leaf of the same pod; where every NIC of a node is on one switch (a plain fat
    tree's leaf, a dragonfly's switch), every switch and every link between switches stays in
    place. None where the GPUs' shift moves no NIC consistently."""
    key = ("spine_perm", block, unit)
    if key not in topo.memo:
        topo.memo[key] = _induced_spine_perm(topo, block, unit)
    return topo.memo[key]  # type: ignore[return-value]


def _induced_spine_perm(topo: Topology, block: int, unit: int) -> np.ndarray | None:
    if _local_link_perm(topo, block, unit) is None:
        return None
    first = topo.nodes * topo.links_per_node
    if all(len({topo.leaf_of(n, k) for k in range(topo.ports)}) == 1 for n in range(topo.nodes)):
        # every NIC of a node on one switch (a plain fat tree's leaf, a dragonfly's switch): the shift
        # leaves every switch in place, and every link between switches
        return np.arange(len(topo.links) - first, dtype=np.int64)
    if topo.platform.network.topology != "rail_optimized":
        return None
    gpn = topo.gpus_per_node
    gpu = {g: (g // block) * block + (g % block + unit) % block for g in range(gpn)}
    nic: dict[int, int] = {}
    for g in range(gpn):
        if nic.setdefault(topo.nic_of(g), topo.nic_of(gpu[g])) != topo.nic_of(gpu[g]):
            return None
    perm = np.empty(len(topo.links) - first, dtype=np.int64)
    for i, lk in enumerate(topo.links[first:]):
        m = re.fullmatch(r"(spine->)?leaf(\d+)\.(\d+)(->spine)?", lk.name)
        if m is None or bool(m.group(1)) == bool(m.group(4)) or int(m.group(2)) not in nic:
            return None
        image = f"leaf{nic[int(m.group(2))]}.{m.group(3)}"
        target = f"spine->{image}" if m.group(1) else f"{image}->spine"
        if not topo.has_link(target):
            return None
        perm[i] = topo.link_id(target) - first
    return perm


def _induced_link_perm(topo: Topology, block: int, unit: int) -> np.ndarray | None:
    """The permutation of one node's links (indices within the node) that shifting its GPUs by
    ``unit`` within every block of ``block`` consecutive GPUs induces; None where it induces none
    (a PCIe switch or NIC whose GPUs' images are not on one switch or NIC, a missing NVLink wire)
    or where a link would not move with every shift (a link shared by the shifted GPUs)."""
    gpn, per = topo.gpus_per_node, topo.links_per_node
    if gpn % block or block % unit or unit == block:
        return None
    gpu = {g: (g // block) * block + (g % block + unit) % block for g in range(gpn)}
    sw_of = [topo.switch_of(g) for g in range(gpn)]
    nic_of = [topo.nic_of(g) for g in range(gpn)]

    def induced(pairs: list[tuple[int, int]]) -> dict[int, int] | None:
        out: dict[int, int] = {}
        for a, b in pairs:
            if out.setdefault(a, b) != b:
                return None
        return out if len(set(out.values())) == len(out) else None

    nic = induced([(nic_of[g], nic_of[gpu[g]]) for g in range(gpn)])
    if nic is None:
        return None
    sw = induced([(sw_of[g], sw_of[gpu[g]]) for g in range(gpn)]
                 + [(topo.nic_switch(k), topo.nic_switch(nic[k])) for k in nic])
    if sw is None:
        return None
    tables = {"gpu": gpu, "pcisw": sw, "nic": nic}

    def image(name: str) -> str | None:
        try:
            out = re.sub(r"n0\.(gpu|pcisw|nic)(\d+)", lambda m: f"n0.{m.group(1)}{tables[m.group(1)][int(m.group(2))]}",
                         name)
        except KeyError:
            return None
        port = re.search(r"n0\.nic(\d+)", out)
        if port is not None:  # a NIC's port on its leaf: the image NIC's leaf
            out = re.sub(r"leaf[\d.]+", topo.leaf_of(0, int(port.group(1))), out)
        return out

    names = [lk.name for lk in topo.links[:per]]
    perm = np.empty(per, dtype=np.int64)
    for i, name in enumerate(names):
        target = image(name)
        if target is None or not topo.has_link(target):
            return None
        perm[i] = topo.link_id(target)
    order = block // unit
    cur = np.arange(per)
    for k in range(1, order + 1):
        cur = perm[cur]
        if k < order and np.any(cur == np.arange(per)):
            return None  # a link that some shift leaves in place: shared by the images
    return perm if np.array_equal(cur, np.arange(per)) else None


def local_shift_unit(topo: Topology, block: int) -> int:
    """The smallest shift of GPUs within blocks of ``block`` consecutive GPUs of every node that
    maps the topology onto itself, link orbits whole (``block`` where none does)."""
    key = ("local_shift_unit", block)
    if key not in topo.memo:
        topo.memo[key] = next((u for u in range(1, block) if block % u == 0
                               and _local_link_perm(topo, block, u) is not None), block)
    return int(topo.memo[key])  # type: ignore[call-overload]


def _level_kind(topo: Topology, block: int, unit: int) -> str | None:
    gpn = topo.gpus_per_node
    if unit % gpn == 0 and block % gpn == 0:
        return "nodes"
    if gpn % block == 0 and _local_link_perm(topo, block, unit) is not None:
        return "local"
    return None


def fold_blocker(topo: Topology, replicas: Replicas) -> str | None:
    """Why ``replicas`` cannot be folded on ``topo`` (None: they can)."""
    if topo.faults:
        return "faults make nodes differ (platform faults)"
    if replicas.world != topo.world:
        return f"the replicas span {replicas.world} ranks, the topology {topo.world} GPUs"
    for block, unit in replicas.levels:
        if _level_kind(topo, block, unit) is None:
            return (f"shifting ranks by {unit} within blocks of {block} moves neither whole nodes nor GPUs "
                    "inside a node onto a like place")
    if topo.core_may_limit and not all(_level_kind(topo, block, unit) == "local"
                                       and _spine_perm(topo, block, unit) is not None
                                       for block, unit in replicas.levels):
        return ("the network core may limit replicas that share it: an oversubscribed spine, or a dragonfly's "
                "local and global links")
    return None


def inside_nodes_only(topo: Topology, replicas: Replicas) -> Replicas | None:
    """``replicas``' levels that shift GPUs inside nodes, where those fold on ``topo`` though all of
    them do not (whole nodes on a core that may limit them: see the module docstring); else None."""
    levels = tuple(lv for lv in replicas.levels if _level_kind(topo, *lv) == "local")
    if not levels or levels == replicas.levels:
        return None
    local = Replicas(world=replicas.world, levels=levels)
    return local if fold_blocker(topo, local) is None else None


class FoldMap:
    """The links as the representative ranks see them: every link onto its orbit's representative,
    and each shift of ranks as a permutation of the links."""

    def __init__(self, topo: Topology, replicas: Replicas) -> None:
        reason = fold_blocker(topo, replicas)
        if reason is not None:
            raise ValueError(f"cannot fold: {reason}")
        self.topo, self.replicas = topo, replicas
        gpn, per = topo.gpus_per_node, topo.links_per_node
        n_links = len(topo.links)
        node_links = topo.nodes * per
        node, local = np.divmod(np.arange(node_links, dtype=np.int64), per)
        #: per level: link id -> the same link one unit further on (-1: a spine link)
        self.next: list[np.ndarray] = []
        self.orders: list[int] = []
        self.node_levels: list[int] = []  # levels that move whole nodes (the others stay inside nodes)
        #: the links between leaves and the spine are kept (mapped by the shifts inside nodes) where the
        #: core may limit (only those shifts fold then, see fold_blocker); else left out
        self.spine = topo.core_may_limit
        for level, (block, unit) in enumerate(replicas.levels):
            nxt = np.full(n_links, -1, dtype=np.int64)
            if _level_kind(topo, block, unit) == "nodes":
                image = np.array([replicas.shift(n * gpn, 1, level) // gpn for n in range(topo.nodes)], dtype=np.int64)
                nxt[:node_links] = image[node] * per + local
                self.node_levels.append(level)
            else:
                perm = _local_link_perm(topo, block, unit)
                assert perm is not None
                nxt[:node_links] = node * per + perm[local]
                if self.spine:
                    spine = _spine_perm(topo, block, unit)
                    assert spine is not None
                    nxt[node_links:] = node_links + spine
            self.next.append(nxt)
            self.orders.append(block // unit)
        #: link id -> the lowest id of its orbit under every shift (-1: a spine link, left out)
        lam = np.full(n_links, -1, dtype=np.int64)
        kept = n_links if self.spine else node_links
        lam[:kept] = np.arange(kept)
        for nxt, order in zip(self.next, self.orders, strict=True):
            cur, best = np.arange(n_links), lam.copy()
            for _ in range(order - 1):
                cur = np.where(cur >= 0, nxt[np.maximum(cur, 0)], -1)
                best = np.where(cur >= 0, np.minimum(best, lam[np.maximum(cur, 0)]), best)
            lam = best
        self.to_rep = lam
        #: the shifts in all (the product of the levels' orders) and, per link, how many times its
        #: orbit's transfers stand on the representative link for each one kept: the shifts over the
        #: orbit's links (1 where every shift moves the link, as a node's own links; 0: left out)
        self.shifts = int(np.prod(self.orders)) if self.orders else 1
        held = lam >= 0
        sizes = np.bincount(lam[held], minlength=n_links)
        self.spread = np.zeros(n_links, dtype=np.int64)
        if held.any():
            orbit = sizes[lam[held]]
            if (self.shifts % orbit).any():
                raise ValueError("a link orbit whose size does not divide the shifts")
            self.spread[held] = self.shifts // orbit
        self._powers: dict[tuple[int, int], np.ndarray] = {}
        self._cache: dict[tuple[int, tuple[int, ...]], list[tuple[tuple[int, ...], float, float]]] = {}
        self._slack: dict[CollectiveRequest, float] = {}
        self._checked: set[tuple[object, ...]] = set()
        #: each node's leaf pod: where images of a group sit differently, latencies may differ
        net = topo.platform.network
        self._pod = np.arange(topo.nodes) // net.nodes_per_leaf if topo.nodes > 1 else np.zeros(1, dtype=np.int64)
        self.pods_aligned = True
        for level in self.node_levels:
            image = np.array([replicas.shift(n * gpn, 1, level) // gpn for n in range(topo.nodes)])
            self.pods_aligned &= bool(all(
                len({int(self._pod[image[n]]) for n in np.flatnonzero(self._pod == p)}) == 1
                and len({int(self._pod[n]) for n in np.flatnonzero(self._pod[image] == p)}) == 1
                for p in np.unique(self._pod)))

    def spans_replicas(self, group: Sequence[int]) -> bool:
        return not all(self.replicas.is_rep(r) for r in group)

    def _power(self, level: int, k: int) -> np.ndarray:
        """Link map of ``k`` units on at ``level``."""
        key = (level, k)
        out = self._powers.get(key)
        if out is None:
            nxt = self.next[level]
            out = np.arange(len(nxt))
            for _ in range(k):
                out = np.where(out >= 0, nxt[np.maximum(out, 0)], -1)
            self._powers[key] = out
        return out

    def _stabiliser(self, group: Sequence[int]) -> list[tuple[int, int]]:
        """Per level, the smallest number of units whose shift maps ``group`` onto itself, as
        ``(level, k)`` for the levels where one below the level's order does."""
        members = set(group)
        gens = []
        for level, order in enumerate(self.orders):
            for k in range(1, order):
                if order % k == 0 and {self.replicas.shift(r, k, level) for r in group} == members:
                    gens.append((level, k))
                    break
        return gens

    def transfers(self, planner: Planner, req: CollectiveRequest,
                  plan: CollectivePlan) -> list[tuple[tuple[int, ...], float, float]]:
        """``plan``'s transfers (for ``req``) as the representative ranks' network carries them.

        Raises :class:`FoldBroken` where a member is not the image of a representative member
        under a shift that keeps the group (then it need not arrive when its representative does),
        or where the collective's image on other GPUs of the nodes is planned differently (the
        tuner's choices are not all symmetric): those images run on links the representative's
        stand for."""
        group = req.group
        key = (id(plan), tuple(group))
        out = self._cache.get(key)
        if out is None:
            self._check_images(planner, req, plan)
            rep = self.replicas
            gens = self._stabiliser(group)
            reached = {r for r in group if rep.is_rep(r)}
            frontier = list(reached)
            while frontier:
                frontier = [m for m in {rep.shift(r, k, level) for r in frontier for level, k in gens}
                            if m not in reached]
                reached.update(frontier)
            if reached != set(group):
                raise FoldBroken(f"{plan.algorithm} over ranks {tuple(group)[:4]}...: members that no shift "
                                 "keeping the group maps onto a representative")
            out = self._cache[key] = self._quotient(plan, group, gens)
        return out

    def _check_images(self, planner: Planner, req: CollectiveRequest, plan: CollectivePlan) -> None:
        # once per shape: the same collective on the same GPUs of other nodes (another pipeline
        # stage's) is planned alike, the planner being blind to which nodes it is given
        gpn = self.topo.gpus_per_node
        first = req.group[0] // gpn
        shape = (req.op, req.nbytes, req.root, req.send_matrix, req.comm_size,
                 tuple((r // gpn - first, r % gpn) for r in req.group))
        if shape in self._checked:
            return
        self._checked.add(shape)
        members = set(req.group)
        for level, order in enumerate(self.orders):
            if level in self.node_levels:
                continue  # images in other nodes: see latency_slack
            for k in range(1, order):
                group = tuple(self.replicas.shift(r, k, level) for r in req.group)
                if set(group) == members:
                    continue
                image = planner.plan(replace(req, group=group))
                moved = self._power(level, k)
                same = ((image.algorithm, image.protocol) == (plan.algorithm, plan.protocol)
                        and abs(image.latency_s - plan.latency_s) <= 1e-9 * max(plan.latency_s, 1e-6)
                        and sorted((self._canon(moved[np.asarray(t.links, dtype=np.int64)]), t.nbytes,
                                    t.max_rate) for t in plan.transfers)
                        == sorted((self._canon(np.asarray(t.links, dtype=np.int64)), t.nbytes, t.max_rate)
                                  for t in image.transfers))
                if not same:
                    raise FoldBroken(f"{req.op} over ranks {req.group[:4]}: its image on other GPUs of the same "
                                     "nodes is planned differently", inside_nodes=True)

    def _canon(self, links: np.ndarray) -> tuple[int, ...]:
        """Links as a sorted multiset, spine links left out (where they are)."""
        return tuple(sorted(int(x) for x in links if x >= 0 and self.to_rep[x] >= 0))

    def route(self, links: Sequence[int]) -> tuple[int, ...]:
        """A representative rank's own route on the representative links, without the spine (where
        it is left out)."""
        return tuple(int(self.to_rep[lk]) for lk in links if self.to_rep[lk] >= 0)

    def _spread(self, route: tuple[int, ...]) -> tuple[int, ...]:
        """``route`` (on representative links) as the flow of a transfer and its images under every
        shift, each a different transfer, stands on them: each link once per shift over its orbit's
        links (see the module docstring)."""
        spread = self.spread
        if all(spread[lk] == 1 for lk in route):
            return route
        return tuple(sorted(lk for lk in route for _ in range(int(spread[lk]))))

    def latency_slack(self, planner: Planner, req: CollectiveRequest, plan: CollectivePlan) -> float:
        """How much later or earlier ``req`` may finish in another replica than in the
        representative one (0 when every image sits on the leaves as it does); raises
        :class:`FoldBroken` if an image is planned differently in anything but its latency."""
        if self.pods_aligned or not self.node_levels:
            return 0.0
        slack = self._slack.get(req)
        if slack is not None:
            return slack
        rep, gpn = self.replicas, self.topo.gpus_per_node
        mine = self._pattern(req.group)
        members = set(req.group)
        slack, seen = 0.0, {mine}
        for level in self.node_levels:
            for k in range(1, self.orders[level]):
                group = tuple(rep.shift(r, k, level) for r in req.group)
                if set(group) == members:
                    continue  # the collective itself (a data-parallel one), not another's
                pattern = self._pattern(group)
                if pattern in seen:
                    continue
                seen.add(pattern)
                image = planner.plan(replace(req, group=group))
                same = (image.algorithm, image.protocol) == (plan.algorithm, plan.protocol) and sorted(
                    self.route(t.links) for t in image.transfers) == sorted(self.route(t.links) for t in plan.transfers)
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

    def _quotient(self, plan: CollectivePlan, group: Sequence[int],
                  gens: list[tuple[int, int]]) -> list[tuple[tuple[int, ...], float, float]]:
        to_rep = self.to_rep
        size = 1
        for level, k in gens:
            size *= self.orders[level] // k
        spread = self.spread
        if size == 1:  # no shift keeps the group: each transfer's images are one a shift
            return [(self._spread(self.route(t.links)), t.nbytes, t.max_rate) for t in plan.transfers]
        maps = [self._power(level, k) for level, k in gens]

        def canon(links: np.ndarray) -> tuple[int, ...]:  # the links as a sorted multiset, spine left out
            return tuple(sorted(int(x) for x in links if x >= 0 and to_rep[x] >= 0))

        items = Counter((canon(np.asarray(t.links, dtype=np.int64)), float(t.nbytes), float(t.max_rate))
                        for t in plan.transfers)
        out: list[tuple[tuple[int, ...], float, float]] = []
        seen: set[tuple[tuple[int, ...], float, float]] = set()
        for item, count in items.items():
            if item in seen:
                continue
            orbit = {item}
            frontier = [item]
            while frontier:  # the transfer's images under the shifts that keep the group
                nxt = []
                for x in frontier:
                    for m in maps:
                        image = (canon(m[np.asarray(x[0], dtype=np.int64)]), x[1], x[2])
                        if image not in orbit:
                            if items.get(image) != count or len(orbit) >= size:
                                raise FoldBroken(f"{plan.algorithm} ({plan.protocol}) over {len(group)} ranks is "
                                                 "not the same seen from every replica")
                            orbit.add(image)
                            nxt.append(image)
                frontier = nxt
            seen |= orbit
            times = size // len(orbit)  # how often the orbit maps onto each representative link
            mapped = Counter(int(x) for x in to_rep[np.asarray(item[0], dtype=np.int64)])
            if size % len(orbit) or any(c * int(spread[lk]) % times for lk, c in mapped.items()):
                raise FoldBroken(f"{plan.algorithm} ({plan.protocol}): a transfer does not divide evenly "
                                 "among the replicas")
            quotient = tuple(sorted(lk for lk, c in mapped.items() for _ in range(c * int(spread[lk]) // times)))
            out += [(quotient, item[1], item[2])] * count
        return out
