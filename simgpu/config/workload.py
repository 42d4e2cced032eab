"""The workload file: which model, how it is trained and parallelised, on which platform.

Each field is documented; units are in the key names. Cross-field rules that involve the platform
(world size, memory fit) are checked in :mod:`simgpu.config.checks`, the one place for them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from .base import Spec

Precision = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]


ShardingType = Literal["table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel", "hybrid"]
#: Names of the plans the sharding planner proposes (see :mod:`simgpu.workload.dlrm.sharding`).
PlannerName = Literal["greedy_size", "greedy_lookups", "greedy_cost", "row_wise_large", "table_row_wise_large",
                      "column_wise_hot", "data_parallel_small", "hybrid_skewed"]


class IndexDistribution(Spec):
    """How a table's ids are drawn: ``uniform`` over its rows, or ``zipf`` (row k, counted from the
    most popular, has probability proportional to ``k ** -alpha``). It sets the index-reuse
    statistics of the lookup kernels; ids are assumed hashed, so hot rows are spread over row shards."""

    kind: Literal["uniform", "zipf"] = Field("uniform", description="uniform or zipf")
    alpha: Annotated[float, Field(gt=0)] = Field(1.05, description="zipf exponent (zipf only)")


class TableSpec(Spec):
    """One embedding table (or ``count`` identical ones)."""

    rows: PositiveInt = Field(description="number of rows (distinct ids)")
    dim: PositiveInt | None = Field(None, description="embedding dimension; default model.embedding_dim")
    pooling_factor: Annotated[float, Field(gt=0)] = Field(
        description="mean number of ids looked up per sample (bag size)")
    count: PositiveInt = Field(1, description="how many identical tables this entry stands for")
    distribution: IndexDistribution = Field(default_factory=lambda: IndexDistribution(),
                                            description="distribution of the ids looked up")


class TableGenerator(Spec):
    """Tables drawn at random from the run's seed: rows log-uniform in ``rows``, dims uniformly from
    ``dims``, pooling factor uniform in ``pooling``. They follow the tables given one by one."""

    count: PositiveInt = Field(description="how many tables to generate")
    rows: tuple[PositiveInt, PositiveInt] = Field(description="[min, max] rows, drawn log-uniformly")
    dims: list[PositiveInt] | None = Field(
        None, min_length=1, description="dims to choose from uniformly; default [model.embedding_dim]")
    pooling: tuple[Annotated[float, Field(gt=0)], Annotated[float, Field(gt=0)]] = Field(
        description="[min, max] pooling factor (ids per sample), drawn uniformly")
    distribution: IndexDistribution = Field(default_factory=lambda: IndexDistribution(),
                                            description="distribution of the ids of every generated table")

    @model_validator(mode="after")
    def _ranges(self) -> TableGenerator:
        for name in ("rows", "pooling"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ValueError(f"{name}: min {lo} is larger than max {hi}")
        return self


class DCNSpec(Spec):
    """DCNv2 cross layers over the concatenated dense and pooled features x0:
    ``x_{l+1} = x0 * (W x_l + b) + x_l``, with ``W = U V`` of rank ``low_rank`` when given."""

    layers: PositiveInt = Field(3, description="number of cross layers")
    low_rank: PositiveInt | None = Field(None, description="rank of the factorised W; null: full rank")


class TableSharding(Spec):
    """The sharding of one table. ``ranks``: table_wise, the one rank holding it; column_wise, one
    rank per column shard. ``shards``: column_wise without ranks, how many column shards (default
    shards of at least 32 columns, at most one per GPU). ``node``: table_row_wise, the node whose
    GPUs split its rows. ``frequent_rows``: hybrid, how many of its most-hit rows are replicated
    (default: HugeCTR's rule from the table's distribution, see :mod:`simgpu.workload.dlrm.hybrid`).
    Row-wise, data-parallel and hybrid tables span every GPU."""

    type: ShardingType = Field(
        description="table_wise, row_wise, column_wise, table_row_wise, data_parallel or hybrid")
    ranks: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, min_length=1, description="table_wise: [rank]; column_wise: a rank per column shard")
    shards: PositiveInt | None = Field(None, description="column_wise: number of column shards placed greedily")
    node: Annotated[int, Field(ge=0)] | None = Field(None, description="table_row_wise: the node holding the table")
    frequent_rows: NonNegativeInt | None = Field(
        None, description="hybrid: rows replicated on every GPU (its most-hit ones); default from its distribution")

    @model_validator(mode="after")
    def _fields_fit_type(self) -> TableSharding:
        if self.ranks is not None and self.type not in ("table_wise", "column_wise"):
            raise ValueError(f"ranks are for table_wise and column_wise tables; a {self.type} table spans "
                             f"every GPU" + (" of its node" if self.type == "table_row_wise" else ""))
        if self.type == "table_wise" and self.ranks is not None and len(self.ranks) != 1:
            raise ValueError(f"a table_wise table lives on one rank, got ranks {self.ranks}")
        if self.ranks is not None and len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"column shards need distinct ranks, got {self.ranks}")
        if self.shards is not None and (self.type != "column_wise" or self.ranks is not None):
            raise ValueError("shards is for column_wise tables without ranks")
        if self.node is not None and self.type != "table_row_wise":
            raise ValueError("node is for table_row_wise tables")
        if self.frequent_rows is not None and self.type != "hybrid":
            raise ValueError(f"frequent_rows is for hybrid tables; a {self.type} table has no frequent part")
        return self


class HybridSettings(Spec):
    """HugeCTR's settings of its hybrid embedding's frequent/infrequent split (its
    ``HybridEmbeddingParam``; defaults: HugeCTR's parser defaults, and the cap its MLPerf DLRM
    configs set). See :mod:`simgpu.workload.dlrm.hybrid` for the rule they enter."""

    all_to_all_gbytes_per_s: Annotated[float, Field(gt=0)] = Field(
        190.0, description="all-to-all bandwidth per GPU the rule assumes, GB/s (max_all_to_all_bandwidth 1.9e11)")
    all_reduce_gbytes_per_s: Annotated[float, Field(gt=0)] = Field(
        130.0, description="all-reduce bandwidth the rule assumes, GB/s (max_all_reduce_bandwidth 1.3e11)")
    efficiency_bandwidth_ratio: Annotated[float, Field(gt=0)] = Field(
        1.0, description="scales the across-nodes threshold (efficiency_bandwidth_ratio)")
    p_dup_max: Annotated[float, Field(gt=0, le=1)] = Field(
        0.01, description="one node: the largest chance a category is duplicated in one GPU's batch for it to "
                          "stay infrequent (p_dup_max)")
    max_frequent_per_batch: Annotated[float, Field(gt=0)] = Field(
        2.0, description="at most this many frequent rows over all hybrid tables per sample of the global batch "
                         "(max_num_frequent_categories)")


class EmbeddingSharding(Spec):
    """The embedding sharding plan, as TorchRec's: a sharding type per table and where its shards
    live. ``table_wise`` (a string) is short for ``{default: table_wise}``. Either the plan is given
    (``default`` for every table, ``tables`` for some by index, tables of ``count`` and generated
    ones numbered in order; shards without ranks placed greedily by ``balance``), or ``planner``
    names one of the plans the sharding planner proposes. Besides TorchRec's types, ``hybrid`` is
    HugeCTR's hybrid embedding (frequent rows replicated, the rest spread over every GPU).
    ``comm_precision`` and ``hybrid`` (the split's settings) apply to either."""

    default: ShardingType = Field("table_wise", description="sharding type of tables not in tables")
    balance: Literal["size", "lookups", "cost"] = Field(
        "size", description="what greedy placement balances: bytes, lookup traffic, or both")
    tables: dict[Annotated[int, Field(ge=0)], TableSharding] = Field(
        default_factory=dict, description="table index -> its sharding, overriding default")
    planner: PlannerName | None = Field(None, description="use the planner's plan of this name instead")
    hybrid: HybridSettings = Field(default_factory=lambda: HybridSettings(),
                                   description="how hybrid tables split into frequent and infrequent rows")
    comm_precision: Literal["fp32", "fp16", "bf16"] = Field(
        "fp32", description="dtype of pooled embeddings and their gradients in collectives (TorchRec's qcomms)")
    compute_kernel: Literal["fused", "per_table"] = Field(
        "fused", description="how lookups run: fused (FBGEMM's table-batched kernels with the optimizer fused in "
                             "the backward, TorchRec's default) or per_table (one nn.EmbeddingBag(sparse=True) per "
                             "table and an optimizer step on its sparse gradient, the reference DLRM's way)")

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any) -> Any:
        return {"default": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _hybrid_kernels(self) -> EmbeddingSharding:
        hybrid = self.default == "hybrid" or any(t.type == "hybrid" for t in self.tables.values())
        if self.compute_kernel == "per_table" and hybrid:
            raise ValueError("compute_kernel: per_table is TorchRec's and the reference DLRM's; hybrid tables run "
                             "HugeCTR's own kernels; expected compute_kernel: fused with hybrid tables")
        return self

    @model_validator(mode="after")
    def _planner_alone(self) -> EmbeddingSharding:
        if self.planner is not None and (self.tables or "default" in self.model_fields_set
                                         or "balance" in self.model_fields_set):
            raise ValueError("planner proposes the whole plan; give either planner or default/balance/tables")
        return self


class DLRMModel(Spec):
    """A DLRM: bottom MLP over dense features, embedding bags over sparse ones (one table per
    sparse feature), an interaction, then the top MLP."""

    kind: Literal["dlrm"]
    dense_features: PositiveInt = Field(13, description="number of dense input features")
    bottom_mlp: list[PositiveInt] = Field(
        min_length=1, description="bottom MLP layer widths; the last equals embedding_dim for dot")
    top_mlp: list[PositiveInt] = Field(min_length=1, description="top MLP layer widths; the last is usually 1")
    embedding_dim: PositiveInt = Field(description="default embedding dimension of the tables")
    tables: list[TableSpec] = Field(default_factory=list, description="embedding tables given one by one")
    generate: TableGenerator | None = Field(None, description="embedding tables drawn from the run's seed")
    interaction: Literal["dot", "cat", "dcn"] = Field(
        "dot", description="feature interaction: pairwise dot products, concatenation, or DCNv2 cross layers")
    dcn: DCNSpec | None = Field(None, description="the cross layers (interaction: dcn only)")

    @model_validator(mode="after")
    def _consistent(self) -> DLRMModel:
        if not self.tables and self.generate is None:
            raise ValueError("at least one embedding table is needed: give tables or generate")
        if self.interaction == "dot":
            d = self.bottom_mlp[-1]
            if d != self.embedding_dim:
                raise ValueError(
                    f"bottom_mlp must end in embedding_dim ({self.embedding_dim}) for the dot "
                    f"interaction, got {d}")
            dims = {t.dim or self.embedding_dim for t in self.tables}
            if self.generate is not None:
                dims |= set(self.generate.dims or [self.embedding_dim])
            if dims - {d}:
                raise ValueError(f"the dot interaction needs every table's dim to equal bottom_mlp[-1] ({d}), "
                                 f"got dims {sorted(dims)}")
        if (self.interaction == "dcn") != (self.dcn is not None):
            raise ValueError("interaction: dcn needs a dcn section, and a dcn section needs interaction: dcn")
        return self

    @property
    def table_count(self) -> int:
        """Tables after expanding ``count`` and generation."""
        return sum(t.count for t in self.tables) + (self.generate.count if self.generate else 0)


#: Defaults each architecture gives the fields left unset: (activation, norm, position, bias, tied).
ARCH_DEFAULTS: dict[str, tuple[str, str, str, bool, bool]] = {
    "gpt": ("gelu", "layernorm", "learned", True, True),
    "llama": ("swiglu", "rmsnorm", "rope", False, False),
    "bert": ("gelu", "layernorm", "learned", True, True),
}


class MoESpec(Spec):
    """Mixture of experts: the MLP of every ``every``-th block is ``experts`` MLPs and a router that
    sends each token to its ``top_k`` best experts (tokens assumed spread evenly over experts)."""

    experts: Annotated[int, Field(ge=2)] = Field(description="experts per MoE block")
    top_k: PositiveInt = Field(2, description="experts each token is routed to")
    capacity_factor: Annotated[float, Field(gt=0)] | None = Field(
        None, description="expert capacity as a multiple of the even share (tokens beyond it are dropped, "
                          "short experts padded); null: dropless")
    every: PositiveInt = Field(1, description="an MoE MLP in every `every`-th block (1: all blocks)")
    expert_ffn_hidden: PositiveInt | None = Field(
        None, description="inner width of each expert; default model.ffn_hidden")
    shared_experts: NonNegativeInt = Field(
        0, description="shared experts every token passes through beside its routed ones (DeepSeek's "
                       "n_shared_experts), run as one dense MLP of shared_ffn_hidden")
    shared_ffn_hidden: PositiveInt | None = Field(
        None, description="inner width of the shared experts together; default shared_experts x the expert width "
                          "(Qwen's shared_expert_intermediate_size)")
    first_dense: NonNegativeInt = Field(
        0, description="the first blocks whose MLPs are dense (model.ffn_hidden wide), not MoE (DeepSeek's "
                       "first_k_dense_replace)")
    expert_bias: bool = Field(False, description="the experts' linears have biases (gpt-oss)")
    skew: Annotated[float, Field(ge=0)] = Field(
        0.0, description="routing load imbalance: exponent of a power law of tokens over experts (0: balanced); "
                         "the busiest expert-parallel rank sets the MoE layer's time")

    @model_validator(mode="after")
    def _top_k_fits(self) -> MoESpec:
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) cannot exceed experts ({self.experts})")
        if self.shared_ffn_hidden is not None and not self.shared_experts:
            raise ValueError("shared_ffn_hidden is the shared experts' width; expected shared_experts >= 1")
        return self


