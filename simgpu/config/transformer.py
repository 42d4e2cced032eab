"""The Transformer model of a workload file: its shape and style, its attention (grouped-query,
multi-head latent, sparse, sliding-window, linear), its mixture of experts, and the served
Transformer.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from .base import Spec

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
