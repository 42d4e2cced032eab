"""Collective algorithms as NCCL runs them: ring, double binary tree, direct (pairwise).

Each turns a :class:`CollectiveRequest` into a :class:`CollectivePlan` over the topology's routes.
Rings and trees use several channels when the group spans nodes, each channel entering and leaving
every node on a different GPU (so a different NIC), as NCCL's channels do.
"""

from __future__ import annotations

from ..config.platform import CollectiveSpec
from ..platform.topology import Topology
from .plan import CollectivePlan, CollectiveRequest, Transfer, register

US = 1e-6


def _by_node(group: tuple[int, ...], topo: Topology) -> list[list[int]]:
    """Group members per node, nodes in order, members in local order."""
    nodes: dict[int, list[int]] = {}
    for r in sorted(group):
        nodes.setdefault(topo.node_of(r), []).append(r)
    return [nodes[n] for n in sorted(nodes)]


def channels(group: tuple[int, ...], topo: Topology, spec: CollectiveSpec) -> int:
    per_node = _by_node(group, topo)
    if len(per_node) == 1:
        return 1
    want = spec.channels or topo.platform.network.nics_per_node
    return max(1, min(want, min(len(m) for m in per_node)))


def ring_order(group: tuple[int, ...], topo: Topology, channel: int) -> list[int]:
    """The ring of ``channel``: nodes in order, each node's members rotated by the channel."""
    out: list[int] = []
    for members in _by_node(group, topo):
        k = channel % len(members)
        out.extend(members[k:] + members[:k])
    return out


def _edges_links(edges: list[tuple[int, int]], topo: Topology) -> tuple[tuple[int, ...], float]:
    links: list[int] = []
    lat = 0.0
    for a, b in edges:
        route = topo.route(a, b)
        links.extend(route)
        lat = max(lat, topo.route_latency(route))
    return tuple(links), lat


# Bytes each ring edge carries, as a multiple of the message size, and the algorithm's steps.
_RING = {
    "all_reduce": (lambda n: 2 * (n - 1) / n, lambda n: 2 * (n - 1)),
    "all_gather": (lambda n: (n - 1) / n, lambda n: n - 1),
    "reduce_scatter": (lambda n: (n - 1) / n, lambda n: n - 1),
    "broadcast": (lambda n: 1.0, lambda n: n - 1),
    "reduce": (lambda n: 1.0, lambda n: n - 1),
}


@register("ring", set(_RING))
def ring(req: CollectiveRequest, topo: Topology, spec: CollectiveSpec) -> CollectivePlan:
    n = len(req.group)
    if n == 1:
        return CollectivePlan("ring", (), 0.0)
    share, steps = _RING[req.op]
    C = channels(req.group, topo, spec)
    transfers = []
    max_lat = 0.0
    for c in range(C):
        order = ring_order(req.group, topo, c)
        if req.op in ("broadcast", "reduce"):  # a pipelined chain starting (or ending) at the root
            root = req.group[req.root]
            k = order.index(root)
            order = order[k:] + order[:k]
            edges = list(zip(order[:-1], order[1:], strict=True))
            if req.op == "reduce":
                edges = [(b, a) for a, b in edges]
        else:
            edges = [(order[i], order[(i + 1) % n]) for i in range(n)]
        links, lat = _edges_links(edges, topo)
        max_lat = max(max_lat, lat)
        transfers.append(Transfer(links, share(n) * req.nbytes / C))
    latency = spec.launch_us * US + steps(n) * (spec.step_us * US + max_lat)
    return CollectivePlan("ring", tuple(transfers), latency)


def _binary_tree(items: list[int]) -> list[tuple[int, int]]:
    """(child, parent) pairs of a complete binary tree over ``items`` in heap order."""
    return [(items[i], items[(i - 1) // 2]) for i in range(1, len(items))]


@register("tree", {"all_reduce"})
def tree(req: CollectiveRequest, topo: Topology, spec: CollectiveSpec) -> CollectivePlan:
    """Double binary tree across nodes, a chain inside each node; reduce up and broadcast down
    pipelined, so every tree edge carries the data once in each direction."""
    n = len(req.group)
    if n == 1:
        return CollectivePlan("tree", (), 0.0)
    per_node = _by_node(req.group, topo)
    C = channels(req.group, topo, spec)
    transfers = []
    depth_max = 0
    max_lat = 0.0
    for c in range(C):
        heads = []
        edges: list[tuple[int, int]] = []
        for members in per_node:
            k = c % len(members)
            chain = members[k:] + members[:k]
            heads.append(chain[0])
            edges += [(chain[i + 1], chain[i]) for i in range(len(chain) - 1)]
        # the second tree of the pair is the first one mirrored, so leaves of one are inner
        # nodes of the other
        order = heads if c % 2 == 0 else heads[::-1]
        pairs = _binary_tree(order)
        edges += pairs
        both = edges + [(p, ch) for ch, p in edges]
        links, lat = _edges_links(both, topo)
        max_lat = max(max_lat, lat)
        depth = max(len(m) for m in per_node) - 1 + max(1, len(order)).bit_length() - 1
        depth_max = max(depth_max, depth)
        transfers.append(Transfer(links, req.nbytes / C))
    latency = spec.launch_us * US + 2 * max(depth_max, 1) * (spec.step_us * US + max_lat)
    return CollectivePlan("tree", tuple(transfers), latency)


@register("direct", {"all_to_all", "send_recv", "all_gather", "reduce_scatter"})
def direct(req: CollectiveRequest, topo: Topology, spec: CollectiveSpec) -> CollectivePlan:
    """Every pair exchanges its share at once (NCCL's all-to-all as grouped send/recv)."""
    g = req.group
    n = len(g)
    if req.op == "send_recv":
        if n != 2:
            raise ValueError(f"send_recv needs a group of 2, got {n}")
        route = topo.route(g[0], g[1])
        return CollectivePlan("direct", (Transfer(route, req.nbytes),),
                              spec.launch_us * US + spec.step_us * US + topo.route_latency(route))
    if n == 1:
        return CollectivePlan("direct", (), 0.0)
    transfers = []
    max_lat = 0.0
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            nbytes = req.send_matrix[i][j] if req.send_matrix is not None else req.nbytes / n
            if nbytes <= 0:
                continue
            route = topo.route(g[i], g[j])
            max_lat = max(max_lat, topo.route_latency(route))
            transfers.append(Transfer(route, nbytes))
    return CollectivePlan("direct", tuple(transfers), spec.launch_us * US + spec.step_us * US + max_lat)