class MLASpec(Spec):
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi K2, GLM-5): queries through a low-rank
    ``q_lora_rank`` projection (none: a full one), keys and values through one latent of
    ``kv_lora_rank`` per token plus a shared rotary key of ``qk_rope_head_dim``; each head's query
    and key are ``qk_nope_head_dim + qk_rope_head_dim`` wide, its value ``v_head_dim``. The KV cache
    holds the latent and the rotary key only. Prefill expands the latent into per-head keys and
    values; decode absorbs the key and value up-projections into the query and output (two batched
    GEMMs a layer) and attends over the latent directly."""

    q_lora_rank: PositiveInt | None = Field(None, description="rank of the query's low-rank projection; null: full")
    kv_lora_rank: PositiveInt = Field(description="width of the compressed key/value latent per token")
    qk_nope_head_dim: PositiveInt = Field(description="per-head query/key width without rotary embedding")
    qk_rope_head_dim: PositiveInt = Field(description="per-head query/key width with rotary embedding (shared key)")
    v_head_dim: PositiveInt = Field(description="per-head value width")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent(self) -> int:
        """Elements cached per token and layer: the latent and the rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


class SparseAttentionSpec(Spec):
    """DeepSeek sparse attention (DSA; DeepSeek-V3.2, GLM-5) over MLA: a lightning indexer of
    ``index_heads`` heads of ``index_head_dim`` scores every cached token, and each query attends to
    its ``index_topk`` best only. The indexer's keys are cached beside the latent."""

    index_topk: PositiveInt = Field(2048, description="keys each query attends to")
    index_heads: PositiveInt = Field(64, description="indexer heads")
    index_head_dim: PositiveInt = Field(128, description="indexer head width (its cached key per token)")


