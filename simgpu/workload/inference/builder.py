"""The inference builder: every rank's program for one iteration of a served Transformer.

A deployment is ``replicas`` identical model replicas; each is ``tp x ep x pp`` GPUs (tensor
parallel innermost, the ``ep`` attention-data-parallel ranks of an expert-parallel group next,
pipeline stages outermost, as :class:`~simgpu.workload.parallel.Layout` orders them) on consecutive
global ranks, replica ``r`` on ranks ``r * g .. (r + 1) * g - 1``. Under expert parallelism the
replica's requests are split evenly over its ``ep`` ranks (each runs attention for its share, the
experts exchange tokens by all-to-all). Every replica runs the same batch: the workload's
``inference`` section (:class:`~simgpu.config.inference.Inference`), or a
:class:`~simgpu.workload.inference.api.Step` given to :func:`build_replica`.

This module owns resolving a workload into a :class:`Deployment`, one stage's program per shape
retargeted to the stage's ranks, replicas laid side by side, and the refusal of a batch whose KV
cache or activations do not fit (:func:`check_fit`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config.inference import Inference
from ...config.transformer import TransformerInferenceModel
from ...config.workload import WorkloadSpec
from ...errors import ConfigError
from ...graph import CollectiveCall, KernelTable, MemoryEstimate, Op, Program, Replicas, Workload
from ...precision import PEAK_OF, gemm_path
from ..parallel import Layout
from ..registry import World, register
from ..stage import retarget
from ..transformer.pipeline import Schedule
from ..transformer.shapes import Setup, active_matmul_params
from .api import ReplicaMemory, Step
from .forward import Serving, StageForward
from .memory import SERVE_BYTES, replica_memory, stage_memory
from .shape import Shape, shape_of


@dataclass(frozen=True)
class Deployment:
    """A served Transformer resolved: one replica's :class:`Setup` (its layout is the replica's),
    the serving settings, the number of replicas and what each GPU holds."""

    setup: Setup
    serving: Serving
    inference: Inference
    replicas: int
    memory: ReplicaMemory

    @property
    def gpus(self) -> int:
        return self.setup.layout.world


def deployment(spec: WorkloadSpec, world: World) -> Deployment:
    """Resolve ``spec`` for ``world``; raises ValueError where the two disagree."""
    md = spec.model
    if not isinstance(md, TransformerInferenceModel):
        raise TypeError(f"the inference builder got a {md.kind} model")
    inf, p = spec.serve, spec.parallelism
    if p.cp > 1 or p.sp or p.zero_stage or p.pp_schedule != "1f1b":
        raise ValueError("a served model takes tp, pp, ep (or attention_dp, moe_tp, moe_ep) and dp only; expected "
                         "cp: 1, sp: false, zero: 0")
    adp, moe_tp, moe_ep = p.serving_split
    per = p.tp * adp * p.pp
    replicas = p.dp // adp if p.dp is not None else world.size // per
    if replicas * per != world.size:
        raise ValueError(f"tp*attention_dp*pp = {per} GPUs per replica do not fill {world.size} GPUs; expected the "
                         f"GPUs a multiple of {per}")
    _check_split(md, p.tp, moe_tp, moe_ep)
    layout = Layout(tp=p.tp, dp=adp, pp=p.pp, ep=adp)
    schedule: Schedule = "1f1b"
    setup = Setup(model=md, layout=layout, micro=1, m=1, precision=inf.precision, framework="megatron",
                  recompute="none", sp=False, zero=0, schedule=schedule, v=1, cp_comm="ring", dp_overlap=True,
                  bucket_bytes=spec.comm.bucket_mib * 2**20, optimizer="sgd", host_s=None,
                  moe_precision=inf.experts_precision, moe_tp=moe_tp, moe_ep=moe_ep)
    kv = inf.kv
    attn = "fp16" if inf.precision == "fp16" else "fp32" if inf.precision == "fp32" else "bf16"
    host = inf.host_overhead_us
    peaks = world.gpu_dtypes
    gemm = inf.precision if peaks is None else gemm_path(inf.precision, peaks) or inf.precision
    moe = inf.experts_precision if peaks is None else gemm_path(inf.experts_precision, peaks) or inf.experts_precision
    serving = Serving(attn_dtype=attn, kv_dtype=kv, kv_bytes=SERVE_BYTES[kv],
                      host_s=None if host is None else host * 1e-6, iteration_s=inf.iteration_overhead_us * 1e-6,
                      request_s=inf.request_overhead_us * 1e-6, prefill_s=inf.prefill_block_overhead_us * 1e-6,
                      fused=inf.framework == "tensorrt_llm",
                      cuda_graphs=inf.cuda_graphs, gemm_dtype=gemm, moe_dtype=moe)
    gib = world.gpu_memory_gib if world.gpu_memory_gib is not None else 80.0
    mem = replica_memory(setup, kv_width=SERVE_BYTES[kv], max_tokens=inf.max_batch_tokens,
                         max_rows=inf.max_batch_size, gpu_bytes=gib * 2**30 * inf.gpu_memory_utilization,
                         block_tokens=inf.block_tokens)
    return Deployment(setup, serving, inf, replicas, mem)


def _check_split(md: TransformerInferenceModel, tp: int, moe_tp: int, moe_ep: int) -> None:
    """The model's heads, experts and widths divide as the deployment splits them."""
    for what, n in (("heads", md.heads), ("kv_heads", md.kv_heads_n if md.mla is None else tp)):
        if n % tp and not (what == "kv_heads" and tp % n == 0):
            raise ValueError(f"tp ({tp}) must divide the model's {what} ({n})")
    la = md.linear_attention
    if la is not None and (la.key_heads % tp or la.value_heads % tp):
        raise ValueError(f"tp ({tp}) must divide linear_attention's key_heads ({la.key_heads}) and value_heads "
                         f"({la.value_heads})")
    if md.moe is not None:
        if md.moe.experts % moe_ep:
            raise ValueError(f"moe_ep ({moe_ep}) must divide the model's experts ({md.moe.experts})")
        if md.expert_ffn % moe_tp:
            raise ValueError(f"moe_tp ({moe_tp}) must divide the experts' width ({md.expert_ffn})")


