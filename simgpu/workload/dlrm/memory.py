"""Memory per GPU of a DLRM under a sharding plan.

Every rank holds the same dense part (the MLPs and cross layers with their gradients and optimizer
states, the dense activations, the pooled embeddings it receives, its send buffers and DDP's
buckets); on top, each shard it holds adds its :func:`~simgpu.workload.dlrm.embedding.footprint`. The
planner places shards with the same accounting, so a plan it proposes fits by this estimate.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...config.workload import WorkloadSpec
from ...graph import MemoryEstimate
from ..common import GRAD_BYTES, dense_memory, optimizer_states
from .arch import Arch, activation_bytes
from .embedding import EMB_BYTES, Shard, footprint


def dense_states(spec: WorkloadSpec) -> int:
    """fp32 states per parameter of the dense optimizer (which also steps data-parallel tables)."""
    return optimizer_states(spec.train.optimizer)


def shard_footprint(spec: WorkloadSpec, shard: Shard, world: int) -> MemoryEstimate:
    return footprint(shard, spec.train.batch_per_gpu, world, spec.train.embedding_optimizer,
                     dense_states(spec))


def base_memory(spec: WorkloadSpec, arch: Arch, shards: Sequence[Shard]) -> MemoryEstimate:
    """What every rank holds whatever its shards: dense parameters, gradients and optimizer states;
    dense activations and the received pooled embeddings; the ids it sends to every shard, the
    pooled-embedding gradients it sends back, and DDP's flat buckets of the dense gradients."""
    t = spec.train
    b = t.batch_per_gpu
    params, grads, states = dense_memory(arch.dense_numel, t.precision, t.optimizer)
    sharded = [s for s in shards if s.type != "data_parallel"]
    pooled = b * sum({s.table.index: s.table.dim for s in sharded}.values()) * EMB_BYTES
    ids = sum(s.input_bytes_from_each_rank(b) for s in sharded)
    buffers = ids + pooled + arch.dense_numel * GRAD_BYTES
    return MemoryEstimate(parameters=params, gradients=grads, optimizer_states=states,
                          activations=activation_bytes(arch, b, t.precision) + pooled, buffers=float(buffers))


def memory_per_rank(spec: WorkloadSpec, arch: Arch, shards: Sequence[Shard], world: int) -> list[MemoryEstimate]:
    """Bytes on each of ``world`` ranks: :func:`base_memory` plus the footprints of its shards."""
    per_rank = [base_memory(spec, arch, shards)] * world
    for s in shards:
        per_rank[s.rank] = per_rank[s.rank] + shard_footprint(spec, s, world)
    return per_rank
