"""How kernels that no measurement covers are timed from kernels that measurements do cover.

The published GPU tables time forward kernels of inference (GEMMs, attention, the elementwise and
norm ops of LLM layers). A training iteration also runs backward attention, batched GEMMs, fp32
optimizer steps and fp32 elementwise ops. :func:`derive` maps such a kernel onto a measured one
(its *proxy*) and a factor on the proxy's time; the learned predictor times the proxy with its
model and reports the kernel as timed ``(rule)``. The rules, each with its source:

- **Backward GEMMs** need no rule: the builders emit a linear layer's backward as the GEMMs of its
  own transposed shapes (dgrad ``m x k x n``, wgrad ``k x n x m``), which the GEMM model times as
  any other shape (the tables' ``C[m,n] = A[m,k] B[k,n]``, up to operand layout).
- **bf16 <-> fp16**: the same element width and the same Tensor Core peak on every GPU that has
  both (A100, H100, H200, B200 datasheets), so one is timed by the other's measurements.
- **Attention backward** = the forward of the same shape x 2.5 (FlashAttention's backward does 2.5x
  the forward's matmul FLOPs: recomputing ``P``, then ``dV``, ``dP``, ``dQ``, ``dK``; the FLOP count
  of flash-attention's ``benchmarks/benchmark_flash_attention.py``) / 0.676, the backward's
  efficiency relative to the forward: Triton's fused attention reaches 0.25 of the A100's Tensor
  Core peak backward and 0.37 forward on the same shape (``../shared/data/kernels/triton-refs``,
  Z=4 H=48 N=4096 D=64, fp16).
- **Batched GEMM** = the GEMM of the same output tiles (``b m`` rows of ``n``, depth ``k``), scaled
  by the ratio of the two shapes' roofline times: the correction the GEMM model learned for those
  tiles carries over, the roofline accounts for the extra operand bytes of ``b`` matrices.
- **MoE experts' backward** (``moe`` kernels with ``bwd`` 1, the input gradients of fc2 then fc1
  with the activation's backward, and ``bwd`` 2, the weight gradients of both) = the forward of the
  same shape x 1 each: each pass is the forward's two grouped GEMMs on transposed shapes (dgrad
  ``m x k x n``, wgrad ``k x n x m`` per expert), the same FLOPs, so the backward is 2x the
  forward, the ratio of any linear layer's (Narayanan et al., "Efficient Large-Scale Language
  Model Training on GPU Clusters Using Megatron-LM", SC 2021: 2 of a layer's 3 GEMM FLOP units are
  backward). AIConfigurator measures TensorRT-LLM's fused MoE forward only.
- **Optimizer step** (fp32 master weights, ``3 + 2 states`` fp32 tensors read or written per
  parameter, as the analytical model counts them) = the measured elementwise add (two inputs, one
  output, 16-bit) that moves the same bytes: on a GPU the step is pure memory traffic, and the
  elementwise measurements say what the GPU's memory delivers to such a kernel.
- **fp32 elementwise and norm** = the 16-bit kernel moving the same bytes (twice the elements, or
  twice the row length), for the same reason.

Models fitted on published tables time only the *kinds* of kernels those tables measured
(:func:`kind`: causal prefill, full prefill or decode attention; an elementwise op's arithmetic per
element; RMS or layer norm, forward or backward), so that a tree never answers for a kind it has
not seen from the leaves of another (a dropout from the leaves of vLLM's SwiGLU kernel). The rest:

- **Full (non-causal) prefill attention** = the causal kernel of the same shape x the blocks of
  128 queries x 128 keys the full kernel computes over those the causal one does (on or below the
  diagonal): 1.6 at 512 tokens, 2 in the limit (:func:`full_over_causal`).
- **An elementwise op no table measures** = the measured plain op (one operation per element, an
  add or a copy) of the same tensors, scaled by their roofline ratio: bandwidth-bound ops take the
  measured bandwidth, arithmetic-heavy ones the extra compute the roofline gives them.
- **Layer norm** = the RMS norm of the same shape (one more reduction, the same bytes) and back;
  **a norm's backward** = its forward scaled by the roofline ratio (three passes over the data
  instead of two).

The quantized dtypes of serving (:data:`DTYPE_PROXIES`), where no table measured a kernel's dtype:

- **mxfp8** = the block-scaled fp8 (``fp8_block``), else the per-tensor fp8 kernel of the same shape,
  **fp8_block** = the fp8 kernel, **mxfp4** = the NVFP4 (``fp4``) kernel, else the 4-bit weight-only
  one (``w4a16``), **fp4** = ``w4a16`` (a GPU without an fp4 path dequantizes, as ``w4a16`` does),
  **w4a16** = the bf16 kernel: each scaled by the two kernels' roofline ratio (the same tensor-core
  path and bytes up to the scales give 1; 4-bit weights against 16-bit ones, the bytes they save).
- **tf32** (fp32 matmuls on Ampere and later Tensor Cores, PyTorch's ``allow_tf32``) = the fp16
  kernel of the same shape (else bf16), scaled by their roofline ratio: the same Tensor Core path at
  the datasheet's TF32 peak (half the fp16 one on A100 and H100) with 4-byte operands.
- **An activation quantize to another target or block size** (``quantize`` with ``block`` > 0: fp8
  per 128, mx per 32, NVFP4 per 16) = the measured per-tensor fp8 quantize of the same tensor, scaled
  by the roofline ratio (the bytes of the narrower output and of the scales): the tables measure the
  per-tensor fp8 kernel only.
- **Full (non-causal) MLA prefill** = the causal one, as attention's.

MLA's absorbed BMMs (``k``, ``n`` of 128 and 512) are a kind of ``bmm`` of their own (``mla``): the
published tables measure them alone, and a model fitted on them times no other batched GEMM (those
go through the batched-GEMM rule to the GEMM model, as before).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Final

from ..graph import KernelSpec

#: Dtypes timed by each other's measurements.
ALIASES: Final = {"bf16": ("fp16",), "fp16": ("bf16",)}
#: (k, n) of MLA's absorbed BMMs (qk_nope_head_dim 128 <-> kv_lora 512, v_head_dim 128): a kind of batched
#: GEMM of its own, so that a model fitted on them answers for no other batched GEMM.
MLA_BMM: Final = (128.0, 512.0)
#: Quantized dtypes timed, where unmeasured, by the kernel of another dtype scaled by the roofline ratio.
DTYPE_PROXIES: Final = {"mxfp8": ("fp8_block", "fp8"), "fp8_block": ("fp8",), "mxfp4": ("fp4", "w4a16"),
                        "fp4": ("w4a16",), "w4a16": ("bf16",), "tf32": ("fp16", "bf16")}
#: FlashAttention's backward FLOPs over its forward's.
ATTENTION_BWD_FLOPS: Final = 2.5
#: Backward over forward share of peak of fused attention (Triton on A100: 0.25 / 0.37).
ATTENTION_BWD_EFFICIENCY: Final = 0.25 / 0.37
#: A factor that is the ratio of the kernel's roofline time to its proxy's (computed in bulk).
ROOFLINE: Final = "roofline"
#: How many rules may be chained (attention backward of a full prefill: backward -> forward -> causal).
DEPTH: Final = 3
#: Query and key block edge of fused attention kernels (FlashAttention-2's 128 x 128 on A100/H100).
ATTENTION_TILE: Final = 128
_HALF: Final = ("bf16", "fp16")
#: The suffix of a ``moe`` kernel's kind per pass (``bwd``): forward, input gradients, weight gradients.
MOE_PASSES: Final = ("", "_dgrad", "_wgrad")
#: Each backward pass of an expert FFN (input gradients, weight gradients) over its forward.
MOE_BWD_PASS: Final = 1.0

Factor = float | str
#: One step of a derivation: the kernel, its proxy, the factor on the proxy's time.
Step = tuple[KernelSpec, KernelSpec, Factor]


def kind(k: KernelSpec) -> str:
    """The kind of kernel within its family that a published table may or may not measure."""
    if k.family.startswith("attention"):
        return "decode" if k.get("seq_q") == 1 else ("causal" if k.get("causal", 0.0) else "full")
    if k.family == "elementwise":
        return f"fpe{k.get('flops_per_element', 1.0):g}"
    if k.family == "norm":
        return ("rms" if k.get("rms", 0.0) else "ln") + ("_bwd" if k.get("bwd", 0.0) else "")
    if k.family == "softmax":
        return "bwd" if k.get("bwd", 0.0) else "fwd"
    if k.family == "bmm":
        return "mla" if sorted((k.get("k"), k.get("n"))) == list(MLA_BMM) else "any"
    if k.family in ("linear_attention", "sparse_attention"):
        return "decode" if k.get("decode", 0.0) else "prefill"
    if k.family == "mla_context":
        return "causal" if k.get("causal", 1.0) else "full"
    if k.family == "quantize":
        return f"block{k.get('block', 0.0):g}"
    if k.family == "moe":
        return (("gated" if k.get("gated", 1.0) else "plain") + ("_skewed" if k.get("skew", 0.0) else "")
                + MOE_PASSES[int(k.get("bwd", 0.0))])
    return "any"


def full_over_causal(sq: float, skv: float, tile: int = ATTENTION_TILE) -> float:
    """Blocks of ``tile`` queries x ``tile`` keys a full attention computes over those a causal one
    does (the blocks on or below the diagonal): 1.6 at 512 tokens, 2 in the limit."""
    nq, nk = math.ceil(sq / tile), math.ceil(skv / tile)
    causal = sum(min(nk, nk - nq + i + 1) for i in range(nq)) if nk >= nq else nq * (nq + 1) / 2
    return nq * nk / max(causal, 1)


def _with(k: KernelSpec, family: str | None = None, dtype: str | None = None, **params: float) -> KernelSpec:
    merged = {**dict(k.params), **params}
    return KernelSpec.make(family or k.family, dtype or k.dtype, **merged)


def _candidates(k: KernelSpec) -> Iterator[tuple[KernelSpec, Factor]]:
    for alt in ALIASES.get(k.dtype, ()):
        yield _with(k, dtype=alt), 1.0
    if k.family == "quantize":
        if k.dtype != "fp8" or k.get("block", 0.0):
            yield _with(k, dtype="fp8", block=0.0), ROOFLINE
        return
    for alt in DTYPE_PROXIES.get(k.dtype, ()):
        yield _with(k, dtype=alt), ROOFLINE
    if k.family == "mla_context" and not k.get("causal", 1.0):
        yield _with(k, causal=1.0), full_over_causal(k.get("seq_q"), k.get("seq_kv"))
    if k.family == "attention_bwd":
        yield _with(k, "attention_fwd"), ATTENTION_BWD_FLOPS / ATTENTION_BWD_EFFICIENCY
    elif k.family == "attention_fwd" and kind(k) == "full":
        yield _with(k, causal=1.0), full_over_causal(k.get("seq_q"), k.get("seq_kv"))
    elif k.family == "bmm":
        params = {n: v for n, v in k.params if n != "b"}
        params["m"] = k.get("b") * k.get("m")
        yield KernelSpec.make("gemm", k.dtype, **params), ROOFLINE
    elif k.family == "moe" and k.get("bwd", 0.0):
        yield _with(k, bwd=0.0), MOE_BWD_PASS
    elif k.family == "optimizer":
        nbytes = k.get("numel") * 4.0 * (3.0 + 2.0 * k.get("states", 0.0))
        for dt in _HALF:
            yield KernelSpec.make("elementwise", dt, numel=nbytes / 6.0, reads=2.0, writes=1.0,
                                  flops_per_element=1.0), 1.0
    elif k.family == "elementwise":
        if k.dtype == "fp32":
            for dt in _HALF:
                yield _with(k, dtype=dt, numel=2.0 * k.get("numel")), 1.0
        if k.get("flops_per_element", 1.0) != 1.0:
            yield _with(k, flops_per_element=1.0), ROOFLINE
    elif k.family == "norm":
        if k.dtype == "fp32":
            for dt in _HALF:
                yield _with(k, dtype=dt, cols=2.0 * k.get("cols")), 1.0
        yield _with(k, rms=0.0 if k.get("rms", 0.0) else 1.0), 1.0
        if k.get("bwd", 0.0):
            yield _with(k, bwd=0.0), ROOFLINE


def derive(k: KernelSpec, measured: Callable[[KernelSpec], bool], depth: int = DEPTH) -> list[Step] | None:
    """The shortest chain of rules from ``k`` to a kernel that ``measured`` accepts (each step: the
    kernel, its proxy, the factor on the proxy's time), or None: no rule applies and the kernel
    falls through to the next model. Among chains of one length, the rules are taken in the order
    of the module docstring."""
    frontier: list[tuple[KernelSpec, list[Step]]] = [(k, [])]
    seen = {k}
    for _ in range(depth):
        nxt = []
        for cur, steps in frontier:
            for cand, factor in _candidates(cur):
                if cand in seen:
                    continue
                seen.add(cand)
                chain = [*steps, (cur, cand, factor)]
                if measured(cand):
                    return chain
                nxt.append((cand, chain))
        frontier = nxt
    return None