def spec_step(inf: Inference) -> Step:
    """The batch the ``inference`` section describes."""
    return Step(prefill=((inf.prompt_tokens, inf.cached_tokens),) * inf.prefill_requests,
                decode=(inf.context_tokens,) * inf.decode_requests)


def check_fit(dep: Deployment, step: Step, file: str | None = None) -> None:
    """Refuse a batch a replica cannot hold: more tokens or requests than its limits, a request
    longer than the model's context, or more KV-cache blocks than its GPUs have room for."""
    inf, mem, md = dep.inference, dep.memory, dep.setup.model
    tokens = step.tokens
    rows = len(step.prefill) + len(step.decode)
    if tokens > inf.max_batch_tokens:
        raise ConfigError(f"the batch has {tokens:,} tokens; expected at most max_batch_tokens = "
                          f"{inf.max_batch_tokens:,}", file=file, key="inference.max_batch_tokens")
    if rows > inf.max_batch_size:
        raise ConfigError(f"the batch has {rows:,} requests; expected at most max_batch_size = "
                          f"{inf.max_batch_size:,}", file=file, key="inference.max_batch_size")
    lengths = [n + c for n, c in step.prefill] + [c + 1 for c in step.decode]
    if max(lengths, default=0) > md.seq_len:
        raise ConfigError(f"a request reaches {max(lengths):,} tokens of context; expected at most model.seq_len "
                          f"= {md.seq_len:,}", file=file, key="model.seq_len")
    b = inf.block_tokens
    blocks = sum(-(-n // b) for n in lengths)
    if blocks > mem.kv_blocks:
        raise ConfigError(
            f"does not fit in GPU memory: the batch's KV cache needs {blocks:,} blocks of {b} tokens but a replica "
            f"holds {mem.kv_blocks:,} ({mem.kv_bytes_per_token / 2**10:.0f} KiB per token per GPU; weights "
            f"{mem.weights_bytes / 2**30:.1f} GiB, activations {mem.activation_bytes / 2**30:.1f} GiB per GPU); "
            f"expected fewer or shorter requests, more tp / pp, fp8 weights or KV cache",
            file=file, key="inference")


def _shift(prog: Program, base: int, tag: str) -> Program:
    """``prog`` as the same rank ``base`` ranks further on runs it (collective groups and keys moved)."""
    ops = []
    for o in prog.ops:
        c = o.coll
        if c is not None:
            c = CollectiveCall(f"{tag}.{c.key}", c.op, tuple(r + base for r in c.group), c.nbytes, c.send_bytes,
                               c.root)
        ops.append(Op(o.name, o.kind, o.category, o.stream, o.phase, o.kernel, c, o.nbytes, o.deps, o.cpu_s,
                      o.delay_s))
    return Program(prog.rank + base, ops, template=prog.template)


def replica_programs(dep: Deployment, shape: Shape, kernels: KernelTable, *, layers: int | None = None,
                     ranks: set[int] | None = None) -> dict[int, Program]:
    """The programs of one replica's ranks (those in ``ranks``; default all) for a batch of ``shape``
    (the replica's batch; each of the ``ep`` ranks takes its share); ``layers`` blocks per stage."""
    s = dep.setup
    lay = s.layout
    share = shape.split(lay.ep)
    out: dict[int, Program] = {}
    for stage in range(lay.pp):
        fw = StageForward(s, dep.serving, share, stage, kernels, layers)
        em = fw.build()
        for r in lay.stage_ranks(stage):
            if ranks is None or r in ranks:
                out[r] = retarget(em, r, fw.host)
    return out


def model_flops(dep: Deployment, step: Step) -> float:
    """Useful FLOPs of one replica's batch: 2 N per token (N the weights a token multiplies by) and
    4 x head dim x heads per (query, key) pair attended, per layer."""
    md = dep.setup.model
    pairs = sum(n * c + n * (n + 1) / 2 for n, c in step.prefill) + sum(c + 1 for c in step.decode)
    return 2.0 * active_matmul_params(md) * step.tokens + 4.0 * md.layers * md.heads * md.d_head * pairs


@register("transformer_inference")
def build(spec: WorkloadSpec, world: World) -> Workload:
    """Every replica running the ``inference`` section's batch; with ``world.fold`` and replicas of
    whole nodes, one replica's programs stand for all."""
    try:
        dep = deployment(spec, world)
    except ValueError as e:
        raise ConfigError(str(e), key="parallelism") from None
    step = spec_step(dep.inference)
    if step.tokens == 0:
        raise ConfigError("the batch is empty; expected prefill_requests or decode_requests above 0",
                          key="inference.decode_requests")
    check_fit(dep, step)
    shape = shape_of(step, exact=True)
    kernels = KernelTable()
    g = dep.gpus
    one = replica_programs(dep, shape, kernels)
    fold = world.fold and world.whole_nodes and dep.replicas > 1 and g % world.gpus_per_node == 0
    programs: list[Program] = []
    for r in range(1 if fold else dep.replicas):
        programs += [_shift(one[k], r * g, f"r{r}") if r else one[k] for k in sorted(one)]
    s = dep.setup
    memory: list[MemoryEstimate] = []
    share = shape.split(s.layout.ep)
    for _ in range(dep.replicas):
        for st in range(s.layout.pp):
            m = stage_memory(s, st, kv_width=dep.serving.kv_bytes, kv_tokens=share.kv_tokens,
                             tokens=share.tokens, rows=share.rows)
            memory += [m] * (g // s.layout.pp)
    n = dep.replicas
    return Workload(name=spec.name, programs=programs, kernels=kernels.specs, memory=memory,
                    samples=n * (len(step.prefill) + len(step.decode)), tokens=n * step.tokens,
                    model_flops=n * model_flops(dep, step),
                    compute_dtype=PEAK_OF.get(dep.serving.gemm_dtype, dep.serving.gemm_dtype),
                    replicas=Replicas(world=g * n, levels=((g * n, g),)) if fold else None)
