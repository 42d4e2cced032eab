"""Collective algorithms as NCCL runs them: ring, double binary tree, NVLS, direct (pairwise).

Each turns a :class:`CollectiveRequest` into a :class:`CollectivePlan` for one protocol (LL, LL128,
Simple): transfers over the topology's routes, whose bytes are inflated by the protocol's payload
fraction, plus a latency of the protocol's fixed cost and one per-step cost per algorithm step,
by the class of hardware the step crosses (NVLink, PCIe, network) and the route's propagation.
A ring's chunk pays each hop's step cost in turn (NVLink or PCIe inside a node, the network between
nodes), and each loop of the ring has one step that copies in a rank's own memory; a tree's chunk
crosses every level up and down. Rings and trees use several channels when the group spans nodes,
each channel entering and leaving every node on a different GPU (so a different NIC), as NCCL's
channels do; on NVLink meshes the rings are Hamiltonian cycles over the wired pairs. Over the
network a channel has SLOTS buffer slots of one chunk each in flight: its transfer never runs
faster than those slots come back (a round trip and the proxy's step), which holds mid-size
messages, whose chunks are small, below the links' bandwidth on high-latency fabrics.
"""

from __future__ import annotations

from itertools import permutations
from typing import Any

import numpy as np

from ..config.platform import CollectiveSpec, ProtocolSpec
from ..platform.topology import RouteParts, Topology, first_positions, key_members
from .channels import Channels, communicator
from .plan import CollectivePlan, CollectiveRequest, register
from .transfers import Transfer, TransferTable
from .tuning import PAT_PER_RANK_US, pat_enabled

US = 1e-6
RING_SEARCH_TRIES = 64
#: NVLS steps: reduce-load, then multicast-store, each a synchronised pass over the switch
NVLS_STEPS = 8
#: slices a chunk is written in over NVLink and PCIe (NCCL's SLICESTEPS / CHUNKSTEPS)
SLICES_PER_CHUNK = 4
#: buffer slots a channel has per peer (NCCL_STEPS): at most this many chunks are in flight on a hop
SLOTS = 8
#: channels of a communicator that point-to-point transfers use (NCCL's MAXCHANNELS)
P2P_CHANNELS = 32
#: the piece a point-to-point transfer moves per step, by the hardware between the peers
#: (NCCL_P2P_NVL_CHUNKSIZE, NCCL_P2P_PCI_CHUNKSIZE, NCCL_P2P_NET_CHUNKSIZE defaults)
P2P_CHUNK = {"nvlink": 512 << 10, "pcie": 128 << 10, "local": 128 << 10, "net": 128 << 10}


def _by_node(group: tuple[int, ...], topo: Topology) -> list[list[int]]:
    """Group members per node, nodes in order, members in local order."""
    nodes: dict[int, list[int]] = {}
    for r in sorted(group):
        nodes.setdefault(topo.node_of(r), []).append(r)
    return [nodes[n] for n in sorted(nodes)]


def nccl_channels(group: tuple[int, ...], topo: Topology) -> Channels:
    """The channels NCCL sets up for ``group`` (:mod:`simgpu.comm.channels`), once per group shape."""
    per_node = _by_node(group, topo)
    key = ("nccl_channels", len(group), len(per_node))
    cached = topo.memo.get(key)
    if cached is None:
        cached = topo.memo[key] = communicator(topo.platform, len(group), len(per_node))
    return cached  # type: ignore[return-value]


def channels(group: tuple[int, ...], topo: Topology, spec: CollectiveSpec) -> int:
    """Distinct rings (and trees) across nodes: NCCL's search channels before duplication, each
    entering every node on its own GPU (``collectives.channels`` where given)."""
    per_node = _by_node(group, topo)
    if len(per_node) == 1:
        return 1
    want = spec.channels or nccl_channels(group, topo).rings
    return max(1, min(want, min(len(m) for m in per_node)))


def _mesh_rings(members: list[int], topo: Topology) -> list[list[int]]:
    """Rings over NVLink among ``members`` that together fit the links, as NCCL searches them.

    Candidates are the Hamiltonian cycles over direct NVLink links (each direction counts: a ring
    walked backwards uses the other direction of each link), or, where the wiring has none, those
    with hops forwarded through one intermediate GPU. Rings are packed greedily while every link
    they use has a wire left, so a pair wired with two links carries two rings.
    """
    if len(members) < 2 or len(members) > 8:
        return []
    node = topo.node_of(members[0])
    gpn = topo.gpus_per_node

    def nv_route(a: int, b: int) -> tuple[int, ...] | None:
        route = topo.route(a, b)
        return route if route and all(topo.links[i].kind == "nvlink" for i in route) else None

    wires: dict[int, int] = {}
    for x in range(gpn):
        for y in range(gpn):
            if x != y:
                c = topo.nvlink_count(node * gpn + x, node * gpn + y)
                if c:
                    wires[topo.route(node * gpn + x, node * gpn + y)[0]] = c
    first, rest = members[0], members[1:]
    cycles: list[tuple[int, list[int], list[int]]] = []
    for perm in permutations(rest):
        order = [first, *perm]
        routes = [nv_route(a, b) for a, b in zip(order, order[1:] + order[:1])]
        if all(r is not None for r in routes):
            used = [link for r in routes for link in r]  # type: ignore[union-attr]
            cycles.append((len(used) - len(order), order, used))
    # rings over direct links only where any exist; forwarded hops only when the wiring needs them
    direct = [c for c in cycles if c[0] == 0]
    cycles = direct or cycles
    if len(members) == 2 and cycles:
        cycles = cycles[:1]
    # greedy packing depends on the order the cycles are tried in: a few seeded shuffles, the best kept
    rng = np.random.default_rng(0)
    best: list[list[int]] = []
    for attempt in range(RING_SEARCH_TRIES):
        order_idx = np.arange(len(cycles)) if attempt == 0 else rng.permutation(len(cycles))
        left = dict(wires)
        rings: list[list[int]] = []
        for i in order_idx:
            _, ring_order, used = cycles[int(i)]
            need: dict[int, int] = {}
            for link in used:
                need[link] = need.get(link, 0) + 1
            if all(left[link] >= k for link, k in need.items()):
                for link, k in need.items():
                    left[link] -= k
                rings.append(ring_order)
        if len(rings) > len(best):
            best = rings
    return best


