"""DLRM as TorchRec trains it: sharded embeddings, data-parallel dense layers.

This module owns the DLRM's program per rank and the builder. Per rank, one iteration is: the
input copy; for each sharding type present (table-wise, column-wise, row-wise, table-row-wise, in
that order, as TorchRec groups them), the input all-to-all of the ids to the shards' owners; the
bottom MLP, overlapping it; per type, the lookups (FBGEMM table-batched kernels over the global
batch) and the output distribution of the pooled embeddings: an all-to-all-v for table- and
column-wise, a reduce-scatter of partial sums for row-wise, a reduce-scatter inside the node then
an all-to-all across nodes for table-row-wise; data-parallel tables are looked up locally. Then the
interaction, top MLP and loss; backward reverses each type's distribution (all-to-all, all-gather)
before its lookups' backward, which applies the embedding optimizer in place (fused); replicated
tables' dense gradients join the DDP buckets of the dense gradients; the dense optimizer runs
once every bucket is reduced. Hybrid tables (HugeCTR's hybrid embedding) come last among the
sharded types; their ops are :mod:`~simgpu.workload.dlrm.hybrid`'s. Pooled embeddings and
their gradients travel as fp32 unless ``parallelism.sharding.comm_precision`` says otherwise
(TorchRec's quantized comms; the memory estimate keeps their buffers at fp32). With
``parallelism.sharding.compute_kernel: per_table`` each shard is looked up by its own kernel and
trained through PyTorch's sparse gradient and optimizer step, as the reference DLRM does (the
memory estimate leaves out the sparse gradient's rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ...config.checks import check_dlrm
from ...config.dlrm import DLRMModel
from ...config.sharding import ShardingType
from ...config.workload import WorkloadSpec
from ...graph import CollectiveCall, KernelTable, Program, Workload
from ..common import (
    MIB,
    Emitter,
    GradBuckets,
    Param,
    assign_buckets,
    aux_dtype,
    dtype_bytes,
    mlp_bwd,
    mlp_fwd,
    optimizer_step,
)
from ..registry import World, register
from . import hybrid, nvidia
from .arch import Arch, interaction_bwd, interaction_fwd, make_arch, model_flops
from .embedding import EMB_BYTES, ID_BYTES, LENGTH_BYTES, Shard, Table, batched_lookup, expand_tables, table_reuse
from .memory import memory_per_rank
from .sharding import Plan, resolve_plan

#: Sharding types in the order TorchRec's sharded collection runs them, with their short names.
TYPES: dict[ShardingType, str] = {"table_wise": "tw", "column_wise": "cw", "row_wise": "rw",
                                  "table_row_wise": "twrw", "hybrid": "hy", "data_parallel": "dp"}
_DENSE_BYTES = 4  # fp32 dense features


@dataclass(frozen=True)
class Layout:
    """The shards of a plan by sharding type and rank, and the bytes each collective moves (computed
    once per build and shared by every rank's program)."""

    world: World
    batch: int
    shards: tuple[Shard, ...]
    wire_bytes: int = EMB_BYTES  # bytes per element of pooled embeddings and their gradients in collectives
    per_table: bool = False  # one nn.EmbeddingBag(sparse=True) kernel per shard instead of table-batched ones

    @cached_property
    def _by_rank(self) -> dict[tuple[ShardingType, int], list[Shard]]:
        out: dict[tuple[ShardingType, int], list[Shard]] = {}
        for s in self.shards:
            out.setdefault((s.type, s.rank), []).append(s)
        return out

    @cached_property
    def _table_dims(self) -> dict[tuple[ShardingType, int], int]:
        """(type, node) -> columns of the tables of that type on that node; node -1: on any node."""
        seen: dict[tuple[ShardingType, int], dict[int, int]] = {}
        for s in self.shards:
            for node in (-1, s.rank // self.world.gpus_per_node):
                seen.setdefault((s.type, node), {})[s.table.index] = s.table.dim
        return {k: sum(v.values()) for k, v in seen.items()}

    @cached_property
    def _input_send(self) -> dict[ShardingType, tuple[int, ...]]:
        return {t: tuple(sum(s.input_bytes_from_each_rank(self.batch) for s in self.of(t, j))
                         for j in range(self.world.size)) for t in self.types}

    @cached_property
    def _reuse(self) -> dict[tuple[int, float, float], dict[str, float]]:
        return {}

    @cached_property
    def hybrid_vectors(self) -> tuple[int, ...]:
        """Bytes of the vectors each rank's infrequent hybrid blocks return to every rank."""
        return tuple(hybrid.vectors_sent(self, j) for j in range(self.world.size))

    @cached_property
    def types(self) -> list[ShardingType]:
        present = {s.type for s in self.shards}
        return [t for t in TYPES if t in present]

    def of(self, type_: ShardingType, rank: int) -> list[Shard]:
        return self._by_rank.get((type_, rank), [])

    def dims(self, type_: ShardingType, rank: int) -> int:
        """Pooled-embedding columns of ``type_`` that ``rank`` computes for each sample."""
        return sum(s.dim for s in self.of(type_, rank))

    def table_dims(self, type_: ShardingType) -> int:
        """Columns of all tables of ``type_``."""
        return self._table_dims.get((type_, -1), 0)

    def node_dims(self, node: int) -> int:
        """Columns of the table-row-wise tables held by ``node``."""
        return self._table_dims.get(("table_row_wise", node), 0)

    def input_send(self, type_: ShardingType) -> tuple[int, ...]:
        """Bytes of ids and lengths every rank sends to each rank in ``type_``'s input all-to-all
        (all ranks send alike: their local batches have the same size)."""
        return self._input_send[type_]

    def reuse(self, rows: int, lookups: float, alpha: float) -> dict[str, float]:
        """:func:`~simgpu.workload.dlrm.embedding.table_reuse`, computed once per distinct arguments."""
        key = (rows, lookups, alpha)
        if key not in self._reuse:
            self._reuse[key] = table_reuse(rows, lookups, alpha)
        return self._reuse[key]

    def node_group(self, rank: int) -> tuple[int, ...]:
        g = self.world.gpus_per_node
        n = rank // g
        return tuple(range(n * g, (n + 1) * g))

    def cross_group(self, rank: int) -> tuple[int, ...]:
        """The ranks with ``rank``'s local index, one per node."""
        g = self.world.gpus_per_node
        return tuple(n * g + rank % g for n in range(self.world.nodes))


def _a2a(em: Emitter, key: str, group: tuple[int, ...], send: tuple[int, ...], *, phase: str,
         deps: Sequence[int]) -> int:
    return em.collective(key, CollectiveCall(key, "all_to_all", group, sum(send), send_bytes=send),
                         phase=phase, deps=deps)


def _lookups(em: Emitter, layout: Layout, shards: Sequence[Shard], type_: ShardingType, bwd: bool,
             dep: int) -> int:
    """Table-batched lookups (or their backward with the fused optimizer) of ``shards``, or, with
    ``compute_kernel: per_table``, a kernel per shard with PyTorch's sparse gradient and step: one
    table-batched kernel for the shards of one width (FBGEMM's kernel takes mixed widths too; by
    width, each row's sectors stay exact), with the distinct rows of every shard summed; returns the
    last op (``dep`` if none)."""
    b = layout.batch
    batch = b if type_ == "data_parallel" else b * layout.world.size
    groups: dict[int | tuple[int, int], list[tuple[int, int, float, float, float]]] = {}
    for s in shards:
        if s.rows > 0:
            ids = s.ids_from_each_rank(b) * batch / b  # the ids of the kernel's batch
            key = (s.table.index, s.col_offset) if layout.per_table else s.dim
            groups.setdefault(key, []).append((s.rows, s.dim, float(batch), float(ids), s.table.zipf_alpha))
    last = dep
    family, phase = ("embedding_bwd", "bwd") if bwd else ("embedding_fwd", "fwd")
    for i, (key, parts) in enumerate(groups.items()):
        name = f"t{key[0]}" if isinstance(key, tuple) else f"group{i}"
        extra = {"fused": 0.0} if layout.per_table else {}
        last = em.kernel(f"emb.{TYPES[type_]}.{name}.{phase}", family, "fp32", phase=phase,
                         deps=(dep,) if i == 0 else (), **batched_lookup(parts, layout.reuse), **extra)
    return last


def _output_dist(em: Emitter, layout: Layout, type_: ShardingType, dep: int) -> int:
    """Pooled embeddings of ``type_`` from the shards to the ranks owning the samples."""
    r, b, w = em.rank, layout.batch, layout.world.size
    everyone = tuple(range(w))
    short = TYPES[type_]
    if type_ in ("table_wise", "column_wise"):
        send = (b * layout.dims(type_, r) * layout.wire_bytes,) * w
        return _a2a(em, f"emb.{short}.output_a2a", everyone, send, phase="fwd", deps=(dep,))
    if type_ == "row_wise":
        call = CollectiveCall("emb.rw.output_rs", "reduce_scatter", everyone,
                              b * w * layout.table_dims(type_) * layout.wire_bytes)
        return em.collective("emb.rw.output_rs", call, phase="fwd", deps=(dep,))
    node = r // layout.world.gpus_per_node
    key = f"emb.twrw.output_rs.node{node}"
    call = CollectiveCall(key, "reduce_scatter", layout.node_group(r),
                          b * w * layout.node_dims(node) * layout.wire_bytes)
    rs = em.collective(key, call, phase="fwd", deps=(dep,))
    cross = layout.cross_group(r)
    send = (b * layout.node_dims(node) * layout.wire_bytes,) * len(cross)
    return _a2a(em, f"emb.twrw.output_a2a.local{r % layout.world.gpus_per_node}", cross, send, phase="fwd",
                deps=(rs,))


def _grad_dist(em: Emitter, layout: Layout, type_: ShardingType, dep: int) -> int:
    """The reverse of :func:`_output_dist`: each rank's gradients of its samples back to the shards."""
    r, b, w = em.rank, layout.batch, layout.world.size
    everyone = tuple(range(w))
    short = TYPES[type_]
    if type_ in ("table_wise", "column_wise"):
        send = tuple(b * layout.dims(type_, j) * layout.wire_bytes for j in range(w))
        return _a2a(em, f"emb.{short}.grad_a2a", everyone, send, phase="bwd", deps=(dep,))
    if type_ == "row_wise":
        call = CollectiveCall("emb.rw.grad_ag", "all_gather", everyone,
                              b * w * layout.table_dims(type_) * layout.wire_bytes)
        return em.collective("emb.rw.grad_ag", call, phase="bwd", deps=(dep,))
    g = layout.world.gpus_per_node
    node = r // g
    cross = layout.cross_group(r)
    send = tuple(b * layout.node_dims(j // g) * layout.wire_bytes for j in cross)
    a2a = _a2a(em, f"emb.twrw.grad_a2a.local{r % g}", cross, send, phase="bwd", deps=(dep,))
    key = f"emb.twrw.grad_ag.node{node}"
    call = CollectiveCall(key, "all_gather", layout.node_group(r), b * w * layout.node_dims(node) * layout.wire_bytes)
    return em.collective(key, call, phase="bwd", deps=(a2a,))


def forward(em: Emitter, layout: Layout, arch: Arch, model: DLRMModel, tables: Sequence[Table], precision: str,
            *, input_name: str, cast_weights: bool = True) -> int:
    """The forward that training and inference share, on ``em``'s rank, up to the top MLP's output
    (returned): the batch's copy (``input_name``), each sharding's ids to the shards' owners, the
    bottom MLP overlapping them, per sharding type the lookups and the output distribution, the
    interaction and the top MLP. ``cast_weights``: the dense weights are fp32 and cast to the
    compute dtype each iteration (training under autocast); a served model stores them cast."""
    b, w, rank = layout.batch, layout.world.size, em.rank
    sharded = [t for t in layout.types if t != "data_parallel"]
    h2d = em.memcpy(input_name, b * model.dense_features * _DENSE_BYTES
                    + sum(t.ids(b) * ID_BYTES + b * LENGTH_BYTES for t in tables))
    inputs = {t: _a2a(em, f"emb.{TYPES[t]}.input_a2a", tuple(range(w)), layout.input_send(t), phase="fwd",
                      deps=(h2d,)) for t in sharded}
    mlp_fwd(em, arch.bottom, b, precision, relu_last=True, deps=(h2d,), cast_weights=cast_weights)
    pooled = []
    for t in layout.types:
        if t == "data_parallel":
            pooled.append(_lookups(em, layout, layout.of(t, rank), t, bwd=False, dep=h2d))
        elif t == "hybrid":
            pooled.extend(hybrid.forward(em, layout, local_dep=h2d, ids_dep=inputs[t]))
        else:
            looked = _lookups(em, layout, layout.of(t, rank), t, bwd=False, dep=inputs[t])
            pooled.append(_output_dist(em, layout, t, looked))
    interaction_fwd(em, arch, b, precision, deps=pooled, cast_weights=cast_weights)
    return mlp_fwd(em, arch.top, b, precision, relu_last=False, cast_weights=cast_weights)


def _rank_program(rank: int, spec: WorkloadSpec, model: DLRMModel, arch: Arch, layout: Layout,
                  tables: Sequence[Table], kernels: KernelTable) -> Program:
    prec = spec.train.precision
    b, w = layout.batch, layout.world.size
    em = Emitter(rank, kernels)
    replicas = layout.of("data_parallel", rank)
    replicated = [Param(f"emb.t{s.table.index}.weight", s.rows * s.dim) for s in replicas]
    grads = GradBuckets(em, assign_buckets(arch.ready_order(replicated), spec.comm.bucket_mib * MIB,
                                           spec.comm.first_bucket_mib * MIB), tuple(range(w)))
    forward(em, layout, arch, model, tables, prec, input_name="batch.h2d")
    out = b * arch.top[-1].outputs
    aux = aux_dtype(prec)
    em.elementwise("loss.fwd", out, 2, 1, aux, op="bce_logits", phase="fwd")  # sigmoid + BCE, fused

    # ---- backward
    em.elementwise("loss.bwd", out, 2, 1, aux, op="bce_logits_bwd", phase="bwd")
    mlp_bwd(em, arch.top, b, prec, relu_last=False, input_grad=True, grads=grads)
    interaction_bwd(em, arch, b, prec, grads)
    pack = em.elementwise("interaction.emb_grad_pack", b * arch.emb_dims, 1, 1, aux, op="copy", phase="bwd")
    # TorchRec's autograd order: the embedding backward (and its fused optimizer) comes before the
    # bottom MLP's, so the compute stream waits for the gradients' distribution.
    frequent_reduced = None
    for t in reversed(layout.types):
        if t == "data_parallel":
            zero = em.elementwise("emb.dp.grad_zero", sum(p.numel for p in replicated), 0, 1, "fp32", op="zero",
                                  phase="bwd", deps=(pack,))
            grads.ready(replicated, _lookups(em, layout, replicas, t, bwd=True, dep=zero))
        elif t == "hybrid":
            frequent_reduced = hybrid.backward(em, layout, pack)
        else:
            _lookups(em, layout, layout.of(t, rank), t, bwd=True, dep=_grad_dist(em, layout, t, pack))
    mlp_bwd(em, arch.bottom, b, prec, relu_last=True, input_grad=False, grads=grads)
    hybrid.update(em, layout, frequent_reduced)  # the frequent rows' SGD once their all-reduce is done

    # ---- dense optimizer (also over replicated tables) after every bucket is reduced
    optimizer_step(em, arch.dense_numel + sum(p.numel for p in replicated), spec.train.optimizer,
                   deps=grads.done())
    return em.program


def layout_of(spec: WorkloadSpec, world: World, tables: Sequence[Table], plan: Plan) -> Layout:
    sharding = spec.parallelism.sharding
    return Layout(world, spec.train.batch_per_gpu, tuple(plan.shards(tables)), dtype_bytes(sharding.comm_precision),
                  sharding.compute_kernel == "per_table")


@register("dlrm")
def build(spec: WorkloadSpec, world: World) -> Workload:
    """One program per rank; ranks differ by the shards they hold. Tables are generated from one
    generator seeded with ``spec.seed``."""
    model = spec.model
    if not isinstance(model, DLRMModel):
        raise TypeError(f"the dlrm builder got a {model.kind} model")
    check_dlrm(spec, world.nodes, world.gpus_per_node)
    tables = expand_tables(model, np.random.default_rng(spec.seed))
    arch = make_arch(model, tables)
    if spec.train.framework == "nvidia_dlrm":
        return nvidia.build(spec, world, model, arch, tables)
    plan = resolve_plan(spec, arch, tables, world)
    layout = layout_of(spec, world, tables, plan)
    kernels = KernelTable()
    programs = [_rank_program(r, spec, model, arch, layout, tables, kernels) for r in range(world.size)]
    memory = memory_per_rank(spec, arch, layout.shards, world.size)
    samples = spec.train.batch_per_gpu * world.size
    return Workload(name=spec.name, programs=programs, kernels=kernels.specs, memory=memory,
                    samples=samples, tokens=0, model_flops=model_flops(arch, samples),
                    compute_dtype=spec.train.precision)
