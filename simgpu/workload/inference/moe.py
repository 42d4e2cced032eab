"""A served MoE layer as the serving engines split it: attention's ranks (``tp`` x ``attention_dp``
a stage) run the experts split ``moe_tp`` x ``moe_ep``.

Each rank routes the tokens its attention produced (a router GEMM, the softmax and top-k). Under
attention data parallelism the token copies go to the ranks holding their experts and come back
by all-to-all over the attention-DP group (each tensor-parallel rank moving its ``1/tp`` slice);
without it every rank of the stage already holds every token (attention's all-reduce), computes
its own experts' share, and the MLP's tensor-parallel all-reduce that follows sums the experts'
partial outputs (TensorRT-LLM's and vLLM's MoE under attention TP). A rank's experts take
``tokens x top_k / moe_ep`` copies of the stage's tokens, over ``experts / moe_ep`` experts of
``expert width / moe_tp``, under a stated routing skew (``moe.skew``, the ``moe`` kernel's
power-law exponent); the kernel routes every token of the stage (``group_tokens``), as the engines'
fused MoE kernels filter the gathered tokens for their own experts. The tokens routed are the
batch's own, not the GEMMs' padded rows (:func:`routed_tokens`): padding a decode of one request
to 32 rows would wake 32 x top-k experts instead of top-k. Shared experts run as a dense MLP
(tp-split as attention) beside the routed ones.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..transformer.shapes import Block

if TYPE_CHECKING:
    from .forward import StageForward
    from .shape import Shape


def routed_tokens(shape: Shape, padded: int) -> int:
    """The tokens a batch routes to experts: its own, not the rows the GEMMs are padded to (a
    multiple of 32, :func:`~simgpu.workload.inference.shape.pad`), which add no expert. Exact for
    decode-only batches; with prompts, their chunks' root-mean-square length times their count
    (the shape keeps no more), at most ``padded``."""
    return max(1, min(padded, shape.prefill * shape.prefill_len + shape.decode))


def serve_moe_fwd(fw: StageForward, blk: Block) -> int:
    """The MoE MLP of ``blk`` on the stage's first rank; returns its last op (partial over tp)."""
    s, bl, em = fw.s, fw.bl, fw.em
    ex, moe = blk.experts, s.model.moe
    assert ex is not None and moe is not None
    adp, tp = s.layout.ep, s.tp
    t, k, h = s.tokens, moe.top_k, bl.h
    bl.lin_fwd(ex.router, "fwd")
    em.kernel(f"{ex.name}.route", "softmax", bl.aux, phase="fwd", rows=t, cols=moe.experts, bwd=0)
    shared = fw.mlp(*blk.shared) if blk.shared is not None else None
    routed = routed_tokens(fw.shape, t)
    stage_tokens = routed * adp  # the tokens of every attention rank of the stage
    rows = math.ceil(stage_tokens * k / s.expert_ep)
    copies = math.ceil(routed * k / tp) * h * bl.w
    dispatch = None
    if adp > 1:
        perm = bl.ew(f"{ex.name}.permute", t * k * h // tp, 1, 1, "fwd", op="gather")
        dispatch = em.group_op("ep", f"{ex.name}.dispatch", f"{ex.name}.dispatch.mb{bl.mb}", "all_to_all", copies,
                               phase="fwd", deps=(perm,), stream="comm.ep")
    out = em.kernel(f"{ex.name}.experts.fwd", "moe", bl.moe_prec, phase="fwd",
                    deps=() if dispatch is None else (dispatch,), rows=rows, experts=ex.local, hidden=h,
                    inter=ex.fc2.inputs, topk=k, gated=float(s.model.act == "swiglu"), skew=moe.skew, bwd=0,
                    group_tokens=stage_tokens)
    if adp > 1:
        out = em.group_op("ep", f"{ex.name}.combine", f"{ex.name}.combine.mb{bl.mb}", "all_to_all", copies,
                          phase="fwd", deps=(out,), stream="comm.ep") or out
    deps = (out,) if shared is None else (out, shared)
    return bl.ew(f"{ex.name}.unpermute", t * k * h // (tp if adp > 1 else 1), 2, 1, "fwd", deps=deps, op="moe_combine")