class LinearAttentionSpec(Spec):
    """Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): per block, a short causal convolution
    over the projected queries, keys and values, then the gated delta rule's recurrence, whose state
    per request is ``value_heads x key_head_dim x value_head_dim`` whatever the context's length (no KV
    cache), then a gated RMSNorm and the output projection."""

    key_heads: PositiveInt = Field(description="query/key heads (linear_num_key_heads)")
    value_heads: PositiveInt = Field(description="value heads (linear_num_value_heads)")
    key_head_dim: PositiveInt = Field(128, description="query/key head width")
    value_head_dim: PositiveInt = Field(128, description="value head width")
    conv_kernel: PositiveInt = Field(4, description="width of the causal convolution (its state is cached too)")

    @model_validator(mode="after")
    def _heads(self) -> LinearAttentionSpec:
        if self.value_heads % self.key_heads:
            raise ValueError(f"value_heads ({self.value_heads}) must be a multiple of key_heads ({self.key_heads})")
        return self

    def state_elements(self) -> int:
        """Elements of one request's recurrent and convolution state in one block."""
        conv = ((2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim)
                * (self.conv_kernel - 1))
        return self.value_heads * self.key_head_dim * self.value_head_dim + conv


#: The attention of a block: full (causal) attention, a sliding window, or linear attention.
AttentionKind = Literal["full", "sliding", "linear"]


