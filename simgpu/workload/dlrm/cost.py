"""The sharding planner's cost model: a TorchRec-style estimate of a plan's embedding time.

This module owns :func:`plan_cost`, the cheap estimate the planner can rank its proposals with
without building or simulating anything, in the manner of TorchRec's ``EmbeddingPerfEstimator``:
each shard's time is the bytes its lookups move through HBM over the HBM bandwidth plus the bytes
its collectives move over the link bandwidth; a rank's time is the sum over its shards; a plan's
cost is the largest rank's (the ranks wait for each other in the all-to-alls). It sees no
overlap, no kernel efficiency, no index reuse, no collective algorithm and no contention: it is
the baseline a simulator should beat.

Per shard, over one iteration (``b`` samples per rank, ``w`` ranks, ``g`` ranks per node, ``d`` the
shard's columns, ``n`` the ids it looks up, 4-byte rows, ``c`` bytes per element on the wire):

- table-wise, column-wise and row-split shards look up the global batch: HBM bytes
  ``3 n d 4 + 2 w b d 4`` (forward: rows read, pooled output written; backward: output gradient
  read, each looked-up row read and written by the fused optimizer). Their collectives move the
  ids in (``n`` x 8 bytes plus a length per sample), the pooled output out and its gradient back
  (``w b d c`` each way), of which ``(g - 1) / w`` inside the node at NVLink bandwidth and
  ``(w - g) / w`` across nodes at the GPU's share of its node's NICs; a table-row-wise shard's
  output is first reduce-scattered inside the node (``(g - 1) / g`` of it at NVLink bandwidth),
  and only its ``1 / g`` share crosses nodes.
- data-parallel replicas look up the local batch (``3 n d 4 + 2 b d 4``) and pass over the whole
  table three times (zeroed dense gradient, its write, the dense optimizer), and their gradient is
  all-reduced: ``2 (w - 1) / w`` of the table's bytes at the slowest link of the ring (the NIC
  share across nodes, NVLink inside one).

Bandwidths are the platform's achievable ones (datasheet times its efficiency).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...config.platform import PlatformSpec
from ..registry import World
from .embedding import EMB_BYTES, Shard, Table
from .sharding import Plan

#: lookups' HBM passes per looked-up row: one read forward, a read and a write by the fused optimizer
_ROW_PASSES = 3
#: passes over a replicated table per iteration: zeroing its dense gradient, writing it, the optimizer
_REPLICA_PASSES = 3


@dataclass(frozen=True)
class Bandwidths:
    """Achievable bytes per second of one GPU: its HBM, its NVLink (per direction; a mesh's links
    of GPU 0 together; PCIe where there is no NVLink), and its share of its node's NICs (per
    direction)."""

    hbm: float
    intra: float
    inter: float

    @staticmethod
    def of(platform: PlatformSpec) -> Bandwidths:
        g, n, net = platform.gpu, platform.node, platform.network
        if n.nvlink is None:
            nvlink = n.pcie.gbytes_per_s * n.pcie.efficiency
        else:  # a mesh: every link of GPU 0 together
            ports = sum(c for a, b, c in n.nvlink.links if 0 in (a, b)) if n.nvlink.kind == "mesh" else 1
            nvlink = n.nvlink.gbytes_per_s * n.nvlink.efficiency * max(ports, 1)
        nic = net.nic_gbps / 8 * net.efficiency * net.nics_per_node / n.gpus
        return Bandwidths(g.hbm_gbytes_per_s * g.memory_efficiency * 1e9, nvlink * 1e9, nic * 1e9)


@dataclass(frozen=True)
class ShardCost:
    """The bytes one shard moves in an iteration: through its GPU's HBM, over NVLink, across nodes."""

    hbm: float
    intra: float
    inter: float

    def seconds(self, bw: Bandwidths) -> float:
        return self.hbm / bw.hbm + self.intra / bw.intra + (self.inter / bw.inter if self.inter else 0.0)


def shard_cost(shard: Shard, batch: int, world: World, wire_bytes: int = EMB_BYTES) -> ShardCost:
    """The bytes ``shard`` moves with ``batch`` samples per rank on ``world`` (see the module docstring)."""
    w, g = world.size, world.gpus_per_node
    d = shard.dim
    if shard.type == "data_parallel":
        ids = shard.table.ids(batch)
        hbm = _ROW_PASSES * ids * d * EMB_BYTES + 2 * batch * d * EMB_BYTES + _REPLICA_PASSES * shard.nbytes
        ring = 2 * (w - 1) / w * shard.nbytes
        return ShardCost(hbm, 0.0 if world.nodes > 1 else ring, ring if world.nodes > 1 else 0.0)
    ids = w * shard.ids_from_each_rank(batch)
    hbm = _ROW_PASSES * ids * d * EMB_BYTES + 2 * w * batch * d * EMB_BYTES
    id_bytes = w * shard.input_bytes_from_each_rank(batch)
    out = w * batch * d * wire_bytes  # the pooled output over the global batch; its gradient alike
    ins = (g - 1) / w * id_bytes, (w - g) / w * id_bytes
    if shard.type == "table_row_wise":
        per_node = out / g  # after the reduce-scatter inside the node
        return ShardCost(hbm, ins[0] + 2 * (g - 1) / g * out,
                         ins[1] + 2 * (world.nodes - 1) / world.nodes * per_node)
    return ShardCost(hbm, ins[0] + 2 * (g - 1) / w * out, ins[1] + 2 * (w - g) / w * out)


def rank_seconds(shards: Sequence[Shard], batch: int, world: World, bw: Bandwidths,
                 wire_bytes: int = EMB_BYTES) -> list[float]:
    """Estimated embedding seconds of each rank: the sum of its shards' :func:`shard_cost` times."""
    out = [0.0] * world.size
    for s in shards:
        out[s.rank] += shard_cost(s, batch, world, wire_bytes).seconds(bw)
    return out


def plan_cost(plan: Plan, tables: Sequence[Table], batch: int, world: World, bw: Bandwidths,
              wire_bytes: int = EMB_BYTES) -> float:
    """The planner's cost of ``plan``: the largest rank's :func:`rank_seconds` (seconds)."""
    return max(rank_seconds(plan.shards(tables), batch, world, bw, wire_bytes))

