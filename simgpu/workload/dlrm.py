"""DLRM as TorchRec trains it: table-wise sharded embeddings, data-parallel MLPs.

This module owns the DLRM's table placement (greedy by bytes), its program per rank (input copy,
the three all-to-alls of the sparse part, bottom / top MLPs, interaction, DDP all-reduces of the
dense gradients, optimizer), its useful FLOPs and its memory per GPU.

Embedding tables are fp32, looked up by FBGEMM table-batched kernels whose backward applies the
embedding optimizer in place; pooled embeddings and their gradients travel as fp32.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..config.workload import DLRMModel, WorkloadSpec
from ..errors import ConfigError
from .common import (
    GRAD_BYTES,
    MIB,
    Emitter,
    GradBuckets,
    Linear,
    Param,
    assign_buckets,
    aux_dtype,
    dense_memory,
    dtype_bytes,
    mlp_bwd,
    mlp_fwd,
    optimizer_step,
)
from .graph import CollectiveCall, KernelTable, MemoryEstimate, Program, Workload
from .registry import World, register

_EMB_BYTES = 4     # fp32 table rows and pooled embeddings
_ID_BYTES = 8      # int64 sparse ids
_LENGTH_BYTES = 4  # int32 bag lengths (one per sample per table)
_DENSE_BYTES = 4   # fp32 dense features


@dataclass(frozen=True)
class Table:
    """One embedding table, ``index`` its position among all tables (``count`` expanded)."""

    index: int
    rows: int
    dim: int
    pooling: float

    @property
    def nbytes(self) -> int:
        return self.rows * self.dim * _EMB_BYTES

    def ids(self, batch: int) -> int:
        """Ids looked up for ``batch`` samples."""
        return round(batch * self.pooling)

    def input_bytes(self, batch: int) -> int:
        """Bytes of this table's ids and lengths for ``batch`` samples."""
        return self.ids(batch) * _ID_BYTES + batch * _LENGTH_BYTES


def expand_tables(model: DLRMModel) -> list[Table]:
    tables: list[Table] = []
    for t in model.tables:
        for _ in range(t.count):
            tables.append(Table(len(tables), t.rows, t.dim or model.embedding_dim, t.pooling_factor))
    return tables


def assign_tables(tables: list[Table], ranks: int) -> list[list[Table]]:
    """Table-wise sharding: largest table first to the least-loaded rank (by bytes).

    Ties go to the lower table index and the lower rank, so the plan is deterministic. Each rank's
    tables are returned in table order.
    """
    heap = [(0, r) for r in range(ranks)]
    plan: list[list[Table]] = [[] for _ in range(ranks)]
    for t in sorted(tables, key=lambda t: (-t.nbytes, t.index)):
        load, r = heapq.heappop(heap)
        plan[r].append(t)
        heapq.heappush(heap, (load + t.nbytes, r))
    return [sorted(p, key=lambda t: t.index) for p in plan]


def _groups(tables: list[Table]) -> list[tuple[Table, int]]:
    """Tables of one shape fused into one kernel: (a representative, how many), first-seen order."""
    counts: dict[tuple[int, int, float], int] = {}
    first: dict[tuple[int, int, float], Table] = {}
    for t in tables:
        key = (t.dim, t.rows, t.pooling)
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, t)
    return [(first[k], n) for k, n in counts.items()]


@dataclass(frozen=True)
class _Arch:
    """The dense side of the model."""

    bottom: list[Linear]
    top: list[Linear]
    features: int  # F, embedding tables
    dim: int       # the bottom MLP's output width (= embedding dim for "dot")

    @property
    def linears(self) -> list[Linear]:
        return self.bottom + self.top

    def ready_order(self) -> list[Param]:
        """Dense parameters in the order backward makes their gradients ready."""
        return [p for lin in reversed(self.linears) for p in lin.params]


def _arch(model: DLRMModel, tables: list[Table]) -> _Arch:
    f = len(tables)
    d = model.bottom_mlp[-1]
    if model.interaction == "dot":
        if any(t.dim != d for t in tables):
            raise ConfigError(f"the dot interaction needs every table's dim to equal bottom_mlp[-1] ({d})",
                              key="model.tables")
        top_in = d + f * (f + 1) // 2  # the bottom output and the pairwise dot products
    else:
        top_in = d + sum(t.dim for t in tables)
    widths_b = [model.dense_features, *model.bottom_mlp]
    widths_t = [top_in, *model.top_mlp]
    bottom = [Linear(f"bot{i}", widths_b[i], widths_b[i + 1]) for i in range(len(model.bottom_mlp))]
    top = [Linear(f"top{i}", widths_t[i], widths_t[i + 1]) for i in range(len(model.top_mlp))]
    return _Arch(bottom, top, f, d)


