"""DLRM inference: a batch of queries through the forward of a DLRM whose tables are sharded as
TorchRec's training plans shard them.

Per rank and iteration: the queries' dense features and sparse ids copied in, the ids sent to the
shards' owners (all-to-all per sharding type), the bottom MLP overlapping them, the lookups and the
pooled embeddings' output distribution, the interaction, the top MLP and the sigmoid, whose scores
the host waits for. The plan is resolved exactly as for training (:mod:`~simgpu.workload.dlrm.sharding`,
the same ``parallelism.sharding`` keys) with the workload's ``inference.batch_per_gpu`` queries per
GPU; the forward is the DLRM builder's (:func:`~simgpu.workload.dlrm.builder.forward`), with the
dense weights stored in the serving dtype (no per-batch cast). Memory per GPU: its shards' rows, the
dense weights and one batch's activations; no gradients or optimizer states.
"""

from __future__ import annotations

import numpy as np

from ...config.checks import check_dlrm
from ...config.dlrm import DLRMInferenceModel, DLRMModel
from ...config.training import Training
from ...config.workload import WorkloadSpec
from ...errors import ConfigError
from ...graph import KernelTable, MemoryEstimate, Op, Program, Workload
from ..common import Emitter, aux_dtype
from ..dlrm.arch import Arch, make_arch, model_flops
from ..dlrm.builder import Layout, forward, layout_of
from ..dlrm.embedding import Table, expand_tables
from ..dlrm.memory import memory_per_rank
from ..dlrm.sharding import resolve_plan
from ..registry import World, register


def training_view(spec: WorkloadSpec) -> WorkloadSpec:
    """``spec`` as the DLRM training pieces read it: a ``dlrm`` model with a batch of the queries per
    GPU and no optimizer state (SGD), so that plans and memory are the training builder's."""
    md, inf = spec.model, spec.serve
    if not isinstance(md, DLRMInferenceModel):
        raise TypeError(f"the dlrm_inference builder got a {md.kind} model")
    if inf.batch_per_gpu is None:
        raise ConfigError("a DLRM answers batches of queries; expected inference.batch_per_gpu",
                          key="inference.batch_per_gpu")
    if inf.precision == "fp4":
        raise ConfigError("fp4 is for Transformer weights; expected fp32, bf16, fp16 or fp8",
                          key="inference.precision")
    model = DLRMModel.model_validate({**md.model_dump(exclude={"kind"}), "kind": "dlrm"})
    train = Training(batch_per_gpu=inf.batch_per_gpu, precision=inf.precision, optimizer="sgd",
                     embedding_optimizer="sgd")
    return spec.model_copy(update={"model": model, "training": train, "inference": None})


def _rank_program(rank: int, spec: WorkloadSpec, arch: Arch, layout: Layout, tables: list[Table],
                  kernels: KernelTable) -> Program:
    md = spec.model
    assert isinstance(md, DLRMModel)
    prec, b = spec.train.precision, layout.batch
    em = Emitter(rank, kernels)
    forward(em, layout, arch, md, tables, prec, input_name="queries.h2d", cast_weights=False)
    score = em.elementwise("sigmoid", b * arch.top[-1].outputs, 1, 1, aux_dtype(prec), op="bce_logits", phase="fwd")
    em.program.add(Op("scores.sync", "host_wait", "sync", stream="compute", phase="fwd", deps=(score,)))
    return em.program


@register("dlrm_inference")
def build(spec: WorkloadSpec, world: World) -> Workload:
    """One program per rank (ranks differ by their shards); tables drawn from ``spec.seed``."""
    view = training_view(spec)
    model = view.model
    assert isinstance(model, DLRMModel)
    check_dlrm(view, world.nodes, world.gpus_per_node)
    tables = expand_tables(model, np.random.default_rng(spec.seed))
    arch = make_arch(model, tables)
    plan = resolve_plan(view, arch, tables, world)
    layout = layout_of(view, world, tables, plan)
    kernels = KernelTable()
    programs = [_rank_program(r, view, arch, layout, tables, kernels) for r in range(world.size)]
    memory = [MemoryEstimate(parameters=m.parameters, activations=m.activations, embeddings=m.embeddings,
                             buffers=m.buffers)
              for m in memory_per_rank(view, arch, layout.shards, world.size)]
    samples = view.train.batch_per_gpu * world.size
    return Workload(name=spec.name, programs=programs, kernels=kernels.specs, memory=memory, samples=samples,
                    tokens=0, model_flops=model_flops(arch, samples) / 3, compute_dtype=view.train.precision)
