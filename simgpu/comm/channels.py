"""How many channels NCCL gives a communicator, as its topology search and setup compute them.

NCCL does not estimate its channels: ``ncclTopoCompute`` (``src/graph/search.cc``) searches
graphs of channels, each at one bandwidth taken from a fixed list per GPU generation, and
``ncclTopoPostset`` (``src/graph/connect.cc``) turns the search channels into the communicator's
channels. The facts below are read from NVIDIA's NCCL source, releases 2.19-2.29 (the
``ncclTopoDupChannels`` rule with its Hopper exception, and the extra doubling on Hopper across
nodes, both of the 2.19 and later sources); what this module computes is that search's outcome
on the shapes a platform file describes (NVSwitch, NVLink mesh or PCIe inside a node, NICs by GPU),
not the search's walk over a PCI tree:

- A search channel at bandwidth ``s`` takes ``s`` on every link it crosses: the NIC and its PCIe
  path where it enters and leaves a node, each GPU's NVLink (or PCIe) port to the next GPU. The
  channels that fit are the fewest the NICs, the GPUs' PCIe links and NVLink ports allow, at most
  ``maxChannels`` (``MAXCHANNELS / 2`` = 16 for rings and trees: ``src/init.cc``).
- The search starts at the highest speed of the list not above ``maxBw`` (the best path of a GPU
  to a NIC across nodes, to another GPU inside one), stops at once where the channels times the
  speed reach ``totalBw`` (the GPU's NVLink sum, or its PCIe link), and otherwise lowers the speed
  while the next one is above 0.49 of the best solution's, keeping the largest channels x speed.
  For rings a second pass raises the speed again while as many channels still fit.
- ``ncclTopoDupChannels``: a graph at 25 GB/s or more per channel is duplicated (twice the
  channels, half the speed each), except, from NCCL 2.19, on Hopper and later below 50 GB/s with
  more than four channels.
- ``ncclTopoPostset``: the communicator takes the fewer of the ring's and the tree's channels and
  doubles them (at most ``MAXCHANNELS``, 32); on Hopper and later across nodes it doubles them again
  where the ring's speed is above 45 GB/s and fewer than 16; then ``NCCL_MAX_NCHANNELS`` caps it and
  ``NCCL_MIN_NCHANNELS`` raises it (the platform's ``collectives.max_channels`` / ``min_channels``).
- NVLS runs on ``NCCL_NVLS_NCHANNELS`` channels (16, ``src/transport/nvls.cc``); CollNet Chain
  adds half the channels where the node's bandwidth exceeds the network's and a node has more than
  one rank (``connect.cc``); CollNet Direct has one head per local GPU, at most
  ``NCCL_MAX_DIRECT_ARITY + 1`` = 8.
- Point-to-point (``src/graph/paths.cc``, ``ncclTopoGetNchannels`` and
  ``ncclTopoComputeP2pChannels``): the p2p channels are the communicator's rounded up to a power
  of two; a network peer gets ``NCCL_NCHANNELS_PER_NET_PEER`` channels, by default up to 2.28 two,
  halved while the peers' channels would exceed four times the p2p channels (at least one per NIC
  the GPU has), and from 2.29 one per NIC the GPU has or as many as its NICs' bandwidth needs at
  ``NCCL_P2P_PER_CHANNEL_NET_BW`` (14 GB/s) each, halved while the peers in rounds of
  ``NCCL_MAX_DEV_WORK_P2P_PER_BATCH`` (8) would need more than the p2p channels.

Bandwidths are NCCL's own figures for the hardware, not the platform's achievable ones: an NVLink
is 20 GB/s on Volta and Ampere, 20.6 on Hopper, 40.1 on Blackwell (``SM*_NVLINK_BW``,
``src/graph/topo.h``), a PCIe link lanes x rate / 80 (``ncclTopoAddPci``, ``src/graph/topo.cc``:
12 GB/s for Gen3 x16, 24 for Gen4, 48 for Gen5), a NIC its line rate in GB/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config.platform import PlatformSpec

#: search bandwidths per channel, GB/s, highest first (src/graph/search.cc): (inside one node, across nodes)
SPEEDS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "sm80": ((40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
             (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2,
              0.24, 0.12)),
    "sm90": ((60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
             (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12)),
    "sm100": ((90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
              (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4,
               1.2, 0.24, 0.12)),
}
#: NCCL's bandwidth of one NVLink by compute capability, GB/s (src/graph/topo.h)
NVLINK_BW = {60: 18.0, 70: 20.0, 75: 20.0, 80: 20.0, 86: 12.0, 90: 20.6, 100: 40.1}
#: one NVLink's datasheet rate per direction, GB/s, to count a port's links (NVLink 2-4: 25; NVLink 5: 50)
NVLINK_DATASHEET_GBPS = {100: 50.0}
MAXCHANNELS = 32           # src/include/device.h
SEARCH_MAX_CHANNELS = MAXCHANNELS // 2   # ring and tree graphs (src/init.cc)
NVLS_CHANNELS = 16         # NCCL_NVLS_NCHANNELS default (src/transport/nvls.cc)
MAX_DIRECT_ARITY = 7       # NCCL_MAX_DIRECT_ARITY: CollNet Direct heads - 1
P2P_PER_CHANNEL_NET_BW = 14.0  # NCCL_P2P_PER_CHANNEL_NET_BW default, GB/s (2.29 paths.cc)
P2P_PER_BATCH = 8          # NCCL_MAX_DEV_WORK_P2P_PER_BATCH
#: GPU names (as platform files give them) to compute capability, by prefix
_ARCH = (("B200", 100), ("GB200", 100), ("B100", 100), ("H100", 90), ("H200", 90), ("H800", 90), ("GH200", 90),
         ("A100", 80), ("A800", 80), ("A40", 86), ("A10", 86), ("RTX3090", 86), ("V100", 70), ("RTX2080", 75),
         ("T4", 75), ("P100", 60))


def compute_capability(platform: PlatformSpec) -> int:
    """The platform GPU's compute capability x 10 (90 for Hopper), from its name; 80 where unknown."""
    name = platform.gpu.name.upper().replace(" ", "")
    for prefix, cc in _ARCH:
        if name.startswith(prefix):
            return cc
    return 80


