"""The algorithms' shared parts: NCCL's constants, channels per group, a channel's start, the
steps' latency, a set of edges' links, the protocol's buffer window and fill, an NVLS transfer
(NVLS's and the tree's within a node)."""

from __future__ import annotations

from ...config.platform import CollectiveSpec, ProtocolSpec
from ...platform.topology import Topology
from ..channels import Channels, communicator
from ..transfers import Transfer

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
    lost = _nics_lost(per_node, topo)
    key = ("nccl_channels", len(group), len(per_node)) + ((lost,) if lost else ())
    cached = topo.memo.get(key)
    if cached is None:
        cached = topo.memo[key] = communicator(topo.platform, len(group), len(per_node), nics_down=lost)
    return cached  # type: ignore[return-value]


def rails_down(per_node: list[list[int]], topo: Topology) -> frozenset[int]:
    """The NICs (by index within a node) down on any node of a group spanning nodes: NCCL's
    channels of the group keep off them on every node, so that each channel stays on one rail."""
    if not topo.faults.ports_down or len(per_node) < 2:
        return frozenset()
    return frozenset(k for members in per_node for k in topo.faults.ports_down.get(topo.node_of(members[0]), ()))


def _nics_lost(per_node: list[list[int]], topo: Topology) -> int:
    """The NICs near the group's members that :func:`rails_down` takes: NCCL's search on the nodes
    that lost them finds as many fewer channels, and the communicator keeps the fewest."""
    down = rails_down(per_node, topo)
    if not down:
        return 0
    return max(len(down & {topo.home_nic(g) for g in members}) for members in per_node)


def channels(group: tuple[int, ...], topo: Topology, spec: CollectiveSpec) -> int:
    """Distinct rings (and trees) across nodes: NCCL's search channels before duplication, each
    entering every node on its own GPU (``collectives.channels`` where given)."""
    per_node = _by_node(group, topo)
    if len(per_node) == 1:
        return 1
    want = spec.channels or nccl_channels(group, topo).rings
    return max(1, min(want, min(len(m) for m in per_node)))


def _channel_start(members: list[int], c: int, topo: Topology, skip: frozenset[int] = frozenset()) -> int:
    """Where channel ``c`` enters a node: the channels take the NICs of the node's members in turn
    (in NIC order), so that they spread over all of them; a NIC shared by several members gives the
    next of them each time round. On a full node of one NIC per GPU, channel c enters at GPU c.
    The NICs in ``skip`` (:func:`rails_down`) are passed over while others remain."""
    by_nic: dict[int, list[int]] = {}
    for k, g in enumerate(members):
        by_nic.setdefault(topo.nic_of(g), []).append(k)
    nics = sorted(by_nic.keys() - skip) or sorted(by_nic)
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


def _slowest_edge(edges: list[tuple[int, int]], topo: Topology) -> float:
    """Bytes/s of the slowest edge alone on its route."""
    return min(topo.edge(a, b).capacity for a, b in edges)


def _fill(per_step_bytes: float, proto: ProtocolSpec, capacity: float, network: bool) -> float:
    """Seconds one chunk takes to cross a hop: a pipeline of D steps pays it D times before the
    bandwidth-bound part starts. Over the network the proxy forwards whole chunks; over NVLink and
    PCIe GPUs write into their peer's buffer a slice at a time, so the pipeline fills by slices."""
    chunk = min(proto.chunk_kib * 1024 / (1 if network else SLICES_PER_CHUNK), per_step_bytes)
    return chunk / proto.bandwidth / capacity


def _nvls_transfer(members: list[int], nbytes: float, topo: Topology, proto: ProtocolSpec) -> Transfer:
    """Every member's switch port, both ways, moving (n+1)/n of the message at the switch's
    reduction efficiency."""
    nv = topo.platform.node.nvlink
    assert nv is not None
    n = len(members)
    links, _ = _edges([(g, members[(i + 1) % n]) for i, g in enumerate(members)], topo, proto)
    scale = nv.efficiency / nv.nvls_efficiency
    return Transfer(links, (n + 1) / n * nbytes * scale / proto.bandwidth)
