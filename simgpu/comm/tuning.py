"""NCCL's own tuning model: which algorithm and protocol NCCL picks for a collective, by node count.

NCCL does not time its candidates on the machine; it predicts each (algorithm, protocol) pair with
a latency and a bus bandwidth from tables and the channels its topology search found, and takes the
fastest (``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` in NCCL's ``src/graph/tuning.cc``). The
figures below are those tables, written out per rule set; the rule set follows the platform's
``collectives.nccl_version``:

- ``"2.8"``: tree and ring only (its CollNet rules not modelled), from the NCCL 2.8-2.11 source;
- ``"2.20"``: adds NVLS inside a node and NVLS-tree across nodes, a per-GPU-generation cap on a
  tree channel's bandwidth, and the network post overhead; from the NCCL 2.17-2.22 source;
- CollNet (the ``2.20`` and ``2.23`` rule sets, where the platform has ``network.in_network_reduction``):
  all-reduce across nodes as CollNet Direct (NVSwitch nodes) or Chain, on the intra-node bandwidth,
  Direct derated by GPUs per NIC, half as algorithm bandwidth, latencies of the newer source's
  tables (Direct 3.7 / 31 us, Chain 2.8 / 30 us on NVLink / the network; the 0.85 on Hopper and
  later not applied);
- ``"2.23"``: adds PAT (Parallel Aggregated Trees) for all-gather and reduce-scatter, which NCCL
  enables only with one GPU per node and the Simple protocol (``ncclPatEnable``: nNodes == nRanks):
  a quarter off the ring's bus bandwidth and no conversion to algorithm bandwidth, a latency of
  8 us + log2(nodes) x the network's tree latency / 3.5 + 2.8 us per rank; the other tables as
  2.20 (the newest modelled, the default).

The graph figures are those NCCL's search finds (:mod:`simgpu.comm.channels`: its channels and each
one's bandwidth inside and across nodes, from the search's speed list for the GPU generation); a
choice's ``channels`` are the communicator's for that algorithm (rings and trees, NVLS, CollNet
Chain or Direct) after NCCL's duplication. Only the choice is taken from this model; the time of the chosen
algorithm is the simulation's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..config.platform import PlatformSpec
from ..platform.topology import Topology
from .channels import communicator, for_size, hardware

PROTOCOLS = ("ll", "ll128", "simple")
#: the rule sets modelled, oldest first; a version maps to the newest rule set at or below it
RULE_SETS = ("2.8", "2.20", "2.23")


@dataclass(frozen=True)
class Rules:
    """One revision's tables: latencies in us, bandwidths in GB/s, per protocol (LL, LL128, Simple)."""

    base_lat: dict[str, tuple[float, float, float]]
    hw_lat: dict[str, dict[str, tuple[float, float, float]]]  # hardware -> algorithm -> protocol
    tree_max_bw: tuple[float, float, float] | None  # Hopper per-channel tree cap by node count (1, 2, >2)
    ll_max_bw: tuple[float, float, float]            # LL cap by node count (Intel hosts)
    net_overhead_us: float                           # per ring step across nodes (x3 with Simple)
    nvls: bool
    ring_plateau: float                              # Simple ring all-reduce latency factor across nodes
    pat: bool = False                                # PAT for all-gather / reduce-scatter at one GPU per node
    #: CollNet's Simple latency (direct, chain) by hardware; None: CollNet not weighed
    collnet_lat: dict[str, tuple[float, float]] | None = None


_RULES = {
    "2.8": Rules(
        base_lat={"tree": (4.4, 4.4, 0.0), "ring": (3.6, 10.0, 8.4)},
        hw_lat={"nvlink": {"tree": (.52, 1.2, 28), "ring": (.47, 1.9, 3.4)},
                "pcie": {"tree": (1.0, 1.9, 28), "ring": (1.0, 2.5, 5.7)},
                "net": {"tree": (5.0, 8.5, 50), "ring": (2.7, 4.0, 9.6)}},
        tree_max_bw=None, ll_max_bw=(39.0, 39.0, 20.4), net_overhead_us=1.0, nvls=False, ring_plateau=1.9),
    "2.20": Rules(
        base_lat={"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4), "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0)},
        hw_lat={"nvlink": {"tree": (.6, 1.25, 28), "ring": (.6, 1.9, 3.4), "nvls": (0, 0, 23),
                           "nvls_tree": (0, 0, 23)},
                "pcie": {"tree": (1.0, 1.9, 28), "ring": (1.0, 2.5, 5.7), "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0)},
                "net": {"tree": (5.0, 8.5, 28), "ring": (2.7, 4.0, 14.0), "nvls": (0, 0, 18),
                        "nvls_tree": (0, 0, 14)}},
        collnet_lat={"nvlink": (3.7, 2.8), "pcie": (3.7, 2.8), "net": (31.0, 30.0)},
        tree_max_bw=(38.7, 41.4, 36.0), ll_max_bw=(39.0, 39.0, 20.4), net_overhead_us=1.0, nvls=True,
        ring_plateau=1.4),
}
_RULES["2.23"] = replace(_RULES["2.20"], pat=True)
#: PAT's model (src/graph/tuning.cc from 2.23): its bus bandwidth's share of the ring's, its fixed
#: latency and its latency per rank ("still a linear part"), us
PAT_BW_FACTOR, PAT_BASE_US, PAT_PER_RANK_US = 0.75, 8.0, 2.8