def _emb_kernels(em: Emitter, tables: list[Table], batch: int, bwd: bool, dep: int) -> int:
    """Fused lookups (or backward + optimizer) of ``tables``; returns the last op (``dep`` if none)."""
    last = dep
    family = "embedding_bwd" if bwd else "embedding_fwd"
    for i, (t, n) in enumerate(_groups(tables)):
        last = em.kernel(f"emb.group{i}.{'bwd' if bwd else 'fwd'}", family, "fp32",
                         phase="bwd" if bwd else "fwd", deps=(dep,) if i == 0 else (), batch=batch,
                         tables=n, pooling=t.pooling, dim=t.dim, rows=t.rows)
    return last


def _dims(tables: list[Table]) -> int:
    return sum(t.dim for t in tables)


def _rank_program(rank: int, spec: WorkloadSpec, model: DLRMModel, arch: _Arch, plan: list[list[Table]],
                  kernels: KernelTable) -> Program:
    prec = spec.training.precision
    aux = aux_dtype(prec)
    world = len(plan)
    group = tuple(range(world))
    b = spec.training.batch_per_gpu
    gb = b * world  # the global batch
    f, d = arch.features, arch.dim
    mine = plan[rank]
    all_tables = [t for p in plan for t in p]
    em = Emitter(rank, kernels)
    grads = GradBuckets(em, assign_buckets(arch.ready_order(), spec.comm.bucket_mib * MIB), group)

    # ---- data: the local batch, then its ids to each table's owner
    h2d = em.memcpy("batch.h2d", b * model.dense_features * _DENSE_BYTES
                    + sum(t.input_bytes(b) for t in all_tables))
    send = tuple(sum(t.input_bytes(b) for t in plan[j]) for j in range(world))
    in_a2a = em.collective("emb.input_a2a", CollectiveCall("emb.input_a2a", "all_to_all", group, sum(send),
                                                           send_bytes=send), phase="fwd", deps=(h2d,))

    # ---- forward: bottom MLP overlaps the input all-to-all; lookups of my tables over the global batch
    mlp_fwd(em, arch.bottom, b, prec, relu_last=True, deps=(h2d,))
    lookups = _emb_kernels(em, mine, gb, bwd=False, dep=in_a2a)
    send = (b * _dims(mine) * _EMB_BYTES,) * world
    out_a2a = em.collective("emb.output_a2a", CollectiveCall("emb.output_a2a", "all_to_all", group,
                                                             sum(send), send_bytes=send),
                            phase="fwd", deps=(lookups,))
    top_in = arch.top[0].inputs
    if model.interaction == "dot":
        em.elementwise("interaction.cat", b * (f + 1) * d, 1, 1, aux, phase="fwd", deps=(out_a2a,))
        em.kernel("interaction.bmm", "bmm", prec, phase="fwd", b=b, m=f + 1, n=f + 1, k=d)
        em.elementwise("interaction.triu_gather", b * f * (f + 1) // 2, 1, 1, aux, phase="fwd")
        em.elementwise("interaction.cat_dense", b * top_in, 1, 1, aux, phase="fwd")
    else:
        em.elementwise("interaction.cat", b * top_in, 1, 1, aux, phase="fwd", deps=(out_a2a,))
    mlp_fwd(em, arch.top, b, prec, relu_last=False)
    out = b * arch.top[-1].outputs
    em.elementwise("loss.fwd", out, 2, 1, aux, phase="fwd")  # sigmoid + BCE, fused

    # ---- backward
    em.elementwise("loss.bwd", out, 2, 1, aux, phase="bwd")
    mlp_bwd(em, arch.top, b, prec, relu_last=False, input_grad=True, grads=grads)
    if model.interaction == "dot":
        em.elementwise("interaction.triu_scatter", b * (f + 1) ** 2, 1, 1, aux, phase="bwd")
        # Z = T @ T^T: dT = dZ @ T + dZ^T @ T
        for i in range(2):
            em.kernel(f"interaction.bmm_bwd{i}", "bmm", prec, phase="bwd", b=b, m=f + 1, n=d, k=f + 1)
        em.elementwise("interaction.dense_grad_add", b * d, 2, 1, aux, phase="bwd")
    pack = em.elementwise("interaction.emb_grad_pack", b * _dims(all_tables), 1, 1, aux, phase="bwd")
    # The reverse of the output all-to-all: my samples' gradients to each table owner.
    send = tuple(b * _dims(plan[j]) * _EMB_BYTES for j in range(world))
    grad_a2a = em.collective("emb.grad_a2a", CollectiveCall("emb.grad_a2a", "all_to_all", group, sum(send),
                                                            send_bytes=send), phase="bwd", deps=(pack,))
    # TorchRec's autograd order: the embedding backward (and its fused optimizer) comes before the
    # bottom MLP's, so the compute stream waits for the gradient all-to-all.
    _emb_kernels(em, mine, gb, bwd=True, dep=grad_a2a)
    mlp_bwd(em, arch.bottom, b, prec, relu_last=True, input_grad=False, grads=grads)

    # ---- dense optimizer after every bucket is reduced
    optimizer_step(em, sum(lin.numel for lin in arch.linears), spec.training.optimizer, deps=grads.done())
    return em.program


def memory_estimate(spec: WorkloadSpec, model: DLRMModel, arch: _Arch, plan: list[list[Table]],
                    rank: int) -> MemoryEstimate:
    """Bytes on ``rank``: dense parameters, its embedding tables, activations and comm buffers.

    Activations are the MLP layer outputs (gemm and ReLU), interaction tensors, the lookups of the
    local tables over the global batch and the received pooled embeddings. Buffers are the ids
    all-to-all (send + receive), the gradient all-to-all (send + receive) and DDP's flat buckets.
    """
    prec = spec.training.precision
    b = spec.training.batch_per_gpu
    world = len(plan)
    gb = b * world
    f, d = arch.features, arch.dim
    mine = plan[rank]
    all_tables = [t for p in plan for t in p]
    dense = sum(lin.numel for lin in arch.linears)
    params, grads, states = dense_memory(dense, prec, spec.training.optimizer)

    adagrad_row = 4 if spec.training.embedding_optimizer == "adagrad" else 0  # row-wise adagrad: 1 fp32
    embeddings = sum(t.nbytes + t.rows * adagrad_row for t in mine)

    width = dtype_bytes(aux_dtype(prec))
    act = 0
    for lin in arch.bottom:
        act += 2 * b * lin.outputs * width
    for i, lin in enumerate(arch.top):
        act += (1 if i == len(arch.top) - 1 else 2) * b * lin.outputs * width
    if model.interaction == "dot":
        act += b * ((f + 1) * d + (f + 1) ** 2 + arch.top[0].inputs) * width
    else:
        act += b * arch.top[0].inputs * width
    act += (gb * _dims(mine) + b * _dims(all_tables)) * _EMB_BYTES

    ids = sum(t.input_bytes(b) for t in all_tables) + sum(t.input_bytes(gb) for t in mine)
    grad_a2a = (b * _dims(all_tables) + gb * _dims(mine)) * _EMB_BYTES
    buffers = ids + grad_a2a + dense * GRAD_BYTES
    return MemoryEstimate(parameters=params, gradients=grads, optimizer_states=states,
                          activations=float(act), embeddings=float(embeddings), buffers=float(buffers))


def model_flops(arch: _Arch, model: DLRMModel, samples: int) -> float:
    """Useful FLOPs of one iteration: 3x the forward matmuls (MLPs and the dot interaction's bmm).

    Embedding lookups are memory traffic, not FLOPs, and are left out.
    """
    fwd = sum(lin.flops(samples) for lin in arch.linears)
    if model.interaction == "dot":
        fwd += 2 * samples * (arch.features + 1) ** 2 * arch.dim
    return 3.0 * fwd


@register("dlrm")
def build(spec: WorkloadSpec, world: World) -> Workload:
    """One program per rank; ranks differ by the tables they own."""
    model = spec.model
    if not isinstance(model, DLRMModel):
        raise TypeError(f"the dlrm builder got a {model.kind} model")
    tables = expand_tables(model)
    arch = _arch(model, tables)
    plan = assign_tables(tables, world.size)
    kernels = KernelTable()
    programs = [_rank_program(r, spec, model, arch, plan, kernels) for r in range(world.size)]
    memory = [memory_estimate(spec, model, arch, plan, r) for r in range(world.size)]
    samples = spec.training.batch_per_gpu * world.size
    return Workload(name=spec.name, programs=programs, kernels=kernels.specs, memory=memory,
                    samples=samples, tokens=0, model_flops=model_flops(arch, model, samples),
                    compute_dtype=spec.training.precision)
