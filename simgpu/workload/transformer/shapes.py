"""The Transformer as one rank holds it: resolved settings, parameter tensors per module, counts, FLOPs.

This module owns :class:`Setup` (the workload's model, batch, precision and parallel layout resolved
into the numbers the builder uses: micro-batches, tokens per rank, padded vocabulary, which layers a
pipeline stage holds), the parameters of each module as one rank holds them under tensor and
expert parallelism (Megatron's splits: column-parallel QKV and first MLP linear, row-parallel output
projections, vocabulary-parallel embedding and output layer, experts split over expert-parallel
ranks), and the whole model's parameter count and useful FLOPs. It emits no ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ...config.workload import TransformerModel, WorkloadSpec
from ..common import DDP_FIRST_BUCKET_BYTES, GRAD_BYTES, Linear, Param, aux_dtype, dtype_bytes, is_mixed
from ..parallel import Layout
from ..registry import World
from .pipeline import Schedule

#: Megatron-core's default gradient bucket: at least this many parameters, and this many per
#: data-parallel rank ("make buckets larger [at large dp] to ensure that chunks used in NCCL
#: ring-reduce implementations are large enough to remain bandwidth-bound"):
#: ``DistributedDataParallelConfig.bucket_size`` is None -> ``max(40000000, 1000000 * dp)``
#: (megatron/core/distributed/distributed_data_parallel.py).
MEGATRON_BUCKET_MIN_PARAMS: Final = 40_000_000
MEGATRON_BUCKET_PARAMS_PER_DP: Final = 1_000_000


def megatron_bucket_params(dp: int) -> int:
    """Megatron-core's default ``bucket_size`` (parameters) for ``dp`` data-parallel ranks (context
    parallelism not counted: ``parallel_state.get_data_parallel_world_size()``)."""
    return max(MEGATRON_BUCKET_MIN_PARAMS, MEGATRON_BUCKET_PARAMS_PER_DP * dp)


def norm_params(name: str, h: int, kind: str) -> tuple[Param, ...]:
    """A LayerNorm has a weight and a bias, an RMSNorm a weight only."""
    w = Param(f"{name}.weight", h)
    return (w, Param(f"{name}.bias", h)) if kind == "layernorm" else (w,)


@dataclass(frozen=True)
class Setup:
    """The workload resolved for the Transformer builder (see the module docstring)."""

    model: TransformerModel
    layout: Layout
    micro: int           # samples per micro-batch
    m: int               # micro-batches per iteration per data-parallel replica
    precision: str
    framework: str
    recompute: str
    sp: bool
    zero: int
    schedule: Schedule
    v: int               # model chunks per stage
    cp_comm: str
    dp_overlap: bool
    bucket_bytes: float
    optimizer: str
    host_s: float | None
    sync_layers: bool = False
    param_overlap: bool = False  # overlap_param_gather (zero 1-2)
    tp_overlap: bool = False     # tp_comm_overlap (Transformer Engine userbuffers)
    #: under tp_overlap, SMs each userbuffers overlap's communication kernel takes (layer -> num_sm)
    ub_sms: tuple[tuple[str, int], ...] = ()
    p2p_overlap: bool = False    # overlap_p2p_comm
    iterations: int = 1          # training iterations built back to back (two for the steady state)
    forward_prefetch: bool = False          # FSDP (zero 3): explicit forward prefetch
    backward_prefetch: str = "backward_pre"  # FSDP: backward_pre, backward_post or none
    limit_all_gathers: bool = True          # FSDP's rate limiter (two units gathered at most)
    reshard_after_forward: bool = True      # FSDP: free gathered weights after the forward (ZeRO-3)
    first_bucket_bytes: float = DDP_FIRST_BUCKET_BYTES   # DDP's first gradient bucket
    bucket_view: bool = False               # DDP gradient_as_bucket_view

    @property
    def bucket_copies(self) -> bool:
        """PyTorch DDP copies gradients into its buckets and back (no gradient_as_bucket_view);
        Megatron's gradients are its buckets."""
        return self.zero == 0 and not self.megatron and not self.bucket_view

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def aux(self) -> str:
        """Dtype of activations and of the non-matmul kernels."""
        return aux_dtype(self.precision)

    @property
    def width(self) -> int:
        """Bytes per activation element."""
        return dtype_bytes(self.aux)

    @property
    def megatron(self) -> bool:
        return self.framework == "megatron"

    @property
    def cast(self) -> bool:
        """Autocast: fp32 weights cast to the compute dtype at each use, gradients cast back."""
        return self.framework == "pytorch" and is_mixed(self.precision) and self.zero < 3

    @property
    def vocab(self) -> int:
        """The vocabulary padded to a multiple of tp (Megatron pads so every rank holds an equal slice)."""
        v, tp = self.model.vocab, self.tp
        return -(-v // tp) * tp

    @property
    def seq(self) -> int:
        """Tokens of one sample on this rank (the sequence split over context-parallel ranks)."""
        return self.model.seq_len // self.layout.cp

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on this rank."""
        return self.micro * self.seq

    @property
    def rows(self) -> int:
        """Tokens that norms, dropout and residuals see: 1/tp of them under sequence parallelism."""
        return self.tokens // self.tp if self.sp else self.tokens

    @property
    def global_batch(self) -> int:
        return self.micro * self.layout.dp * self.m

    @property
    def chunks(self) -> int:
        """Model chunks of the whole pipeline (pp * v)."""
        return self.layout.pp * self.v

    def chunk_layers(self, g: int) -> range:
        """Blocks of global model chunk ``g`` (0-based, in model order)."""
        per = self.model.layers // self.chunks
        return range(g * per, (g + 1) * per)

    def stage_chunks(self, stage: int) -> list[int]:
        """Global chunks that ``stage`` holds, in local chunk order."""
        return [c * self.layout.pp + stage for c in range(self.v)]


def make_setup(spec: WorkloadSpec, world: World) -> Setup:
    """Resolve ``spec`` for ``world``; raises ValueError where the two disagree."""
    model = spec.model
    if not isinstance(model, TransformerModel):
        raise TypeError(f"the transformer builder got a {model.kind} model")
    p, t = spec.parallelism, spec.train
    mp = p.tp * p.pp * p.cp
    dp = p.dp or world.size // mp
    if mp * dp != world.size:
        raise ValueError(f"tp*pp*cp*dp = {p.tp}*{p.pp}*{p.cp}*dp={dp} does not match {world.size} GPUs")
    layout = Layout(tp=p.tp, cp=p.cp, dp=dp, pp=p.pp, ep=p.ep)
    if t.global_batch is not None:
        if t.global_batch % (t.batch_per_gpu * dp):
            raise ValueError(f"global_batch {t.global_batch} is not a multiple of micro_batch x dp = "
                             f"{t.batch_per_gpu * dp}")
        m = t.global_batch // (t.batch_per_gpu * dp)
    else:
        m = t.grad_accumulation or 1
    schedule: Schedule = p.pp_schedule
    host = spec.train.host_overhead_us
    param_overlap = p.overlap_param_gather  # zero 1 or 2, checked by the spec
    iterations = (3 if t.steady_state == "check" else
                  2 if t.steady_state == "always" or (t.steady_state == "auto" and param_overlap) else 1)
    return Setup(model=model, layout=layout, micro=t.batch_per_gpu, m=m, precision=t.precision,
                 framework=t.framework, recompute=t.recompute, sp=p.sp, zero=p.zero_stage, schedule=schedule,
                 v=p.virtual_stages, cp_comm=p.cp_comm, dp_overlap=p.dp_overlap,
                 bucket_bytes=_bucket_bytes(spec, dp), optimizer=t.optimizer,
                 host_s=None if host is None else host / 1e6, sync_layers=t.sync_each_layer,
                 param_overlap=param_overlap, iterations=iterations, tp_overlap=p.tp_comm_overlap,
                 ub_sms=tuple(p.tp_comm_overlap_sms.model_dump().items()),
                 p2p_overlap=p.overlap_p2p_comm, forward_prefetch=p.forward_prefetch,
                 backward_prefetch=p.backward_prefetch, limit_all_gathers=p.limit_all_gathers,
                 reshard_after_forward=p.reshard_after_forward, first_bucket_bytes=spec.comm.first_bucket_mib * 2**20,
                 bucket_view=p.gradient_as_bucket_view)


def _bucket_bytes(spec: WorkloadSpec, dp: int) -> float:
    """The gradient bucket's bytes: ``comm.bucket_mib`` (PyTorch DDP's default, 25), or under
    Megatron, unless given, Megatron-core's default in fp32 gradients."""
    if spec.train.framework == "megatron" and "bucket_mib" not in spec.comm.model_fields_set:
        return float(megatron_bucket_params(dp) * GRAD_BYTES)
    return spec.comm.bucket_mib * 2**20


