"""Memory of one GPU of a served Transformer: weights, activations, workspace and the KV cache.

- Weights: the parameters a rank holds (tensor-parallel slices, its pipeline stage's blocks, its
  expert-parallel share of the experts, the embedding on the first stage and the output layer on
  the last) at the serving dtype's width (fp4: half a byte, plus one fp8 scale per 16 weights as
  NVFP4 stores them; the embedding and the output layer stay 16-bit, as TensorRT-LLM keeps them).
- KV cache per token on a GPU: its blocks x its KV heads (``kv_heads / tp``; tp must divide them)
  x head dim x 2 (K and V) x the cache dtype's width.
- Activations: the largest iteration's (``max_batch_tokens``) live tensors of one block, which a
  forward frees as it goes: the residual stream and a norm output, the QKV output, the attention
  output and the MLP's (or experts') inner activations, plus the logits of ``max_batch_size`` rows.
- Workspace: a fixed reserve for the CUDA context, cuBLAS / attention workspaces and NCCL's
  buffers (:data:`WORKSPACE_BYTES`).

What is left of ``gpu_memory_utilization`` of the GPU is the KV cache, in blocks of
``block_tokens``; a replica holds as many blocks as its fullest GPU can (its stages hold different
layers, so their budgets differ), times ``ep`` under expert parallelism (each attention rank holds
the caches of its share of the requests).
"""

from __future__ import annotations

import math

from ...graph import MemoryEstimate
from ..transformer.shapes import Setup, block, embedding_params, head_params
from .api import ReplicaMemory

#: Bytes per element of the serving dtypes (fp4 and the other 4-bit formats: half a byte).
SERVE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5, "fp8_block": 1.0, "mxfp8": 1.0,
               "mxfp4": 0.5, "w4a16": 0.5}
#: NVFP4 stores an fp8 scale per block of 16 values (NVIDIA's NVFP4 format description).
FP4_SCALE_BYTES = 1.0 / 16
#: Scale bytes per weight of the other formats: DeepSeek's fp8 blocks an fp32 scale per 128 x 128
#: (its config's weight_block_size); the OCP MX formats an 8-bit exponent per 32 values (OCP
#: Microscaling Formats v1.0); int4 AWQ a 16-bit scale and zero per group of 128 (AWQ's default
#: q_group_size).
SCALE_BYTES = {"fp4": FP4_SCALE_BYTES, "fp8_block": 4.0 / (128 * 128), "mxfp8": 1.0 / 32, "mxfp4": 1.0 / 32,
               "w4a16": 4.0 / 128}
#: CUDA context, cuBLAS and attention workspaces, NCCL buffers: about what vLLM's profiling run
#: leaves outside the weights and activations on an H100 (its logs show 1-3 GiB of "non-torch"
#: memory); a reserve, not a measurement of any row here.
WORKSPACE_BYTES = 2.0 * 2**30


def weight_width(precision: str) -> float:
    return SERVE_BYTES[precision] + SCALE_BYTES.get(precision, 0.0)


def stage_weight_bytes(s: Setup, stage: int) -> float:
    """Bytes of the weights one rank of ``stage`` holds (the experts at the MoE layers' precision)."""
    md, pp = s.model, s.layout.pp
    per = md.layers // pp
    w, we = weight_width(s.precision), weight_width(s.moe_dtype)
    out = 0.0
    for i in range(stage * per, (stage + 1) * per):
        b = block(s, i)
        experts = sum(p.numel for p in b.experts.params) if b.experts is not None else 0
        out += (b.numel() - experts) * w + experts * we
    if stage == 0:
        out += sum(p.numel for p in embedding_params(s)) * 2.0
    if stage == pp - 1:
        out += sum(p.numel for p in head_params(s)) * 2.0
        if md.tied and pp > 1:
            out += s.vocab // s.tp * md.hidden * 2.0
    return out


