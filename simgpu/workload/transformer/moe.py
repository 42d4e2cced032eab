"""The mixture-of-experts MLP of one block on one rank, forward and backward (Megatron's all-to-all
token dispatcher).

This module owns the MoE MLP: a router linear and its softmax / top-k, the permutation that groups
each token's ``top_k`` copies by expert, the all-to-all over the expert-parallel group that sends
them to the ranks holding their experts (dispatch), the local experts (each tp-split like a dense
MLP) as one ``moe`` kernel (fc1, its activation and fc2 as grouped GEMMs, timed as a fused MoE
kernel is measured), the all-to-all back (combine) and the weighted sum of the ``top_k`` outputs;
backward runs the same in reverse, the experts as two ``moe`` kernels: the input gradients (before
the dispatch's all-to-all back) and the weight gradients (beside it). Tokens are assumed spread
evenly over experts: each local expert gets ``tokens x top_k x ep / experts`` tokens (times the
capacity factor, padded, when one is set).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..dataparallel import GradSink
from .shapes import Experts, Setup

if TYPE_CHECKING:
    from .blocks import Blocks


def tokens_per_expert(s: Setup) -> int:
    """Tokens each local expert processes per micro-batch (from every rank of its ep group)."""
    moe = s.model.moe
    if moe is None:
        raise ValueError("the model has no experts")
    share = s.tokens * moe.top_k * s.layout.ep / moe.experts
    return math.ceil(share * (moe.capacity_factor or 1.0))


def expert_shape(bl: Blocks, ex: Experts) -> dict[str, float]:
    """The ``moe`` kernel's shape of this rank's experts: the token copies they take, the local
    experts, hidden and (tp-split) inner widths, top-k, SwiGLU (gated) or not, balanced routing."""
    moe = bl.s.model.moe
    assert moe is not None
    return {"rows": tokens_per_expert(bl.s) * ex.local, "experts": ex.local, "hidden": bl.h,
            "inter": ex.fc2.inputs, "topk": moe.top_k, "gated": float(bl.s.model.act == "swiglu"), "skew": 0.0}


def sharded(s: Setup) -> bool:
    """Whether the MoE layer dispatches each tensor-parallel rank's sequence shard (sequence
    parallelism with tp > 1, as Megatron-core requires for experts beside tensor parallelism)."""
    return s.sp and s.tp > 1


def _a2a(bl: Blocks, ex: Experts, what: str, phase: str, tag: str, dep: int) -> int | None:
    # under sequence parallelism each tensor-parallel rank sends only its shard's token copies
    nbytes = tokens_per_expert(bl.s) * ex.local * bl.h * bl.w // (bl.s.tp if sharded(bl.s) else 1)
    return bl.em.group_op("ep", f"{ex.name}.{what}{tag}", f"{ex.name}.{what}{tag}.mb{bl.mb}", "all_to_all",
                          nbytes, phase=phase, deps=(dep,), stream="comm.ep")


def _tp_tokens(bl: Blocks, ex: Experts, what: str, phase: str, tag: str, dep: int | None) -> int | None:
    """Under sequence parallelism, the all-gather (``ag``) over tp of the token copies the rank's
    experts take after the dispatch, or the reduce-scatter (``rs``) of their outputs before the combine
    (Megatron-core's MoEAlltoAllTokenDispatcher with tensor-parallel experts); None otherwise."""
    if not sharded(bl.s):
        return dep
    nbytes = tokens_per_expert(bl.s) * ex.local * bl.h * bl.w
    red = bl.tp_comm(what, f"{ex.name}.tokens_{what}{tag}", phase, deps=() if dep is None else (dep,), nbytes=nbytes)
    return dep if red is None else red


def moe_fwd(bl: Blocks, ex: Experts, phase: str, tag: str, deps: Iterable[int] = ()) -> int:
    """Forward of the MoE MLP; returns its last op (the output is tp-partial, as a dense MLP's)."""
    s, em = bl.s, bl.em
    moe = s.model.moe
    assert moe is not None
    t, k, h = s.rows if sharded(s) else s.tokens, moe.top_k, bl.h
    bl.lin_fwd(ex.router, phase, tag, deps=deps, rows=t)
    route = em.kernel(f"{ex.name}.route{tag}", "softmax", bl.aux, phase=phase, rows=t, cols=moe.experts, bwd=0)
    if s.megatron and moe.capacity_factor is None:
        # Megatron-core's all-to-all dispatcher, dropless, copies the tokens per expert (the
        # all-to-all's splits, the permuted length) to the host and synchronises the stream before
        # permuting (token_dispatcher.py, MoEAlltoAllTokenDispatcher: _maybe_dtoh_and_synchronize at
        # its cuda_sync_point): the host launches nothing more until the router has run
        em.host_wait(f"{ex.name}.splits_sync{tag}", (route,), phase=phase)
    perm = bl.ew(f"{ex.name}.permute{tag}", t * k * h, 1, 1, phase, op="gather")
    dispatch = _tp_tokens(bl, ex, "ag", phase, tag, _a2a(bl, ex, "dispatch", phase, tag, perm))
    if s.cast:
        bl.ew(f"{ex.name}.experts.cast{tag}", (ex.fc1.numel + ex.fc2.numel) * ex.local, 1, 1, phase, op="cast")
    out = em.kernel(f"{ex.name}.experts.fwd{tag}", "moe", bl.moe_prec, phase=phase,
                    deps=() if dispatch is None else (dispatch,), **expert_shape(bl, ex), bwd=0)
    combine = _a2a(bl, ex, "combine", phase, tag, _tp_tokens(bl, ex, "rs", phase, tag, out) or out)
    return bl.ew(f"{ex.name}.unpermute{tag}", t * k * h, 2, 1, phase, deps=() if combine is None else (combine,),
                 op="moe_combine")


def moe_bwd(bl: Blocks, ex: Experts, phase: str, sink: GradSink | None, esink: GradSink | None,
            deps: Iterable[int] = ()) -> int | None:
    """Backward of the MoE MLP; returns the tp reduction of its input gradient (None where tp is 1, or
    where each rank routed its own sequence shard, :func:`sharded`)."""
    s, em = bl.s, bl.em
    moe = s.model.moe
    assert moe is not None
    t, k, h = s.rows if sharded(s) else s.tokens, moe.top_k, bl.h
    te = tokens_per_expert(s)
    unperm = bl.ew(f"{ex.name}.unpermute_bwd", t * k * h, 2, 1, phase, deps=deps, op="moe_combine_bwd")
    combine = _tp_tokens(bl, ex, "ag", phase, "_bwd", _a2a(bl, ex, "combine_bwd", phase, "", unperm))
    shape = expert_shape(bl, ex)
    dgrad = em.kernel(f"{ex.name}.experts.dgrad", "moe", bl.prec, phase=phase,
                      deps=() if combine is None else (combine,), **shape, bwd=1)
    dispatch = _a2a(bl, ex, "dispatch_bwd", phase, "", _tp_tokens(bl, ex, "rs", phase, "_bwd", dgrad) or dgrad)
    last = em.kernel(f"{ex.name}.experts.wgrad", "moe", bl.prec, phase=phase, deps=(), **shape, bwd=2)
    if ex.fc1.bias:
        last = bl.ew(f"{ex.name}.bias_grad", te * ex.local * (ex.fc1.outputs + h), 1, 0, phase, op="sum_rows")
    if s.cast:
        last = bl.ew(f"{ex.name}.experts.grad_cast", (ex.fc1.numel + ex.fc2.numel) * ex.local, 1, 1, phase,
                     op="cast")
    if esink is not None:
        esink.ready(ex.params, last)
    bl.ew(f"{ex.name}.permute_bwd", t * k * h, 1, 1, phase, deps=() if dispatch is None else (dispatch,),
          op="scatter_add")
    em.kernel(f"{ex.name}.route_bwd", "softmax", bl.aux, phase=phase, rows=t, cols=moe.experts, bwd=1)
    dgrad = bl.lin_dgrad(ex.router, phase, rows=t)
    red = None if sharded(s) else bl.tp_comm("rs" if s.sp else "ar", f"{ex.name}.dgrad", phase, deps=(dgrad,))
    bl.lin_wgrad(ex.router, phase, sink, rows=t)
    return red