@dataclass(frozen=True)
class Experts:
    """The experts of one MoE block on one rank: ``local`` experts, each tp-split like a dense MLP."""

    name: str
    router: Linear
    local: int
    fc1: Linear   # one expert's
    fc2: Linear

    @property
    def params(self) -> tuple[Param, ...]:
        """The stacked expert weights (reduced over the expert-data-parallel group)."""
        return (Param(f"{self.name}.experts.fc2", self.fc2.numel * self.local),
                Param(f"{self.name}.experts.fc1", self.fc1.numel * self.local))


@dataclass(frozen=True)
class Block:
    """The parameterised modules of one Transformer block on one rank."""

    index: int
    name: str
    ln1: tuple[Param, ...]
    qkv: Linear
    proj: Linear
    ln2: tuple[Param, ...]
    fc1: Linear | None
    fc2: Linear | None
    experts: Experts | None

    def dense_params(self) -> tuple[Param, ...]:
        """Parameters reduced over the data-parallel group, in the order backward readies them."""
        mlp: tuple[Param, ...] = ()
        if self.fc1 is not None and self.fc2 is not None:
            mlp = (*self.fc2.params, *self.fc1.params)
        elif self.experts is not None:
            mlp = self.experts.router.params
        return (*mlp, *self.ln2, *self.proj.params, *self.qkv.params, *self.ln1)

    def numel(self) -> int:
        n = sum(p.numel for p in self.dense_params())
        return n + (sum(p.numel for p in self.experts.params) if self.experts else 0)