def ring_orders(group: tuple[int, ...], topo: Topology, spec: CollectiveSpec) -> list[list[int]]:
    """One ring per channel: nodes in order, each node's members rotated by the channel (or, on an
    NVLink mesh inside one node, the Hamiltonian cycles over its links)."""
    key = ("rings", group, spec.channels)
    cached = topo.memo.get(key)
    if cached is None:
        cached = topo.memo[key] = _ring_orders(group, topo, spec)
    return cached  # type: ignore[return-value]


def _ring_orders(group: tuple[int, ...], topo: Topology, spec: CollectiveSpec) -> list[list[int]]:
    per_node = _by_node(group, topo)
    nv = topo.platform.node.nvlink
    if len(per_node) == 1 and nv is not None and nv.kind == "mesh":
        rings = _mesh_rings(per_node[0], topo)
        if rings:
            return rings
    out = []
    for c in range(channels(group, topo, spec)):
        order: list[int] = []
        for members in per_node:
            k = _channel_start(members, c, topo)
            order.extend(members[k:] + members[:k])
        out.append(order)
    return out


def _channel_start(members: list[int], c: int, topo: Topology) -> int:
    """Where channel ``c`` enters a node: the channels take the NICs of the node's members in turn
    (in NIC order), so that they spread over all of them; a NIC shared by several members gives the
    next of them each time round. On a full node of one NIC per GPU, channel c enters at GPU c."""
    by_nic: dict[int, list[int]] = {}
    for k, g in enumerate(members):
        by_nic.setdefault(topo.nic_of(g), []).append(k)
    nics = sorted(by_nic)
    turn, i = divmod(c, len(nics))
    ks = by_nic[nics[i]]
    return ks[turn % len(ks)]


def _step_cost(proto: ProtocolSpec, hardware: str) -> float:
    return {"nvlink": proto.step_nvlink_us, "pcie": proto.step_pcie_us, "net": proto.step_net_us,
            "local": 0.0}[hardware] * US


def _edges(edges: list[tuple[int, int]], topo: Topology, proto: ProtocolSpec) -> tuple[tuple[int, ...], float]:
    """The links of all edges, and the slowest edge's step time (protocol step + propagation)."""
    links: list[int] = []
    worst = 0.0
    for a, b in edges:
        e = topo.edge(a, b)
        links.extend(e.route)
        trips = 2.0 if e.hardware == "net" and proto.net_round_trip else 1.0
        worst = max(worst, _step_cost(proto, e.hardware) + trips * e.latency)
    return tuple(links), worst


def _base(spec: CollectiveSpec, proto: ProtocolSpec) -> float:
    return (spec.launch_us + proto.base_us) * US


# Bytes each ring edge carries, as a multiple of the message size, and the algorithm's steps.
_RING = {
    "all_reduce": (lambda n: 2 * (n - 1) / n, lambda n: 2 * (n - 1)),
    "all_gather": (lambda n: (n - 1) / n, lambda n: n - 1),
    "reduce_scatter": (lambda n: (n - 1) / n, lambda n: n - 1),
    "broadcast": (lambda n: 1.0, lambda n: n - 1),
    "reduce": (lambda n: 1.0, lambda n: n - 1),
}