def kv_heads_per_gpu(s: Setup) -> int:
    return max(s.model.kv_heads_n // s.tp, 1)


def _layer_token_elements(s: Setup) -> float:
    """Cache elements one token takes in one attention block on one GPU: K and V of the GPU's KV
    heads; under MLA the latent and the rotary key, whole on every tp rank (and DSA's indexer key)."""
    md = s.model
    if md.mla is not None:
        return md.mla.latent + (md.sparse_attention.index_head_dim if md.sparse_attention is not None else 0)
    return kv_heads_per_gpu(s) * md.d_head * 2


def _stage_layers(s: Setup, stage: int) -> range:
    per = s.model.layers // s.layout.pp
    return range(stage * per, (stage + 1) * per)


def kv_bytes_per_token(s: Setup, kv_width: float, stage: int = 0) -> float:
    """KV-cache bytes of one token on one GPU of ``stage``: its full-attention blocks x (KV heads x
    head dim x 2, or MLA's latent) x bytes. Sliding-window and linear-attention blocks hold a
    bounded amount per request instead (:func:`request_state_bytes`)."""
    full = sum(s.model.attention_kind(i) == "full" for i in _stage_layers(s, stage))
    return full * _layer_token_elements(s) * kv_width


def request_state_bytes(s: Setup, kv_width: float, stage: int = 0) -> float:
    """Bytes one request holds on one GPU of ``stage`` whatever its length: a sliding block's window of
    keys and values, a linear-attention block's recurrent state (fp32, Qwen3-Next's mamba_ssm_dtype)
    and convolution state (16-bit), split over tp by heads."""
    md = s.model
    out = 0.0
    for i in _stage_layers(s, stage):
        kind = md.attention_kind(i)
        if kind == "sliding":
            assert md.sliding_window is not None
            out += md.sliding_window * _layer_token_elements(s) * kv_width
        elif kind == "linear":
            la = md.linear_attention
            assert la is not None
            rec = la.value_heads * la.key_head_dim * la.value_head_dim
            out += (rec * 4.0 + (la.state_elements() - rec) * 2.0) / s.tp
    return out


def activation_bytes(s: Setup, tokens: int, rows: int) -> float:
    """Peak bytes of one forward's live activations for ``tokens`` tokens and ``rows`` requests."""
    md, tp, w = s.model, s.tp, s.width
    h, d = md.hidden, md.d_head
    heads, kv = md.heads // tp, kv_heads_per_gpu(s)
    gate = 2 if md.act == "swiglu" else 1
    inner = md.ffn // tp
    if md.moe is not None:
        inner = max(inner, math.ceil(md.expert_ffn // tp * md.moe.top_k))
    per_token = 2 * h + (heads + 2 * kv) * d + heads * d + (gate + 1) * inner
    if md.mla is not None:  # the expanded keys and values of a prefill
        per_token += heads * (md.mla.qk_nope_head_dim + md.mla.v_head_dim)
    logits = rows * s.vocab * 4.0 * 2  # fp32 logits of the rank's slice and of the gathered whole
    return tokens * per_token * w + logits


def replica_memory(s: Setup, *, kv_width: float, max_tokens: int, max_rows: int, gpu_bytes: float,
                   block_tokens: int) -> ReplicaMemory:
    """What each GPU of a replica holds; blocks from the GPU with the least room."""
    act = activation_bytes(s, max_tokens, max_rows)
    weights = [stage_weight_bytes(s, st) for st in range(s.layout.pp)]
    per_token = kv_bytes_per_token(s, kv_width)
    # the per-request state of sliding and linear blocks is reserved for max_batch_size requests (as
    # vLLM reserves its Mamba state per max_num_seqs)
    state = max(request_state_bytes(s, kv_width, st) for st in range(s.layout.pp)) * max_rows / s.layout.ep
    free = min(gpu_bytes - w - act - WORKSPACE_BYTES - state for w in weights)
    per_token = max(per_token, 1.0)  # a model of sliding or linear blocks only still pages its prompts
    # under expert parallelism each of the ep attention ranks holds the caches of its share of requests
    blocks = max(int(free // (per_token * block_tokens)), 0) * s.layout.ep
    return ReplicaMemory(weights_bytes=max(weights), activation_bytes=act, workspace_bytes=WORKSPACE_BYTES,
                         kv_bytes_per_token=per_token, gpu_bytes=gpu_bytes, block_tokens=block_tokens,
                         kv_blocks=blocks, state_bytes=state)


def stage_memory(s: Setup, stage: int, *, kv_width: float, kv_tokens: int, tokens: int, rows: int) -> MemoryEstimate:
    """One rank of ``stage`` running a batch of ``tokens`` tokens that holds ``kv_tokens`` in its cache."""
    return MemoryEstimate(parameters=stage_weight_bytes(s, stage), activations=activation_bytes(s, tokens, rows),
                          buffers=WORKSPACE_BYTES, kv_cache=kv_tokens * kv_bytes_per_token(s, kv_width, stage)
                          + rows * request_state_bytes(s, kv_width, stage))
