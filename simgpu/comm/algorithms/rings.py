"""Rings: the ring orders of a group (Hamiltonian cycles on NVLink meshes, NCCL's channels across
nodes) and the ring algorithm."""

from __future__ import annotations

from itertools import permutations

import numpy as np

from ...config.platform import CollectiveSpec, ProtocolSpec
from ...platform.topology import Topology
from ..plan import CollectivePlan, CollectiveRequest, register
from ..transfers import Transfer
from .common import RING_SEARCH_TRIES, _base, _by_node, _channel_start, _fill, _step_cost, _window, channels, rails_down


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
    skip = rails_down(per_node, topo)
    for c in range(channels(group, topo, spec)):
        order: list[int] = []
        for members in per_node:
            k = _channel_start(members, c, topo, skip)
            order.extend(members[k:] + members[:k])
        out.append(order)
    return out


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