@register("ring", set(_RING))
def ring(req: CollectiveRequest, topo: Topology, spec: CollectiveSpec, proto: ProtocolSpec) -> CollectivePlan:
    n = len(req.group)
    if n == 1:
        return CollectivePlan("ring", (), 0.0)
    share, steps = _RING[req.op]
    orders = ring_orders(req.group, topo, spec)
    per_step = share(n) * req.nbytes / len(orders) / steps(n)
    transfers = []
    # a chunk crosses the ring's hops one after the other, each at its own cost (NCCL's ring
    # latency: the steps inside a node at NVLink or PCIe cost, those between nodes at the
    # network's), so its latency and the pipeline's fill add up hop by hop: steps(n) hops, a lap
    # of the ring every n of them. A hop between nodes costs the protocol's network step and the
    # propagation only: the proxy posts each step as it lands, so neither a round trip nor a
    # chunk's fill is paid per hop (NCCL's tuning model charges each inter-node ring step its
    # hwLat[NET] alone, src/graph/tuning.cc; the ten-node H100 runs of 32-128 MiB match it)
    per_hop = 0.0
    hop_cost: dict[tuple[str, float, float, bool], float] = {}  # by the kind of hop: hops repeat
    for order in orders:
        if req.op in ("broadcast", "reduce"):  # a pipelined chain starting (or ending) at the root
            k = order.index(req.group[req.root])
            order = order[k:] + order[:k]
            edges = list(zip(order[:-1], order[1:]))
            if req.op == "reduce":
                edges = [(b, a) for a, b in edges]
        else:
            edges = [(order[i], order[(i + 1) % n]) for i in range(n)]
        links: list[int] = []
        lap = 0.0
        for a, b in edges:
            e = topo.edge(a, b)
            links.extend(e.route)
            kind = (e.hardware, e.latency, e.capacity, e.forwards_chunks)
            hop = hop_cost.get(kind)
            if hop is None:
                if e.hardware == "net":
                    hop = _step_cost(proto, e.hardware) + e.latency
                else:
                    hop = (_step_cost(proto, e.hardware) + e.latency
                           + _fill(per_step, proto, e.capacity, e.forwards_chunks))
                hop_cost[kind] = hop
            lap += hop
        per_hop = max(per_hop, lap / len(edges))
        window = _window(edges, topo, proto, min(proto.chunk_kib * 1024, per_step))
        transfers.append(Transfer(tuple(links), share(n) * req.nbytes / len(orders) / proto.bandwidth, window))
    local = _local_step(req, per_step * len(orders), topo, spec)
    return CollectivePlan("ring", tuple(transfers), _base(spec, proto) + steps(n) * per_hop + local)


def _local_step(req: CollectiveRequest, step_bytes: float, topo: Topology, spec: CollectiveSpec) -> float:
    """Seconds of the one step per ring loop that crosses no link, summed over the loops.

    A rank runs its steps of a loop one after the other, and in all-reduce, all-gather and
    reduce-scatter one of them only copies in its own memory: with P2P writes the last step
    takes the chunk out of the receive buffer into the output; with P2P reads (NCCL's default
    between Ampere GPUs on NVLink) the first step stages the rank's own chunk in its send buffer.
    Over the whole collective that is one step's bytes read and written at the GPU's memory
    bandwidth, on top of the steps over the links. Broadcast and reduce chains overlap it: the
    copying rank does nothing else. Where one process drives all the GPUs of the group's node
    (``collectives.single_process``), NCCL passes direct pointers and the copy goes away.
    """
    if req.op not in ("all_reduce", "all_gather", "reduce_scatter"):
        return 0.0
    if spec.single_process and len({topo.node_of(r) for r in req.group}) == 1:
        return 0.0
    return 2 * step_bytes / (topo.platform.gpu.hbm_gbytes_per_s * 1e9)


def _window(edges: list[tuple[int, int]], topo: Topology, proto: ProtocolSpec, chunk: float) -> float:
    """The most wire bytes/s one channel moves over its network hops: SLOTS chunks in flight,
    each slot free again a round trip (and the proxy's step) after its chunk left. Chunks
    shrink with the message, so mid-size messages can be held to this pace on high-latency
    fabrics while large ones reach the links' bandwidth."""
    rate = float("inf")
    for a, b in edges:
        e = topo.edge(a, b)
        if e.hardware == "net":
            rtt = 2 * e.latency + _step_cost(proto, "net")
            rate = min(rate, SLOTS * chunk / proto.bandwidth / rtt)
    return rate


def _tree_chunk(per_channel: float, depth: int, proto: ProtocolSpec) -> float:
    """The chunk a tree pipelines a channel's share in. With the Simple protocol NCCL halves it
    until the share is several chunks per level of the tree, so the pipeline fills (8 per level
    down to 128 KiB, 4 per level down to 64 KiB, one per level down to 32 KiB)."""
    chunk = proto.chunk_kib * 1024
    if proto.bandwidth >= 1:
        for per_level, floor in ((8, 128 << 10), (4, 64 << 10), (1, 32 << 10)):
            while per_channel < per_level * depth * chunk and chunk > floor:
                chunk /= 2
    return min(chunk, per_channel)


def _slowest_edge(edges: list[tuple[int, int]], topo: Topology) -> float:
    """Bytes/s of the slowest edge alone on its route."""
    return min(topo.edge(a, b).capacity for a, b in edges)


def _fill(per_step_bytes: float, proto: ProtocolSpec, capacity: float, network: bool) -> float:
    """Seconds one chunk takes to cross a hop: a pipeline of D steps pays it D times before the
    bandwidth-bound part starts. Over the network the proxy forwards whole chunks; over NVLink and
    PCIe GPUs write into their peer's buffer a slice at a time, so the pipeline fills by slices."""
    chunk = min(proto.chunk_kib * 1024 / (1 if network else SLICES_PER_CHUNK), per_step_bytes)
    return chunk / proto.bandwidth / capacity