class TransformerModel(Spec):
    """A Transformer: GPT (decoder, learned positions, GELU, LayerNorm), LLaMA (decoder, RoPE,
    SwiGLU, RMSNorm, grouped-query attention, no biases) or BERT (bidirectional encoder with an MLM
    head); ``moe`` turns its MLPs into mixtures of experts. Unset style fields take the arch's value."""

    kind: Literal["transformer"]
    arch: Literal["gpt", "llama", "bert"] = Field(
        "gpt", description="gpt (causal decoder), llama (causal decoder) or bert (bidirectional encoder, MLM head)")
    layers: PositiveInt = Field(description="number of Transformer blocks")
    hidden: PositiveInt = Field(description="model width (d_model)")
    heads: PositiveInt = Field(description="attention (query) heads")
    kv_heads: PositiveInt | None = Field(
        None, description="key/value heads (grouped-query attention); default heads (multi-head attention)")
    ffn_hidden: PositiveInt | None = Field(
        None, description="MLP inner width; default 4 * hidden (gelu) or LLaMA's 2/3 * 4 * hidden rounded up "
                          "to a multiple of 256 (swiglu)")
    seq_len: PositiveInt = Field(description="tokens per sample")
    vocab: PositiveInt = Field(description="vocabulary size (padded up to a multiple of tp when split)")
    activation: Literal["gelu", "swiglu"] | None = Field(None, description="MLP activation; default by arch")
    norm: Literal["layernorm", "rmsnorm"] | None = Field(None, description="normalisation; default by arch")
    position: Literal["learned", "rope"] | None = Field(
        None, description="learned position embeddings or rotary (RoPE); default by arch")
    bias: bool | None = Field(None, description="linear layers have biases; default by arch")
    tied_embeddings: bool | None = Field(
        None, description="the output layer shares the token embedding; default by arch")
    attention: Literal["flash", "unfused"] = Field(
        "flash", description="flash (fused, scores never stored) or unfused (Megatron core attention: "
                             "bmm, fused softmax where its kernel takes the shape (else PyTorch's in fp32), dropout, "
                             "bmm over stored scores)")
    dropout: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.0, description="dropout probability of hidden states and attention probabilities (0: none)")
    moe: MoESpec | None = Field(None, description="mixture of experts; null: dense MLPs")
    head_dim: PositiveInt | None = Field(
        None, description="width of each attention head; default hidden / heads (Qwen3, gpt-oss and others set "
                          "their own)")
    qk_norm: bool = Field(False, description="an RMSNorm over each head's query and key before RoPE (Qwen3)")
    attention_output_gate: bool = Field(
        False, description="a sigmoid gate on the attention output, projected with the query (Qwen3.5's "
                           "attn_output_gate)")
    mla: MLASpec | None = Field(None, description="multi-head latent attention instead of grouped-query attention")
    sparse_attention: SparseAttentionSpec | None = Field(
        None, description="DeepSeek sparse attention over MLA (an indexer picks the keys each query attends to)")
    layer_types: list[AttentionKind] | None = Field(
        None, min_length=1, description="the attention of each block: full, sliding (a window of sliding_window "
                                        "keys) or linear (linear_attention); a list shorter than layers repeats, "
                                        "a longer one gives the first blocks'; default full everywhere")
    sliding_window: PositiveInt | None = Field(None, description="keys a sliding-window block attends to")
    attention_sinks: bool = Field(
        False, description="a learned per-head sink logit joins each softmax (gpt-oss); timed as the attention it "
                           "belongs to")
    linear_attention: LinearAttentionSpec | None = Field(
        None, description="the linear attention of blocks whose layer type is linear (Gated DeltaNet)")
    config: str | None = Field(
        None, description="a Hugging Face config.json this model was read from (a path relative to the workload "
                          "file); the fields given here override the file's")

    @model_validator(mode="after")
    def _heads_divide(self) -> TransformerModel:
        if self.head_dim is None and self.mla is None and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads}), or head_dim given")
        if self.heads % self.kv_heads_n:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads_n})")
        kinds = set(self.layer_types or ())
        if self.layer_types is not None and self.layers % len(self.layer_types) and len(self.layer_types) < self.layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries; expected one per block (the first "
                             f"layers are used), or a pattern that divides layers ({self.layers})")
        if "sliding" in kinds and self.sliding_window is None:
            raise ValueError("layer_types has sliding blocks; expected sliding_window (keys each attends to)")
        if "linear" in kinds and self.linear_attention is None:
            raise ValueError("layer_types has linear blocks; expected a linear_attention section")
        if self.linear_attention is not None and "linear" not in kinds:
            raise ValueError("linear_attention describes the linear blocks; expected layer_types naming some linear")
        if self.sparse_attention is not None and self.mla is None:
            raise ValueError("sparse_attention (DSA) runs over multi-head latent attention; expected an mla section")
        if self.mla is not None and (self.kv_heads not in (None, self.heads) or kinds - {"full"}):
            raise ValueError("mla replaces grouped-query attention in every block; expected no kv_heads and no "
                             "sliding or linear layer_types")
        if self.moe is not None and self.moe.first_dense >= self.layers:
            raise ValueError(f"moe.first_dense ({self.moe.first_dense}) leaves no MoE block of {self.layers}")
        return self

    def attention_kind(self, layer: int) -> str:
        """The attention of block ``layer`` (0-based): full, sliding or linear."""
        if self.layer_types is None:
            return "full"
        return self.layer_types[layer % len(self.layer_types)]

    def count_kind(self, kind: str) -> int:
        """Blocks whose attention is ``kind``."""
        return sum(self.attention_kind(i) == kind for i in range(self.layers))

    def _default(self, i: int) -> str | bool:
        return ARCH_DEFAULTS[self.arch][i]

    @property
    def act(self) -> str:
        return self.activation or str(self._default(0))

    @property
    def norm_kind(self) -> str:
        return self.norm or str(self._default(1))

    @property
    def rope(self) -> bool:
        return (self.position or self._default(2)) == "rope"

    @property
    def has_bias(self) -> bool:
        return bool(self._default(3)) if self.bias is None else self.bias

    @property
    def tied(self) -> bool:
        return bool(self._default(4)) if self.tied_embeddings is None else self.tied_embeddings

    @property
    def causal(self) -> bool:
        return self.arch != "bert"

    @property
    def kv_heads_n(self) -> int:
        return self.kv_heads or self.heads

    @property
    def d_head(self) -> int:
        """Width of each attention head: ``head_dim``, else hidden / heads (under MLA, the query/key's)."""
        if self.mla is not None:
            return self.mla.qk_head_dim
        return self.head_dim or self.hidden // self.heads

    @property
    def ffn(self) -> int:
        if self.ffn_hidden:
            return self.ffn_hidden
        if self.act == "swiglu":
            return -(-(8 * self.hidden // 3) // 256) * 256
        return 4 * self.hidden

    @property
    def expert_ffn(self) -> int:
        return (self.moe.expert_ffn_hidden if self.moe else None) or self.ffn

    @property
    def shared_ffn(self) -> int:
        """Inner width of the shared experts' MLP (0: none)."""
        if self.moe is None or not self.moe.shared_experts:
            return 0
        return self.moe.shared_ffn_hidden or self.moe.shared_experts * self.expert_ffn

    def is_moe_layer(self, layer: int) -> bool:
        """Whether block ``layer`` (0-based) has an MoE MLP: past the ``moe.first_dense`` dense blocks, the
        last of every ``moe.every`` blocks."""
        return (self.moe is not None and layer >= self.moe.first_dense and (layer + 1) % self.moe.every == 0)


class TransformerInferenceModel(TransformerModel):
    """A Transformer served for inference (:mod:`simgpu.workload.inference`): the same fields as a
    ``transformer`` model; ``seq_len`` is the longest context one request may reach (prompt and
    output tokens), which its KV cache must hold."""

    kind: Literal["transformer_inference"]  # type: ignore[assignment]


class DLRMInferenceModel(DLRMModel):
    """A DLRM answering queries (:mod:`simgpu.workload.inference.dlrm`): its forward only, over the
    tables sharded as the training plans shard them."""

    kind: Literal["dlrm_inference"]  # type: ignore[assignment]


#: Model kinds that are served: their workload has an ``inference`` section instead of ``training``.
INFERENCE_KINDS = ("transformer_inference", "dlrm_inference")

Model = Annotated[DLRMModel | TransformerModel | TransformerInferenceModel | DLRMInferenceModel,
                  Field(discriminator="kind")]

InferencePrecision = Literal["fp32", "bf16", "fp16", "fp8", "fp8_block", "mxfp8", "fp4", "nvfp4", "mxfp4", "w4a16",
                             "int4"]


class Inference(Spec):
    """How an inference deployment runs one iteration, and the batch ``simgpu run`` simulates.

    The iteration's batch (on each model replica): ``prefill_requests`` requests each processing
    ``prompt_tokens`` new prompt tokens over ``cached_tokens`` already in their KV cache (earlier
    chunks of a chunked prefill), and ``decode_requests`` requests each adding one token over a KV
    cache of ``context_tokens``. A DLRM takes ``batch_per_gpu`` queries per GPU instead. The memory
    plan reserves activations for ``max_batch_tokens`` and leaves the rest of
    ``gpu_memory_utilization`` of each GPU to the KV cache, in blocks of ``block_tokens``.
    """

    precision: InferencePrecision = Field(
        "bf16", description="dtype of the weights and of the matmuls: bf16, fp16, fp32; fp8 (per tensor), fp8_block "
                            "(128x128 blocks), mxfp8, fp4 (NVFP4, also nvfp4), mxfp4, w4a16 (4-bit weights, 16-bit "
                            "activations: int4 AWQ, also int4); see simgpu.precision")
    moe_precision: InferencePrecision | None = Field(
        None, description="dtype of the experts' weights and matmuls; default precision (gpt-oss: mxfp4 experts "
                          "beside bf16 attention)")
    kv_dtype: Literal["bf16", "fp16", "fp8"] | None = Field(
        None, description="dtype of the KV cache; default fp8 under fp8 / fp4 precision, else bf16 (fp16 for fp16)")
    prefill_requests: NonNegativeInt = Field(0, description="requests prefilling in the iteration")
    prompt_tokens: PositiveInt = Field(512, description="new prompt tokens of each prefilling request")
    cached_tokens: NonNegativeInt = Field(
        0, description="tokens already in each prefilling request's KV cache (earlier chunks)")
    decode_requests: NonNegativeInt = Field(0, description="requests decoding one token in the iteration")
    context_tokens: PositiveInt = Field(512, description="tokens in each decoding request's KV cache")
    batch_per_gpu: PositiveInt | None = Field(None, description="queries per GPU per iteration (DLRM only)")
    max_batch_tokens: PositiveInt = Field(
        8192, description="most tokens one iteration processes (activations are reserved for it)")
    max_batch_size: PositiveInt = Field(256, description="most requests one iteration holds")
    block_tokens: PositiveInt = Field(16, description="tokens per KV-cache block (paged attention; vLLM's 16)")
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = Field(
        0.9, description="share of each GPU's memory the server may use (vLLM's gpu_memory_utilization)")
    host_overhead_us: Annotated[float, Field(ge=0)] | None = Field(
        None, description="CPU time the serving framework spends per launched op, us; default: the "
                          "platform's host.launch_us")
    iteration_overhead_us: Annotated[float, Field(ge=0)] = Field(
        0.0, description="CPU time per iteration outside the ops (scheduling, input preparation, "
                         "detokenisation), us")
    framework: Literal["vllm", "tensorrt_llm", "sglang"] = Field(
        "vllm", description="which kernels are fused: vllm (the residual add into the next RMSNorm; RoPE, the KV-cache "
                            "write and SwiGLU as kernels of their own), sglang (the same fusions as vllm: "
                            "fused_add_rmsnorm, silu_and_mul, RoPE and the cache write apart) or tensorrt_llm (also "
                            "RoPE and the KV-cache write into attention, SwiGLU and the fp8 / fp4 quantisation of "
                            "activations into the GEMMs' epilogues)")
    request_overhead_us: Annotated[float, Field(ge=0)] = Field(
        0.0, description="further CPU time per iteration per request in its batch (the request's inputs, "
                         "block table, sampling and detokenisation), us")
    prefill_block_overhead_us: Annotated[float, Field(ge=0)] = Field(
        0.0, description="further CPU time per block of an iteration that prefills (the prompts' attention "
                         "metadata and bias built at every layer), us; the GPUs work through queued kernels meanwhile")
    cuda_graphs: bool = Field(
        False, description="decode-only iterations replay a captured CUDA graph: one launch for all their ops")

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            from ..precision import ALIASES
            data = {k: ALIASES.get(v, v) if k in ("precision", "moe_precision") and isinstance(v, str) else v
                    for k, v in data.items()}
        return data

    @property
    def kv(self) -> str:
        if self.kv_dtype is not None:
            return self.kv_dtype
        return ("fp8" if self.precision in ("fp8", "fp8_block", "mxfp8", "fp4", "mxfp4") else
                "fp16" if self.precision == "fp16" else "bf16")

    @property
    def experts_precision(self) -> str:
        return self.moe_precision or self.precision


class Training(Spec):
    """How one iteration is run.

    Batch: ``micro_batch`` (or its older name ``batch_per_gpu``, give one) is the samples of one
    micro-batch of one model replica (Megatron's --micro-batch-size). Each data-parallel replica runs
    ``grad_accumulation`` micro-batches per iteration, so ``global_batch`` = micro_batch x dp x
    grad_accumulation; give at most one of the two (default one micro-batch: under pure data
    parallelism ``batch_per_gpu`` is then the samples per GPU per iteration, as before).
    """

    batch_per_gpu: PositiveInt = Field(
        description="samples per micro-batch of each data-parallel replica (= micro_batch; under pure data "
                    "parallelism without accumulation, samples per GPU per iteration)")
    micro_batch: PositiveInt | None = Field(
        None, description="samples per micro-batch of one model replica (Megatron --micro-batch-size); "
                          "the same number as batch_per_gpu, give one of them")
    global_batch: PositiveInt | None = Field(
        None, description="samples per iteration over the whole job (Megatron --global-batch-size); a multiple "
                          "of micro_batch x dp; default micro_batch x dp x grad_accumulation")
    grad_accumulation: PositiveInt | None = Field(
        None, description="micro-batches per iteration of each data-parallel replica (give this or global_batch)")
    precision: Precision = Field(
        "fp32", description="compute precision of matmuls (mixed precision keeps fp32 master weights)")
    optimizer: Literal["sgd", "adam", "adagrad"] = Field("adam", description="dense optimizer")
    embedding_optimizer: Literal["sgd", "adagrad"] = Field(
        "sgd", description="fused optimizer applied in the embedding backward (DLRM)")
    recompute: Literal["none", "selective", "full"] = Field(
        "none", description="activation recomputation (Transformer): none, selective (attention core) or full "
                            "(every block re-runs its forward in backward)")
    framework: Literal["pytorch", "megatron", "nvidia_dlrm"] = Field(
        "pytorch", description="conventions of the program: pytorch (Transformer: autocast casts fp32 weights "
                               "each forward, DDP/FSDP; DLRM: TorchRec's sharded embeddings), megatron "
                               "(Transformer: low-precision weights with fp32 main params and grads, fused "
                               "kernels, batched P2P with a device sync) or nvidia_dlrm (DLRM: NVIDIA's PyTorch "
                               "DLRM of DeepLearningExamples and MLPerf v0.7: whole tables placed by size, the "
                               "bottom MLP on GPU 0, one all-to-all, fused interaction and embedding kernels)")
    input_mbytes_per_s: PositiveFloat | None = Field(
        None, description="(nvidia_dlrm) the rate, MB/s, at which one GPU's process reads and stages its input "
                          "batch on the host, one batch ahead of the GPU; None: input reading is not modelled")
    cuda_graphs: bool = Field(
        False, description="the iteration is captured in a CUDA graph and launched at once: no op pays the host's "
                           "per-launch time (nvidia_dlrm's --cuda_graphs)")
    sync_each_layer: bool = Field(
        False, description="the host synchronises with the GPU at the start and end of every block's forward and "
                           "backward (Megatron-DeepSpeed --synchronize-each-layer, DeepSpeed checkpointing's "
                           "synchronize)")
    steady_state: Literal["auto", "always", "never", "check"] = Field(
        "auto", description="how the reported iteration is found: auto simulates two iterations and reports the "
                            "second where work crosses the iteration boundary (overlap_param_gather), one "
                            "isolated iteration otherwise; always: two iterations in every case; never: one "
                            "isolated iteration (what crosses the boundary is then exposed at its end); check: "
                            "three iterations, the third reported, the summary giving the second's and third's "
                            "lengths and how far each iteration's tail (its step and what follows) is from the one "
                            "before (is the second, which auto and always report, already steady?)")
    host_overhead_us: Annotated[float, Field(ge=0)] | None = Field(
        None, description="CPU time the framework spends per launched op (Python, dispatcher, autograd), us; "
                          "default: the platform's host.launch_us")

    @model_validator(mode="before")
    @classmethod
    def _micro_batch_alias(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("micro_batch") is not None:
            if data.get("batch_per_gpu") is None:
                return {**data, "batch_per_gpu": data["micro_batch"]}
            if data["batch_per_gpu"] != data["micro_batch"]:
                raise ValueError(f"micro_batch ({data['micro_batch']}) and batch_per_gpu ({data['batch_per_gpu']}) "
                                 "name the same number; give one of them")
        return data

    @model_validator(mode="after")
    def _one_batch_rule(self) -> Training:
        if self.global_batch is not None and self.grad_accumulation is not None:
            raise ValueError("give global_batch or grad_accumulation, not both")
        return self


class UserbufferSMs(Spec):
    """SMs the communication kernel of each Transformer Engine userbuffers overlap takes beside its GEMM
    (the ub config's ``num_sm`` per layer). Defaults: Transformer Engine's ``initialize_ub``, 16 for
    "bulk" and "pipeline" (transformer_engine/pytorch/module/base.py). NeMo's GPT-3 175B bf16 config
    (nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py,
    ``userbuffers_bf16_h100_h12288_tp4_mbs1_seqlen2048``): qkv_dgrad 4, qkv_wgrad 4, fc1_dgrad 2,
    fc1_wgrad 4, proj_fprop 24 (fc2_fprop is a ring exchange there, not modelled: pipeline here)."""

    qkv_dgrad: PositiveInt = Field(16, description="bulk: the input's all-gather beside the qkv dgrad GEMM")
    qkv_wgrad: PositiveInt = Field(16, description="bulk: the input gradient's reduce-scatter beside the qkv wgrad "
                                                   "GEMM")
    fc1_dgrad: PositiveInt = Field(16, description="bulk: the input's all-gather beside the fc1 dgrad GEMM")
    fc1_wgrad: PositiveInt = Field(16, description="bulk: the input gradient's reduce-scatter beside the fc1 wgrad "
                                                   "GEMM")
    proj_fprop: PositiveInt = Field(16, description="pipeline: each chunk's reduce-scatter beside the next proj "
                                                    "GEMM chunk")
    fc2_fprop: PositiveInt = Field(16, description="pipeline: each chunk's reduce-scatter beside the next fc2 GEMM "
                                                   "chunk")


class Parallelism(Spec):
    """How the job is split over GPUs, as Megatron-LM does it: tensor (tp, innermost: consecutive
    ranks of a node), context (cp), data (dp, with experts sharded over ep of its ranks) and pipeline
    (pp, outermost) parallelism; tp * cp * dp * pp is the world size and ``dp`` defaults to the rest."""

    dp: PositiveInt | None = Field(
        None, description="data-parallel degree; default world size / (tp * pp * cp)")
    tp: PositiveInt = Field(1, description="tensor-parallel degree (Megatron column/row splits)")
    pp: PositiveInt = Field(1, description="pipeline-parallel degree (stages)")
    cp: PositiveInt = Field(1, description="context-parallel degree (the sequence split over ranks)")
    ep: PositiveInt = Field(1, description="expert-parallel degree (experts split over ep data-parallel ranks); "
                                           "served: short for attention_dp = moe_ep = ep")
    attention_dp: PositiveInt | None = Field(
        None, description="served MoE models: attention data parallelism, ranks of a replica each running attention "
                          "for its own requests with its own KV cache (TensorRT-LLM's enable_attention_dp, SGLang's "
                          "dp-attention); tp x attention_dp GPUs a pipeline stage; default ep")
    moe_tp: PositiveInt | None = Field(
        None, description="served MoE models: ranks each expert is split over; moe_tp x moe_ep = tp x attention_dp; "
                          "default tp")
    moe_ep: PositiveInt | None = Field(
        None, description="served MoE models: ranks the experts are spread over; default attention_dp")
    sp: bool = Field(False, description="sequence parallelism: all-gather / reduce-scatter instead of the tp "
                                        "all-reduces, norms and dropout on 1/tp of the tokens (needs tp > 1)")
    zero: Literal[0, 1, 2, 3] = Field(
        0, description="ZeRO stage over the data-parallel ranks: 0 replicated (DDP), 1 optimizer states, "
                       "2 and gradients, 3 and parameters (all-gathered per block, FSDP)")
    fsdp: bool = Field(False, description="PyTorch FSDP full sharding: the same as zero: 3")
    # FSDP's prefetch and rate limiter, as torch.distributed.fsdp.FullyShardedDataParallel's arguments of
    # the same names (PyTorch docs, "FullyShardedDataParallel" and "FSDP Notes: FSDP Prefetch Nuances";
    # torch/distributed/fsdp/_limiter_utils.py for the limit of two); zero: 3 only.
    forward_prefetch: bool = Field(
        False, description="zero 3 / FSDP: the next unit's all-gather is issued before this unit's forward "
                           "kernels (explicit prefetch) instead of after them (implicit prefetch: a separate "
                           "stream still lets it run under this unit's compute); PyTorch FSDP forward_prefetch, "
                           "default False")
    backward_prefetch: Literal["backward_pre", "backward_post", "none"] = Field(
        "backward_pre", description="zero 3 / FSDP: when the backward all-gathers the next unit (in backward "
                                    "order): backward_pre before this unit's gradient computation (it runs under "
                                    "it), backward_post after it, before this unit's reduce-scatter (exposed; "
                                    "the reduce-scatter runs under the next unit), none when the next unit's "
                                    "backward starts, behind this unit's reduce-scatter on the process group's "
                                    "NCCL stream (no overlap); PyTorch FSDP backward_prefetch, default "
                                    "BackwardPrefetch.BACKWARD_PRE")
    limit_all_gathers: bool = Field(
        True, description="zero 3 / FSDP's rate limiter: before issuing an all-gather the CPU waits for the "
                          "older of the two last units' frees, so at most two units are gathered at once; "
                          "false: the CPU issues all-gathers as far ahead as it runs (every unit gathered at "
                          "once in the memory estimate); PyTorch FSDP limit_all_gathers, default True")
    reshard_after_forward: bool = Field(
        True, description="zero 3 / FSDP: free each unit's gathered parameters after its forward and all-gather "
                          "them again in backward (ZeRO-3, FULL_SHARD); false: keep them from the forward to "
                          "the backward (ZeRO-2 style, SHARD_GRAD_OP): no backward all-gathers, the stage's "
                          "unsharded weights held; PyTorch FSDP2 fully_shard reshard_after_forward, default True")
    pp_schedule: Literal["1f1b", "gpipe", "interleaved"] = Field(
        "1f1b", description="pipeline schedule: 1f1b, gpipe (all forwards, then all backwards) or interleaved "
                            "1F1B over virtual_stages model chunks per stage")
    virtual_stages: PositiveInt = Field(1, description="model chunks per pipeline stage (interleaved only)")
    account_for_embedding_and_loss: bool = Field(
        False, description="the embedding and the loss count as a block each when the blocks are split over the "
                           "pipeline's chunks, so the first and the last chunk hold one block fewer (Megatron-core's "
                           "account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split); "
                           "layers + 2 must divide into pp x virtual_stages chunks")
    cp_comm: Literal["ring", "all_gather"] = Field(
        "ring", description="context parallelism: ring (K/V passed around the ring, overlapping attention) or "
                            "all_gather (K/V all-gathered per block)")
    dp_overlap: bool = Field(
        True, description="reduce gradient buckets while backward runs (DDP; Megatron's overlap_grad_reduce, "
                          "which may be given by that name instead: all-reduce, or reduce-scatter per bucket "
                          "under the distributed optimizer); false: after the backward. Default true as PyTorch "
                          "DDP and NeMo (overlap_grad_sync: True); Megatron-LM's --overlap-grad-reduce is off "
                          "unless given")
    gradient_as_bucket_view: bool = Field(
        False, description="PyTorch DDP (zero: 0, framework: pytorch): gradients are views into the all-reduce "
                           "buckets; false, DDP's default: each bucket's gradients are copied into it before its "
                           "all-reduce and back after it (a copy kernel each way per bucket) and the buckets take "
                           "as much memory again as the gradients (torch.nn.parallel.DistributedDataParallel "
                           "gradient_as_bucket_view, default False)")
    overlap_param_gather: bool = Field(
        False, description="the distributed optimizer (zero: 1 or 2) all-gathers the updated parameters per "
                           "bucket after the optimizer step without waiting, and the next iteration's forward "
                           "waits for each bucket's all-gather before the layers that use it (Megatron-LM "
                           "--overlap-param-gather, default off; NeMo overlap_param_sync, on in its GPT recipes); "
                           "false: the step waits for every all-gather")

    overlap_p2p_comm: bool = Field(
        False, description="pipeline sends and receives issued one by one (not batched) and waited for on the GPU "
                           "by the step that needs them, with no host synchronisation, so they overlap the "
                           "compute around them (Megatron-LM --overlap-p2p-communication, default off, which "
                           "turns batch_p2p_comm off; interleaved schedule only); false: Megatron's batched "
                           "isend/irecv and a host wait before each step")
    tp_comm_overlap: bool = Field(
        False, description="Transformer Engine's userbuffers overlap of the tensor-parallel all-gather and "
                           "reduce-scatter with the GEMMs beside them (Megatron-core / NeMo tp_comm_overlap, default "
                           "off; NeMo's GPT and LLaMA recipes turn it on): the forward all-gather as a ring exchange "
                           "with a GEMM chunk per step, the reduce-scatter after GEMM chunks; needs sp and tp > 1")

    tp_comm_overlap_sms: UserbufferSMs = Field(
        default_factory=lambda: UserbufferSMs(),
        description="under tp_comm_overlap, the SMs each overlap's communication kernel takes beside its GEMM, per "
                    "layer (the ub config's num_sm; Transformer Engine's defaults, 16)")

    sharding: EmbeddingSharding = Field(default_factory=lambda: EmbeddingSharding(),
                                        description="embedding sharding plan (DLRM)")

    @model_validator(mode="before")
    @classmethod
    def _megatron_names(cls, data: Any) -> Any:
        if isinstance(data, dict) and "overlap_grad_reduce" in data:
            data = dict(data)
            value = data.pop("overlap_grad_reduce")
            if "dp_overlap" in data and data["dp_overlap"] != value:
                raise ValueError("overlap_grad_reduce is Megatron's name of dp_overlap; expected one of them, "
                                 "or both equal")
            data["dp_overlap"] = value
        return data

    @model_validator(mode="after")
    def _zero_or_fsdp(self) -> Parallelism:
        if self.overlap_param_gather and self.zero_stage not in (1, 2):
            raise ValueError(f"overlap_param_gather is the distributed optimizer's; expected zero: 1 or 2, got "
                             f"zero: {self.zero_stage}")
        if self.overlap_p2p_comm and self.pp_schedule != "interleaved":
            raise ValueError(f"overlap_p2p_comm is Megatron's for the interleaved schedule; expected pp_schedule: "
                             f"interleaved, got {self.pp_schedule}")
        if self.tp_comm_overlap and not (self.sp and self.tp > 1):
            raise ValueError(f"tp_comm_overlap overlaps sequence parallelism's all-gathers and reduce-scatters; "
                             f"expected sp: true and tp > 1, got sp: {str(self.sp).lower()}, tp: {self.tp}")
        if self.fsdp and self.zero not in (0, 3):
            raise ValueError(f"fsdp is ZeRO stage 3; it contradicts zero: {self.zero}; expected zero: 3 or no fsdp")
        if self.gradient_as_bucket_view and self.zero_stage != 0:
            raise ValueError(f"gradient_as_bucket_view is PyTorch DDP's; expected zero: 0, got zero: {self.zero_stage}")
        if "tp_comm_overlap_sms" in self.model_fields_set and not self.tp_comm_overlap:
            raise ValueError("tp_comm_overlap_sms are the SMs of userbuffers' overlaps; expected tp_comm_overlap: "
                             "true")
        fsdp_keys = [k for k in ("forward_prefetch", "backward_prefetch", "limit_all_gathers", "reshard_after_forward")
                     if k in self.model_fields_set]
        if fsdp_keys and self.zero_stage != 3:
            raise ValueError(f"{fsdp_keys[0]} is FSDP's (ZeRO stage 3); expected zero: 3 or fsdp: true, got "
                             f"zero: {self.zero}")
        return self

    @property
    def zero_stage(self) -> int:
        return 3 if self.fsdp else int(self.zero)

    @property
    def serving_split(self) -> tuple[int, int, int]:
        """A served model's (attention_dp, moe_tp, moe_ep), defaults resolved."""
        adp = self.attention_dp or self.ep
        moe_tp = self.moe_tp or (self.tp if self.moe_ep is None else self.tp * adp // self.moe_ep)
        moe_ep = self.moe_ep or (adp if self.moe_tp is None else self.tp * adp // self.moe_tp)
        return adp, moe_tp, moe_ep

    @model_validator(mode="after")
    def _serving_split(self) -> Parallelism:
        given = [k for k in ("attention_dp", "moe_tp", "moe_ep") if getattr(self, k) is not None]
        if given and self.ep > 1:
            raise ValueError(f"ep is short for attention_dp = moe_ep; expected ep or {given[0]}, not both")
        if given:
            adp = self.attention_dp or self.ep
            stage = self.tp * adp
            for key in ("moe_tp", "moe_ep"):
                v = getattr(self, key)
                if v is not None and stage % v:
                    raise ValueError(f"{key} ({v}) does not divide tp x attention_dp ({self.tp} x {adp} = {stage}), "
                                     f"the GPUs the MoE layers run on; expected a divisor of {stage}")
            _, mt, me = self.serving_split
            if mt * me != stage:
                raise ValueError(f"moe_tp x moe_ep ({mt} x {me}) must equal tp x attention_dp ({self.tp} x {adp}): "
                                 f"the MoE layers run on the same GPUs as attention; expected moe_tp x moe_ep = "
                                 f"{stage}")
        return self


class Comm(Spec):
    """Communication settings of the job."""

    algorithm: Literal["auto", "ring", "tree", "nvls", "direct"] = Field(
        "auto", description="collective algorithm; auto picks the fastest for each op, size and group, "
                            "as NCCL's tuner does; a named one applies where it implements the op")
    protocol: Literal["auto", "ll", "ll128", "simple"] = Field(
        "auto", description="NCCL protocol; auto picks per collective")
    bucket_mib: Annotated[float, Field(gt=0)] = Field(
        25.0, description="gradient bucket size of data-parallel reductions, MiB of fp32 gradients (PyTorch DDP "
                          "bucket_cap_mb, default 25); buckets are filled in the order backward readies the "
                          "gradients, the reverse of the parameters' order, as DDP's rebuilt buckets after the first "
                          "iteration. Under training.framework: megatron, when not given, Megatron-core's "
                          "DistributedDataParallelConfig.bucket_size default: max(40,000,000, 1,000,000 x dp) "
                          "parameters (megatron/core/distributed/distributed_data_parallel.py); given, that many "
                          "MiB (its --ddp-bucket-size in parameters of 4 bytes)")
    first_bucket_mib: Annotated[float, Field(gt=0)] = Field(
        1.0, description="size of the first gradient bucket, MiB, so that the first all-reduce starts early "
                         "(PyTorch DDP's torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, 1 MiB); PyTorch DDP's "
                         "only: Megatron's buckets are all of one size")


class WorkloadSpec(Spec):
    """A workload file."""

    name: str = Field(description="a short name for the run")
    platform: str = Field(description="platform name in platforms/ or a path to a platform YAML")
    nodes: PositiveInt = Field(1, description="number of nodes of the platform")
    gpus_per_node: PositiveInt | None = Field(
        None, description="GPUs used per node; default all GPUs of the node")
    seed: int = Field(0, description="seed of the run's random generator")
    model: Model
    training: Training | None = Field(None, description="how one training iteration runs (training models)")
    inference: Inference | None = Field(
        None, description="how one inference iteration runs (transformer_inference, dlrm_inference)")
    parallelism: Parallelism = Field(default_factory=lambda: Parallelism())
    comm: Comm = Field(default_factory=lambda: Comm())

    @model_validator(mode="after")
    def _one_mode(self) -> WorkloadSpec:
        served = self.model.kind in INFERENCE_KINDS
        if served and self.training is not None:
            raise ValueError(f"training: a {self.model.kind} model is served, not trained; expected an inference "
                             "section instead of training")
        if not served and self.inference is not None:
            raise ValueError(f"inference: a {self.model.kind} model is trained; expected a training section instead "
                             "of inference (or a transformer_inference / dlrm_inference model)")
        split = [k for k in ("attention_dp", "moe_tp", "moe_ep") if getattr(self.parallelism, k) is not None]
        if split and not served:
            raise ValueError(f"parallelism.{split[0]} is a serving engine's split; expected ep for a trained model")
        if served and self.inference is None:
            raise ValueError(f"inference: missing required key (a {self.model.kind} model is served); expected "
                             "inference: {...}")
        if not served and self.training is None:
            raise ValueError(f"training: missing required key (a {self.model.kind} model is trained); expected "
                             "training: {...}")
        framework = self.training.framework if self.training is not None else "pytorch"
        if framework == "megatron" and "first_bucket_mib" in self.comm.model_fields_set:
            raise ValueError("comm.first_bucket_mib is PyTorch DDP's small first bucket; Megatron's buckets are all "
                             "comm.bucket_mib; expected no first_bucket_mib under training.framework: megatron")
        if framework == "nvidia_dlrm" and self.model.kind != "dlrm":
            raise ValueError(f"training.framework: nvidia_dlrm is NVIDIA's PyTorch DLRM; expected model.kind: dlrm, "
                             f"not {self.model.kind}")
        if framework == "megatron" and self.model.kind == "dlrm":
            raise ValueError("training.framework: megatron trains transformers; expected pytorch (TorchRec) or "
                             "nvidia_dlrm for a dlrm model")
        sharding = self.parallelism.sharding
        if framework == "nvidia_dlrm" and (sharding.model_fields_set - {"default"} or sharding.default != "table_wise"):
            raise ValueError("parallelism.sharding: nvidia_dlrm places whole tables by size itself and sends vectors "
                             "in the matmuls' precision; expected no sharding plan (or table_wise) under "
                             "training.framework: nvidia_dlrm")
        if self.training is not None and self.training.input_mbytes_per_s is not None and framework != "nvidia_dlrm":
            raise ValueError("training.input_mbytes_per_s: the host's input reading is modelled for nvidia_dlrm only; "
                             "expected training.framework: nvidia_dlrm or no input_mbytes_per_s")
        if self.training is not None and self.training.cuda_graphs and framework != "nvidia_dlrm":
            raise ValueError("training.cuda_graphs: captured training iterations are modelled for nvidia_dlrm only; "
                             "expected training.framework: nvidia_dlrm or no cuda_graphs")
        if self.parallelism.gradient_as_bucket_view and (self.model.kind != "transformer" or framework != "pytorch"):
            raise ValueError("parallelism.gradient_as_bucket_view is PyTorch DDP's for a transformer; expected "
                             "model.kind: transformer and training.framework: pytorch")
        return self

    @property
    def train(self) -> Training:
        """The training section (a trained model always has one)."""
        if self.training is None:
            raise ValueError(f"workload {self.name!r} has no training section")
        return self.training

    @property
    def serve(self) -> Inference:
        """The inference section (a served model always has one)."""
        if self.inference is None:
            raise ValueError(f"workload {self.name!r} has no inference section")
        return self.inference

    @property
    def precision(self) -> str:
        """The dtype of the matmuls, trained or served."""
        return self.serve.precision if self.training is None else self.training.precision
