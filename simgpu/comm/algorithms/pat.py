"""PAT: NCCL's all-gather and reduce-scatter of one rank per node."""

from __future__ import annotations

from ...config.platform import CollectiveSpec, ProtocolSpec
from ...platform.topology import Topology
from ..plan import CollectivePlan, CollectiveRequest, register
from ..transfers import Transfer
from ..tuning import PAT_PER_RANK_US, pat_enabled
from .common import US, _base, _by_node, _edges, _window


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