def _speeds(cc: int, inter: bool) -> tuple[float, ...]:
    arch = "sm100" if cc >= 100 else "sm90" if cc >= 90 else "sm80"
    return SPEEDS[arch][1 if inter else 0]


def _version(v: str) -> tuple[int, int]:
    major, minor = v.split(".")[:2]
    return int(major), int(minor)


@dataclass(frozen=True)
class Graph:
    """One searched graph: its channels and each channel's bandwidth inside and across nodes, GB/s."""

    channels: int
    bw_intra: float
    bw_inter: float


@dataclass(frozen=True)
class Hardware:
    """What NCCL's topology sees of one node's share of a communicator (bandwidths in GB/s)."""

    cc: int
    gpus: int            # the communicator's GPUs on a node
    nvlink: float        # one GPU's NVLink bandwidth in all (0: none)
    nvlink_pair: float   # the most between two GPUs over NVLink
    pcie: float          # one GPU's PCIe link
    nics: int            # NICs near the communicator's GPUs of a node
    nic_bw: float        # one NIC


def hardware(platform: PlatformSpec, gpus: int, nics_down: int = 0) -> Hardware:
    """NCCL's view of ``gpus`` GPUs of one node of ``platform`` (``nics_down`` of their NICs gone)."""
    cc = compute_capability(platform)
    nv, node, net = platform.node.nvlink, platform.node, platform.network
    per_link = NVLINK_BW.get(cc, 20.0)
    datasheet = NVLINK_DATASHEET_GBPS.get(cc, 25.0)
    total = pair = 0.0
    if nv is not None and nv.kind == "nvswitch":
        total = pair = max(1, round(nv.gbytes_per_s / datasheet)) * per_link
    elif nv is not None:
        counts: dict[int, int] = {}
        for a, b, k in nv.links:
            counts[a] = counts.get(a, 0) + k
            counts[b] = counts.get(b, 0) + k
            pair = max(pair, k * max(1, round(nv.gbytes_per_s / datasheet)) * per_link)
        total = max(counts.values()) * max(1, round(nv.gbytes_per_s / datasheet)) * per_link if counts else 0.0
    # a PCIe link as NCCL reads it: lanes x rate / 80, i.e. 0.75 of the per-direction line rate
    pcie = node.pcie.gbytes_per_s * 0.75
    nics = max(1, min(net.nics_per_node, math.ceil(gpus * net.nics_per_node / node.gpus)) - nics_down)
    return Hardware(cc, gpus, total, pair, pcie, nics, net.nic_gbps / 8)


