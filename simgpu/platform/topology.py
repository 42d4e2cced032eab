"""The platform as a graph of directed links, and the routes between GPUs.

A platform spec plus a node count becomes a :class:`Topology`: every GPU's NVLink port (to the
NVSwitch, each direction), every PCIe link (GPU and NIC to their switch, switch to CPU), every NIC
port and every leaf-switch uplink is a :class:`Link` with an achievable bandwidth and a latency.
Routes are computed on demand and cached; the network layer shares link bandwidth between the
transfers that cross it.

Naming: ``n3.gpu5->n3.nvsw`` is node 3, GPU 5's NVLink port towards the switch. GPU indices are
global ranks: rank r is local GPU ``r % gpus_per_node`` of node ``r // gpus_per_node``.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

import numpy as np

from ..config.platform import PlatformSpec
from .faults import NoPath, check_paths, resolve
from .links import NET_KINDS, EdgeInfo, Link
from .route_parts import RouteParts, route_parts_of


class Topology:
    """Links and routes of ``nodes`` nodes of ``platform``, using ``gpus_per_node`` GPUs each."""

    def __init__(self, platform: PlatformSpec, nodes: int, gpus_per_node: int | None = None) -> None:
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        self.platform = platform
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node or platform.node.gpus
        if not 1 <= self.gpus_per_node <= platform.node.gpus:
            raise ValueError(f"gpus_per_node must be in 1..{platform.node.gpus}, got {self.gpus_per_node}")
        from ..config.checks import check_network

        check_network(platform, nodes)  # a dragonfly's links, counted before any is made
        self.links: list[Link] = []
        self._ids: dict[str, int] = {}
        p = platform
        nv, pcie, net = p.node.nvlink, p.node.pcie, p.network
        #: one NIC's achievable rate; a GPU's port (its NICs striped, multi-rail) moves ``port_bw``
        self.nic_bw = net.nic_gbps / 8 * 1e9 * net.efficiency
        self.rails = net.nics_per_gpu
        self.port_bw = self.nic_bw * self.rails
        pcie_bw = pcie.gbytes_per_s * 1e9 * pcie.efficiency
        # a port is one NIC, or on a multi-rail node the NICs of one GPU, striped (as NCCL spreads the
        # GPU's channels over them) and each on its own rail's leaf: one link of their summed rate
        G, S, K = p.node.gpus, pcie.switches, net.nics_per_node // self.rails
        self.ports = K
        self._gpu_switch = [g * S // G for g in range(G)]
        self._nic_switch = [k * S // K for k in range(K)]
        self._nic_of = [self._pick_nic(g) for g in range(G)]
        for n in range(nodes):
            for g in range(self.gpus_per_node):
                if nv is not None and nv.kind == "nvswitch":
                    bw, lat = nv.gbytes_per_s * 1e9 * nv.efficiency, nv.latency_us * 0.5e-6
                    self._add(f"n{n}.gpu{g}->n{n}.nvsw", "nvlink", bw, lat)
                    self._add(f"n{n}.nvsw->n{n}.gpu{g}", "nvlink", bw, lat)
                sw = self._gpu_switch[g]
                self._add(f"n{n}.gpu{g}->n{n}.pcisw{sw}", "pcie", pcie_bw, pcie.latency_us * 0.5e-6)
                self._add(f"n{n}.pcisw{sw}->n{n}.gpu{g}", "pcie", pcie_bw, pcie.latency_us * 0.5e-6)
            if nv is not None and nv.kind == "mesh":
                for a, b, count in nv.links:
                    if a < self.gpus_per_node and b < self.gpus_per_node:
                        bw = count * nv.gbytes_per_s * 1e9 * nv.efficiency
                        self._add(f"n{n}.gpu{a}->n{n}.gpu{b}", "nvlink", bw, nv.latency_us * 1e-6)
                        self._add(f"n{n}.gpu{b}->n{n}.gpu{a}", "nvlink", bw, nv.latency_us * 1e-6)
            if not pcie.p2p:
                # one staging buffer area in host memory that every GPU-to-GPU copy passes through
                staged = pcie.staged_gbytes_per_s * 1e9 if pcie.staged_gbytes_per_s else pcie_bw
                self._add(f"n{n}.hostmem", "host", staged, pcie.latency_us * 1e-6)
            for s in range(S):
                self._add(f"n{n}.pcisw{s}->n{n}.cpu", "pcie", pcie_bw, pcie.latency_us * 0.5e-6)
                self._add(f"n{n}.cpu->n{n}.pcisw{s}", "pcie", pcie_bw, pcie.latency_us * 0.5e-6)
            if nodes > 1:
                for k in range(K):
                    s = self._nic_switch[k]
                    self._add(f"n{n}.pcisw{s}->n{n}.nic{k}", "pcie", pcie_bw, pcie.latency_us * 0.5e-6)
                    self._add(f"n{n}.nic{k}->n{n}.pcisw{s}", "pcie", pcie_bw, pcie.latency_us * 0.5e-6)
                    leaf = self.leaf_of(n, k)
                    self._add(f"n{n}.nic{k}->{leaf}", "nic", self.port_bw, net.latency_us * 0.5e-6)
                    self._add(f"{leaf}->n{n}.nic{k}", "nic", self.port_bw, net.latency_us * 0.5e-6)
        #: links of each node, added node by node: node n's are ids [n * links_per_node, (n + 1) * ...)
        self.links_per_node = len(self.links) // nodes
        self._leaves = sorted({self.leaf_of(n, k) for n in range(nodes) for k in range(K)}) if nodes > 1 else []
        if net.topology == "dragonfly":
            if nodes > 1:
                self._add_dragonfly()
        elif len(self._leaves) > 1:
            for leaf in self._leaves:
                ports = min(net.nodes_per_leaf, nodes) * (1 if net.topology == "rail_optimized" else K)
                up = ports * self.port_bw / net.oversubscription
                self._add(f"{leaf}->spine", "spine", up, net.spine_latency_us * 0.5e-6)
                self._add(f"spine->{leaf}", "spine", up, net.spine_latency_us * 0.5e-6)
        if getattr(p, "kinds", None):  # a mixed platform: each node's links of its own kind
            from .mixed import per_kind_links
            per_kind_links(self)
        #: the platform's faults on these links (falsy: none); a factor scales a link's capacity
        self.faults = resolve(p, nodes, self.gpus_per_node, self.links, self._ids, self.leaf_of, self._nic_of,
                              self._gpu_switch, self._nic_switch)
        for lid, f in self.faults.scale.items():
            lk = self.links[lid]
            self.links[lid] = Link(lid, lk.name, lk.kind, lk.capacity * f, lk.latency)
        self.capacity = np.array([lk.capacity for lk in self.links])
        self.latency = np.array([lk.latency for lk in self.links])
        self.route = lru_cache(maxsize=None)(self._route)
        self.edge = lru_cache(maxsize=None)(self._edge)
        #: derived facts that other stages cache per topology (for example ring orders)
        self.memo: dict[object, object] = {}
        if self.faults.dead:
            check_paths(self)

    # -- construction ---------------------------------------------------------------------------

    def _add(self, name: str, kind: str, capacity: float, latency: float) -> int:
        if name in self._ids:
            raise ValueError(f"duplicate link {name}")
        lid = len(self.links)
        self.links.append(Link(lid, name, kind, capacity, latency))
        self._ids[name] = lid
        return lid

    def _add_dragonfly(self) -> None:
        """Local links between every two switches of each group in use, and the global links between
        every two groups in use (pooled under adaptive routing: see ``DragonflySpec.routing``):
        ``global_links_per_group_pair`` (L) of them, link m of groups (a, b) on switch
        ``(b * L + m) % S`` of group a and ``(a * L + m) % S`` of group b, so a group's global links
        spread round its switches (named ``sw{a}.{x}->sw{b}.{y}/g{m}``)."""
        net = self.platform.network
        df = net.dragonfly
        assert df is not None
        eff = net.efficiency
        S, L = df.switches_per_group, df.global_links_per_group_pair
        local_bw = df.local_link_gbps / 8 * 1e9 * eff * df.local_links_per_switch_pair
        global_bw = df.global_link_gbps / 8 * 1e9 * eff
        switches = (self.nodes + df.nodes_per_switch - 1) // df.nodes_per_switch
        groups = (switches + S - 1) // S
        in_group = S if groups > 1 else switches  # one group: only its switches in use route
        if df.routing == "adaptive":
            # every path used at once: a switch's local links as one pool each way, the global links
            # between two groups as one
            lat = df.local_latency_us * 1e-6
            for grp in range(groups if in_group > 1 else 0):  # one switch a group: no local links
                for a in range(in_group):
                    self._add(f"sw{grp}.{a}->local", "local", (in_group - 1) * local_bw, lat)
                    self._add(f"local->sw{grp}.{a}", "local", (in_group - 1) * local_bw, 0.0)
            for ga in range(groups):
                for gb in range(groups):
                    if ga != gb:
                        self._add(f"g{ga}->g{gb}", "global", L * global_bw, df.global_latency_us * 1e-6)
            return
        for grp in range(groups):
            for a in range(in_group):
                for b in range(in_group):
                    if a != b:
                        self._add(f"sw{grp}.{a}->sw{grp}.{b}", "local", local_bw, df.local_latency_us * 1e-6)
        for ga in range(groups):
            for gb in range(groups):
                if ga != gb:
                    for m in range(L):
                        self._add(self._global_name(ga, gb, m), "global", global_bw, df.global_latency_us * 1e-6)

    def _global_name(self, ga: int, gb: int, m: int) -> str:
        """The ``m``-th global link from group ``ga`` to group ``gb``."""
        return f"sw{ga}.{self._gateway(ga, gb, m)}->sw{gb}.{self._gateway(gb, ga, m)}/g{m}"

    def _gateway(self, group: int, other: int, m: int) -> int:
        """The switch of ``group`` that holds its ``m``-th global link to group ``other``."""
        df = self.platform.network.dragonfly
        assert df is not None
        return (other * df.global_links_per_group_pair + m) % df.switches_per_group

    def switch_at(self, node: int) -> tuple[int, int]:
        """(group, switch within the group) of ``node`` on a dragonfly."""
        df = self.platform.network.dragonfly
        assert df is not None
        sw = node // df.nodes_per_switch
        return divmod(sw, df.switches_per_group)

    def _fabric(self, na: int, la: str, nb: int, lb: str) -> list[str]:
        """Link names between the switch ``la`` of node ``na`` and ``lb`` of node ``nb``."""
        net = self.platform.network
        if net.topology != "dragonfly":
            return [f"{la}->spine", f"spine->{lb}"] if la != lb else []
        df = net.dragonfly
        assert df is not None
        (ga, sa), (gb, sb) = self.switch_at(na), self.switch_at(nb)
        if df.routing == "adaptive":
            if ga == gb:
                return [f"sw{ga}.{sa}->local", f"local->sw{ga}.{sb}"] if sa != sb else []
            # out through the source switch's local links to the switches holding global links, across
            # the groups' pool, in through the destination switch's local links
            if df.switches_per_group == 1:
                return [f"g{ga}->g{gb}"]
            return [f"sw{ga}.{sa}->local", f"g{ga}->g{gb}", f"local->sw{gb}.{sb}"]
        if ga == gb:
            return [f"sw{ga}.{sa}->sw{ga}.{sb}"] if sa != sb else []
        # minimal: to the switch holding the global link, across it, on to the destination's switch;
        # the flow's global link is picked by its end nodes, as a static hash spreads flows
        m = (na + nb) % df.global_links_per_group_pair
        xa, xb = self._gateway(ga, gb, m), self._gateway(gb, ga, m)
        hops = [f"sw{ga}.{sa}->sw{ga}.{xa}"] if sa != xa else []
        hops.append(self._global_name(ga, gb, m))
        if xb != sb:
            hops.append(f"sw{gb}.{xb}->sw{gb}.{sb}")
        return hops

    def _pick_nic(self, g: int) -> int:
        """The NIC GPU ``g`` uses: one on its own PCIe switch where there is one (GPUDirect RDMA)."""
        p = self.platform
        sw = self._gpu_switch[g]
        local_nics = [k for k, s in enumerate(self._nic_switch) if s == sw]
        if local_nics:
            peers = [h for h, s in enumerate(self._gpu_switch) if s == sw]
            return local_nics[peers.index(g) % len(local_nics)]
        return g * self.ports // p.node.gpus

    # -- queries --------------------------------------------------------------------------------

    def switch_of(self, local_gpu: int) -> int:
        """The PCIe switch (index within its node) of local GPU ``local_gpu``."""
        return self._gpu_switch[local_gpu]

    def nic_switch(self, nic: int) -> int:
        """The PCIe switch (index within its node) of NIC ``nic``."""
        return self._nic_switch[nic]

    def has_link(self, name: str) -> bool:
        return name in self._ids

    def spine_links(self) -> list[int]:
        """Ids of the links between switches: leaf to spine, or a dragonfly's local and global links
        (shared by nodes; every other link belongs to one node)."""
        return list(range(self.nodes * self.links_per_node, len(self.links)))

    def implied_links(self) -> dict[int, frozenset[int]]:
        """The links between switches whose capacity can never limit a flow, each with the links that
        cover it (see :class:`~simgpu.comm.network.FlowNetwork`): on a fat tree, plain or
        rail-optimised, every flow up a leaf's uplink leaves its node through one of the leaf's NIC
        ports (every flow down its downlink arrives through one), so where those ports' capacities
        sum to no more than the uplink's (a core that is not oversubscribed) the uplink's
        constraint is implied by theirs. Sums are compared to 1e-12: the uplink's capacity is
        computed as a product, the ports' as a sum."""
        if self.platform.network.topology == "dragonfly" or len(self._leaves) < 2:
            return {}
        up: dict[str, list[int]] = {leaf: [] for leaf in self._leaves}
        down: dict[str, list[int]] = {leaf: [] for leaf in self._leaves}
        for n in range(self.nodes):
            for k in range(self.ports):
                leaf = self.leaf_of(n, k)
                if k not in self.faults.ports_down.get(n, ()):  # a port down carries nothing
                    up[leaf].append(self._ids[f"n{n}.nic{k}->{leaf}"])
                    down[leaf].append(self._ids[f"{leaf}->n{n}.nic{k}"])
        out: dict[int, frozenset[int]] = {}
        for leaf in self._leaves:
            for name, cover in ((f"{leaf}->spine", up[leaf]), (f"spine->{leaf}", down[leaf])):
                lid = self._ids[name]
                if self.capacity[lid] >= float(self.capacity[cover].sum()) * (1 - 1e-12):
                    out[lid] = frozenset(cover)
        return out

    @property
    def core_may_limit(self) -> bool:
        """Whether the links between switches may hold traffic below the NICs' rate: an
        oversubscribed spine, or any dragonfly of more than one switch (its global links are few
        per group pair, and a flow takes one of them)."""
        if self.nodes == 1 or not self.spine_links():
            return False
        return self.platform.network.topology == "dragonfly" or self.platform.network.oversubscription > 1

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_node

    def local_of(self, gpu: int) -> int:
        return gpu % self.gpus_per_node

    def nic_of(self, gpu: int) -> int:
        """Index within its node of the NIC that ``gpu`` sends and receives through."""
        return self.faults.nic_of.get(self.node_of(gpu), self._nic_of)[self.local_of(gpu)]

    def home_nic(self, gpu: int) -> int:
        """The NIC ``gpu`` has to itself or shares, as built: :meth:`nic_of` before faults."""
        return self._nic_of[self.local_of(gpu)]

    def leaf_of(self, node: int, nic: int) -> str:
        """The switch NIC (port) ``nic`` of ``node`` attaches to."""
        net = self.platform.network
        if net.topology == "dragonfly":
            group, sw = self.switch_at(node)
            return f"sw{group}.{sw}"
        pod = node // net.nodes_per_leaf
        return f"leaf{nic}.{pod}" if net.topology == "rail_optimized" else f"leaf{pod}"

    def link_id(self, name: str) -> int:
        return self._ids[name]

    def _route(self, src: int, dst: int) -> tuple[int, ...]:
        """Link ids from GPU ``src`` to GPU ``dst`` (empty when they are the same GPU); where a link
        of it is down, the first of the other paths the platform offers that avoids every link down."""
        route = self._plain_route(src, dst)
        dead = self.faults.dead
        if not dead or not dead.intersection(route):
            return route
        for hops in self._detours(src, dst):
            ids = tuple(self._ids[h] for h in hops)
            if not dead.intersection(ids):
                return ids
        raise NoPath(f"GPU {src} (node {self.node_of(src)}) is cut off from GPU {dst} (node {self.node_of(dst)}): no "
                     "path is left; expected a path between every two GPUs", key=f"faults.{self.faults.culprit(route)}")

    def _plain_route(self, src: int, dst: int) -> tuple[int, ...]:
        if src == dst:
            return ()
        for g in (src, dst):
            if not 0 <= g < self.world:
                raise ValueError(f"GPU {g} is not in this {self.world}-GPU topology")
        na, nb = self.node_of(src), self.node_of(dst)
        ga, gb = self.local_of(src), self.local_of(dst)
        i = self._ids
        nv = self.platform.node.nvlink
        if na == nb:
            if nv is not None and nv.kind == "nvswitch":
                return (i[f"n{na}.gpu{ga}->n{na}.nvsw"], i[f"n{na}.nvsw->n{na}.gpu{gb}"])
            direct = f"n{na}.gpu{ga}->n{na}.gpu{gb}"
            if direct in i:
                return (i[direct],)
            if nv is not None:  # NVLink through an intermediate GPU wired to both (NCCL's NVB path)
                via = [k for k in range(self.gpus_per_node)
                       if f"n{na}.gpu{ga}->n{na}.gpu{k}" in i and f"n{na}.gpu{k}->n{na}.gpu{gb}" in i]
                if via:
                    k = max(via, key=lambda k: (min(self.nvlink_count(src, na * self.gpus_per_node + k),
                                                    self.nvlink_count(na * self.gpus_per_node + k, dst)), -k))
                    return (i[f"n{na}.gpu{ga}->n{na}.gpu{k}"], i[f"n{na}.gpu{k}->n{na}.gpu{gb}"])
            # no NVLink between the two: PCIe, through host memory when peer-to-peer is off
            return tuple(i[h] for h in self._pcie_hops(na, ga, gb))
        ka, kb = self.nic_of(src), self.nic_of(dst)
        relay = ga
        if ka != kb and nv is not None and nv.kind == "nvswitch":
            # PXN: hop over NVLink to the local GPU on the destination's rail, then leave through
            # its NIC, so rail-optimised fabrics carry the traffic without crossing the spine.
            relay, ka = self._relay(na, gb, kb), kb
        return tuple(i[h] for h in self._inter_hops(na, ga, relay, ka, nb, gb, kb))

    def _pcie_hops(self, n: int, ga: int, gb: int) -> list[str]:
        """Link names from local GPU ``ga`` to ``gb`` of node ``n`` over PCIe (through host memory
        where peer-to-peer is off)."""
        sa, sb = self._gpu_switch[ga], self._gpu_switch[gb]
        hops = [f"n{n}.gpu{ga}->n{n}.pcisw{sa}"]
        if not self.platform.node.pcie.p2p:  # staged through a buffer in host memory
            hops += [f"n{n}.pcisw{sa}->n{n}.cpu", f"n{n}.hostmem", f"n{n}.cpu->n{n}.pcisw{sb}"]
        elif sa != sb:
            hops += [f"n{n}.pcisw{sa}->n{n}.cpu", f"n{n}.cpu->n{n}.pcisw{sb}"]
        hops.append(f"n{n}.pcisw{sb}->n{n}.gpu{gb}")
        return hops

    def _detours(self, src: int, dst: int) -> Iterator[list[str]]:
        """The paths from GPU ``src`` to ``dst`` that a link down leaves to try, best first: inside a
        node NVLink (direct, then through a GPU wired to both), then PCIe; across nodes every pair
        of NICs, the destination's own and the rail's first, leaving through the NIC directly or
        from the GPU on its rail over NVLink (PXN)."""
        na, nb, ga, gb = self.node_of(src), self.node_of(dst), self.local_of(src), self.local_of(dst)
        nv, ids = self.platform.node.nvlink, self._ids
        if na == nb:
            if nv is not None and nv.kind == "nvswitch":
                yield [f"n{na}.gpu{ga}->n{na}.nvsw", f"n{na}.nvsw->n{na}.gpu{gb}"]
            elif nv is not None:
                if f"n{na}.gpu{ga}->n{na}.gpu{gb}" in ids:
                    yield [f"n{na}.gpu{ga}->n{na}.gpu{gb}"]
                for k in range(self.gpus_per_node):
                    via = [f"n{na}.gpu{ga}->n{na}.gpu{k}", f"n{na}.gpu{k}->n{na}.gpu{gb}"]
                    if all(h in ids for h in via):
                        yield via
            yield self._pcie_hops(na, ga, gb)
            return
        ka0, kb0 = self.nic_of(src), self.nic_of(dst)
        rest = list(range(self.ports))
        for kb in [kb0, *(k for k in rest if k != kb0)]:
            for ka in dict.fromkeys([kb, ka0, *rest]):
                relays = [ga]
                if nv is not None and nv.kind == "nvswitch":
                    relays = list(dict.fromkeys([*(h for h in range(self.gpus_per_node) if self._nic_of[h] == ka), ga]))
                for relay in relays:
                    yield self._inter_hops(na, ga, relay, ka, nb, gb, kb)

    def _relay(self, node: int, g: int, nic: int) -> int:
        """The GPU of ``node`` that PXN hops to for leaving through NIC ``nic`` (``g`` without faults)."""
        if not self.faults or self.faults.nic_of.get(node, self._nic_of)[g] == nic:
            return g
        own = [h for h in range(self.gpus_per_node) if self._nic_of[h] == nic]
        return own[0] if own else g

    def _inter_hops(self, na: int, ga: int, relay: int, ka: int, nb: int, gb: int, kb: int) -> list[str]:
        """Link names from local GPU ``ga`` of node ``na`` (through ``relay`` over NVLink, where it is
        another GPU) out of NIC ``ka``, to local GPU ``gb`` of node ``nb`` in through NIC ``kb``."""
        hops = []
        if relay != ga:
            hops += [f"n{na}.gpu{ga}->n{na}.nvsw", f"n{na}.nvsw->n{na}.gpu{relay}"]
            ga = relay
        sa, sb = self._gpu_switch[ga], self._gpu_switch[gb]
        xa, xb = self._nic_switch[ka], self._nic_switch[kb]
        la, lb = self.leaf_of(na, ka), self.leaf_of(nb, kb)
        hops.append(f"n{na}.gpu{ga}->n{na}.pcisw{sa}")
        if sa != xa:
            hops += [f"n{na}.pcisw{sa}->n{na}.cpu", f"n{na}.cpu->n{na}.pcisw{xa}"]
        hops += [f"n{na}.pcisw{xa}->n{na}.nic{ka}", f"n{na}.nic{ka}->{la}"]
        hops += self._fabric(na, la, nb, lb)
        hops += [f"{lb}->n{nb}.nic{kb}", f"n{nb}.nic{kb}->n{nb}.pcisw{xb}"]
        if xb != sb:
            hops += [f"n{nb}.pcisw{xb}->n{nb}.cpu", f"n{nb}.cpu->n{nb}.pcisw{sb}"]
        hops.append(f"n{nb}.pcisw{sb}->n{nb}.gpu{gb}")
        return hops

    def switch_route(self, gpu: int, up: bool = True) -> tuple[int, ...]:
        """Links between ``gpu`` and the switch its NIC attaches to (up: towards the switch), as
        in-network reduction uses them."""
        n, g = self.node_of(gpu), self.local_of(gpu)
        k = self.nic_of(gpu)
        s, x = self._gpu_switch[g], self._nic_switch[k]
        leaf = self.leaf_of(n, k)
        hops = [f"n{n}.gpu{g}->n{n}.pcisw{s}"]
        if s != x:
            hops += [f"n{n}.pcisw{s}->n{n}.cpu", f"n{n}.cpu->n{n}.pcisw{x}"]
        hops += [f"n{n}.pcisw{x}->n{n}.nic{k}", f"n{n}.nic{k}->{leaf}"]
        if not up:
            hops = [f"{b}->{a}" for a, b in (h.split("->") for h in reversed(hops))]
        return tuple(self._ids[h] for h in hops)

    def host_route(self, gpu: int, to_device: bool = True) -> tuple[int, ...]:
        """Links of a copy between host memory and ``gpu`` (host to device by default)."""
        n, g = self.node_of(gpu), self.local_of(gpu)
        s = self._gpu_switch[g]
        hops = ([f"n{n}.cpu->n{n}.pcisw{s}", f"n{n}.pcisw{s}->n{n}.gpu{g}"] if to_device
                else [f"n{n}.gpu{g}->n{n}.pcisw{s}", f"n{n}.pcisw{s}->n{n}.cpu"])
        return tuple(self._ids[h] for h in hops)

    def nvlinked(self, a: int, b: int) -> bool:
        """Whether GPUs ``a`` and ``b`` are joined by NVLink (same node, switch or direct link)."""
        nv = self.platform.node.nvlink
        if nv is None or self.node_of(a) != self.node_of(b) or a == b:
            return False
        if nv.kind == "nvswitch":
            return True
        n = self.node_of(a)
        return f"n{n}.gpu{self.local_of(a)}->n{n}.gpu{self.local_of(b)}" in self._ids

    def nvlink_count(self, a: int, b: int) -> int:
        """NVLink links wired between GPUs ``a`` and ``b`` of a mesh (1 for a switch port pair)."""
        nv = self.platform.node.nvlink
        if not self.nvlinked(a, b) or nv is None:
            return 0
        if nv.kind == "nvswitch":
            return 1
        la, lb = self.local_of(a), self.local_of(b)
        return sum(c for x, y, c in nv.links if {x, y} == {la, lb})

    def hardware(self, route: tuple[int, ...]) -> str:
        """The slowest class of hardware on a route: "net", "pcie" or "nvlink" (or "local")."""
        kinds = {self.links[i].kind for i in route}
        if kinds & NET_KINDS:
            return "net"
        if kinds & {"pcie", "host"}:
            return "pcie"
        return "nvlink" if kinds else "local"

    def _edge(self, src: int, dst: int) -> EdgeInfo:
        route = self.route(src, dst)
        return EdgeInfo(route, self.route_latency(route), self.hardware(route), self.route_capacity(route),
                        self.forwards_chunks(route))

    def forwards_chunks(self, route: tuple[int, ...]) -> bool:
        """Whether data on this route is forwarded in whole chunks (by the network proxy) rather
        than written a slice at a time: into the peer, or, without peer-to-peer, into a buffer in
        host memory that the peer reads as each slice lands (NCCL's shared-memory transport)."""
        return any(self.links[i].kind in NET_KINDS for i in route)

    def route_latency(self, route: tuple[int, ...]) -> float:
        return float(self.latency[list(route)].sum()) if route else 0.0

    def route_capacity(self, route: tuple[int, ...]) -> float:
        return float(self.capacity[list(route)].min()) if route else float("inf")

    # -- many routes at once --------------------------------------------------------------------

    def route_table(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The routes of the pairs ``src[p] -> dst[p]`` (distinct GPUs) as a table, and a number per
        pair shared by the pairs whose routes are the same up to the nodes they start and end on.

        Row p holds :meth:`route` ``(src[p], dst[p])``'s link ids in order, padded with -1 between
        and after them (``table[table >= 0]`` lists every route's links, route after route); the
        rows of :meth:`route_parts`."""
        if len(src) == 0:
            return np.full((0, 1), -1, dtype=np.int64), np.zeros(0, dtype=np.int64)
        parts = self.route_parts(src, dst)
        return parts.rows(), parts.shape

    def route_parts(self, src: np.ndarray, dst: np.ndarray) -> RouteParts:
        """The routes of the pairs ``src[p] -> dst[p]`` (distinct GPUs) as :class:`RouteParts`.

        A route is its source node's links, the fabric between the switches and its destination
        node's links; every node's links sit at the same offsets of its block of ids, so the node
        parts are the route of one representative pair of the same local GPUs shifted to the pair's
        nodes, and the fabric is computed once per pair of switches it depends on."""
        return route_parts_of(self, src, dst)
