"""Trees: NCCL's double binary tree across nodes, and CollNet (in-network reduction: SHARP)."""

from __future__ import annotations

from ...config.platform import CollectiveSpec, ProtocolSpec
from ...platform.topology import Topology
from ..plan import CollectivePlan, CollectiveRequest, register
from ..transfers import Transfer
from .common import (
    NVLS_STEPS,
    US,
    _base,
    _by_node,
    _channel_start,
    _edges,
    _fill,
    _nvls_transfer,
    _slowest_edge,
    _step_cost,
    _window,
    channels,
    rails_down,
)


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
    skip = rails_down(per_node, topo)
    for c in range(C):
        heads = []
        chain_edges: list[tuple[int, int]] = []
        for members in per_node:
            k = _channel_start(members, c, topo, skip)
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
    skip = rails_down(per_node, topo)
    for c in range(C):
        heads, chain_edges = [], []
        for members in per_node:
            k = _channel_start(members, c, topo, skip)
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
