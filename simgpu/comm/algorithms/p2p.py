"""Direct (pairwise) transfers: all-to-all, send/recv, and all-gather or reduce-scatter as pairs;
the point-to-point channels and an all-to-all's pairs as a table of route kinds."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...config.platform import CollectiveSpec, ProtocolSpec
from ...platform.route_parts import RouteParts, first_positions, key_members
from ...platform.topology import Topology
from ..channels import communicator
from ..plan import CollectivePlan, CollectiveRequest, register
from ..transfers import Transfer, TransferTable
from .common import P2P_CHANNELS, P2P_CHUNK, US, _base, _edges, _window


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