def _tree_efficiency(proto: ProtocolSpec, nbytes: float, power: float = 1.0) -> float:
    """The fraction of its bandwidth a tree all-reduce of ``nbytes`` reaches with ``proto``: the
    figure of the power of two at or below ``nbytes / 64`` (NCCL's indexing), 1 beyond the table,
    raised to the platform's ``tree_efficiency_power``."""
    i = int(nbytes // 64).bit_length() - 1
    return (proto.tree_efficiency[i] if 0 <= i < len(proto.tree_efficiency) else 1.0) ** power


def _btree_parent(n: int, rank: int) -> int:
    """The parent of ``rank`` in NCCL's binary tree over ``n`` ranks (-1: the root), which keeps
    each subtree on a range of consecutive ranks (src/graph/trees.cc, ncclGetBtree): clear the
    lowest set bit and set the one above it, or only clear it where that is out of range."""
    if rank == 0:
        return -1
    bit = rank & -rank
    up = (rank ^ bit) | (bit << 1)
    return up if up < n else rank ^ bit


def _binary_tree(items: list[int], second: bool = False) -> list[tuple[int, int]]:
    """(child, parent) pairs of NCCL's tree over ``items`` (in node order), or of the second tree of
    its double binary tree: the first mirrored where there are an even number of items, shifted
    by one where odd (ncclGetDtree), so the inner nodes of one tree are leaves of the other."""
    n = len(items)
    pairs = []
    for i in range(n):
        if not second:
            p = _btree_parent(n, i)
        elif n % 2:
            u = _btree_parent(n, (i - 1) % n)
            p = -1 if u == -1 else (u + 1) % n
        else:
            u = _btree_parent(n, n - 1 - i)
            p = -1 if u == -1 else n - 1 - u
        if p != -1:
            pairs.append((items[i], items[p]))
    return pairs


@register("tree", {"all_reduce"})
def tree(req: CollectiveRequest, topo: Topology, spec: CollectiveSpec, proto: ProtocolSpec) -> CollectivePlan:
    """Double binary tree across nodes, a chain inside each node; reduce up and broadcast down
    pipelined, so every tree edge carries the data once in each direction. Within a single node
    this is a chain, which NCCL does not use: there only the ring (and NVLS) apply."""
    n = len(req.group)
    per_node = _by_node(req.group, topo)
    if n == 1:
        return CollectivePlan("tree", (), 0.0)
    if len(per_node) == 1:  # NCCL's trees span nodes; inside one node the ring (or NVLS) serves
        return CollectivePlan("tree", (), float("inf"))
    C = channels(req.group, topo, spec)
    nv = topo.platform.node.nvlink
    nvls_nodes = nv is not None and nv.nvls and proto.bandwidth >= 1 and min(len(m) for m in per_node) > 1
    transfers = []
    depth = max(1, (len(per_node)).bit_length() - 1)
    # each channel's share, as its edges carry it (NCCL's derating by size), and its chunk
    wire = req.nbytes / C / proto.bandwidth / _tree_efficiency(proto, req.nbytes, spec.tree_efficiency_power)
    chunk = _tree_chunk(req.nbytes / C, max(len(m) for m in per_node) - 1 + depth, proto)
    intra = inter = 0.0  # one step on the slowest edge inside the nodes, between them
    for c in range(C):
        heads = []
        chain_edges: list[tuple[int, int]] = []
        for members in per_node:
            k = _channel_start(members, c, topo)
            chain = members[k:] + members[:k]
            heads.append(chain[0])
            chain_edges += [(chain[i + 1], chain[i]) for i in range(len(chain) - 1)]
        # the second tree of each pair mirrors the first, so leaves of one are inner nodes of the other
        tree_edges = _binary_tree(heads, second=c % 2 == 1)
        both = tree_edges if nvls_nodes else chain_edges + tree_edges
        links, _ = _edges(both + [(p, ch) for ch, p in both], topo, proto)
        if chain_edges:
            intra = max(intra, _edges(chain_edges, topo, proto)[1])
        inter = max(inter, _edges(tree_edges, topo, proto)[1])
        transfers.append(Transfer(links, wire, _window(tree_edges, topo, proto, chunk)))
    if nvls_nodes:
        # NVLS tree: each node reduces (and later multicasts) in its switch, then the heads run
        # the trees between nodes
        for members in per_node:
            transfers.append(_nvls_transfer(members, req.nbytes, topo, proto))
        intra = NVLS_STEPS / 2 * _edges([(per_node[0][0], per_node[0][-1])], topo, proto)[1]
    chain_len = 1 if nvls_nodes else max(len(m) for m in per_node) - 1
    # reduce up and broadcast down: the first chunk crosses every level twice, each level at the
    # pace of its own hop (the chain's, or the switch's under NVLS, over NVLink or PCIe; the
    # tree's over the network)
    net_fill = _fill(chunk, proto, _slowest_edge(tree_edges, topo), True)
    chain_fill = _fill(chunk, proto, _slowest_edge(chain_edges, topo), True) if chain_edges else net_fill
    fill = 2 * (chain_len * chain_fill + depth * net_fill)
    latency = _base(spec, proto) + 2 * (chain_len * intra + depth * inter) + fill
    return CollectivePlan("tree", tuple(transfers), latency)


@register("collnet", {"all_reduce"})
def collnet(req: CollectiveRequest, topo: Topology, spec: CollectiveSpec, proto: ProtocolSpec) -> CollectivePlan:
    """In-network reduction across nodes (NCCL's CollNet over SHARP), Simple only: each channel
    reduces along a chain inside every node to its head, the head sends the node's data up its NIC
    once, the switches reduce it level by level up the fat tree and multicast the result back down,
    and the chain broadcasts it. A NIC carries the message once each way, where a ring carries it
    twice; above the leaves each leaf switch sends its reduced stream up once and takes the result
    back once (:func:`_sharp_tree`). Every channel's stream is reduced at most at the switches'
    aggregation rate (``network.sharp``: a fraction of the port's line rate, shared by the channels
    through one switch where it runs one tree at a time), and each level of the tree adds its
    aggregation and multicast latency."""
    n = len(req.group)
    per_node = _by_node(req.group, topo)
    if n == 1:
        return CollectivePlan("collnet", (), 0.0)
    if not topo.platform.network.in_network_reduction or len(per_node) == 1 or proto.bandwidth < 1:
        return CollectivePlan("collnet", (), float("inf"))
    net = topo.platform.network
    C = channels(req.group, topo, spec)
    wire = req.nbytes / C / proto.bandwidth
    chunk = min(proto.chunk_kib * 1024, req.nbytes / C)
    heads_of: list[list[int]] = []
    chains: list[list[tuple[int, int]]] = []
    for c in range(C):
        heads, chain_edges = [], []
        for members in per_node:
            k = _channel_start(members, c, topo)
            chain = members[k:] + members[:k]
            heads.append(chain[0])
            chain_edges += [(chain[i + 1], chain[i]) for i in range(len(chain) - 1)]
        heads_of.append(heads)
        chains.append(chain_edges)
    # the channels whose heads share a leaf switch (one tree at a time per switch: they share its rate)
    by_leaf: dict[str, set[int]] = {}
    for c, heads in enumerate(heads_of):
        for h in heads:
            by_leaf.setdefault(topo.leaf_of(topo.node_of(h), topo.nic_of(h)), set()).add(c)
    sharing = max(len(cs) for cs in by_leaf.values()) if net.sharp.trees == "per_switch" else 1
    reduce_rate = net.sharp.reduction_efficiency * net.nic_gbps / 8 * 1e9 / sharing / proto.bandwidth
    transfers = []
    intra = up_latency = 0.0
    levels = 1
    for heads, chain_edges in zip(heads_of, chains):
        links: list[int] = []
        nic_latency = 0.0
        for h in heads:
            up, down = topo.switch_route(h, True), topo.switch_route(h, False)
            links += [*up, *down]
            nic_latency = max(nic_latency, topo.route_latency(up) + topo.route_latency(down))
        above, above_latency, depth = _sharp_tree(heads, topo)
        links += above
        levels = max(levels, depth)
        up_latency = max(up_latency, nic_latency + above_latency)
        if chain_edges:
            chain_links, step = _edges(chain_edges + [(b, a) for a, b in chain_edges], topo, proto)
            links += chain_links
            intra = max(intra, step)
        transfers.append(Transfer(tuple(links), wire, reduce_rate))
    chain_edges = chains[-1]
    chain_len = max(len(m) for m in per_node) - 1
    # up the chain, up the tree to its root and back down (a round trip with Simple), down the
    # chain; the first chunk fills each hop, and each level of the tree aggregates and multicasts
    inter = (_step_cost(proto, "net") + (2.0 if proto.net_round_trip else 1.0) * up_latency
             + levels * net.sharp.level_us * US)
    net_fill = chunk / proto.bandwidth / topo.port_bw
    chain_fill = _fill(chunk, proto, _slowest_edge(chain_edges, topo), True) if chain_edges else 0.0
    latency = _base(spec, proto) + 2 * chain_len * (intra + chain_fill) + inter + 2 * net_fill
    return CollectivePlan("collnet", tuple(transfers), latency)


def _sharp_tree(heads: list[int], topo: Topology) -> tuple[list[int], float, int]:
    """The links above the leaves that one channel's aggregation tree over ``heads`` loads, their
    latency up and down, and the tree's switch levels. On a fat tree each leaf under which heads sit
    sends its reduced stream up its spine link once and takes the result down it once (two levels
    where the heads span leaves, one where they share a leaf). On a dragonfly each group's first
    switch aggregates the streams of its group's other switches over the local links, and the first
    group's aggregates the groups' over the global links; results go back the same way (levels: one
    switch, one group, several groups)."""
    net = topo.platform.network
    leaves: dict[str, int] = {}
    for h in heads:
        leaves.setdefault(topo.leaf_of(topo.node_of(h), topo.nic_of(h)), h)
    if len(leaves) == 1:
        return [], 0.0, 1
    links: list[int] = []
    latency = 0.0
    if net.topology != "dragonfly":
        for leaf in leaves:
            up, down = topo.link_id(f"{leaf}->spine"), topo.link_id(f"spine->{leaf}")
            links += [up, down]
            latency = max(latency, topo.route_latency((up, down)))
        return links, latency, 2
    # each group's first switch aggregates its group; the first group's aggregates the groups
    group_root: dict[int, int] = {}
    for h in leaves.values():
        group_root.setdefault(topo.switch_at(topo.node_of(h))[0], h)
    root = heads[0]
    above = ("local", "global")
    local_latency = global_latency = 0.0
    for h in leaves.values():
        g = topo.switch_at(topo.node_of(h))[0]
        to = group_root[g] if h != group_root[g] else root
        if to == h:
            continue
        route = [x for x in topo.route(h, to) + topo.route(to, h) if topo.links[x].kind in above]
        links += route
        if to == root and h == group_root[g]:
            global_latency = max(global_latency, topo.route_latency(tuple(route)))
        else:
            local_latency = max(local_latency, topo.route_latency(tuple(route)))
    return links, local_latency + global_latency, 3 if len(group_root) > 1 else 2


@register("nvls", {"all_reduce"})
def nvls(req: CollectiveRequest, topo: Topology, spec: CollectiveSpec, proto: ProtocolSpec) -> CollectivePlan:
    """In-switch reduction (NVLink SHARP) inside one node: each GPU sends its buffer to the switch,
    which reduces it and multicasts the result; per GPU port (n+1)/n of the message each way."""
    n = len(req.group)
    nv = topo.platform.node.nvlink
    if n == 1 or nv is None or not nv.nvls or len(_by_node(req.group, topo)) > 1 or proto.bandwidth < 1:
        return CollectivePlan("nvls", (), float("inf"))
    edge = [(req.group[0], req.group[-1])]
    _, step = _edges(edge, topo, proto)
    fill = NVLS_STEPS * _fill(req.nbytes / n, proto, _slowest_edge(edge, topo), False)
    return CollectivePlan("nvls", (_nvls_transfer(list(req.group), req.nbytes, topo, proto),),
                          _base(spec, proto) + NVLS_STEPS * step + fill)


def _nvls_transfer(members: list[int], nbytes: float, topo: Topology, proto: ProtocolSpec) -> Transfer:
    """Every member's switch port, both ways, moving (n+1)/n of the message at the switch's
    reduction efficiency."""
    nv = topo.platform.node.nvlink
    assert nv is not None
    n = len(members)
    links, _ = _edges([(g, members[(i + 1) % n]) for i, g in enumerate(members)], topo, proto)
    scale = nv.efficiency / nv.nvls_efficiency
    return Transfer(links, (n + 1) / n * nbytes * scale / proto.bandwidth)


@register("pat", {"all_gather", "reduce_scatter"})
def pat(req: CollectiveRequest, topo: Topology, spec: CollectiveSpec, proto: ProtocolSpec) -> CollectivePlan:
    """PAT (Parallel Aggregated Trees, NCCL 2.23 and later) at one GPU per node, Simple only: a
    Bruck-like exchange in ceil(log2 n) steps, step k moving 2^k ranks' chunks (what is left, in the
    last) to the rank 2^k on (all-gather) or back (reduce-scatter), every rank at once, so each rank
    sends (n-1)/n of the message in all, as on a ring, while a chunk pays log2 n network steps
    instead of n-1. The steps' transfers run together (NCCL pipelines them); the latency adds
    NCCL's own model's per-rank part (2.8 us a rank: the kernel's work per peer)."""
    g = req.group
    n = len(g)
    if n == 1:
        return CollectivePlan("pat", (), 0.0)
    nodes = len(_by_node(g, topo))
    if proto.bandwidth < 1 or not pat_enabled(spec.nccl_version, n, nodes):
        return CollectivePlan("pat", (), float("inf"))
    chunk = req.nbytes / n
    sign = 1 if req.op == "all_gather" else -1
    transfers = []
    steps = worst = 0.0
    d = 1
    while d < n:
        moved = min(d, n - d) * chunk
        for i, a in enumerate(g):
            b = g[(i + sign * d) % n]
            links, step = _edges([(a, b)], topo, proto)
            worst = max(worst, step)
            window = _window([(a, b)], topo, proto, min(proto.chunk_kib * 1024, moved))
            transfers.append(Transfer(links, moved / proto.bandwidth, window))
        steps += 1
        d *= 2
    return CollectivePlan("pat", tuple(transfers), _base(spec, proto) + steps * worst + n * PAT_PER_RANK_US * US)


def p2p_channels(nbytes: float, ranks: int, piece: float, across_nodes: bool) -> int:
    """Channels NCCL spreads one point-to-point transfer of ``nbytes`` over, on a communicator of
    ``ranks``: the transfer is cut into pieces of at most 32 steps (one step across nodes) on as few
    channels as the communicator's share per peer allows, doubling them (up to four times that
    share) while pieces are too big; small transfers fill fewer channels."""
    lo = hi = P2P_CHANNELS
    while lo * ranks > P2P_CHANNELS and lo > 1:
        lo //= 2
    while hi * ranks > 4 * P2P_CHANNELS and hi > 1:
        hi //= 2
    biggest = piece if across_nodes else 32 * piece
    channels, size = lo, max(piece / 8, nbytes / lo)
    while size > biggest and channels <= hi // 2:
        channels *= 2
        size = nbytes / channels
    return max(1, min(channels, int(np.ceil(nbytes / size))))


def net_peer_channels(ranks: int, topo: Topology) -> int:
    """Channels NCCL gives one peer across the network on a communicator of ``ranks`` spread evenly
    over the topology's nodes, by the rule of the platform's NCCL release (:mod:`simgpu.comm.channels`)."""
    per_node = max(1, min(topo.gpus_per_node, ranks // max(1, topo.nodes)))
    nodes = max(2, -(-ranks // per_node))
    key = ("net_peer_channels", ranks, nodes)
    cached = topo.memo.get(key)
    if cached is None:
        cached = topo.memo[key] = communicator(topo.platform, per_node * nodes, nodes).net_peer
    return cached  # type: ignore[return-value]


def _p2p_rate(a: int, b: int, nbytes: float, ranks: int, topo: Topology, spec: CollectiveSpec,
              proto: ProtocolSpec) -> float:
    """The most wire bytes/s a point-to-point transfer a -> b of ``nbytes`` moves: its channels,
    each half a thread block's rate (a channel's warps are split between its send and its receive);
    across nodes the channels NCCL gives a network peer, each at the network channel's own bound
    (``collectives.net_channel_gbytes_per_s``, where given, instead of the block's) and its window
    of slots, and at most the share of a NIC one send/recv pair's connection reaches (of as many
    NICs as it has channels, up to the GPU's own, on a multi-rail node)."""
    e = topo.edge(a, b)
    piece = P2P_CHUNK[e.hardware]
    net = e.hardware == "net"
    channels = p2p_channels(nbytes, ranks, piece, net)
    per_channel = float("inf")
    if spec.channel_gbytes_per_s is not None:
        per_channel = spec.channel_gbytes_per_s * 1e9 / 2 / proto.bandwidth
    if not net:
        return channels * per_channel
    channels = min(channels, net_peer_channels(ranks, topo))
    if spec.net_channel_gbytes_per_s is not None:  # a network channel's own bound replaces the block's
        per_channel = spec.net_channel_gbytes_per_s * 1e9 / proto.bandwidth
    per_channel = min(per_channel, _window([(a, b)], topo, proto, min(piece, nbytes / channels)))
    # a channel leaves through one NIC: on a multi-rail node a pair's channels spread over the GPU's NICs
    nics = topo.rails if topo.platform.network.stripe_messages else min(channels, topo.rails)
    return min(channels * per_channel, spec.net_peer_share * nics * topo.nic_bw / proto.bandwidth)


def _pairs(req: CollectiveRequest, topo: Topology
           ) -> tuple[np.ndarray, np.ndarray, RouteParts, np.ndarray, np.ndarray, np.ndarray, dict[str, object]]:
    """The pairs of an all-to-all with bytes to move, member by member (member indices from and
    to), their routes (:class:`RouteParts`), bytes and kinds (pairs whose routes
    cross the same kinds of link in the same order, so the same hardware, latency and bottleneck,
    and whose sizes are equal; numbered in the order they first appear), each member's pairs of
    each kind (a member x kind array), and a memo the plans' transfer tables share
    (:class:`TransferTable`); the same for every protocol, so the last request's are kept."""
    cached = topo.memo.get("direct pairs")
    if cached is not None and cached[0] == req:  # type: ignore[index]
        return cached[1]  # type: ignore[index]
    topo.memo.pop("direct pairs", None)
    g, n = np.array(req.group, dtype=np.int32 if topo.world < 2**31 else np.int64), len(req.group)
    small = np.int32 if n < 2**31 else np.int64
    src: np.ndarray
    dst: np.ndarray
    if req.send_matrix is not None:
        nbytes = np.array(req.send_matrix, dtype=float).reshape(n, n)
        keep = (nbytes > 0) & ~np.eye(n, dtype=bool)
        src, dst = (x.astype(small) for x in np.nonzero(keep))  # row by row: member i's pairs in the order of j
        sizes = nbytes[src, dst]
        del keep, nbytes
    else:  # every pair, row by row, and their sizes one number (a view of it per pair)
        share = np.float64(req.nbytes / n)
        m = n * (n - 1) if share > 0 else 0
        src = np.repeat(np.arange(n, dtype=small), n - 1 if m else 0)
        dst = np.tile(np.arange(n - 1, dtype=small), n if m else 0)
        dst[dst >= src] += 1  # member i's peers skip i
        sizes = np.broadcast_to(share, (m,))
    held: Any = topo.memo.get("direct routes")
    if held is not None and held[0] == req.group and np.array_equal(held[1], src) and np.array_equal(held[2], dst):
        parts, shape_class, memo = held[3:]  # the last request's pairs (another size): its routes
    else:
        topo.memo.pop("direct routes", None)  # the last request's routes go before these are made
        ident = n == topo.world and bool(np.all(g == np.arange(n, dtype=g.dtype)))  # the members are the GPUs
        parts = topo.route_parts(src, dst) if ident else topo.route_parts(g[src], g[dst])
        shape_class = _shape_classes(parts, topo)
        memo = {}
        topo.memo["direct routes"] = (req.group, src, dst, parts, shape_class, memo)
    kinds = _route_kinds(shape_class, sizes)
    K = int(kinds.max()) + 1 if len(kinds) else 0
    at = (src.astype(np.int64) if n * K >= 2**31 else src) * K  # in the pairs' width where it fits
    at += kinds
    peers = np.bincount(at, minlength=n * K).reshape(n, K)
    del at
    out = (src, dst, parts, sizes, kinds, peers, memo)
    topo.memo["direct pairs"] = (req, out)
    return out


def _link_classes(topo: Topology) -> np.ndarray:
    """Per link, a number shared by the links of the same kind, capacity and latency."""
    cached = topo.memo.get("link_classes")
    if cached is None:
        seen: dict[tuple[str, float, float], int] = {}
        cached = topo.memo["link_classes"] = np.array(
            [seen.setdefault((lk.kind, lk.capacity, lk.latency), len(seen)) for lk in topo.links], dtype=np.int64)
    return cached  # type: ignore[return-value]


def _shape_classes(parts: RouteParts, topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    """A number per shape of ``parts`` (:meth:`RouteParts.shapes`), shared by the shapes whose
    routes cross the same classes of link in the same order, and each pair's shape: the pairs of
    one class are those whose shapes have it. Routes of one shape differ only in their end nodes,
    whose links at the same place of their block are alike, so one route a shape is read."""
    if len(parts) == 0:
        return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32)
    shapes, of_shape = parts.shapes()
    rows = parts.shape_rows(shapes)
    classes = np.full(rows.shape, -1, dtype=np.int64)
    for k, row in enumerate(rows):
        route = row[row >= 0]
        classes[k, :len(route)] = _link_classes(topo)[route]
    _, shape_class = np.unique(classes, axis=0, return_inverse=True)
    return shape_class.reshape(-1).astype(np.int32), of_shape


def _first_seen(table: np.ndarray, of: np.ndarray, k: int) -> np.ndarray:
    """The first position of each of the values ``0..k-1`` (each present) in ``table[of]``, read in
    chunks that double, so that values which all show up early cost a few short reads."""
    first = np.full(k, -1, dtype=np.int64)
    lo, step, left = 0, 1024, k
    while left and lo < len(of):
        values, at = np.unique(table[of[lo:lo + step]], return_index=True)
        new = first[values] < 0
        first[values[new]] = lo + at[new]
        left -= int(np.count_nonzero(new))
        lo, step = lo + step, step * 2
    return first


def _route_kinds(classes: tuple[np.ndarray, np.ndarray], sizes: np.ndarray) -> np.ndarray:
    """A number per pair, shared by the pairs of the same class of route (:func:`_shape_classes`:
    a class per shape, and each pair's shape) and size; numbered in the order they first appear."""
    if len(sizes) == 0:
        return np.zeros(0, dtype=np.int32)
    shape_class, of_shape = classes
    if sizes.min() == sizes.max():  # the kinds are the classes: numbered per shape, read once a pair
        k = int(shape_class.max()) + 1
        first = _first_seen(shape_class, of_shape, k)
        renumber = np.empty(k, dtype=np.int32)
        renumber[np.argsort(first, kind="stable")] = np.arange(k, dtype=np.int32)
        return renumber[shape_class][of_shape]
    _, size_class = np.unique(sizes, return_inverse=True)
    key = shape_class[of_shape] * (int(size_class.max()) + 1) + size_class.reshape(-1)
    _, _, inverse = key_members(key, members=False)
    first = first_positions(inverse, int(inverse.max()) + 1)
    renumber = np.empty(len(first), dtype=np.int64)
    renumber[np.argsort(first, kind="stable")] = np.arange(len(first))
    return renumber.astype(np.int32)[inverse]


@register("direct", {"all_to_all", "send_recv", "all_gather", "reduce_scatter"})
def direct(req: CollectiveRequest, topo: Topology, spec: CollectiveSpec, proto: ProtocolSpec) -> CollectivePlan:
    """Every pair exchanges its share at once (NCCL's all-to-all as grouped send/recv), each pair's
    transfer on the channels NCCL gives a point-to-point transfer of its size.

    A grouped operation serves its peers one after another (NCCL's p2p schedule walks the peers
    round by round, and the proxy progresses each peer's connection in turn), so on top of the
    slowest step it pays a per-peer cost for every peer of its busiest member, by transport
    (``collectives.p2p_net_peer_us``, ``p2p_local_peer_us``). Over more than two nodes each NIC
    exchanges with several other nodes at once and reaches ``network.many_peer_efficiency`` of
    its rate."""
    g = req.group
    n = len(g)
    ranks = req.comm_ranks
    if req.op == "send_recv":
        if n != 2:
            raise ValueError(f"send_recv needs a group of 2, got {n}")
        links, step = _edges([(g[0], g[1])], topo, proto)
        rate = _p2p_rate(g[0], g[1], req.nbytes, ranks, topo, spec, proto)
        return CollectivePlan("direct", (Transfer(links, req.nbytes / proto.bandwidth, rate),),
                              _base(spec, proto) + step)
    if n == 1:
        return CollectivePlan("direct", (), 0.0)
    src, dst, parts, _, kinds, peers, memo = _pairs(req, topo)
    spread = len({topo.node_of(r) for r in g}) > 2
    per_kind: list[tuple[float, float, float, bool]] = []
    kinds_n = int(kinds.max()) + 1 if len(kinds) else 0
    for first in first_positions(kinds, kinds_n).tolist():  # kinds are numbered as they first appear
        i, j = int(src[first]), int(dst[first])
        a, b = g[i], g[j]
        nbytes = req.send_matrix[i][j] if req.send_matrix is not None else req.nbytes / n
        net = topo.edge(a, b).hardware == "net"
        step = _edges([(a, b)], topo, proto)[1]
        rate = _p2p_rate(a, b, nbytes, ranks, topo, spec, proto)
        eff = topo.platform.network.many_peer_efficiency if net and spread else 1.0
        per_kind.append((step, rate, nbytes / proto.bandwidth / eff, net))
    worst = max((step for step, _, _, _ in per_kind), default=0.0)
    # per member: peers inside its node, peers across the network
    remote = peers @ np.array([net for *_, net in per_kind], dtype=float)
    local = peers.sum(axis=1) - remote
    per_peer = float(np.max(local * spec.p2p_local_peer_us + remote * spec.p2p_net_peer_us, initial=0.0)) * US
    transfers = TransferTable(None, None, np.array([w for _, _, w, _ in per_kind]),  # bytes and caps per kind
                              np.array([r for _, r, _, _ in per_kind]), memo, parts, kinds)
    return CollectivePlan("direct", transfers, _base(spec, proto) + worst + per_peer)