def pat_enabled(version: str, ranks: int, nodes: int) -> bool:
    """Whether NCCL ``version`` weighs PAT for a communicator of ``ranks`` over ``nodes`` nodes:
    from 2.23, with one GPU per node (``ncclPatEnable``)."""
    return _RULES[rule_set(version)].pat and ranks == nodes and nodes > 1
#: NCCL's correction of tree bandwidth at medium sizes, by power of two from 64 B (treeCorrectionFactor)
_TREE_CORRECTION = {
    "ll": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    "ll128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    "simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}


def rule_set(version: str) -> str:
    """The newest rule set at or below NCCL ``version`` (``"2.21.5"`` -> ``"2.20"``)."""
    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split(".")[:2])
    chosen = RULE_SETS[0]
    for r in RULE_SETS:
        if key(r) <= key(version):
            chosen = r
    return chosen


@dataclass(frozen=True)
class Choice:
    """One (algorithm, protocol) pair as NCCL's model sees it: ``time_us`` = latency + bytes / bw."""

    algorithm: str
    protocol: str
    latency_us: float
    bandwidth_gbps: float
    time_us: float
    channels: int


def estimates(platform: PlatformSpec, topo: Topology, op: str, nbytes: int, ranks: int, nodes: int,
              protocols: list[str]) -> list[Choice]:
    """NCCL's predicted time of every (algorithm, protocol) it weighs for ``op`` of ``nbytes`` on a
    communicator of ``ranks`` over ``nodes`` nodes (all-reduce, all-gather, reduce-scatter,
    broadcast, reduce; an empty list for the rest)."""
    rules = _RULES[rule_set(platform.collectives.nccl_version)]
    if op not in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce") or ranks < 2:
        return []
    ppn = ranks / nodes
    net, nv = platform.network, platform.node.nvlink
    # the graph NCCL's search found: its channels and each one's bandwidth (simgpu/comm/channels.py)
    comm = communicator(platform, ranks, nodes)
    nch, bw_intra, bw_inter = comm.search.channels, comm.search.bw_intra, comm.search.bw_inter
    intra_hw = "nvlink" if nv is not None else "pcie"
    idx = 0 if nodes == 1 else 1 if nodes == 2 else 2
    nsteps = 2 * (ranks - 1) if op == "all_reduce" else ranks - 1 if op in ("all_gather", "reduce_scatter") else ranks
    inter_steps = ((2 * nodes if nodes > 1 else 0) if op == "all_reduce"
                   else nodes - 1 if op in ("all_gather", "reduce_scatter") else nodes)
    algos = ["ring"]
    if op in ("all_gather", "reduce_scatter") and pat_enabled(platform.collectives.nccl_version, ranks, nodes):
        algos.append("pat")
    if op == "all_reduce":
        algos.append("tree")
        if rules.collnet_lat is not None and net.in_network_reduction and nodes > 1:
            # CollNet Direct needs NVSwitch (every GPU reaches the node's NICs); the chain runs anywhere
            algos += (["collnet_direct"] if nv is not None and nv.kind == "nvswitch" else []) + ["collnet_chain"]
        if rules.nvls and nv is not None and nv.nvls and ppn > 1:
            algos.append("nvls" if nodes == 1 else "nvls_tree")
    out = []
    for a in algos:
        for p in protocols:
            k = PROTOCOLS.index(p)
            if (a.startswith("nvls") or a == "pat") and p != "simple":
                continue
            if a.startswith("collnet"):
                if p != "simple":
                    continue
                assert rules.collnet_lat is not None
                bus = nch * bw_intra  # CollNet takes the graph's intra-node bandwidth
                j = 0 if a == "collnet_direct" else 1
                intra = rules.collnet_lat[intra_hw][j]
                inter = rules.collnet_lat["net"][j] + 2 * net.latency_us
                local = ppn - 1
                if a == "collnet_direct":
                    # GPUs per NIC: Direct wants a NIC per GPU for full speed
                    factor = ppn / hardware(platform, int(ppn)).nics
                    bus /= factor - (factor - 1) / 2
                    lat = 2 * (min(1.0, local) * intra + local * 0.4) + inter  # 0.4 us arity serialisation
                else:
                    lat = 2 * local * intra + inter
                bw_alg = bus * 0.5
                used = for_size(comm, a, p, nbytes, ranks, nodes)
                out.append(Choice(a, p, lat, bw_alg, lat + nbytes / (1000 * bw_alg), used))
                continue
            if a == "pat":
                bus = nch * (bw_intra if nodes <= 2 else bw_inter) * PAT_BW_FACTOR
                # with one GPU per node the latencies are fully exposed: the network's tree latency
                inter = rules.hw_lat["net"]["tree"][k] + 2 * net.latency_us
                lat = PAT_BASE_US + int(math.log2(nodes)) * inter / 3.5 + ranks * PAT_PER_RANK_US
                used = for_size(comm, a, p, nbytes, ranks, nodes)
                out.append(Choice(a, p, lat, bus, lat + nbytes / (1000 * bus), used))
                continue
            bw = bw_intra if nodes <= 2 else bw_inter
            if a == "nvls_tree":
                bw = min(bw_intra, bw_inter if nodes <= 2 else bw_inter / 2)
            if a == "nvls":
                bw = bw_intra
            bus = nch * bw
            if a == "ring" and p == "ll":
                bus = min(rules.ll_max_bw[idx], bus * (0.25 if nodes > 1 or op in ("all_reduce", "reduce") else 1 / 3))
            if a == "ring" and p == "ll128":
                bus *= 0.7 if ppn < 2 else 0.92
            if a == "tree":
                bus = min(bus * 0.92, nch * rules.tree_max_bw[idx]) if rules.tree_max_bw else bus * 0.9
                if p == "ll":
                    bus = min(bus / 3.8, rules.ll_max_bw[idx])
                if p == "ll128":
                    bus *= 7 / 9 if nodes == 1 else 120 / 128
            ratio = ranks / nsteps if a == "ring" else 5 / 6 if a.startswith("nvls") else 0.5
            bw_alg = bus * ratio
            intra = rules.hw_lat[intra_hw][a][k]
            inter = rules.hw_lat["net"][a][k] + (2 if p == "simple" else 1) * net.latency_us
            lat = rules.base_lat[a][k]
            if a == "ring":
                if op in ("broadcast", "reduce"):
                    lat += nsteps * rules.hw_lat["net" if nodes > 1 else intra_hw]["tree" if p == "simple" else a][k]
                else:
                    over = rules.net_overhead_us * (3 if p == "simple" else 1) if nodes > 1 else 0.0
                    lat += (nsteps - inter_steps) * max(intra, over) + inter_steps * inter
                    if p == "simple" and nodes > 1 and op == "all_reduce" and nbytes / (nch * ranks) >= 64:
                        lat *= rules.ring_plateau
            elif a == "tree":
                lat += 2 * ((ppn - 1) * intra + int(math.log2(nodes)) * inter)
            elif a == "nvls":
                lat = intra
            else:
                lat += intra + 2 * int(math.log2(nodes)) * inter
            if a == "tree":
                i = int(nbytes // 64).bit_length() - 1
                bw_alg *= _TREE_CORRECTION[p][i] if 0 <= i < len(_TREE_CORRECTION[p]) else 1.0
            used = for_size(comm, a, p, nbytes, ranks, nodes)
            out.append(Choice(a, p, lat, bw_alg, lat + nbytes / (1000 * bw_alg), used))
    return out


def choose(platform: PlatformSpec, topo: Topology, op: str, nbytes: int, ranks: int, nodes: int,
           protocols: list[str]) -> Choice | None:
    """The pair NCCL's model picks (the fastest estimate), or None where it weighs none."""
    est = estimates(platform, topo, op, nbytes, ranks, nodes, protocols)
    return min(est, key=lambda c: c.time_us) if est else None
