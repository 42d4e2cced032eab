"""The attention of a trained block that is not grouped-query attention, forward and backward:
multi-head latent attention (MLA) and Gated DeltaNet linear attention.

MLA as Megatron-core's ``MLASelfAttention`` runs it in training (DeepSeek-V2 paper, section 2.1):
the down-projections of the query and of the key/value latent with the rotary key (one GEMM here,
whole on every tensor-parallel rank), their RMSNorms, the column-parallel up-projections of the
query and of the latent into per-head keys and values, RoPE, and the attention core over heads of
``qk_nope + qk_rope`` query/key and ``v_head_dim`` value widths (timed as flash attention of their
mean width, which makes both matmuls' FLOPs exact). Backward mirrors it with the same rules as a
dense block (each GEMM's dgrad and wgrad; flash attention's backward kernel); the all-reduce of the
down-projections' input gradient over tp is left out (a latent's width, small beside the block's).
Under DeepSeek sparse attention each query attends to its ``index_topk`` best keys, timed as the
same attention over a window of that many keys, beside the lightning indexer's projections and
scores (:func:`_indexer`).

Gated DeltaNet (Yang et al., "Gated Delta Networks", ICLR 2025; Qwen3-Next): ``in_proj_qkvz`` and
``in_proj_ba`` (column-parallel), the short causal convolution, the chunked delta rule
(``linear_attention`` kernel) and the gated RMSNorm. Its backward is timed as two forward passes of
the chunked kernel (the chunk states recomputed, then the gradients through them: the structure of
the flash-linear-attention library's ``chunk_gated_delta_rule`` backward), beside the GEMMs'
dgrad and wgrad and the convolution's and norm's backward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..dataparallel import GradSink
from .attention import core_bwd, core_fwd
from .shapes import Block

if TYPE_CHECKING:
    from .blocks import Blocks


def mla_fwd(bl: Blocks, blk: Block, phase: str, tag: str, src: int) -> int:
    """MLA's forward up to the output projection (the caller's); returns the last op."""
    s, em = bl.s, bl.em
    ml = s.model.mla
    assert ml is not None and blk.q_up is not None and blk.kv_up is not None
    n = blk.name
    down = bl.gather_lin_fwd(blk.qkv, f"{n}.ln1", phase, tag, src)
    if ml.q_lora_rank:
        em.kernel(f"{n}.attn.q_a_norm{tag}", "norm", bl.aux, phase=phase, deps=(down,), rows=s.tokens,
                  cols=ml.q_lora_rank, bwd=0, rms=1)
        bl.lin_fwd(blk.q_up, phase, tag)
    else:
        bl.lin_fwd(blk.q_up, phase, tag, deps=(down,))
    em.kernel(f"{n}.attn.kv_a_norm{tag}", "norm", bl.aux, phase=phase, rows=s.tokens, cols=ml.kv_lora_rank, bwd=0,
              rms=1)
    bl.lin_fwd(blk.kv_up, phase, tag)
    if s.model.rope:
        bl.ew(f"{n}.rope{tag}", s.tokens * (bl.heads + 1) * ml.qk_rope_head_dim, 1, 1, phase, op="rope")
    if blk.indexer is not None:
        _indexer(bl, blk, phase, tag, bwd=False)
    return core_fwd(bl, n, phase, tag)


def _indexer(bl: Blocks, blk: Block, phase: str, tag: str, bwd: bool, sink: GradSink | None = None) -> int:
    """DSA's lightning indexer in training: its projections, the scores of every query over every
    earlier key (a batched GEMM per indexer head) and the top-k over them; backward, the scores'
    two gradient GEMMs and the projections' (the indexer is trained beside the model, DeepSeek-V3.2
    technical report, section 2.1)."""
    s, em = bl.s, bl.em
    sa = s.model.sparse_attention
    assert sa is not None and blk.indexer is not None
    b, S, n = s.micro * sa.index_heads, s.seq, blk.name
    if not bwd:
        bl.lin_fwd(blk.indexer, phase, tag)
        em.kernel(f"{n}.attn.index_scores{tag}", "bmm", bl.attn_dtype, phase=phase, b=b, m=S, n=S, k=sa.index_head_dim)
        return em.kernel(f"{n}.attn.index_topk{tag}", "softmax", bl.aux, phase=phase, rows=s.micro * S, cols=S, bwd=0)
    em.kernel(f"{n}.attn.index_scores.dgrad_q", "bmm", bl.attn_dtype, phase=phase, b=b, m=S, n=sa.index_head_dim, k=S)
    em.kernel(f"{n}.attn.index_scores.dgrad_k", "bmm", bl.attn_dtype, phase=phase, b=b, m=S, n=sa.index_head_dim, k=S)
    bl.lin_dgrad(blk.indexer, phase)
    return bl.lin_wgrad(blk.indexer, phase, sink)


def mla_bwd(bl: Blocks, blk: Block, phase: str, sink: GradSink | None) -> int | None:
    """MLA's backward from the attention core down; returns the tp reduction of the block input's
    gradient (None where tp is 1)."""
    s, em = bl.s, bl.em
    ml = s.model.mla
    assert ml is not None and blk.q_up is not None and blk.kv_up is not None
    n = blk.name
    core_bwd(bl, n, phase)
    if blk.indexer is not None:
        _indexer(bl, blk, phase, "", bwd=True, sink=sink)
    if s.model.rope:
        bl.ew(f"{n}.rope_bwd", s.tokens * (bl.heads + 1) * ml.qk_rope_head_dim, 1, 1, phase, op="rope")
    bl.lin_dgrad(blk.kv_up, phase)
    bl.lin_wgrad(blk.kv_up, phase, sink)
    em.kernel(f"{n}.attn.kv_a_norm.bwd", "norm", bl.aux, phase=phase, rows=s.tokens, cols=ml.kv_lora_rank, bwd=1,
              rms=1)
    bl.lin_dgrad(blk.q_up, phase)
    bl.lin_wgrad(blk.q_up, phase, sink)
    if ml.q_lora_rank:
        em.kernel(f"{n}.attn.q_a_norm.bwd", "norm", bl.aux, phase=phase, rows=s.tokens, cols=ml.q_lora_rank, bwd=1,
                  rms=1)
    return bl.column_bwd(blk.qkv, blk.qkv.name, phase, sink)


def _linear_kernel(bl: Blocks, blk: Block, name: str, phase: str) -> int:
    s = bl.s
    la = s.model.linear_attention
    assert la is not None
    return bl.em.kernel(name, "linear_attention", bl.attn_dtype, phase=phase, batch=s.micro, seq_q=s.seq,
                        heads_k=la.key_heads // s.tp, heads_v=la.value_heads // s.tp, head_k_dim=la.key_head_dim,
                        head_v_dim=la.value_head_dim, decode=0)


def _conv_numel(bl: Blocks) -> int:
    s = bl.s
    la = s.model.linear_attention
    assert la is not None
    return s.tokens * (2 * la.key_heads * la.key_head_dim + la.value_heads * la.value_head_dim) // s.tp


def linear_fwd(bl: Blocks, blk: Block, phase: str, tag: str, src: int) -> int:
    """A Gated DeltaNet block's forward up to its output projection; returns the last op."""
    s = bl.s
    la = s.model.linear_attention
    assert la is not None and blk.gates is not None
    n = blk.name
    bl.gather_lin_fwd(blk.qkv, f"{n}.ln1", phase, tag, src)
    bl.lin_fwd(blk.gates, phase, tag)
    bl.ew(f"{n}.attn.conv1d{tag}", _conv_numel(bl), la.conv_kernel, 1, phase, op="fma")
    _linear_kernel(bl, blk, f"{n}.attention.fwd{tag}", phase)
    return bl.em.kernel(f"{n}.attn.gated_norm{tag}", "norm", bl.aux, phase=phase,
                        rows=s.tokens * (la.value_heads // s.tp), cols=la.value_head_dim, bwd=0, rms=1)


def linear_bwd(bl: Blocks, blk: Block, phase: str, sink: GradSink | None) -> int | None:
    """A Gated DeltaNet block's backward below its output projection; returns the tp reduction of
    the block input's gradient (None where tp is 1)."""
    s = bl.s
    la = s.model.linear_attention
    assert la is not None and blk.gates is not None
    n = blk.name
    bl.em.kernel(f"{n}.attn.gated_norm.bwd", "norm", bl.aux, phase=phase, rows=s.tokens * (la.value_heads // s.tp),
                 cols=la.value_head_dim, bwd=1, rms=1)
    _linear_kernel(bl, blk, f"{n}.attention.bwd_recompute", phase)
    _linear_kernel(bl, blk, f"{n}.attention.bwd", phase)
    bl.ew(f"{n}.attn.conv1d_bwd", _conv_numel(bl), la.conv_kernel + 1, 2, phase, op="fma_bwd")
    bl.lin_dgrad(blk.gates, phase)
    bl.lin_wgrad(blk.gates, phase, sink)
    return bl.column_bwd(blk.qkv, blk.qkv.name, phase, sink)
