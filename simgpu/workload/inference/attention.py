"""The attention of a served block that is not grouped-query attention: multi-head latent attention
(MLA, with or without DeepSeek sparse attention) and Gated DeltaNet linear attention.

MLA as TensorRT-LLM, vLLM and SGLang serve it (DeepSeek-V2 paper, section 2.1.3; vLLM's
``MLACommonImpl``): the fused low-rank projection of the query and of the key/value latent (whole
on every tensor-parallel rank), their RMSNorms, the query's up-projection (column-parallel), the
latent and rotary key written to the cache; prompts expand their cached latents into per-head keys
and values (the ``kv_b`` GEMM over every key they attend to) and run ``mla_context`` attention;
decoding requests absorb the key up-projection into the query (a batched GEMM per head into the
latent space), run ``mla_decode`` attention over the latent cache as multi-query attention, and
absorb the value up-projection into the output (a second batched GEMM). Under DSA (DeepSeek-V3.2,
GLM-5) the whole attention layer is one ``sparse_attention`` module per kind of sequence, as the
tables measure it: its projections, the indexer (scores over every key, top-k), the sparse MLA over
the selected keys and the output projection (:func:`dsa_fwd`).

Gated DeltaNet (Qwen3-Next, Qwen3.5; Yang et al. 2024): the ``in_proj_qkvz`` and ``in_proj_ba``
GEMMs, the short causal convolution over queries, keys and values, the chunked delta-rule kernel
over the prompts' tokens and its one-step recurrence for decoding requests (``linear_attention``),
and the gated RMSNorm over each value head's output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..transformer.shapes import Block

if TYPE_CHECKING:
    from .forward import StageForward


def dsa_fwd(fw: StageForward, blk: Block) -> int:
    """A DSA block's whole attention layer, its projections and output projection included, as one
    ``sparse_attention`` module per kind of sequence (the measured tables time the module so); the
    cache write beside it where the framework does not fuse it. Returns the last op."""
    s, bl, sh, sv, em = fw.s, fw.bl, fw.shape, fw.sv, fw.em
    ml, sa = s.model.mla, s.model.sparse_attention
    assert ml is not None and sa is not None
    last = em.last
    if not sv.fused:
        last = em.elementwise(f"{blk.name}.kv_cache.write", s.tokens * (ml.latent + sa.index_head_dim), 1, 1,
                              sv.kv_dtype, op="copy", phase="fwd")
    for kind, batch, sq, skv, decode in (("prefill", sh.prefill, sh.prefill_len, sh.prefill_len, 0),
                                         ("cached", sh.chunked, sh.chunk_q, sh.chunk_kv + sh.chunk_q, 0),
                                         ("decode", sh.decode, 1, sh.decode_ctx, 1)):
        if batch:
            last = em.kernel(f"{blk.name}.attention.{kind}", "sparse_attention", sv.attn_dtype, phase="fwd",
                             batch=batch, seq_q=sq, seq_kv=skv, heads=bl.heads, topk=sa.index_topk,
                             index_heads=sa.index_heads, index_head_dim=sa.index_head_dim, decode=decode)
    return last


def mla_fwd(fw: StageForward, blk: Block) -> int:
    """MLA up to the output projection (which the caller runs); returns the last op."""
    s, bl, sh, sv, em = fw.s, fw.bl, fw.shape, fw.sv, fw.em
    ml = s.model.mla
    assert ml is not None and blk.q_up is not None and blk.kv_up is not None
    assert s.model.sparse_attention is None, "a DSA block runs as one module (dsa_fwd)"
    n, heads = blk.name, bl.heads
    bl.lin_fwd(blk.qkv, "fwd")
    if ml.q_lora_rank:
        em.kernel(f"{n}.attn.q_a_norm", "norm", bl.aux, phase="fwd", rows=s.tokens, cols=ml.q_lora_rank, bwd=0, rms=1)
    em.kernel(f"{n}.attn.kv_a_norm", "norm", bl.aux, phase="fwd", rows=s.tokens, cols=ml.kv_lora_rank, bwd=0, rms=1)
    bl.lin_fwd(blk.q_up, "fwd")
    if not sv.fused:
        bl.ew(f"{n}.rope", s.tokens * (heads + 1) * ml.qk_rope_head_dim, 1, 1, "fwd", op="rope")
        em.elementwise(f"{n}.kv_cache.write", s.tokens * ml.latent, 1, 1, sv.kv_dtype, op="copy", phase="fwd")
    last = em.last
    prompts = sh.prefill * sh.prefill_len + sh.chunked * (sh.chunk_q + sh.chunk_kv)  # keys the prompts expand
    if prompts:
        bl.lin_fwd(blk.kv_up, "fwd", rows=prompts)
    for kind, batch, sq, skv, causal in (("prefill", sh.prefill, sh.prefill_len, sh.prefill_len, 1),
                                         ("cached", sh.chunked, sh.chunk_q, sh.chunk_kv, 0)):
        if batch:
            last = em.kernel(f"{n}.attention.{kind}", "mla_context", sv.attn_dtype, phase="fwd", batch=batch, seq_q=sq,
                             seq_kv=skv, heads=heads, causal=causal, qk_head_dim=ml.qk_head_dim,
                             v_head_dim=ml.v_head_dim, kv_bytes=sv.kv_bytes)
    if sh.decode:
        em.kernel(f"{n}.attention.absorb_k", "bmm", sv.attn_dtype, phase="fwd", b=heads, m=sh.decode,
                  n=ml.kv_lora_rank, k=ml.qk_nope_head_dim)
        em.kernel(f"{n}.attention.decode", "mla_decode", sv.attn_dtype, phase="fwd", batch=sh.decode, seq_q=1,
                  seq_kv=sh.decode_ctx, heads=heads, kv_lora=ml.kv_lora_rank, rope_dim=ml.qk_rope_head_dim,
                  kv_bytes=sv.kv_bytes)
        last = em.kernel(f"{n}.attention.absorb_v", "bmm", sv.attn_dtype, phase="fwd", b=heads, m=sh.decode,
                         n=ml.v_head_dim, k=ml.kv_lora_rank)
    return last


def linear_attention_fwd(fw: StageForward, blk: Block) -> int:
    """A Gated DeltaNet block up to its output projection; returns the last op."""
    s, bl, sh, sv, em = fw.s, fw.bl, fw.shape, fw.sv, fw.em
    la = s.model.linear_attention
    assert la is not None and blk.gates is not None
    tp, n = s.tp, blk.name
    kh, vh = la.key_heads // tp, la.value_heads // tp
    bl.lin_fwd(blk.qkv, "fwd")
    bl.lin_fwd(blk.gates, "fwd")
    conv = s.tokens * (2 * kh * la.key_head_dim + vh * la.value_head_dim)
    bl.ew(f"{n}.attn.conv1d", conv, la.conv_kernel, 1, "fwd", op="fma")
    last = em.last
    for kind, batch, sq, decode in (("prefill", sh.prefill, sh.prefill_len, 0), ("cached", sh.chunked, sh.chunk_q, 0),
                                    ("decode", sh.decode, 1, 1)):
        if batch:
            last = em.kernel(f"{n}.attention.{kind}", "linear_attention", sv.attn_dtype, phase="fwd", batch=batch,
                             seq_q=sq, heads_k=kh, heads_v=vh, head_k_dim=la.key_head_dim,
                             head_v_dim=la.value_head_dim, decode=decode)
    return em.kernel(f"{n}.attn.gated_norm", "norm", bl.aux, phase="fwd", deps=(last,), rows=s.tokens * vh,
                     cols=la.value_head_dim, bwd=0, rms=1)
