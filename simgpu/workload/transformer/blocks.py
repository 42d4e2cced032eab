"""The kernels and tensor-parallel collectives of a Transformer's modules on one rank, forward and backward.

This module owns what one micro-batch issues through a block (norm, QKV, RoPE, attention core,
output projection, residual, norm, MLP or MoE, residual), the embedding and the output head with
its loss, under Megatron's tensor parallelism: column-parallel linears need their input whole (an
all-gather first under sequence parallelism) and give their input gradient partial (all-reduced,
or reduce-scattered under sequence parallelism, overlapping the weight gradient); row-parallel
linears give a partial output (all-reduced, or reduce-scattered); norms, dropout and residuals run
on 1/tp of the tokens under sequence parallelism. The vocabulary-parallel cross entropy all-reduces
its max, target logit and sum of exponentials.

``framework`` pytorch: autocast casts every weight to the compute dtype at each use and the weight
gradients back to fp32; dropout and residual are separate kernels. megatron: low-precision weights,
weight gradients accumulated straight into fp32 main grads, fused bias-dropout-add. FP8 follows
Transformer Engine: block linears in FP8 with their weights quantised once per iteration, inputs
quantised by the kernel producing them (norm, activation) except the attention output, output
gradients cast and transposed before each linear's backward; attention and the output layer in bf16.
Recomputation: ``full`` re-runs each block's forward (with its collectives) before its backward;
``selective`` re-runs the unfused attention core (flash attention recomputes internally anyway).

This file stays above 500 lines: it is one class, :class:`Blocks`, whose methods call one another
(a block's passes through its linears, collectives and norms); the attention core, the token mixers
and MoE are functions of it in their own modules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ...graph import CollectiveOp
from ...precision import QUANTIZED_ACTIVATIONS
from ..common import Linear, Param
from ..dataparallel import GradSink
from ..stage import Pair, StageEmitter
from .attention import core_bwd, core_fwd
from .mixers import linear_bwd, linear_fwd, mla_bwd, mla_fwd
from .moe import moe_bwd, moe_fwd, sharded
from .shapes import Block, Setup, embedding_params, head_linears, norm_params

#: GEMM dtypes of quantised linears (a served model's formats, and training's fp8)
QUANTIZED = frozenset({*QUANTIZED_ACTIVATIONS, "w4a16"})
_TP_OPS: dict[str, CollectiveOp] = {"ar": "all_reduce", "rs": "reduce_scatter", "ag": "all_gather"}


#: Transformer Engine's userbuffers defaults (``initialize_ub`` in transformer_engine/pytorch/module/
#: base.py): the GEMM before a reduce-scatter (proj_fprop, fc2_fprop) runs "pipeline", in this many
#: chunks, each chunk's reduce-scatter kernel on the ub config's num_sm SMs (16 by default,
#: ``parallelism.tp_comm_overlap_sms``); the all-gathers before qkv_fprop / fc1_fprop and proj_dgrad
#: / fc2_dgrad run "ring_exchange", a GEMM chunk per tp step, with the copy engines moving the
#: shards (no SMs taken); the backward of qkv and fc1 runs "bulk": the input's all-gather beside the
#: dgrad GEMM (qkv_dgrad, fc1_dgrad) and the input gradient's reduce-scatter beside the wgrad GEMM
#: (qkv_wgrad, fc1_wgrad), each communication kernel on its num_sm SMs.
UB_SPLITS = 4


def _split(n: int, parts: int) -> list[int]:
    """``n`` rows in ``parts`` chunks as even as integers allow (none empty)."""
    parts = max(1, min(parts, n))
    q, r = divmod(n, parts)
    return [q + (1 if i < r else 0) for i in range(parts)]


def _d(idx: int | None) -> tuple[int, ...]:
    return () if idx is None else (idx,)


class Blocks:
    """Emits the modules of one stage's micro-batches onto ``em``; set :attr:`mb` before each step."""

    def __init__(self, s: Setup, em: StageEmitter) -> None:
        md = s.model
        self.s, self.em = s, em
        self.mb = 0
        self.prec = s.precision
        self.moe_prec = s.moe_dtype
        self.aux = s.aux
        self.attn_dtype = "bf16" if s.precision == "fp8" else s.precision
        self.aux_gemm = self.attn_dtype  # GEMMs kept out of FP8
        self.w = s.width
        self.h, self.d = md.hidden, md.d_head
        # KV heads beyond tp are replicated (a served GQA model at tp above its KV heads)
        self.heads, self.kv = md.heads // s.tp, max(md.kv_heads_n // s.tp, 1)
        self.window = 0  # the keys a sliding-window block attends to (0: all)
        self.p = md.dropout
        self.causal = md.causal
        self.norm_kind = md.norm_kind
        #: module name -> ops its forward must wait for first (the parameter all-gathers of its
        #: buckets, Megatron's forward pre-hook); each is handed out once
        self.waits: Callable[[str], tuple[int, ...]] = lambda _module: ()

    # ---- primitives

    def ew(self, name: str, numel: int, reads: int, writes: int, phase: str, deps: Iterable[int] = (),
           dtype: str | None = None, *, op: str) -> int:
        """An elementwise kernel of op ``op`` (see :mod:`simgpu.elementwise`), in the auxiliary
        dtype unless ``dtype`` says otherwise."""
        return self.em.elementwise(name, numel, reads, writes, dtype or self.aux, op=op, phase=phase, deps=deps)

    def norm(self, name: str, bwd: bool, phase: str, tag: str = "", deps: Iterable[int] = ()) -> int:
        if not bwd:
            deps = (*deps, *self.waits(name))
        return self.em.kernel(f"{name}.{'bwd' if bwd else 'fwd'}{tag}", "norm", self.aux, phase=phase, deps=deps,
                              rows=self.s.rows, cols=self.h, bwd=int(bwd))

    def ub_sms(self, lin: Linear, method: str) -> int:
        """SMs userbuffers' communication beside ``lin``'s GEMM takes under tp_comm_overlap (0 without it):
        the ub config's num_sm of the layer, e.g. ``qkv_wgrad`` for the qkv linear's ``wgrad``."""
        if not self.s.tp_overlap:
            return 0
        layer = lin.name.rsplit(".", 1)[-1]
        return dict(self.s.ub_sms)[f"{layer}_{method}"]

    def tp_comm(self, what: str, name: str, phase: str, deps: Iterable[int] = (), nbytes: int | None = None
                ) -> int | None:
        """A tensor-parallel all-reduce (``ar``), reduce-scatter (``rs``) or all-gather (``ag``) of a
        ``[tokens, hidden]`` activation; None where tp is 1."""
        op = _TP_OPS[what]
        size = self.s.tokens * self.h * self.w if nbytes is None else nbytes
        return self.em.group_op("tp", f"{name}.{op}", f"{name}.{what}.mb{self.mb}", op, size, phase=phase,
                                deps=deps, stream="comm.tp")

    def fp8(self, lin: Linear) -> bool:
        """Whether ``lin`` runs in a quantised dtype (FP8 under Transformer Engine; a served model's fp8,
        fp4 and other formats, :mod:`simgpu.precision`); the output layer stays 16-bit, as in Megatron."""
        return self.prec in QUANTIZED and not lin.name.startswith(("lm_head", "mlm", "pooler", "nsp"))

    def lin_fwd(self, lin: Linear, phase: str, tag: str = "", deps: Iterable[int] = (), rows: int | None = None,
                quantize_input: bool = False, weight_ready: bool = False, sm_taken: int = 0) -> int:
        """``y = x W^T (+ b)``. Under autocast the weight is cast first; under FP8 it is quantised at the
        first micro-batch (then cached), and ``quantize_input`` casts an input that no fused kernel has
        already produced in FP8 (bf16 read, fp8 written). ``weight_ready``: a later chunk of a split
        GEMM, whose weight the first chunk prepared; ``sm_taken``: SMs a communication kernel beside
        the GEMM holds."""
        t = self.s.tokens if rows is None else rows
        wait = self.waits(lin.name)  # on every op that reads the weight
        deps = (*deps, *wait)
        if self.s.cast and not weight_ready:
            self.ew(f"{lin.name}.cast{tag}", lin.numel, 1, 1, phase, op="cast", deps=wait)
        fp8 = self.fp8(lin)
        if fp8 and self.mb == 0 and not tag and not weight_ready:
            self.ew(f"{lin.name}.weight_fp8", lin.numel, 1, 1, phase, op="quantize", deps=wait)
        if fp8 and quantize_input and self.prec in QUANTIZED_ACTIVATIONS:
            # counted in fp8 bytes: a 2-byte read and a 1-byte write per element
            self.em.elementwise(f"{lin.name}.quantize{tag}", t * lin.inputs, 2, 1, "fp8", op="quantize", phase=phase,
                                deps=deps)
            deps = ()
        idx = self.em.kernel(f"{lin.name}.fwd{tag}", "gemm", self.prec if fp8 else self.aux_gemm, phase=phase,
                             deps=deps, m=t, n=lin.outputs, k=lin.inputs)
        self.em.program.ops[idx].sm_taken = sm_taken
        return idx

    # ---- tensor-parallel communication beside the GEMMs (tp_comm_overlap)

    def gather_lin_fwd(self, lin: Linear, name: str, phase: str, tag: str, src: int) -> int:
        """``lin`` over the norm output ``src``: under sequence parallelism all-gathered over tp first.
        Under tp_comm_overlap, Transformer Engine's ring exchange: the GEMM in tp chunks, the first
        over the local shard at once, chunk k once the k-th shard has arrived (:meth:`_ring`)."""
        s = self.s
        if not s.sp:
            return self.lin_fwd(lin, phase, tag)
        if not s.tp_overlap:
            ag = self.tp_comm("ag", f"{name}{tag}", phase, deps=(src,))
            return self.lin_fwd(lin, phase, tag, deps=_d(ag))
        steps = self._ring(f"{name}{tag}", phase, src)
        last = -1
        for k, rows in enumerate(_split(s.tokens, s.tp)):
            last = self.lin_fwd(lin, phase, tag, deps=(src,) if k == 0 else _d(steps[k - 1]), rows=rows,
                                weight_ready=k > 0)
        return last

    def lin_fwd_reduce(self, lin: Linear, name: str, phase: str, tag: str, quantize_input: bool = False
                       ) -> int | None:
        """A row-parallel ``lin`` and the reduction of its output over tp (reduce-scatter under
        sequence parallelism, all-reduce otherwise); returns the reduction (None where tp is 1).
        Under tp_comm_overlap, Transformer Engine's pipelined overlap: the GEMM in :data:`UB_SPLITS`
        chunks, each chunk's reduce-scatter beside the next chunk, which runs on the SMs the
        reduce-scatter leaves (its num_sm taken, :meth:`ub_sms`)."""
        s = self.s
        if not s.tp_overlap:
            out = self.lin_fwd(lin, phase, tag, quantize_input=quantize_input)
            return self.tp_comm("rs" if s.sp else "ar", f"{name}{tag}", phase, deps=(out,))
        red: int | None = None
        full = s.tokens * self.h * self.w
        for j, rows in enumerate(_split(s.tokens, UB_SPLITS)):
            g = self.lin_fwd(lin, phase, tag, rows=rows, quantize_input=quantize_input, weight_ready=j > 0,
                             sm_taken=self.ub_sms(lin, "fprop") if j > 0 else 0)
            red = self.tp_comm("rs", f"{name}{tag}.chunk{j}", phase, deps=(g,), nbytes=full * rows // s.tokens)
        return red

    def gather_dgrad(self, lin: Linear, name: str, phase: str) -> int:
        """The input gradient of a row-parallel ``lin`` (proj, fc2), its output gradient all-gathered
        over tp first under sequence parallelism (Transformer Engine's ring exchange under
        tp_comm_overlap, as :meth:`gather_lin_fwd`)."""
        s = self.s
        if not s.sp:
            return self.lin_dgrad(lin, phase)
        src = self.em.last
        if not s.tp_overlap:
            ag = self.tp_comm("ag", name, phase, deps=(src,))
            return self.lin_dgrad(lin, phase, deps=_d(ag))
        steps = self._ring(name, phase, src)
        last = -1
        for k, rows in enumerate(_split(s.tokens, s.tp)):
            last = self.lin_dgrad(lin, phase, deps=(src,) if k == 0 else _d(steps[k - 1]), rows=rows)
        return last

    def _ring(self, name: str, phase: str, src: int) -> list[int | None]:
        """The tp - 1 steps of a ring exchange of ``src``'s shard (1/tp of the gathered bytes): each
        step sends the shard last received to the next tp rank and receives one from the previous;
        returns the receives."""
        shard = -(-self.s.tokens * self.h * self.w // self.s.tp)
        recvs: list[int | None] = []
        held = src
        for k in range(1, self.s.tp):
            key = f"{name}.ring{k}.mb{self.mb}"
            self.em.p2p(Pair("tp", +1, True), f"{name}.ring_send", key, shard, phase=phase, deps=(held,),
                        stream="comm.tp_send")
            held = self.em.p2p(Pair("tp", -1, False), f"{name}.ring_recv", key, shard, phase=phase,
                               stream="comm.tp_recv")
            recvs.append(held)
        return recvs

    def lin_dgrad(self, lin: Linear, phase: str, deps: Iterable[int] = (), rows: int | None = None,
                  sm_taken: int = 0) -> int:
        """Input gradient; under FP8 the output gradient is first cast and transposed (for the wgrad too)."""
        t = self.s.tokens if rows is None else rows
        fp8 = self.fp8(lin)
        if fp8:
            self.em.elementwise(f"{lin.name}.grad_cast_transpose", t * lin.outputs, 1, 1, self.aux, op="quantize",
                                phase=phase, deps=deps)
            deps = ()
        idx = self.em.kernel(f"{lin.name}.dgrad", "gemm", self.prec if fp8 else self.aux_gemm, phase=phase,
                             deps=deps, m=t, n=lin.inputs, k=lin.outputs)
        self.em.program.ops[idx].sm_taken = sm_taken
        return idx

    def lin_wgrad(self, lin: Linear, phase: str, sink: GradSink | None, deps: Iterable[int] = (),
                  rows: int | None = None, sm_taken: int = 0) -> int:
        """Weight gradient, bias gradient (a reduction over the rows) and, under autocast, the cast of
        the gradients to fp32; the parameters are ready at the last of them."""
        t = self.s.tokens if rows is None else rows
        last = self.em.kernel(f"{lin.name}.wgrad", "gemm", self.prec if self.fp8(lin) else self.aux_gemm,
                              phase=phase, deps=deps, m=lin.outputs, n=lin.inputs, k=t)
        self.em.program.ops[last].sm_taken = sm_taken
        if lin.bias:
            last = self.ew(f"{lin.name}.bias_grad", t * lin.outputs, 1, 0, phase, op="sum_rows")
        if self.s.cast:
            last = self.ew(f"{lin.name}.grad_cast", lin.numel, 1, 1, phase, op="cast")
        if sink is not None:
            sink.ready(lin.params, last)
        return last

    def column_bwd(self, lin: Linear, name: str, phase: str, sink: GradSink | None, deps: Iterable[int] = ()
                   ) -> int | None:
        """Backward of a column-parallel linear: the input gradient is reduced over tp while the weight
        gradient runs (under sequence parallelism the wgrad needs the input all-gathered again).
        Returns the reduction (None where tp is 1), which the next op must wait for. Under
        tp_comm_overlap, userbuffers' bulk overlaps: the dgrad and wgrad GEMMs run beside the
        all-gather and the reduce-scatter on the SMs their kernels leave (:meth:`ub_sms`)."""
        ag = self.tp_comm("ag", f"{name}.input", phase, deps=(self.em.last,)) if self.s.sp else None
        dgrad = self.lin_dgrad(lin, phase, deps=deps, sm_taken=self.ub_sms(lin, "dgrad"))
        red = self.tp_comm("rs" if self.s.sp else "ar", f"{name}.dgrad", phase, deps=(dgrad,))
        self.lin_wgrad(lin, phase, sink, deps=_d(ag), sm_taken=self.ub_sms(lin, "wgrad"))
        return red

    def residual(self, name: str, phase: str, deps: Iterable[int] = ()) -> int:
        """Dropout and the residual add: Megatron's fused bias-dropout-add, or separate kernels."""
        rows = self.s.rows * self.h
        if self.s.megatron:
            return self.ew(name, rows, 2, 2 if self.p else 1, phase, deps=deps,
                           op="bias_dropout_add" if self.p else "bias_residual_add")
        if self.p:
            self.ew(f"{name}.dropout", rows, 1, 2, phase, deps=deps, op="dropout")
            deps = ()
        return self.ew(name, rows, 2, 1, phase, deps=deps, op="add")

    def residual_bwd(self, name: str, phase: str) -> None:
        if self.p:
            self.ew(f"{name}.dropout_bwd", self.s.rows * self.h, 2, 1, phase, op="dropout_bwd")

    # ---- a block

    def sync(self, name: str, phase: str) -> None:
        """Under ``sync_each_layer``, the host waits for everything issued so far."""
        if self.s.sync_layers:
            self.em.host_wait(name, (self.em.last,), phase=phase)

    def block_fwd(self, blk: Block, phase: str = "fwd", tag: str = "", deps: Iterable[int] = ()) -> int:
        """One block's forward; ``tag`` marks a recomputation, ``deps`` gate its first kernel.
        Returns its last op."""
        s, n = self.s, blk.name
        if not tag:
            self.sync(f"{n}.sync", phase)
        ln1 = self.norm(f"{n}.ln1", False, phase, tag, deps=deps)
        self.attention_dims(blk)
        if blk.kv_up is not None:
            mla_fwd(self, blk, phase, tag, ln1)
        elif blk.kind == "linear":
            linear_fwd(self, blk, phase, tag, ln1)
        else:
            self.gather_lin_fwd(blk.qkv, f"{n}.ln1", phase, tag, ln1)
            if s.model.qk_norm:
                self.em.kernel(f"{n}.qk_norm{tag}", "norm", self.aux, phase=phase,
                               rows=s.tokens * (self.heads + self.kv), cols=self.d, bwd=0, rms=1)
            if s.model.rope:
                self.ew(f"{n}.rope{tag}", s.tokens * (self.heads + self.kv) * self.d, 1, 1, phase, op="rope")
            core_fwd(self, n, phase, tag)
            if s.model.attention_output_gate:
                self.ew(f"{n}.attn_gate{tag}", s.tokens * self.heads * self.d, 2, 1, phase, op="mul")
        red = self.lin_fwd_reduce(blk.proj, blk.proj.name, phase, tag, quantize_input=True)
        self.residual(f"{blk.proj.name}.residual{tag}", phase, deps=_d(red))
        ln2 = self.norm(f"{n}.ln2", False, phase, tag)
        if blk.experts is not None:
            shard = sharded(s)  # each tp rank routes its own sequence shard (Megatron's SP with experts)
            ag = self.tp_comm("ag", f"{n}.ln2{tag}", phase, deps=(ln2,)) if s.sp and (blk.shared or not shard) else None
            out = moe_fwd(self, blk.experts, phase, tag, deps=(ln2,) if shard else _d(ag))
            outs: tuple[int, ...] = (out,)
            if blk.shared is not None:  # the shared experts: a dense MLP beside the routed ones
                fc1, fc2 = blk.shared
                act = self.lin_fwd(fc1, phase, tag, deps=_d(ag))
                self.activation(fc2.inputs, fc1.name, phase, tag, deps=(act,))
                outs = (out, self.lin_fwd(fc2, phase, tag, quantize_input=True))
            if shard:  # the routed experts' output is the shard's already; the shared MLP's is reduced
                shared = self.tp_comm("rs", f"{n}.moe.shared{tag}", phase, deps=outs[1:]) if blk.shared else None
                red = self.ew(f"{n}.moe.sum{tag}", s.rows * self.h, 2, 1, phase, deps=(out, *_d(shared)),
                              op="add") if blk.shared else out
            else:
                red = self.tp_comm("rs" if s.sp else "ar", f"{n}.moe{tag}", phase, deps=outs)
            name = f"{n}.moe"
        else:
            assert blk.fc1 is not None and blk.fc2 is not None
            act = self.gather_lin_fwd(blk.fc1, f"{n}.ln2", phase, tag, ln2)
            self.activation(blk.fc2.inputs, f"{blk.fc1.name}", phase, tag, deps=(act,))
            red = self.lin_fwd_reduce(blk.fc2, blk.fc2.name, phase, tag)
            name = blk.fc2.name
        last = self.residual(f"{name}.residual{tag}", phase, deps=_d(red))
        if not tag:
            self.sync(f"{n}.sync", phase)
        return last

    def attention_dims(self, blk: Block) -> None:
        """The attention core's head width, KV heads and window for ``blk``: under MLA the mean of the
        query/key and value widths (the two matmuls' FLOPs exact) over as many KV heads as heads; a
        sliding block's window."""
        md = self.s.model
        self.window = (md.sliding_window or 0) if blk.kind == "sliding" else 0
        if md.sparse_attention is not None:  # each query attends to its top-k keys: a window's work
            self.window = md.sparse_attention.index_topk
        if md.mla is not None:
            self.d, self.kv = (md.mla.qk_head_dim + md.mla.v_head_dim) // 2, self.heads
        else:
            self.d, self.kv = md.d_head, max(md.kv_heads_n // self.s.tp, 1)

    def activation(self, width: int, name: str, phase: str, tag: str = "", deps: Iterable[int] = (),
                   rows: int | None = None, bwd: bool = False) -> int:
        """GELU (bias fused) or SwiGLU over ``rows x width`` outputs."""
        numel = (self.s.tokens if rows is None else rows) * width
        swiglu = self.s.model.act == "swiglu"
        kind = "swiglu" if swiglu else "gelu"
        if bwd:
            return self.ew(f"{name}.{kind}_bwd", numel, 3 if swiglu else 2, 2 if swiglu else 1, phase, deps=deps,
                           op=f"{kind}_bwd")
        return self.ew(f"{name}.{kind}{tag}", numel, 2 if swiglu else 1, 1, phase, deps=deps, op=kind)

    def block_bwd(self, blk: Block, sink: GradSink | None, esink: GradSink | None, phase: str = "bwd") -> int:
        """One block's backward (recomputation first); ``esink`` takes the expert gradients."""
        s, n = self.s, blk.name
        self.sync(f"{n}.sync", phase)
        if s.recompute == "full":
            self.block_fwd(blk, phase, ".recompute")
        if blk.experts is not None:
            self.residual_bwd(f"{n}.moe.residual", phase)
            shard = sharded(s)
            grad = self.em.last
            need_ag = s.sp and (blk.shared is not None or not shard)
            ag = self.tp_comm("ag", f"{n}.moe.grad", phase, deps=(grad,)) if need_ag else None
            shared_red = None
            if blk.shared is not None:  # the shared experts' backward; its input gradient joins the routed one's
                fc1, fc2 = blk.shared
                self.lin_dgrad(fc2, phase, deps=_d(ag))
                self.lin_wgrad(fc2, phase, sink)
                self.activation(fc2.inputs, fc1.name, phase, bwd=True)
                dg = self.lin_dgrad(fc1, phase)
                self.lin_wgrad(fc1, phase, sink)
                if shard:
                    shared_red = self.tp_comm("rs", f"{n}.moe.shared.dgrad", phase, deps=(dg,))
            red = moe_bwd(self, blk.experts, phase, sink, esink, deps=(grad,) if shard else _d(ag))
            if shard and shared_red is not None:
                red = self.ew(f"{n}.moe.grad_sum", s.rows * self.h, 2, 1, phase, deps=(shared_red, self.em.last),
                              op="add")
        else:
            assert blk.fc1 is not None and blk.fc2 is not None
            self.residual_bwd(f"{blk.fc2.name}.residual", phase)
            self.gather_dgrad(blk.fc2, f"{blk.fc2.name}.grad", phase)
            self.lin_wgrad(blk.fc2, phase, sink)
            self.activation(blk.fc2.inputs, blk.fc1.name, phase, bwd=True)
            red = self.column_bwd(blk.fc1, blk.fc1.name, phase, sink)
        ln2 = self.norm(f"{n}.ln2", True, phase, deps=_d(red))
        if sink is not None:
            sink.ready(blk.ln2, ln2)
        # The residual stream forks at each block input: its two gradients are summed.
        self.ew(f"{n}.ln2.residual_grad", s.rows * self.h, 2, 1, phase, op="add")
        self.residual_bwd(f"{blk.proj.name}.residual", phase)
        self.gather_dgrad(blk.proj, f"{blk.proj.name}.grad", phase)
        self.lin_wgrad(blk.proj, phase, sink)
        self.attention_dims(blk)
        if blk.kv_up is not None:
            red = mla_bwd(self, blk, phase, sink)
        elif blk.kind == "linear":
            red = linear_bwd(self, blk, phase, sink)
        else:
            if s.model.attention_output_gate:
                self.ew(f"{n}.attn_gate_bwd", s.tokens * self.heads * self.d, 3, 2, phase, op="mul")
            core_bwd(self, n, phase)
            if s.model.rope:
                self.ew(f"{n}.rope_bwd", s.tokens * (self.heads + self.kv) * self.d, 1, 1, phase, op="rope")
            if s.model.qk_norm:
                self.em.kernel(f"{n}.qk_norm_bwd", "norm", self.aux, phase=phase,
                               rows=s.tokens * (self.heads + self.kv), cols=self.d, bwd=1, rms=1)
            red = self.column_bwd(blk.qkv, blk.qkv.name, phase, sink)
        if sink is not None and blk.attn_norms:
            sink.ready(blk.attn_norms, self.em.last)
        ln1 = self.norm(f"{n}.ln1", True, phase, deps=_d(red))
        if sink is not None:
            sink.ready(blk.ln1, ln1)
        last = self.ew(f"{n}.ln1.residual_grad", s.rows * self.h, 2, 1, phase, op="add")
        self.sync(f"{n}.sync", phase)
        return last

    # ---- embedding and head

    def embedding_fwd(self, copy: int, deps: Iterable[int] = ()) -> int:
        """Token (vocabulary-parallel) and position / token-type embeddings of the micro-batch; returns
        the op the first block must wait for. ``deps`` gate the first kernel, with the batch's copy."""
        s, h = self.s, self.h
        self.ew("embed.tok_gather", s.tokens * h, 1, 1, "fwd", deps=(copy, *deps), op="gather")
        if not s.model.rope:
            self.ew("embed.pos_gather", s.seq * h, 1, 1, "fwd", op="gather")
            self.ew("embed.add", s.tokens * h, 2, 1, "fwd", op="add")
        if s.model.arch == "bert":
            self.ew("embed.type_gather", s.tokens * h, 1, 1, "fwd", op="gather")
            self.ew("embed.type_add", s.tokens * h, 2, 1, "fwd", op="add")
        last = self.em.last
        red = self.tp_comm("rs" if s.sp else "ar", "embed", "fwd", deps=(last,))
        if s.model.arch == "bert":
            last = self.norm("embed.ln", False, "fwd", deps=_d(red))
        elif self.p:
            last = self.ew("embed.dropout", s.rows * h, 1, 2, "fwd", deps=_d(red), op="dropout")
        elif red is not None:
            last = red
        return last

    def embedding_bwd(self, sink: GradSink | None) -> int:
        """Position gradient summed over the batch; the token embedding's gradient is a fresh fp32
        ``vocab/tp x h`` tensor (zeroed, rows scatter-added), then summed into the accumulated one."""
        s, h = self.s, self.h
        if s.model.arch == "bert":
            self.norm("embed.ln", True, "bwd")
            if sink is not None:
                sink.ready(norm_params("embed.ln", h, self.norm_kind), self.em.last)
        elif self.p:
            self.ew("embed.dropout_bwd", s.rows * h, 2, 1, "bwd", op="dropout_bwd")
        ag = self.tp_comm("ag", "embed.grad", "bwd", deps=(self.em.last,)) if s.sp else None
        params = {p.name: p for p in embedding_params(s)}
        if "wpe" in params:
            pos = self.ew("embed.pos_grad", s.tokens * h, 1, 1, "bwd", deps=_d(ag), op="sum_rows")
            ag = None
            if sink is not None:
                sink.ready((params["wpe"],), pos)
        if "wtt" in params:
            tt = self.ew("embed.type_grad", s.tokens * h, 1, 1, "bwd", deps=_d(ag), op="scatter_add")
            ag = None
            if sink is not None:
                sink.ready((params["wtt"],), tt)
        v = s.vocab // s.tp
        self.ew("embed.tok_grad_zero", v * h, 0, 1, "bwd", dtype="fp32", deps=_d(ag), op="zero")
        self.ew("embed.tok_grad_scatter", s.tokens * h, 1, 1, "bwd", dtype="fp32", op="scatter_add")
        last = self.ew("embed.tok_grad_accumulate", v * h, 2, 1, "bwd", dtype="fp32", op="add")
        if sink is not None:
            sink.ready((params["wte"],), last)
        return last

    def head_fwd(self, labels: int, deps: Iterable[int] = ()) -> int:
        """Final norm, (BERT's MLM transform and next-sentence head), output layer and cross entropy;
        ``deps`` gate the first kernel."""
        s, h = self.s, self.h
        lins = head_linears(s)
        ln = self.norm("ln_f", False, "fwd", deps=deps)
        ag = self.tp_comm("ag", "ln_f", "fwd", deps=(ln,)) if s.sp else None
        if "mlm" in lins:
            self.lin_fwd(lins["mlm"], "fwd", deps=_d(ag))
            ag = None
            self.ew("mlm.gelu", s.tokens * h, 1, 1, "fwd", op="gelu")
            self.norm("mlm.ln", False, "fwd")
        logits = self.lin_fwd(lins["lm_head"], "fwd", deps=_d(ag))
        v = lins["lm_head"].outputs
        last = self.em.kernel("loss.cross_entropy.fwd", "softmax", self.aux, phase="fwd", deps=(logits, labels),
                              rows=s.tokens, cols=v, bwd=0)
        for part in ("max", "target", "sum_exp"):
            red = self.tp_comm("ar", f"loss.{part}", "fwd", deps=(last,), nbytes=s.tokens * 4)
            last = last if red is None else red
        if "nsp" in lins:
            self.lin_fwd(lins["pooler"], "fwd", rows=s.micro)
            self.ew("pooler.tanh", s.micro * h, 1, 1, "fwd", op="tanh")
            last = self.lin_fwd(lins["nsp"], "fwd", rows=s.micro)
        return last

    def head_bwd(self, sink: GradSink | None) -> int:
        """Backward of :meth:`head_fwd`. A tied output layer on the embedding's stage gives its
        gradient to the token embedding, which is ready only after the embedding backward."""
        s, h = self.s, self.h
        lins = head_linears(s)
        self.em.kernel("loss.cross_entropy.bwd", "softmax", self.aux, phase="bwd", rows=s.tokens,
                       cols=lins["lm_head"].outputs, bwd=1)
        lm = lins["lm_head"]
        own = not (s.model.tied and s.layout.pp == 1)
        self.lin_dgrad(lm, "bwd")
        self.lin_wgrad(lm, "bwd", sink if own else None)
        if not own and lm.bias and sink is not None:
            sink.ready((Param("lm_head.bias", lm.outputs),), self.em.last)
        if "nsp" in lins:
            for name in ("nsp", "pooler"):
                self.lin_dgrad(lins[name], "bwd", rows=s.micro)
                self.lin_wgrad(lins[name], "bwd", sink, rows=s.micro)
            self.norm("mlm.ln", True, "bwd")
            if sink is not None:
                sink.ready(norm_params("mlm.ln", h, self.norm_kind), self.em.last)
            self.ew("mlm.gelu_bwd", s.tokens * h, 2, 1, "bwd", op="gelu_bwd")
            self.lin_dgrad(lins["mlm"], "bwd")
            self.lin_wgrad(lins["mlm"], "bwd", sink)
        red = self.tp_comm("rs" if s.sp else "ar", "ln_f.grad", "bwd", deps=(self.em.last,))
        ln = self.norm("ln_f", True, "bwd", deps=_d(red))
        if sink is not None:
            sink.ready(norm_params("ln_f", h, self.norm_kind), ln)
        return ln
