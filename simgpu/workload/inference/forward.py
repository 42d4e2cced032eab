"""The forward of one iteration's batch on one pipeline stage of a model replica.

This module owns what a serving engine (vLLM, TensorRT-LLM) runs per iteration on a stage: the
input copy (token ids, positions, block tables), the vocabulary-parallel embedding, each block's
norm, QKV, RoPE, the write of the new K/V into the paged cache, paged attention (a causal prefill
kernel over the prompts, one over chunked prompts' cached keys, a decode kernel over the decoding
requests' caches: :mod:`~simgpu.workload.inference.shape`), the output projection and its
tensor-parallel all-reduce, the MLP or MoE (Megatron's all-to-all dispatcher, as in training);
residual adds are fused into the RMSNorm that follows them (a LayerNorm model adds them, and a
model with biases its row-parallel biases, in kernels of their own after each all-reduce, as vLLM's
BLOOM and GPT do), and ``framework: tensorrt_llm`` fuses RoPE and the cache write into attention,
SwiGLU and the quantisation of activations into the GEMMs; on the last stage the final norm, the
output layer over one row per request, the logits gathered over tp and the sampler, which the host
waits for. Between stages the activations are sent on.

The modules are the Transformer builder's (:class:`~simgpu.workload.transformer.blocks.Blocks`
primitives and :func:`~simgpu.workload.transformer.moe.moe_fwd`, shapes from
:func:`~simgpu.workload.transformer.shapes.block`); only attention and the head differ from a
training forward. Weights are stored in the serving dtype (fp8 / fp4 quantised offline), so no
weight is cast or quantised per iteration.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ...graph import KernelTable, Op
from ..common import Linear
from ..parallel import Coord
from ..stage import Pair, StageEmitter
from ..transformer.blocks import Blocks
from ..transformer.shapes import Block, Setup, block, head_linears
from .attention import dsa_fwd, linear_attention_fwd, mla_fwd
from .moe import serve_moe_fwd
from .shape import Shape

#: Bytes the host copies per token (token id and position, int64) and per request (its block table
#: row of int32 block ids, sampling parameters) into the iteration's input buffers.
TOKEN_INPUT_BYTES = 16
REQUEST_INPUT_BYTES = 512
_ACT, _RECV = Pair("pp", +1, True), Pair("pp", -1, False)


@dataclass(frozen=True)
class Serving:
    """What the forward needs beyond a Transformer's :class:`Setup`: the attention and KV-cache
    dtypes, the KV cache's element width, the host's costs, and how many of a stage's blocks to emit."""

    attn_dtype: str
    kv_dtype: str
    kv_bytes: float
    host_s: float | None            # per launched op (None: the platform's launch cost)
    iteration_s: float              # host work per iteration outside the ops
    request_s: float                # further host work per iteration per request in the batch
    prefill_s: float                # further host work per block of an iteration that prefills
    fused: bool                     # TensorRT-LLM's fusions (see Inference.framework)
    cuda_graphs: bool
    gemm_dtype: str = "bf16"        # the linears' GEMM path on this GPU (simgpu.precision.gemm_path)
    moe_dtype: str = "bf16"         # the experts'


def stage_setup(base: Setup, tokens: int) -> Setup:
    """``base`` resolved for a batch of ``tokens`` tokens (one micro-batch of one "sample")."""
    return replace(base, model=base.model.model_copy(update={"seq_len": tokens}), micro=1)


