"""The attention core (softmax(Q K^T) V) of one block on one rank, forward and backward.

This module owns the kernels of the attention core and, under context parallelism, its K/V
traffic. ``flash``: one fused kernel each way (scores never stored). ``unfused``: Megatron's core
attention: a batched matmul for the scores, the fused scale-mask-softmax, dropout on the
probabilities, a batched matmul with V and a permute back to ``[s, b, h]``. Megatron uses its fused
softmax kernel only where the kernel supports the shape (:func:`fused_softmax_available`); elsewhere
it runs the softmax as PyTorch ops in fp32 (:func:`_softmax`), five kernels each way instead of one.

Context parallelism splits the sequence into ``2 cp`` chunks, each rank holding two (chunks i and
2cp-1-i, so causal work is balanced). ``ring`` (Megatron / Transformer Engine): ``cp`` attention
steps, the local K/V block first, each further step on the block received from the previous rank
while the next is sent on (forward: K/V; backward: K/V and the partial dK/dV, which finally go
home); a causal off-diagonal step attends to half a block. ``all_gather``: K/V all-gathered per
block, attention of the local queries over the whole sequence, dK/dV reduce-scattered in backward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..stage import Pair

if TYPE_CHECKING:
    from .blocks import Blocks

_SEND, _RECV = Pair("cp", +1, True), Pair("cp", -1, False)
CP_STREAMS = ("comm.cp_send", "comm.cp_recv")


def _kv_bytes(bl: Blocks) -> int:
    return bl.s.micro * bl.s.seq * 2 * bl.kv * bl.d * bl.w


def _flash(bl: Blocks, name: str, bwd: bool, phase: str, sq: int, skv: int, causal: bool,
           deps: tuple[int, ...] = ()) -> int:
    extra: dict[str, Any] = {"window": bl.window} if bl.window else {}
    return bl.em.kernel(name, "attention_bwd" if bwd else "attention_fwd", bl.attn_dtype, phase=phase, deps=deps,
                        batch=bl.s.micro, heads=bl.heads, seq_q=sq, seq_kv=skv, head_dim=bl.d, causal=int(causal),
                        **extra)


def fused_softmax_available(attn_batches: int, sq: int, sk: int, causal: bool, half: bool) -> bool:
    """Whether Megatron's fused scale-mask-softmax kernel takes scores of ``attn_batches`` (micro-batch
    x heads on this rank) matrices of ``sq x sk`` (``FusedScaleMaskSoftmax.is_kernel_available``):
    fp16/bf16 input, ``16 < sk <= 4096``, ``sq``, ``sk`` and ``attn_batches`` multiples of 4, and the
    batches (causal) or the query rows (padding mask) a multiple of the matrices one 128-thread block
    handles: a warp of ``min(32, next_pow2(sk))`` threads per matrix row, two rows per warp up to
    ``sk`` 128."""
    if not (half and 16 < sk <= 4096 and sq % 4 == 0 and sk % 4 == 0 and attn_batches % 4 == 0):
        return False
    pow2 = 1 << (sk - 1).bit_length()
    per_block = 128 // min(32, pow2) * (2 if pow2 <= 128 else 1)
    return (attn_batches if causal else sq) % per_block == 0


def _softmax(bl: Blocks, n: str, phase: str, tag: str, bwd: bool) -> int:
    """The scale-mask-softmax of the scores (or its backward): the fused kernel where Megatron has it
    for the shape, else PyTorch's path as Megatron takes it with query-key layer scaling (softmax in
    fp32): cast to fp32, scale, mask, softmax, cast back (each a kernel, and one each back)."""
    s, em = bl.s, bl.em
    bh, S = s.micro * bl.heads, s.seq
    half = bl.aux in ("fp16", "bf16")
    name = f"{n}.attention.softmax{'_bwd' if bwd else ''}{tag}"
    if fused_softmax_available(bh, S, S, bl.causal, half):
        return em.kernel(name, "softmax", bl.aux, phase=phase, rows=bh * S, cols=S, bwd=int(bwd))
    numel = bh * S * S

    def ew(step: str, op: str) -> int:
        return bl.ew(f"{name}.{step}", numel, 1, 1, phase, dtype="fp32", op=op)

    if bwd:  # autograd's mirror: the grad cast to fp32, softmax, mask, scale, cast back
        if half:
            ew("cast_grad", "cast")
        em.kernel(name, "softmax", "fp32", phase=phase, rows=bh * S, cols=S, bwd=1)
        ew("mask", "copy")
        last = ew("scale", "mul")
        return ew("cast_in", "cast") if half else last
    if half:
        ew("cast_in", "cast")
    ew("scale", "mul")
    ew("mask", "copy")
    last = em.kernel(name, "softmax", "fp32", phase=phase, rows=bh * S, cols=S, bwd=0)
    return ew("cast_out", "cast") if half else last


def _ring_step_shape(bl: Blocks, k: int) -> tuple[int, bool]:
    """(kv length, causal) of ring step ``k``: the diagonal block first, then half blocks (causal)."""
    sl = bl.s.seq
    if k == 0:
        return sl, bl.causal
    return (sl // 2, False) if bl.causal else (sl, False)


def core_fwd(bl: Blocks, n: str, phase: str, tag: str) -> int:
    """Forward of block ``n``'s attention core; returns its last op."""
    s, em = bl.s, bl.em
    S, b, heads = s.seq, s.micro, bl.heads
    if s.layout.cp == 1:
        if s.model.attention == "flash":
            return _flash(bl, f"{n}.attention.fwd{tag}", False, phase, S, S, bl.causal)
        bh = b * heads
        em.kernel(f"{n}.attention.scores{tag}", "bmm", bl.attn_dtype, phase=phase, b=bh, m=S, n=S, k=bl.d)
        _softmax(bl, n, phase, tag, bwd=False)
        if bl.p:
            bl.ew(f"{n}.attention.dropout{tag}", bh * S * S, 1, 2, phase, op="dropout")
        em.kernel(f"{n}.attention.context{tag}", "bmm", bl.attn_dtype, phase=phase, b=bh, m=S, n=bl.d, k=S)
        return bl.ew(f"{n}.attention.permute{tag}", s.tokens * heads * bl.d, 1, 1, phase, op="transpose")
    suffix = f"{n}.kv{tag}.mb{bl.mb}"
    if s.cp_comm == "all_gather":
        full = s.model.seq_len
        ag = em.group_op("cp", f"{n}.attention.kv_all_gather{tag}", suffix, "all_gather",
                         s.layout.cp * _kv_bytes(bl), phase=phase, deps=(em.last,), stream="comm.cp")
        return _flash(bl, f"{n}.attention.fwd{tag}", False, phase, S, full, bl.causal,
                      deps=() if ag is None else (ag,))
    return _ring(bl, n, phase, tag, bwd=False)