def _fit(hw: Hardware, speed: float, inter: bool) -> int:
    """Search channels at ``speed`` that the node's links carry."""
    if inter:
        nic_path = min(hw.pcie, hw.nic_bw)
        per_nic = int(nic_path // speed)
        # the NICs behind one GPU share its PCIe link
        nics_per_gpu = max(1, hw.nics // max(1, hw.gpus))
        gpus_with_nics = min(hw.gpus, hw.nics)
        by_pcie = gpus_with_nics * int(hw.pcie // speed) if nics_per_gpu > 1 else hw.nics * per_nic
        n = min(hw.nics * per_nic, by_pcie)
        if hw.gpus > 1:
            # every GPU but the one that leaves to the NIC sends to the next over its port
            port = hw.nvlink if hw.nvlink > 0 else hw.pcie
            n = min(n, int(hw.gpus * port // ((hw.gpus - 1) * speed)))
        return min(n, SEARCH_MAX_CHANNELS)
    if hw.gpus < 2:
        return SEARCH_MAX_CHANNELS
    port = hw.nvlink if hw.nvlink > 0 else hw.pcie
    return min(int(port // speed), SEARCH_MAX_CHANNELS)


def search(hw: Hardware, nodes: int, pattern: str = "ring", duplicate: bool = True) -> Graph:
    """The graph ``ncclTopoCompute`` finds for ``pattern`` (ring or tree) and (unless told not to)
    duplicates."""
    inter = nodes > 1
    speeds = _speeds(hw.cc, inter)
    if not inter and hw.gpus < 2:
        return Graph(1, speeds[0], speeds[0])
    # the best path: a GPU's to a NIC across nodes, to another GPU inside one
    max_bw = min(hw.pcie, hw.nic_bw) if inter else (hw.nvlink_pair or hw.pcie)
    total_bw = max(hw.nvlink, hw.pcie)
    if pattern != "ring" and hw.gpus > 1:
        total_bw *= hw.gpus / (hw.gpus - 1)  # trees need not come back to the NIC they left from
    i = 0
    while i < len(speeds) - 1 and (speeds[i] > max_bw or speeds[i] > total_bw):
        i += 1
    best = Graph(0, 0.0, 0.0)
    while True:
        n = _fit(hw, speeds[i], inter)
        if n > 0 and n * speeds[i] > best.channels * best.bw_intra:
            best = Graph(n, speeds[i], speeds[i])
        if best.channels and (best.channels >= SEARCH_MAX_CHANNELS or best.channels * best.bw_inter >= total_bw):
            break
        if i < len(speeds) - 1 and (best.channels == 0 or speeds[i + 1] / best.bw_inter > 0.49):
            i += 1
            continue
        break
    if best.channels == 0:
        return Graph(1, 0.1, 0.1)  # NCCL's fallback: one channel in a simple order
    if duplicate:
        best = _dup(best, hw.cc)
    if pattern == "ring":
        # second pass: raise the speed while as many channels still fit
        j = speeds.index(best.bw_inter) if best.bw_inter in speeds else len(speeds) - 1
        while j > 0 and speeds[j - 1] <= max_bw and _fit(hw, speeds[j - 1], inter) >= best.channels:
            j -= 1
            best = Graph(best.channels, speeds[j], speeds[j])
    return best


def _dup(g: Graph, cc: int) -> Graph:
    """``ncclTopoDupChannels``: twice the channels at half the speed, at 25 GB/s a channel or more,
    except on Hopper and later below 50 GB/s with more than four channels."""
    if g.bw_intra < 25.0 or (cc > 80 and g.bw_intra < 50.0 and g.channels > 4):
        return g
    dup = min(2 * g.channels, SEARCH_MAX_CHANNELS)
    div = math.ceil(dup / g.channels)
    return Graph(dup, g.bw_intra / div, g.bw_inter / div)


@dataclass(frozen=True)
class Channels:
    """A communicator's channels: ``search`` the ring graph, ``collective`` what its rings and trees
    run on, ``nvls`` and ``collnet`` those of NVLS and CollNet, ``p2p`` the point-to-point channels
    and ``net_peer`` a network peer's share of them."""

    search: Graph
    rings: int           # distinct search channels (before duplication): each enters a node on its own NIC
    collective: int
    nvls: int
    collnet_chain: int
    collnet_direct: int
    p2p: int
    net_peer: int


def _pow2_up(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def communicator(platform: PlatformSpec, ranks: int, nodes: int, nics_down: int = 0) -> Channels:
    """The channels NCCL sets up for a communicator of ``ranks`` GPUs spread evenly over ``nodes``
    (``nics_down``: the NICs a node has lost, of those near its GPUs; the fewest channels hold)."""
    spec = platform.collectives
    ppn = max(1, ranks // max(1, nodes))
    hw = hardware(platform, ppn, nics_down)
    ring, tree = search(hw, nodes, "ring"), search(hw, nodes, "tree")
    rings = search(hw, nodes, "ring", duplicate=False).channels
    n = min(ring.channels, tree.channels)
    n = min(MAXCHANNELS, 2 * n)
    if hw.cc >= 90 and nodes > 1 and ring.bw_intra > 45.0 and n < 16:
        n *= 2
    n = min(n, spec.max_channels or MAXCHANNELS)
    n = max(n, spec.min_channels or 0)
    chain = min(MAXCHANNELS, n + n // 2) if nodes > 1 and ranks > nodes and ring.bw_intra > ring.bw_inter else n
    direct = min(MAX_DIRECT_ARITY + 1, ppn)
    nv = platform.node.nvlink
    nvls = NVLS_CHANNELS if (nv is not None and nv.nvls and hw.cc >= 90 and ppn > 2) else 0
    p2p = _pow2_up(n)
    return Channels(ring, rings, n, nvls, chain, direct, p2p, net_peer_channels(platform, ranks, nodes, p2p))


def net_peer_channels(platform: PlatformSpec, ranks: int, nodes: int, p2p: int) -> int:
    """Channels NCCL gives one peer across the network (``NCCL_NCHANNELS_PER_NET_PEER`` where the
    platform sets ``collectives.net_peer_channels``), by the rule of the platform's NCCL release."""
    spec, net = platform.collectives, platform.network
    if spec.net_peer_channels is not None:
        return spec.net_peer_channels
    if nodes < 2:
        return 0
    nics = net.nics_per_gpu
    hw = hardware(platform, max(1, ranks // nodes))
    # the communicator's fewest per peer: a peer in the node over NVLink has two per link's worth
    local = (2 * max(1, int(hw.nvlink_pair // NVLINK_BW.get(hw.cc, 20.0))) if hw.nvlink_pair > 0 else 2) \
        if hw.gpus > 1 else MAXCHANNELS
    if _version(spec.nccl_version) >= (2, 29):
        per_peer = max(nics, math.ceil(nics * net.nic_gbps / 8 / P2P_PER_CHANNEL_NET_BW))
        per_peer = _pow2_up(min(per_peer, local, p2p))
        while per_peer * math.ceil(ranks / P2P_PER_BATCH) > p2p and per_peer > 1:
            per_peer //= 2
        return per_peer
    per_peer = 2
    while per_peer * ranks > 4 * p2p and per_peer > 1:
        per_peer //= 2
    # the fewest over the peers starts from the p2p channels themselves
    return _pow2_up(min(max(nics, per_peer), local, p2p))


#: threads per channel by protocol (NCCL_LL_MAX_NTHREADS, NCCL_LL128_MAX_NTHREADS, NCCL_SIMPLE_MAX_NTHREADS)
MAX_THREADS = {"ll": 512, "ll128": 640, "simple": 512}
#: bytes a thread must have before NCCL adds channels (NCCL_*_THREAD_THRESHOLD; the ring's LL one x ranks)
THREAD_THRESHOLD = {"ll": 8, "ll128": 8, "simple": 64}


def for_size(comm: Channels, algorithm: str, protocol: str, nbytes: float, ranks: int, nodes: int) -> int:
    """The channels one collective of ``nbytes`` runs on (``topoGetAlgoInfo``, src/enqueue.cc): from
    the communicator's, one fewer while each thread would have less than its threshold of bytes;
    NVLS always on its own (no more than the communicator's across nodes); CollNet Direct stepping
    down through 16, 8, ... with its heads sharing the work."""
    nt = MAX_THREADS[protocol]
    threshold = float(THREAD_THRESHOLD[protocol] * (ranks if algorithm == "ring" and protocol == "ll" else 1))
    if algorithm.startswith("nvls"):
        return min(comm.nvls, comm.collective) if algorithm == "nvls" and nodes > 1 else comm.nvls
    if algorithm == "collnet_direct":
        nc, switch, short = comm.collective, 16, True
        while switch >= 1 and short:
            while (short := nbytes < nc * nt * comm.collnet_direct * threshold) and nc > switch:
                if nc == switch + switch // 2:
                    threshold /= 2
                nc -= 1
            switch //= 2
        return nc
    nc = comm.collnet_chain if algorithm == "collnet_chain" else comm.collective
    while nbytes < nc * nt * threshold and nc >= 2:
        nc -= 1
    return nc
