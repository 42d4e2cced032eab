"""The mixture-of-experts MLP of one block on one rank, forward and backward (Megatron's all-to-all
token dispatcher).

This module owns the MoE MLP: a router linear and its softmax / top-k, the permutation that groups
each token's ``top_k`` copies by expert, the all-to-all over the expert-parallel group that sends
them to the ranks holding their experts (dispatch), the local experts as grouped GEMMs (each expert
tp-split like a dense MLP), the all-to-all back (combine) and the weighted sum of the ``top_k``
outputs; backward runs the same in reverse. Tokens are assumed spread evenly over experts: each
local expert gets ``tokens x top_k x ep / experts`` tokens (times the capacity factor, padded, when
one is set).
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


def _a2a(bl: Blocks, ex: Experts, what: str, phase: str, tag: str, dep: int) -> int | None:
    nbytes = tokens_per_expert(bl.s) * ex.local * bl.h * bl.w
    return bl.em.group_op("ep", f"{ex.name}.{what}{tag}", f"{ex.name}.{what}{tag}.mb{bl.mb}", "all_to_all",
                          nbytes, phase=phase, deps=(dep,), stream="comm.ep")


def moe_fwd(bl: Blocks, ex: Experts, phase: str, tag: str, deps: Iterable[int] = ()) -> int:
    """Forward of the MoE MLP; returns its last op (the output is tp-partial, as a dense MLP's)."""
    s, em = bl.s, bl.em
    moe = s.model.moe
    assert moe is not None
    t, k, h = s.tokens, moe.top_k, bl.h
    te = tokens_per_expert(s)
    bl.lin_fwd(ex.router, phase, tag, deps=deps)
    em.kernel(f"{ex.name}.route{tag}", "softmax", bl.aux, phase=phase, rows=t, cols=moe.experts, bwd=0)
    perm = bl.ew(f"{ex.name}.permute{tag}", t * k * h, 1, 1, phase, op="gather")
    dispatch = _a2a(bl, ex, "dispatch", phase, tag, perm)
    if s.cast:
        bl.ew(f"{ex.name}.experts.cast{tag}", (ex.fc1.numel + ex.fc2.numel) * ex.local, 1, 1, phase, op="cast")
    em.kernel(f"{ex.name}.fc1.fwd{tag}", "bmm", bl.prec, phase=phase, deps=() if dispatch is None else (dispatch,),
              b=ex.local, m=te, n=ex.fc1.outputs, k=h)
    bl.activation(ex.fc2.inputs, f"{ex.name}.fc1", phase, tag, rows=te * ex.local)
    out = em.kernel(f"{ex.name}.fc2.fwd{tag}", "bmm", bl.prec, phase=phase, b=ex.local, m=te, n=h,
                    k=ex.fc2.inputs)
    combine = _a2a(bl, ex, "combine", phase, tag, out)
    return bl.ew(f"{ex.name}.unpermute{tag}", t * k * h, 2, 1, phase, deps=() if combine is None else (combine,),
                 op="moe_combine")


def moe_bwd(bl: Blocks, ex: Experts, phase: str, sink: GradSink | None, esink: GradSink | None,
            deps: Iterable[int] = ()) -> int | None:
    """Backward of the MoE MLP; returns the tp reduction of its input gradient (None where tp is 1)."""
    s, em = bl.s, bl.em
    moe = s.model.moe
    assert moe is not None
    t, k, h = s.tokens, moe.top_k, bl.h
    te = tokens_per_expert(s)
    unperm = bl.ew(f"{ex.name}.unpermute_bwd", t * k * h, 2, 1, phase, deps=deps, op="moe_combine_bwd")
    combine = _a2a(bl, ex, "combine_bwd", phase, "", unperm)
    em.kernel(f"{ex.name}.fc2.dgrad", "bmm", bl.prec, phase=phase, deps=() if combine is None else (combine,),
              b=ex.local, m=te, n=ex.fc2.inputs, k=h)
    em.kernel(f"{ex.name}.fc2.wgrad", "bmm", bl.prec, phase=phase, b=ex.local, m=h, n=ex.fc2.inputs, k=te)
    bl.activation(ex.fc2.inputs, f"{ex.name}.fc1", phase, rows=te * ex.local, bwd=True)
    dgrad = em.kernel(f"{ex.name}.fc1.dgrad", "bmm", bl.prec, phase=phase, b=ex.local, m=te, n=h,
                      k=ex.fc1.outputs)
    dispatch = _a2a(bl, ex, "dispatch_bwd", phase, "", dgrad)
    last = em.kernel(f"{ex.name}.fc1.wgrad", "bmm", bl.prec, phase=phase, b=ex.local, m=ex.fc1.outputs, n=h, k=te)
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
    dgrad = bl.lin_dgrad(ex.router, phase)
    red = bl.tp_comm("rs" if s.sp else "ar", f"{ex.name}.dgrad", phase, deps=(dgrad,))
    bl.lin_wgrad(ex.router, phase, sink)
    return red
