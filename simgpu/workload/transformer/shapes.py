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

from ...config.transformer import TransformerModel
from ...config.workload import WorkloadSpec
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
    embedding_in_split: bool = False        # the embedding and the loss count as a block in the pipeline split
    stage_layers: tuple[int, ...] | None = None  # blocks per global model chunk (None: an even split)
    moe_precision: str = ""                 # the experts' GEMM dtype (served models; "" : precision)
    moe_tp: int = 0                         # the experts' tensor split (served models; 0: tp)
    moe_ep: int = 0                         # the experts' expert split (served models; 0: layout.ep)

    @property
    def moe_dtype(self) -> str:
        return self.moe_precision or self.precision

    @property
    def expert_tp(self) -> int:
        """Ranks each expert is split over (tensor parallelism of the MoE layers)."""
        return self.moe_tp or self.layout.tp

    @property
    def expert_ep(self) -> int:
        """Ranks the experts are spread over (expert parallelism of the MoE layers)."""
        return self.moe_ep or self.layout.ep

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
        """Blocks of global model chunk ``g`` (0-based, in model order). Under ``embedding_in_split``
        the embedding and the loss count as a block each (Megatron-core's
        account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split): the first
        and the last chunk hold one block fewer. ``stage_layers`` gives each chunk's count instead."""
        if self.stage_layers is not None:
            start = sum(self.stage_layers[:g])
            return range(start, start + self.stage_layers[g])
        extra = 2 if self.embedding_in_split else 0
        per = (self.model.layers + extra) // self.chunks
        shift = 1 if extra and g > 0 else 0
        end = self.model.layers if extra and g == self.chunks - 1 else (g + 1) * per - (1 if extra else 0)
        return range(g * per - shift, end)

    def stage_chunks(self, stage: int) -> list[int]:
        """Global chunks that ``stage`` holds, in local chunk order."""
        return [c * self.layout.pp + stage for c in range(self.v)]


def make_setup(spec: WorkloadSpec, world: World) -> Setup:
    """Resolve ``spec`` for ``world``; raises ValueError where the two disagree."""
    model = spec.model
    if not isinstance(model, TransformerModel):
        raise TypeError(f"the transformer builder got a {model.kind} model")
    p, t = spec.parallelism, spec.train
    if p.cp > 1 and (model.mla is not None or model.layer_types is not None):
        raise ValueError("context parallelism is modelled for full grouped-query attention only; expected cp: 1 with "
                         "mla or layer_types")
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
                 bucket_view=p.gradient_as_bucket_view, embedding_in_split=p.account_for_embedding_and_loss,
                 stage_layers=None if p.stage_layers is None else tuple(p.stage_layers))


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
    """The parameterised modules of one Transformer block on one rank.

    ``qkv`` is the block's first projection: grouped-query attention's fused QKV (with the output
    gate's half under ``attention_output_gate``); under MLA the fused low-rank query and latent
    projection (``q_a`` and ``kv_a``, whole on every tp rank), followed by ``q_up`` (the query's
    up-projection, column-parallel) and ``kv_up`` (the latent's key/value up-projection); in a
    linear-attention block Gated DeltaNet's ``in_proj_qkvz``, beside ``gates`` (its ``in_proj_ba``).
    ``indexer`` is DSA's (its query up-projection, keys and head weights as one linear). ``shared``
    is the shared experts' MLP (fc1, fc2) beside an MoE block's routed experts."""

    index: int
    name: str
    ln1: tuple[Param, ...]
    qkv: Linear
    proj: Linear
    ln2: tuple[Param, ...]
    fc1: Linear | None
    fc2: Linear | None
    experts: Experts | None
    kind: str = "full"
    q_up: Linear | None = None
    kv_up: Linear | None = None
    gates: Linear | None = None
    indexer: Linear | None = None
    shared: tuple[Linear, Linear] | None = None
    attn_norms: tuple[Param, ...] = ()

    def dense_params(self) -> tuple[Param, ...]:
        """Parameters reduced over the data-parallel group, in the order backward readies them."""
        mlp: tuple[Param, ...] = ()
        if self.fc1 is not None and self.fc2 is not None:
            mlp = (*self.fc2.params, *self.fc1.params)
        elif self.experts is not None:
            mlp = self.experts.router.params
            if self.shared is not None:
                mlp = (*self.shared[1].params, *self.shared[0].params, *mlp)
        attn: tuple[Param, ...] = ()
        for lin in (self.kv_up, self.q_up, self.indexer, self.gates):
            if lin is not None:
                attn = (*attn, *lin.params)
        return (*mlp, *self.ln2, *self.proj.params, *attn, *self.attn_norms, *self.qkv.params, *self.ln1)

    def numel(self) -> int:
        n = sum(p.numel for p in self.dense_params())
        return n + (sum(p.numel for p in self.experts.params) if self.experts else 0)