class StageForward:
    """Emits one stage's forward of a batch of shape ``shape`` (one rank's share) for the stage's
    first rank; ``layers`` limits the blocks emitted (None: all of the stage's)."""

    def __init__(self, base: Setup, sv: Serving, shape: Shape, stage: int, kernels: KernelTable,
                 layers: int | None = None) -> None:
        self.s = s = stage_setup(base, shape.tokens)
        self.sv, self.shape, self.stage = sv, shape, stage
        lay = s.layout
        self.em = StageEmitter(lay.rank(Coord(0, 0, 0, stage)), kernels, lay, sv.host_s)
        self.bl = Blocks(s, self.em)
        self.bl.mb = 1  # quantised weights are stored: no per-iteration weight quantisation
        self.bl.attn_dtype = sv.attn_dtype
        self.bl.prec, self.bl.moe_prec = sv.gemm_dtype, sv.moe_dtype
        # the output layer (and any linear a quantised checkpoint leaves out) in 16 bits; NVFP4's
        # output layer as it was measured in MLPerf's fp4 systems
        self.bl.aux_gemm = "fp4" if sv.gemm_dtype == "fp4" else sv.attn_dtype
        per = s.model.layers // lay.pp
        first = stage * per
        self.blocks = [block(s, i) for i in range(first, first + (per if layers is None else layers))]
        self.host: dict[int, float] = {}

    def build(self) -> StageEmitter:
        s, em, bl, sh = self.s, self.em, self.bl, self.shape
        lay = s.layout
        first, last = self.stage == 0, self.stage == lay.pp - 1
        host = self.sv.iteration_s + self.sv.request_s * (sh.prefill + sh.decode)
        if first and host > 0:
            self.host[em.program.add(Op("iteration.schedule", "host", "host", stream="compute", phase="fwd",
                                        cpu_s=host))] = host
        copy = em.memcpy("inputs.h2d", sh.tokens * TOKEN_INPUT_BYTES + sh.rows * REQUEST_INPUT_BYTES)
        gate: tuple[int, ...]
        if first:
            gate = (bl.embedding_fwd(copy),)
        else:
            gate = (em.p2p(_RECV, "pp.recv_act", "act", s.tokens * s.model.hidden * s.width, phase="fwd",
                           stream="comm.pp_recv_fwd"), copy)
        for b in self.blocks:
            self.block_fwd(b, gate)
            gate = ()
        if last:
            self.head()
        else:
            em.p2p(_ACT, "pp.send_act", "act", s.tokens * s.model.hidden * s.width, phase="fwd", deps=(em.last,),
                   stream="comm.pp_send_fwd")
        if self.sv.cuda_graphs and sh.prefill == 0:
            self._graph()
        return em

    def _graph(self) -> None:
        """A decode-only iteration replays a captured graph: one launch for every op of the stage."""
        launched = False
        for i, op in enumerate(self.em.program.ops):
            if op.kind != "host":
                if launched:
                    op.cpu_s = 0.0
                    self.host[i] = 0.0
                launched = True

    def attention(self, n: str, window: int = 0) -> int:
        """Paged attention of the batch's three kinds of sequences, and the K/V write before it;
        ``window``: a sliding window of keys (0: all)."""
        bl, sh, sv = self.bl, self.shape, self.sv
        em = self.em
        last = em.last
        if not sv.fused:
            kv_numel = sh.tokens * 2 * bl.kv * bl.d
            last = em.elementwise(f"{n}.kv_cache.write", kv_numel, 1, 1, sv.kv_dtype, op="copy", phase="fwd")
        def paged(kind: str, batch: int, sq: int, skv: int, causal: int) -> int:
            extra: dict[str, Any] = {"window": window} if window else {}
            return em.kernel(f"{n}.attention.{kind}", "attention_fwd", sv.attn_dtype, phase="fwd", batch=batch,
                             seq_q=sq, seq_kv=skv, causal=causal, heads=bl.heads, head_dim=bl.d, kv_heads=bl.kv,
                             kv_bytes=sv.kv_bytes, **extra)

        if sh.prefill and sv.prefill_s > 0:
            # the host prepares the prompts' attention (metadata, bias) at every block; the GPU
            # works through what is already queued meanwhile
            self.host[em.program.add(Op(f"{n}.attention.prefill_host", "host", "host", stream="compute",
                                        phase="fwd", cpu_s=sv.prefill_s))] = sv.prefill_s
        if sh.prefill:
            last = paged("prefill", sh.prefill, sh.prefill_len, sh.prefill_len, 1)
        if sh.chunked:
            last = paged("cached", sh.chunked, sh.chunk_q, sh.chunk_kv, 0)
        if sh.decode:
            last = paged("decode", sh.decode, 1, sh.decode_ctx, 0)
        return last

    def block_fwd(self, blk: Block, deps: tuple[int, ...]) -> int:
        """One block's forward, as :meth:`Blocks.block_fwd` with paged attention for the core (MLA,
        sliding-window or linear attention as the block has), and the MoE as a serving engine splits it."""
        s, bl, fused = self.s, self.bl, self.sv.fused
        n = blk.name
        # the residual add of the block's input is fused into its first norm (vLLM's
        # fused_add_rms_norm, TensorRT-LLM's fused residual norm); the norm waits for the reduction
        bl.norm(f"{n}.ln1", False, "fwd", deps=deps)
        out = -1
        if s.model.sparse_attention is not None:
            out = dsa_fwd(self, blk)  # the module includes the output projection
        elif blk.kv_up is not None:
            mla_fwd(self, blk)
        elif blk.kind == "linear":
            linear_attention_fwd(self, blk)
        else:
            bl.lin_fwd(blk.qkv, "fwd")
            if s.model.qk_norm:  # one RMSNorm per query and key head
                self.em.kernel(f"{n}.qk_norm", "norm", bl.aux, phase="fwd", rows=s.tokens * (bl.heads + bl.kv),
                               cols=bl.d, bwd=0, rms=1)
            if s.model.rope and not fused:
                bl.ew(f"{n}.rope", s.tokens * (bl.heads + bl.kv) * bl.d, 1, 1, "fwd", op="rope")
            window = (s.model.sliding_window or 0) if blk.kind == "sliding" else 0
            self.attention(n, window)
            if s.model.attention_output_gate:
                bl.ew(f"{n}.attn_gate", s.tokens * bl.heads * bl.d, 2, 1, "fwd", op="mul")
        if out < 0:
            out = bl.lin_fwd(blk.proj, "fwd", quantize_input=not fused)
        red = bl.tp_comm("ar", blk.proj.name, "fwd", deps=(out,))
        red = self.unfused_epilogue(blk.proj.name, out if red is None else red)
        bl.norm(f"{n}.ln2", False, "fwd", deps=(red,))
        if blk.experts is not None:
            out = serve_moe_fwd(self, blk)
            name = f"{n}.moe"
        else:
            assert blk.fc1 is not None and blk.fc2 is not None
            out = self.mlp(blk.fc1, blk.fc2)
            name = blk.fc2.name
        red = bl.tp_comm("ar", name, "fwd", deps=(out,))
        return self.unfused_epilogue(name, out if red is None else red)

    def mlp(self, fc1: Linear, fc2: Linear, deps: tuple[int, ...] = ()) -> int:
        """A dense (tp-split) MLP: fc1, its activation (fused into the GEMM by TensorRT-LLM), fc2."""
        bl = self.bl
        act = bl.lin_fwd(fc1, "fwd", deps=deps)
        if not self.sv.fused:
            bl.activation(fc2.inputs, fc1.name, "fwd", deps=(act,))
        return bl.lin_fwd(fc2, "fwd", quantize_input=not self.sv.fused)

    def unfused_epilogue(self, name: str, dep: int) -> int:
        """What vLLM runs after a row-parallel linear's all-reduce as kernels of their own: the bias
        add (``RowParallelLinear`` adds its bias to the reduced output) and, where the norm is a
        LayerNorm (no fused residual norm), the residual add. TensorRT-LLM fuses both."""
        s, bl = self.s, self.bl
        if self.sv.fused:
            return dep
        numel = s.tokens * s.model.hidden
        if s.model.has_bias:
            dep = bl.ew(f"{name}.bias", numel, 1, 1, "fwd", deps=(dep,), op="add")
        if s.model.norm_kind != "rmsnorm":
            dep = bl.ew(f"{name}.residual", numel, 2, 1, "fwd", deps=(dep,), op="add")
        return dep

    def head(self) -> int:
        """Final norm, the output layer over the last token of each request, the logits gathered
        over tp (vLLM's gather to the sampler), the sampler, and the host waiting for its tokens."""
        s, bl, em, sh = self.s, self.bl, self.em, self.shape
        bl.norm("ln_f", False, "fwd")
        lm = head_linears(s)["lm_head"]
        bl.ew("ln_f.select_last", sh.rows * s.model.hidden, 1, 1, "fwd", op="gather")
        logits = bl.lin_fwd(lm, "fwd", rows=sh.rows)
        gathered = bl.tp_comm("ag", "logits", "fwd", deps=(logits,), nbytes=sh.rows * s.vocab * 4)
        sample = em.kernel("sampler", "softmax", "fp32", phase="fwd", deps=() if gathered is None else (gathered,),
                           rows=sh.rows, cols=s.model.vocab, bwd=0)
        return em.host_wait("sampler.sync", (sample,), phase="fwd")