def _ring(bl: Blocks, n: str, phase: str, tag: str, bwd: bool) -> int:
    s, em = bl.s, bl.em
    cp = s.layout.cp
    nbytes = _kv_bytes(bl) * (2 if bwd else 1)
    what = "bwd" if bwd else "fwd"
    held = em.last  # the op that produced the block this rank passes on first
    last = held
    for k in range(cp):
        deps: tuple[int, ...] = (held,) if k else ()
        if k < cp - 1:
            sfx = f"{n}.ring.{what}{tag}.mb{bl.mb}.step{k}"
            em.p2p(_SEND, f"{n}.attention.ring_send{tag}", sfx, nbytes, phase=phase, deps=(held,),
                   stream=CP_STREAMS[0])
            recv = em.p2p(_RECV, f"{n}.attention.ring_recv{tag}", sfx, nbytes, phase=phase, stream=CP_STREAMS[1])
        skv, causal = _ring_step_shape(bl, k)
        last = _flash(bl, f"{n}.attention.{what}.step{k}{tag}", bwd, phase, s.seq, skv, causal, deps=deps)
        if k:
            # merge the partial result with the running one (output and log-sum-exp, or dQ)
            last = bl.ew(f"{n}.attention.merge{k}{tag}", s.tokens * bl.heads * bl.d, 2, 1, phase, op="attention_merge")
        if k < cp - 1:
            held = recv
    if bwd:
        # the accumulated dK/dV of the block that arrived last go back to their owner
        sfx = f"{n}.ring.home{tag}.mb{bl.mb}"
        em.p2p(_SEND, f"{n}.attention.dkv_send{tag}", sfx, _kv_bytes(bl), phase=phase, deps=(last,),
               stream=CP_STREAMS[0])
        recv = em.p2p(_RECV, f"{n}.attention.dkv_recv{tag}", sfx, _kv_bytes(bl), phase=phase, stream=CP_STREAMS[1])
        last = bl.ew(f"{n}.attention.dkv_add{tag}", _kv_bytes(bl) // bl.w, 2, 1, phase, deps=(recv,), op="add")
    return last


def core_bwd(bl: Blocks, n: str, phase: str) -> int:
    """Backward of block ``n``'s attention core (selective recomputation first); returns its last op."""
    s, em = bl.s, bl.em
    S, b, heads = s.seq, s.micro, bl.heads
    if s.layout.cp == 1:
        if s.model.attention == "flash":
            return _flash(bl, f"{n}.attention.bwd", True, phase, S, S, bl.causal)
        if s.recompute == "selective":
            core_fwd(bl, n, phase, ".recompute")
        bh = b * heads
        bl.ew(f"{n}.attention.permute_bwd", s.tokens * heads * bl.d, 1, 1, phase, op="transpose")
        em.kernel(f"{n}.attention.context_dgrad_v", "bmm", bl.attn_dtype, phase=phase, b=bh, m=S, n=bl.d, k=S)
        em.kernel(f"{n}.attention.context_dgrad_p", "bmm", bl.attn_dtype, phase=phase, b=bh, m=S, n=S, k=bl.d)
        if bl.p:
            bl.ew(f"{n}.attention.dropout_bwd", bh * S * S, 2, 1, phase, op="dropout_bwd")
        _softmax(bl, n, phase, "", bwd=True)
        em.kernel(f"{n}.attention.scores_dgrad_q", "bmm", bl.attn_dtype, phase=phase, b=bh, m=S, n=bl.d, k=S)
        return em.kernel(f"{n}.attention.scores_dgrad_k", "bmm", bl.attn_dtype, phase=phase, b=bh, m=S, n=bl.d,
                         k=S)
    if s.cp_comm == "all_gather":
        full = s.model.seq_len
        suffix = f"{n}.kv.bwd.mb{bl.mb}"
        ag = em.group_op("cp", f"{n}.attention.kv_all_gather.bwd", suffix + ".ag", "all_gather",
                         s.layout.cp * _kv_bytes(bl), phase=phase, deps=(em.last,), stream="comm.cp")
        last = _flash(bl, f"{n}.attention.bwd", True, phase, S, full, bl.causal, deps=() if ag is None else (ag,))
        rs = em.group_op("cp", f"{n}.attention.dkv_reduce_scatter", suffix + ".rs", "reduce_scatter",
                         s.layout.cp * _kv_bytes(bl), phase=phase, deps=(last,), stream="comm.cp")
        return last if rs is None else bl.ew(f"{n}.attention.dkv_copy", _kv_bytes(bl) // bl.w, 1, 1, phase,
                                              deps=(rs,), op="copy")
    return _ring(bl, n, phase, "", bwd=True)
