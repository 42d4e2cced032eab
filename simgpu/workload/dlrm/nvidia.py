"""DLRM as NVIDIA's PyTorch implementation trains it (``training.framework: nvidia_dlrm``).

NVIDIA's DLRM for PyTorch (DeepLearningExamples ``PyTorch/Recommendation/DLRM``, and its ancestor,
NVIDIA's MLPerf Training v0.7 DLRM) runs hybrid parallelism differently from TorchRec
(:mod:`simgpu.workload.dlrm.builder`), and this module owns that program:

- **Placement** (:func:`device_mapping`): every table whole on one GPU, the largest first into the
  GPU holding the fewest bytes, no GPU taking more than ``ceil(tables / GPUs)`` tables; above four
  GPUs, GPU 0 holds no table and runs the bottom MLP alone (``dlrm/utils/distributed.py``,
  ``get_device_mapping``).
- **Input**: each GPU reads from storage only the ids of its own tables, for the whole global batch,
  and GPU 0 the dense features of the whole batch; there is no all-to-all of ids.
- **Forward**: GPU 0 runs the bottom MLP over the global batch; each GPU looks up its tables over the
  global batch in one fused kernel; one all-to-all sends every GPU its local samples' vectors (the
  bottom MLP's output counts as one vector), in fp16 under AMP; the dot interaction is one fused
  kernel (``dot_based_interact``: the batched product, the upper triangle and the concatenation in
  one pass); the top MLP and the loss are data-parallel.
- **Backward**: the top MLP's gradients are all-reduced (DDP over the top MLP only), the fused
  interaction backward, the reverse all-to-all, the embedding backward with the SGD update fused
  (one kernel per GPU over its tables), and GPU 0's bottom MLP backward (its gradients, on one GPU,
  need no reduction); then the dense SGD step.
- **CUDA graphs** (``training.cuda_graphs``, the 2022 version's ``--cuda_graphs``): the iteration is
  one graph launch, so no op pays the host's per-launch time.

Lookups are timed per GPU as one kernel over its tables, with the distinct rows summed over the
tables (each table's ids uniform over its rows unless a distribution is given), see
:mod:`simgpu.kernels.embedding`. The memory estimate is the TorchRec one of the same whole-table
shards (:mod:`simgpu.workload.dlrm.memory`); it leaves out that GPU 0's bottom MLP keeps
activations for the global batch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from ...config.dlrm import DLRMModel
from ...config.workload import WorkloadSpec
from ...graph import CollectiveCall, KernelTable, Op, Program, Workload
from ..common import (
    MIB,
    Emitter,
    GradBuckets,
    assign_buckets,
    aux_dtype,
    dtype_bytes,
    is_mixed,
    mlp_bwd,
    mlp_fwd,
    optimizer_step,
)
from ..registry import World
from .arch import Arch, model_flops
from .embedding import Shard, Table, batched_lookup
from .memory import memory_per_rank

_IDS_BYTES = 4     # int32 ids as the binary dataset stores them
_DENSE_BYTES = 2   # fp16 dense features
_LABEL_BYTES = 1   # bool labels


def device_mapping(sizes: Sequence[int], gpus: int) -> list[list[int]]:
    """The tables of each GPU (indices into ``sizes``, bytes or rows per table), as NVIDIA's code
    places them: largest first, each into the open GPU with the fewest bytes; a GPU is closed once
    it has ``ceil(tables / GPUs)`` tables; above four GPUs, GPU 0 is left for the bottom MLP."""
    slots = gpus - 1 if gpus > 4 else gpus
    cap = math.ceil(len(sizes) / slots)
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    open_: list[list[int]] = [[] for _ in range(slots)]
    closed: list[list[int]] = []
    for i in order:
        open_[0].append(i)
        if len(open_[0]) == cap:
            closed.append(open_.pop(0))
        open_.sort(key=lambda b: sum(sizes[j] for j in b))
    buckets = closed + open_
    return [[], *buckets] if gpus > 4 else buckets


def _lookup(em: Emitter, tables: Sequence[Table], batch: int, *, bwd: bool, out_bytes: int, dep: int) -> int:
    """One fused lookup (or backward with PyTorch's sparse SGD) over ``tables`` for ``batch`` samples."""
    if not tables:
        return dep
    parts = [(t.rows, t.dim, float(batch), float(t.ids(batch)), t.zipf_alpha) for t in tables]
    family, phase = ("embedding_bwd", "bwd") if bwd else ("embedding_fwd", "fwd")
    params = batched_lookup(parts)
    params["dim"] = float(max(t.dim for t in tables))
    return em.kernel(f"emb.{phase}", family, "fp32", phase=phase, deps=(dep,), **params, out_bytes=out_bytes,
                     fused=0.0)


def _rank_program(rank: int, spec: WorkloadSpec, model: DLRMModel, arch: Arch, mapping: list[list[int]],
                  tables: Sequence[Table], world: World, kernels: KernelTable) -> Program:
    prec = spec.train.precision
    w = world.size
    b = spec.train.batch_per_gpu
    batch = b * w  # the global batch each GPU looks its tables up for
    wire = dtype_bytes(aux_dtype(prec))  # fp16 vectors under AMP, fp32 otherwise
    dim = model.embedding_dim
    mine = [tables[i] for i in mapping[rank]]
    em = Emitter(rank, kernels)
    bottom_here = rank == 0
    lookups = sum(t.ids(batch) for t in mine)
    dense_in = batch * model.dense_features * _DENSE_BYTES if bottom_here else 0
    input_bytes = lookups * _IDS_BYTES + dense_in + b * _LABEL_BYTES  # what this GPU reads of a batch
    h2d = em.memcpy("batch.h2d", input_bytes)
    last = h2d
    if bottom_here:
        last = mlp_fwd(em, arch.bottom, batch, prec, relu_last=True, deps=(h2d,))
    looked = _lookup(em, mine, batch, bwd=False, out_bytes=wire, dep=h2d)
    vectors = [len(mapping[r]) + (1 if r == 0 else 0) for r in range(w)]
    if w > 1:
        send = tuple(b * vectors[rank] * dim * wire for _ in range(w))
        a2a = em.collective("bottom_to_top.a2a", CollectiveCall("bottom_to_top.a2a", "all_to_all", tuple(range(w)),
                                                                sum(send), send_bytes=send),
                            phase="fwd", deps=(looked, last))
        ready: tuple[int, ...] = (a2a,)
    else:
        ready = (looked, last)
    f = arch.features
    inter = em.kernel("interaction.fused", "bmm", prec, phase="fwd", deps=ready, b=b, m=f + 1, n=f + 1, k=arch.dim)
    mlp_fwd(em, arch.top, b, prec, relu_last=False, deps=(inter,))
    out = b * arch.top[-1].outputs
    aux = aux_dtype(prec)
    em.elementwise("loss.fwd", out, 2, 1, aux, op="bce_logits", phase="fwd")
    em.elementwise("loss.bwd", out, 2, 1, aux, op="bce_logits_bwd", phase="bwd")
    top_params = [p for lin in reversed(arch.top) for p in lin.params]
    buckets = assign_buckets(top_params, spec.comm.bucket_mib * MIB, spec.comm.first_bucket_mib * MIB)
    grads = GradBuckets(em, buckets, tuple(range(w))) if w > 1 else None
    mlp_bwd(em, arch.top, b, prec, relu_last=False, input_grad=True, grads=grads)
    ibwd = em.kernel("interaction.fused_bwd", "bmm", prec, phase="bwd", b=b, m=f + 1, n=arch.dim, k=f + 1)
    if w > 1:
        recv = tuple(b * vectors[j] * dim * wire for j in range(w))
        back = em.collective("top_to_bottom.a2a", CollectiveCall("top_to_bottom.a2a", "all_to_all", tuple(range(w)),
                                                                 sum(recv), send_bytes=recv),
                             phase="bwd", deps=(ibwd,))
    else:
        back = ibwd
    ends = [_lookup(em, mine, batch, bwd=True, out_bytes=wire, dep=back)]
    if bottom_here:
        ends.append(mlp_bwd(em, arch.bottom, batch, prec, relu_last=True, input_grad=False, grads=None))
    captured = len(em.program.ops)  # the graph holds the forward and backward; the weight update is eager
    ends += grads.done() if grads is not None else []
    if is_mixed(prec):
        # GradScaler.step reads the inf check to the host: the host waits for the backward, then unscales
        # the embedding's sparse gradient (one fp32 row per id, read and written) before the sparse SGD
        em.program.add(Op("scaler.found_inf", "host_wait", "sync", stream="compute", phase="opt", deps=tuple(ends)))
        if lookups:
            em.elementwise("emb.grad_unscale", lookups * dim, 1, 1, "fp32", op="mul", phase="opt")
    dense = sum(lin.numel for lin in arch.top) + (sum(lin.numel for lin in arch.bottom) if bottom_here else 0)
    optimizer_step(em, dense, spec.train.optimizer, deps=ends)
    rate = spec.train.input_mbytes_per_s
    if rate is not None:  # once the step is launched, the host reads the next batch while the GPU runs
        em.program.add(Op("loader.next_batch", "host", "host", stream="compute", phase="data",
                          cpu_s=input_bytes / (rate * 1e6)))
    program = em.program
    host = spec.train.host_overhead_us
    if host is not None:  # the framework's host time per launched op, where the platform's is not it
        program.ops[:] = [op if op.kind in ("host", "host_wait") else dataclasses.replace(op, cpu_s=host * 1e-6)
                          for op in program.ops]
    if spec.train.cuda_graphs:  # one graph launch: the captured ops after the first pay no launch time
        program.ops[1:captured] = [dataclasses.replace(op, cpu_s=0.0) for op in program.ops[1:captured]]
    return program


def build(spec: WorkloadSpec, world: World, model: DLRMModel, arch: Arch, tables: Sequence[Table]) -> Workload:
    """One program per rank under NVIDIA's placement and execution; see the module docstring."""
    mapping = device_mapping([t.nbytes for t in tables], world.size)
    kernels = KernelTable()
    programs = [_rank_program(r, spec, model, arch, mapping, tables, world, kernels) for r in range(world.size)]
    shards = [Shard(tables[i], "table_wise", r, tables[i].rows, tables[i].dim)
              for r, idx in enumerate(mapping) for i in idx]
    memory = memory_per_rank(spec, arch, shards, world.size)
    samples = spec.train.batch_per_gpu * world.size
    return Workload(name=spec.name, programs=programs, kernels=kernels.specs, memory=memory,
                    samples=samples, tokens=0, model_flops=model_flops(arch, samples),
                    compute_dtype=spec.train.precision)