def block(s: Setup, i: int) -> Block:
    """Block ``i`` as one rank holds it."""
    md, tp = s.model, s.tp
    h, d, bias = md.hidden, md.head_dim, md.has_bias
    qkv_out = (md.heads + 2 * md.kv_heads_n) * d // tp
    gate = 2 if md.act == "swiglu" else 1
    name = f"h{i}"
    qkv = Linear(f"{name}.attn.qkv", h, qkv_out, bias)
    proj = Linear(f"{name}.attn.proj", md.heads * d // tp, h, bias)
    fc1 = fc2 = None
    experts = None
    if md.is_moe_layer(i):
        assert md.moe is not None
        f = md.expert_ffn // tp
        experts = Experts(f"{name}.moe", Linear(f"{name}.moe.router", h, md.moe.experts, False),
                          md.moe.experts // s.layout.ep, Linear(f"{name}.moe.fc1", h, gate * f, bias),
                          Linear(f"{name}.moe.fc2", f, h, bias))
    else:
        fc1 = Linear(f"{name}.mlp.fc1", h, gate * md.ffn // tp, bias)
        fc2 = Linear(f"{name}.mlp.fc2", md.ffn // tp, h, bias)
    return Block(i, name, norm_params(f"{name}.ln1", h, md.norm_kind), qkv, proj,
                 norm_params(f"{name}.ln2", h, md.norm_kind), fc1, fc2, experts)


def embedding_params(s: Setup) -> tuple[Param, ...]:
    """The first chunk's parameters in the order backward readies them (token embedding last;
    BERT's embedding norm first)."""
    md, h = s.model, s.model.hidden
    out: list[Param] = []
    if md.arch == "bert":
        out += norm_params("embed.ln", h, md.norm_kind)
    if not md.rope:
        out.append(Param("wpe", md.seq_len * h))
    if md.arch == "bert":
        out.append(Param("wtt", 2 * h))
    out.append(Param("wte", s.vocab // s.tp * h))
    return tuple(out)


def head_linears(s: Setup) -> dict[str, Linear]:
    """The last chunk's linears: the output layer (its weight is ``wte`` when tied on one stage) and
    BERT's MLM transform and next-sentence classifier."""
    md, h = s.model, s.model.hidden
    out = {"lm_head": Linear("lm_head", h, s.vocab // s.tp, bias=md.arch == "bert")}
    if md.arch == "bert":
        out = {"mlm": Linear("mlm.dense", h, h), "pooler": Linear("pooler", h, h), "nsp": Linear("nsp", h, 2),
               **out}
    return out


def head_params(s: Setup) -> tuple[Param, ...]:
    """The last chunk's own parameters in ready order: the output layer unless it is the token
    embedding of the same stage (tied, one stage), then the final norm and BERT's heads."""
    md, h = s.model, s.model.hidden
    lins = head_linears(s)
    lm = lins.pop("lm_head")
    out: list[Param] = []
    if not (md.tied and s.layout.pp == 1):
        out.append(Param("lm_head.weight", lm.inputs * lm.outputs))
    if lm.bias:
        out.append(Param("lm_head.bias", lm.outputs))
    if md.arch == "bert":
        out += [*lins["nsp"].params, *lins["pooler"].params, *norm_params("mlm.ln", h, md.norm_kind),
                *lins["mlm"].params]
    out += norm_params("ln_f", h, md.norm_kind)
    return tuple(out)


def _mlp_params(h: int, f: int, gate: int, bias: bool) -> int:
    return h * gate * f + f * h + ((gate * f + h) if bias else 0)


def parameter_count(model: TransformerModel) -> int:
    """Parameters of the whole model, a tied output layer counted once (GPT-2 small: 124,439,808)."""
    md = model
    h, d = md.hidden, md.head_dim
    nb = 2 if md.norm_kind == "layernorm" else 1
    bias = md.has_bias
    gate = 2 if md.act == "swiglu" else 1
    qkv_out = (md.heads + 2 * md.kv_heads_n) * d
    qkv = h * qkv_out + (qkv_out if bias else 0)
    proj = md.heads * d * h + (h if bias else 0)
    total = 0
    for i in range(md.layers):
        total += qkv + proj + 2 * nb * h
        if md.is_moe_layer(i):
            assert md.moe is not None
            f = md.expert_ffn
            total += h * md.moe.experts + md.moe.experts * _mlp_params(h, f, gate, bias)
        else:
            total += _mlp_params(h, md.ffn, gate, bias)
    total += md.vocab * h + (0 if md.rope else md.seq_len * h) + nb * h
    if not md.tied:
        total += md.vocab * h
    if md.arch == "bert":
        total += 2 * h + nb * h + md.vocab + (h * h + h) + nb * h + (h * h + h) + (2 * h + 2)
    return total


def active_matmul_params(model: TransformerModel) -> int:
    """Parameters a token multiplies by: all but the embedding lookups and the experts it skips."""
    md = model
    n = parameter_count(md) - (0 if md.rope else md.seq_len * md.hidden) - (2 * md.hidden if md.arch == "bert" else 0)
    if not md.tied:
        n -= md.vocab * md.hidden  # the input embedding is a lookup; the output layer is a matmul
    if md.moe is not None:
        gate = 2 if md.act == "swiglu" else 1
        per_expert = md.hidden * gate * md.expert_ffn + md.expert_ffn * md.hidden
        moe_layers = sum(md.is_moe_layer(i) for i in range(md.layers))
        n -= moe_layers * (md.moe.experts - md.moe.top_k) * per_expert
    return n


def model_flops(model: TransformerModel, samples: int) -> float:
    """Useful FLOPs of one iteration of the whole job (forward + backward), the usual MFU convention.

    6 * N * tokens with N the parameters a token multiplies by (no position-embedding lookup; the
    tied token embedding counted once, as the output matmul; an MoE token only through its top_k
    experts), plus attention QK^T and AV counted as full (non-causal) matrices:
    12 * layers * samples * s^2 * hidden. Recomputation is not useful work and is not counted.
    """
    s, h = model.seq_len, model.hidden
    return 6.0 * active_matmul_params(model) * samples * s + 12.0 * model.layers * samples * s * s * h