def attention_linears(md: TransformerModel, i: int, tp: int) -> dict[str, Linear]:
    """Block ``i``'s attention linears as one rank holds them under tensor parallelism ``tp``
    (``tp`` 1: the whole model's), and the widths of its per-head norms (``norms``: their parameter
    count as a pseudo-linear's inputs)."""
    h, bias, name = md.hidden, md.has_bias, f"h{i}"
    kind = md.attention_kind(i)
    out: dict[str, Linear] = {}
    if md.mla is not None:
        ml = md.mla
        first = (ml.q_lora_rank or 0) + ml.latent
        out["qkv"] = Linear(f"{name}.attn.qkv_a", h, first, bias)
        q_in = ml.q_lora_rank or h
        out["q_up"] = Linear(f"{name}.attn.q_b", q_in, md.heads * ml.qk_head_dim // tp, False)
        if ml.q_lora_rank is None:  # the query straight from the block's input, column-parallel
            out["qkv"] = Linear(f"{name}.attn.kv_a", h, ml.latent, bias)
        out["kv_up"] = Linear(f"{name}.attn.kv_b", ml.kv_lora_rank,
                              md.heads * (ml.qk_nope_head_dim + ml.v_head_dim) // tp, False)
        out["proj"] = Linear(f"{name}.attn.proj", md.heads * ml.v_head_dim // tp, h, bias)
        if md.sparse_attention is not None:
            sa = md.sparse_attention
            q_in = ml.q_lora_rank or h
            # wq_b (from the query latent), wk (from the input) and the head weights, tp-replicated
            out["indexer"] = Linear(f"{name}.attn.indexer", q_in + h,
                                    sa.index_heads * sa.index_head_dim + sa.index_head_dim + sa.index_heads, False)
        return out
    if kind == "linear":
        la = md.linear_attention
        assert la is not None
        qkvz = 2 * la.key_heads * la.key_head_dim + 2 * la.value_heads * la.value_head_dim
        out["qkv"] = Linear(f"{name}.attn.in_proj_qkvz", h, qkvz // tp, False)
        out["gates"] = Linear(f"{name}.attn.in_proj_ba", h, 2 * la.value_heads // tp, False)
        out["proj"] = Linear(f"{name}.attn.out_proj", la.value_heads * la.value_head_dim // tp, h, False)
        return out
    d = md.d_head
    q = md.heads * d * (2 if md.attention_output_gate else 1)
    out["qkv"] = Linear(f"{name}.attn.qkv", h, (q + 2 * md.kv_heads_n * d) // tp, bias)
    out["proj"] = Linear(f"{name}.attn.proj", md.heads * d // tp, h, bias)
    return out


def _attn_norms(md: TransformerModel, i: int, name: str) -> tuple[Param, ...]:
    """The norms inside attention: QK-norm's two (one head wide), MLA's two latent norms, a linear
    block's gated output norm."""
    if md.mla is not None:
        ml = md.mla
        return ((Param(f"{name}.attn.q_a_norm.weight", ml.q_lora_rank),) if ml.q_lora_rank else ()) + (
            Param(f"{name}.attn.kv_a_norm.weight", ml.kv_lora_rank),)
    if md.attention_kind(i) == "linear":
        la = md.linear_attention
        assert la is not None
        return (Param(f"{name}.attn.norm.weight", la.value_head_dim),
                Param(f"{name}.attn.conv1d.weight",
                      (2 * la.key_heads * la.key_head_dim + la.value_heads * la.value_head_dim) * la.conv_kernel),
                Param(f"{name}.attn.A_log", 2 * la.value_heads))
    if md.qk_norm:
        return (Param(f"{name}.attn.q_norm.weight", md.d_head), Param(f"{name}.attn.k_norm.weight", md.d_head))
    return ()


def block(s: Setup, i: int) -> Block:
    """Block ``i`` as one rank holds it."""
    md, tp = s.model, s.tp
    h, bias = md.hidden, md.has_bias
    gate = 2 if md.act == "swiglu" else 1
    name = f"h{i}"
    att = attention_linears(md, i, tp)
    fc1 = fc2 = None
    experts = None
    shared = None
    if md.is_moe_layer(i):
        assert md.moe is not None
        f = md.expert_ffn // s.expert_tp
        ebias = bias or md.moe.expert_bias
        experts = Experts(f"{name}.moe", Linear(f"{name}.moe.router", h, md.moe.experts, md.moe.expert_bias),
                          md.moe.experts // s.expert_ep, Linear(f"{name}.moe.fc1", h, gate * f, ebias),
                          Linear(f"{name}.moe.fc2", f, h, ebias))
        if md.shared_ffn:
            sf = md.shared_ffn // tp
            shared = (Linear(f"{name}.moe.shared.fc1", h, gate * sf, bias),
                      Linear(f"{name}.moe.shared.fc2", sf, h, bias))
    else:
        fc1 = Linear(f"{name}.mlp.fc1", h, gate * md.ffn // tp, bias)
        fc2 = Linear(f"{name}.mlp.fc2", md.ffn // tp, h, bias)
    return Block(i, name, norm_params(f"{name}.ln1", h, md.norm_kind), att["qkv"], att["proj"],
                 norm_params(f"{name}.ln2", h, md.norm_kind), fc1, fc2, experts, kind=md.attention_kind(i),
                 q_up=att.get("q_up"), kv_up=att.get("kv_up"), gates=att.get("gates"), indexer=att.get("indexer"),
                 shared=shared, attn_norms=_attn_norms(md, i, name))


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


def _block_params(md: TransformerModel, i: int) -> tuple[int, int]:
    """Block ``i``'s parameters (whole model, tp 1): all of them, and those of its experts a token skips."""
    h, bias = md.hidden, md.has_bias
    nb = 2 if md.norm_kind == "layernorm" else 1
    gate = 2 if md.act == "swiglu" else 1
    total = sum(lin.numel for lin in attention_linears(md, i, 1).values()) + 2 * nb * h
    total += sum(p.numel for p in _attn_norms(md, i, "x"))
    skipped = 0
    if md.is_moe_layer(i):
        assert md.moe is not None
        f = md.expert_ffn
        expert = _mlp_params(h, f, gate, bias or md.moe.expert_bias)
        total += h * md.moe.experts + md.moe.experts * expert + (_mlp_params(h, md.shared_ffn, gate, bias)
                                                                  if md.shared_ffn else 0)
        skipped = (md.moe.experts - md.moe.top_k) * expert
    else:
        total += _mlp_params(h, md.ffn, gate, bias)
    return total, skipped


def parameter_count(model: TransformerModel) -> int:
    """Parameters of the whole model, a tied output layer counted once (GPT-2 small: 124,439,808)."""
    md = model
    h = md.hidden
    nb = 2 if md.norm_kind == "layernorm" else 1
    total = sum(_block_params(md, i)[0] for i in range(md.layers))
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
        n -= sum(_block_params(md, i)[1] for i in range(md.layers))
    return n


def model_flops(model: TransformerModel, samples: int) -> float:
    """Useful FLOPs of one iteration of the whole job (forward + backward), the usual MFU convention.

    6 * N * tokens with N the parameters a token multiplies by (no position-embedding lookup; the
    tied token embedding counted once, as the output matmul; an MoE token only through its top_k
    experts), plus attention QK^T and AV counted as full (non-causal) matrices:
    12 * layers * samples * s^2 * hidden. Recomputation is not useful work and is not counted.
    """
    s = model.seq_len
    return 6.0 * active_matmul_params(model) * samples * s + 3.0 * samples * attention_flops(model, s)


def attention_flops(md: TransformerModel, s: int) -> float:
    """Forward FLOPs of QK^T and AV over one sequence of ``s`` tokens, as full matrices, summed over the
    blocks: ``2 s kv heads (d_qk + d_v)`` a block, ``kv`` the keys a query sees (``s``, a sliding
    window's at most, DSA's top-k at most); none in a linear-attention block (its recurrence is
    linear in ``s``). Plain attention: 4 s^2 hidden a block."""
    dqk = md.d_head
    dv = md.mla.v_head_dim if md.mla is not None else dqk
    total = 0.0
    for i in range(md.layers):
        kind = md.attention_kind(i)
        if kind == "linear":
            continue
        kv = min(s, md.sliding_window or s) if kind == "sliding" else s
        if md.sparse_attention is not None:
            kv = min(kv, md.sparse_attention.index_topk)
        total += 2.0 * s * kv * md.heads * (dqk + dv)
    return total
