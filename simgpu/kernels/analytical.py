"""The analytical kernel model: a roofline with achievable peaks and wave quantisation.

A kernel takes ``max(flops / achievable FLOP/s, bytes / achievable HBM bandwidth)``, but never less
than the platform's shortest kernel. GEMMs are tiled: the work is rounded up to whole waves of
output tiles over the SMs, so a GEMM one tile larger than a wave costs nearly two waves, as on the
real GPU. An MoE layer's experts (``moe``) are two grouped GEMMs in turn, each tiled in the same
way and bound by its compute or by its operand bytes (the weights of every expert that gets a
token: a decode step reads them all for a few tokens). Embedding lookups are the bytes each level of
memory moves for the ids' distribution (:mod:`simgpu.kernels.embedding`).
Elementwise kernels do their op's arithmetic (``flops_per_element``, see
:mod:`simgpu.elementwise`) on the vector units at the fp32 peak, whatever the storage dtype
(PyTorch computes bf16 and fp16 elementwise ops in fp32, tensor cores do not run them): a GELU is
memory-bound on a GPU, but can be compute-bound on a CPU core.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any, Final

import numpy as np

from ..config.platform import GPUSpec, PlatformSpec
from ..graph import KernelSpec
from .base import register
from .embedding import lookup_seconds
from .lookups import lookup_params as kernel_params  # the name the fitted models' baseline hash has

#: Bytes per element of each dtype's values (scales not counted: :data:`SCALE_BYTES`). ``fp8_block``:
#: DeepSeek's 128x128 block-scaled fp8; ``mxfp8`` / ``mxfp4``: OCP microscaling (an e8m0 scale per 32);
#: ``mxfp4`` is MXFP4 weights with MXFP8 activations (Blackwell); ``w4a16``: 4-bit weights (int4 AWQ,
#: or MXFP4 weight-only) with 16-bit activations, its width that of the weights.
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp4": 0.5,
               "fp8_block": 1, "mxfp8": 1, "mxfp4": 0.5, "w4a16": 0.5}
#: The tensor-core path (the platform's ``peak_tflops`` key) a dtype's matmuls run on, where not its own.
PEAK_DTYPE = {"fp8_block": "fp8", "mxfp8": "fp8", "mxfp4": "fp4", "w4a16": "bf16"}
#: Where a GPU has no peak of the 4-bit path (Hopper: no fp4), its kernels dequantize the 4-bit
#: weights and run the 16-bit path: bf16 peak, 0.5-byte weights, 16-bit activations.
DEQUANT_DTYPE = {"fp4": "bf16", "mxfp4": "bf16"}
#: Scale bytes per element of an operand (activations, weights) of the block-scaled dtypes: fp8_block
#: an fp32 scale per 128 activations (1 x 128 groups) and per 128 x 128 weights; mx an e8m0 byte per
#: 32; w4a16 an fp16 scale per 128 weights (AWQ's group). NVFP4 (``fp4``) is counted as its values alone.
SCALE_BYTES = {"fp8_block": (4 / 128, 4 / 16384), "mxfp8": (1 / 32, 1 / 32), "mxfp4": (1 / 32, 1 / 32),
               "w4a16": (0.0, 2 / 128)}
#: GEMM output tiles (rows, columns, efficiency relative to the largest tile)
TILES = ((256, 128, 1.0), (128, 128, 0.95), (128, 64, 0.85), (64, 64, 0.7))
ATTN_EFFICIENCY = 0.6  # flash attention reaches a lower share of the matmul peak (softmax, masking)
#: Tensor-core GEMMs load their operands in 16-byte vectors; when a dimension is not a multiple of
#: 16 bytes the kernels fall back to narrower loads and run at about this share of the aligned rate.
#: Source: padding GPT-2's vocabulary from 50,257 to 50,304 (the output layer's N) sped nanoGPT's
#: training steps up by ~25% (A. Karpathy, nanoGPT), i.e. its output-layer GEMMs ran ~2x slower.
MISALIGNED_EFFICIENCY = 0.5
ALIGN_BYTES = 16
TENSOR_CORE_DTYPES = ("tf32", "bf16", "fp16", "fp8", "fp4", "fp8_block", "mxfp8", "mxfp4", "w4a16")
#: The dtype whose peak elementwise arithmetic runs at (the vector units' fp32 rate).
VECTOR_DTYPE = "fp32"


def attention_pairs(sq: Any, skv: Any, causal: Any, window: Any) -> Any:
    """(query, key) pairs one head attends: ``sq skv``, half of it when causal (as the balanced chunks
    of context parallelism and a full causal prefill have it); a sliding ``window`` > 0 of keys caps
    each query's keys. Causal under a window, the queries are the last ``sq`` positions of ``skv``
    and the one at position ``p`` attends ``min(window, p + 1)`` keys (a prompt from its start: the
    first ``window`` queries attend fewer). Works on arrays too."""
    sq, skv, causal, window = (np.asarray(x, dtype=float) for x in (sq, skv, causal, window))
    full = sq * skv * np.where(causal > 0, 0.5, 1.0)
    w = np.where(window > 0, np.minimum(window, skv), skv)
    # positions lo..hi attend p + 1 < w keys; the other queries attend w each (more queries than
    # keys: the extra ones attend w each too)
    lo, hi = np.maximum(skv - sq, 0), np.minimum(skv - 1, w - 2)
    short = np.maximum(hi - lo + 1, 0)
    ramp = np.where(short > 0, (hi + 1) * (hi + 2) / 2 - lo * (lo + 1) / 2, 0.0)
    capped = np.where(causal > 0, ramp + w * (sq - short), sq * w)
    return np.where((window > 0) & (window < skv), np.minimum(full, capped), full)


def moe_gemms(k: KernelSpec) -> list[tuple[float, float, float, float]]:
    """The grouped GEMMs ``(experts, m, n, k)`` of a ``moe`` kernel, one rank's expert FFNs.

    ``rows`` token copies spread evenly over the ``experts`` local experts (as many experts as get
    a token, ``m`` rows each); fc1 maps ``hidden`` to ``inter`` (twice that when ``gated``: the
    gate and up projections of SwiGLU in one GEMM), fc2 ``inter`` back to ``hidden``. ``bwd`` 0 is
    the forward (fc1 then fc2), 1 the input gradients (fc2's, then fc1's: ``m x inter x hidden``
    and ``m x hidden x 2 inter``), 2 the weight gradients (``inter x hidden`` and ``hidden x 2
    inter`` outputs over a depth of ``m`` rows): the backward as GEMMs of the forward's transposed
    shapes, as a linear layer's.
    """
    rows, experts = max(k.get("rows"), 1.0), k.get("experts")
    hidden, inter = k.get("hidden"), k.get("inter")
    up = inter * (2.0 if k.get("gated", 1.0) else 1.0)
    active = min(experts, rows)
    m = float(np.ceil(rows / active))
    bwd = int(k.get("bwd", 0.0))
    if bwd == 1:
        return [(active, m, inter, hidden), (active, m, hidden, up)]
    if bwd == 2:
        return [(active, inter, hidden, m), (active, hidden, up, m)]
    return [(active, m, up, hidden), (active, m, hidden, inter)]


def peak_dtype(dtype: str, peaks: Container[str]) -> str:
    """The ``peak_tflops`` key that ``dtype``'s matmuls run at on a GPU listing ``peaks``: the dtype's
    own, that of its tensor-core path (:data:`PEAK_DTYPE`), or, for a 4-bit path the GPU lacks, the
    dequantize path's (:data:`DEQUANT_DTYPE`)."""
    d = PEAK_DTYPE.get(dtype, dtype)
    if d not in peaks and dtype in DEQUANT_DTYPE:
        return DEQUANT_DTYPE[dtype]
    return d


def operand_bytes(dtype: str, peaks: Container[str]) -> tuple[float, float, float]:
    """Bytes per element of a GEMM's activations (``A``), weights (``B``) and output (``C``) in
    ``dtype`` on a GPU listing ``peaks``: the dtype's width (with its scales, :data:`SCALE_BYTES`) for
    all three, but 16-bit activations and output beside 4-bit weights where the kernel runs the
    16-bit path (``w4a16``; ``fp4`` / ``mxfp4`` without an fp4 peak), and MXFP8 activations beside
    MXFP4 weights (``mxfp4``)."""
    e = float(DTYPE_BYTES[dtype])
    sa, sw = SCALE_BYTES.get(dtype, (0.0, 0.0))
    if dtype == "w4a16" or (dtype in DEQUANT_DTYPE and peak_dtype(dtype, peaks) == DEQUANT_DTYPE[dtype]):
        return 2.0, 0.5 + sw, 2.0
    if dtype == "mxfp4":
        return 1.0 + sa, 0.5 + sw, 1.0
    return e + sa, e + sw, e


#: The serving families' shape parameters and defaults (None: required), per rank after tensor
#: parallelism (``heads``: this rank's); :data:`~simgpu.kernels.features.FAMILY_PARAMS` holds them
#: with the others. ``kv_bytes`` NaN: the dtype's width. See :func:`serving_work` for what each times.
SERVING_PARAMS: Final[Mapping[str, Mapping[str, float | None]]] = {
    "mla_context": {"batch": None, "seq_q": None, "seq_kv": None, "heads": None, "causal": 1.0,
                    "qk_head_dim": 192.0, "v_head_dim": 128.0, "kv_bytes": np.nan},
    "mla_decode": {"batch": None, "seq_q": 1.0, "seq_kv": None, "heads": None, "kv_lora": 512.0, "rope_dim": 64.0,
                   "kv_bytes": np.nan},
    "linear_attention": {"batch": None, "seq_q": None, "heads_k": None, "heads_v": None, "head_k_dim": 128.0,
                         "head_v_dim": 128.0, "decode": 0.0},
    "sparse_attention": {"batch": None, "seq_q": None, "seq_kv": None, "heads": None, "topk": 2048.0,
                         "index_heads": 64.0, "index_head_dim": 128.0, "decode": 0.0},
    "quantize": {"m": None, "k": None, "block": 0.0},
}
#: DeepSeek-V3.2's attention module (hidden 7168, q_lora 1536, kv_lora 512, rope 64, nope 128, v 128):
#: the measured ``sparse_attention`` module runs its projections too (see :func:`serving_work`).
DSA_DIMS: Final = {"hidden": 7168.0, "q_lora": 1536.0, "kv_lora": 512.0, "rope": 64.0, "nope": 128.0, "v": 128.0}
#: Tokens per chunk of the chunked gated-delta-rule kernel (FLA's chunk_gated_delta_rule), and bytes per
#: element of its recurrent state (fp32).
GDN_CHUNK: Final = 64.0
GDN_STATE_BYTES: Final = 4.0
#: Arithmetic per element of an activation quantize (absolute value, max, scale, convert).
QUANT_FLOPS: Final = 4.0


def serving_work(family: str, p: Mapping[str, Any], e: Any, kv_e: Any) -> dict[str, Any]:
    """The work of a serving-family kernel (arrays or floats ``p``, element width ``e``, KV cache width
    ``kv_e``): FLOPs by the unit that runs them (``mm``: matmuls at the dtype's peak; ``attn``:
    attention at the dtype's peak x :data:`ATTN_EFFICIENCY`; ``attn16`` / ``attn8``: attention in bf16 /
    fp8 whatever the dtype; ``vec``: the vector units) and ``bytes`` moved. The analytical model and
    the learned models' features (:mod:`simgpu.kernels.features`) both count from here.

    - ``mla_context``: un-absorbed prefill MLA, per head QK^T over ``qk_head_dim`` (nope + rope) and PV
      over ``v_head_dim``, K and V materialised per head; Q, O, K, V read or written once.
    - ``mla_decode``: absorbed MLA over the latent cache (MQA-like: one ``kv_lora + rope_dim`` entry per
      token shared by the heads), QK^T over ``kv_lora + rope_dim``, PV over ``kv_lora``; the cache read once.
    - ``linear_attention``: the Gated DeltaNet kernel (chunked in prefill, :data:`GDN_CHUNK` tokens a chunk,
      on the tensor cores; recurrent in decode, on the vector units): per token and value head a
      ``head_k_dim x head_v_dim`` state update and read-out; q, k, v, o and gates moved once, the fp32
      state read and written once per sequence (and the chunks' states once in prefill).
    - ``sparse_attention``: DeepSeek-V3.2's attention module with DSA, as measured: the projections
      (fused q_a/kv_a, q_b, o_proj, the indexer's wq_b, wk and weights_proj: matmuls at the dtype's peak,
      weights read once), the absorbed BMMs, the lightning indexer (fp8 logits of ``index_heads`` x
      ``index_head_dim`` over every causal key), and the sparse MLA (bf16, each query over its
      ``topk`` keys); the latent cache and the indexer's keys read once, the fp32 logits written once.
    - ``quantize``: a bf16 activation ``m x k`` read once, written in the target dtype with one scale per
      ``block`` elements (fp32 scales for 128-element blocks, one byte for 16 / 32; per-tensor: one).
    """
    if family == "mla_context":
        b, h, sq, skv = p["batch"], p["heads"], p["seq_q"], p["seq_kv"]
        d = p["qk_head_dim"] + p["v_head_dim"]
        attn = 2.0 * b * h * d * attention_pairs(sq, skv, p["causal"], 0.0)
        return {"attn": attn, "bytes": b * h * d * (sq * e + skv * kv_e)}
    if family == "mla_decode":
        b, h, sq, skv, lora, rope = (p[x] for x in ("batch", "heads", "seq_q", "seq_kv", "kv_lora", "rope_dim"))
        attn = 2.0 * b * h * sq * skv * (2.0 * lora + rope)
        return {"attn": attn, "bytes": b * skv * (lora + rope) * kv_e + b * h * sq * (2.0 * lora + rope) * e}
    if family == "linear_attention":
        b, sq, hk, hv, dk, dv = (p[x] for x in ("batch", "seq_q", "heads_k", "heads_v", "head_k_dim", "head_v_dim"))
        dec = np.asarray(p["decode"]) > 0
        tokens = b * sq
        chunk = np.minimum(GDN_CHUNK, np.maximum(sq, 1.0))
        chunked = tokens * hv * (4.0 * dk * dv + 2.0 * chunk * (dk + dv))
        state = b * hv * dk * dv
        nbytes = (tokens * (2.0 * hk * dk + 2.0 * hv * dv) * e + tokens * hv * 2.0 * GDN_STATE_BYTES
                  + 2.0 * state * GDN_STATE_BYTES + np.where(dec, 0.0, 2.0 * np.ceil(sq / chunk) * state * e))
        return {"attn": np.where(dec, 0.0, chunked), "vec": np.where(dec, 6.0 * tokens * hv * dk * dv, 0.0),
                "bytes": nbytes}
    if family == "sparse_attention":
        b, sq, skv, h, topk, ih, idim = (p[x] for x in ("batch", "seq_q", "seq_kv", "heads", "topk", "index_heads",
                                                        "index_head_dim"))
        causal = np.where(np.asarray(p["decode"]) > 0, 0.0, 1.0)
        dd = DSA_DIMS
        tokens = b * sq
        lora, rope = dd["kv_lora"], dd["rope"]
        weights = (dd["hidden"] * (dd["q_lora"] + lora + rope) + dd["q_lora"] * h * (dd["nope"] + rope)
                   + h * dd["v"] * dd["hidden"] + dd["q_lora"] * ih * idim + dd["hidden"] * (idim + ih))
        bmm = h * (dd["nope"] * lora + lora * dd["v"])
        idx_pairs = b * attention_pairs(sq, skv, causal, 0.0)
        sel_pairs = b * attention_pairs(sq, skv, causal, topk)
        nbytes = ((weights + bmm) * e + tokens * dd["hidden"] * 2.0 * 2.0 + b * skv * (lora + rope) * kv_e
                  + b * skv * idim * 1.0 + idx_pairs * 4.0)
        return {"mm": 2.0 * tokens * (weights + bmm), "attn8": 2.0 * idx_pairs * ih * idim,
                "attn16": 2.0 * sel_pairs * h * (2.0 * lora + rope), "bytes": nbytes}
    if family == "quantize":
        n = p["m"] * p["k"]
        block = np.asarray(p["block"], dtype=float)
        scales = np.where(block > 0, n / np.maximum(block, 1.0) * np.where(block >= 128, 4.0, 1.0), 4.0)
        return {"vec": QUANT_FLOPS * n, "bytes": n * (2.0 + e) + scales}
    raise KeyError(f"not a serving family: {family!r}")


class Analytical:
    """Times kernels from the GPU's datasheet figures; see the module docstring."""

    name = "analytical"

    def __init__(self, platform: PlatformSpec | GPUSpec) -> None:
        g = platform if isinstance(platform, GPUSpec) else platform.gpu
        self.gpu = g
        self.bw = g.hbm_gbytes_per_s * 1e9 * g.memory_efficiency
        self.min_s = g.kernel_min_us * 1e-6
        self._families: dict[str, Callable[[KernelSpec], tuple[float, float]]] = {
            "gemm": self._gemm, "bmm": self._gemm,
            "attention_fwd": self._attention, "attention_bwd": self._attention,
            "embedding_fwd": self._embedding, "embedding_bwd": self._embedding,
            "elementwise": self._elementwise, "norm": self._rowwise, "softmax": self._rowwise,
            "optimizer": self._optimizer, "moe": self._moe,
            **{f: self._serving for f in SERVING_PARAMS},
        }

    @classmethod
    def for_gpu(cls, gpu: GPUSpec) -> Analytical:
        """The model of one GPU alone (the only part of a platform it uses)."""
        return cls(gpu)

    def flops_rate(self, dtype: str) -> float:
        peaks = self.gpu.peak_tflops
        peak = peaks.get(peak_dtype(dtype, peaks))  # type: ignore[call-overload]
        if peak is None:
            raise ValueError(f"{self.gpu.name} has no {dtype} peak in its platform file")
        return float(peak) * 1e12 * self.gpu.matmul_efficiency

    def vector_rate(self, dtype: str) -> float:
        """Achievable FLOP/s of elementwise arithmetic on ``dtype`` data: the fp32 peak (``dtype``'s
        where the platform gives no fp32 peak) at the matmul efficiency."""
        return self.flops_rate(VECTOR_DTYPE if VECTOR_DTYPE in self.gpu.peak_tflops else dtype)

    def supports(self, kernel: KernelSpec) -> bool:
        return kernel.family in self._families

    def predict(self, kernels: Sequence[KernelSpec]) -> tuple[np.ndarray, list[str]]:
        out = np.empty(len(kernels))
        for i, k in enumerate(kernels):
            fn = self._families.get(k.family)
            if fn is None:
                raise ValueError(f"the analytical model does not know kernel family {k.family!r}")
            flops_s, bytes_s = fn(k)
            out[i] = max(flops_s, bytes_s, self.min_s)
        return out, [self.name] * len(kernels)

    # Each family returns (compute-bound seconds, memory-bound seconds).

    def _gemm(self, k: KernelSpec) -> tuple[float, float]:
        m, n, kk = k.get("m"), k.get("n"), k.get("k")
        return self._gemm_s(k.get("b", 1.0), m, n, kk, k.dtype, (m, n, kk))

    def _gemm_s(self, b: float, m: float, n: float, kk: float, dtype: str,
                aligned: Sequence[float]) -> tuple[float, float]:
        """Compute-bound and memory-bound seconds of ``b`` GEMMs ``m x n x kk``; ``aligned`` are the
        dimensions whose misalignment costs the narrower loads."""
        e = DTYPE_BYTES[dtype]
        a, w, c = operand_bytes(dtype, self.gpu.peak_tflops)
        # Like cuBLAS's heuristics, take the tile shape that finishes first: every wave of output
        # tiles over the SMs costs a full wave, padded to the tile edges; smaller tiles waste less
        # of the last wave but reuse operands less (lower efficiency).
        best = np.inf
        for tm, tn, eff in TILES:
            tiles = b * np.ceil(m / tm) * np.ceil(n / tn)
            waves = np.ceil(tiles / self.gpu.sms)
            best = min(best, waves * self.gpu.sms * tm * tn * kk * 2.0 / eff)
        if dtype in TENSOR_CORE_DTYPES and any(int(x) * e % ALIGN_BYTES for x in aligned):
            best /= MISALIGNED_EFFICIENCY
        # activations, weights and output of other widths where they differ (4-bit weights, block scales)
        nbytes = b * (m * kk + kk * n + m * n) * e if a == w == c else b * (m * kk * a + kk * n * w + m * n * c)
        return best / self.flops_rate(dtype), nbytes / self.bw

    def _moe(self, k: KernelSpec) -> tuple[float, float]:
        # The experts' two grouped GEMMs in turn, each bound by its compute or its bytes (the
        # weights of every expert that gets a token are read whole); see moe_gemms. Grouped GEMMs
        # take any number of tokens per expert: only the weights' widths must be aligned.
        total_s, total_b = 0.0, 0.0
        widths = (k.get("hidden"), k.get("inter"))
        for b, m, n, kk in moe_gemms(k):
            flops_s, bytes_s = self._gemm_s(b, m, n, kk, k.dtype, widths)
            total_s += max(flops_s, bytes_s, self.min_s)
            total_b += bytes_s
        return total_s, total_b

    def _attention(self, k: KernelSpec) -> tuple[float, float]:
        b, h, sq, skv, d = (k.get(x) for x in ("batch", "heads", "seq_q", "seq_kv", "head_dim"))
        kv, window = k.get("kv_heads", h), k.get("window", 0.0)
        flops = 4.0 * b * h * d * float(attention_pairs(sq, skv, k.get("causal", 0.0), window))
        bwd = k.family == "attention_bwd"
        if bwd:
            flops *= 2.5  # recompute of P plus dQ, dK, dV
        e = DTYPE_BYTES[k.dtype]
        kv_e = k.get("kv_bytes", float(e))
        # Q and O (and dQ, dO), K and V of the kv_heads (a sliding window reads only its keys)
        kv_len = min(skv, window) if window > 0 and not bwd else skv
        q, kv_read = b * h * sq * d * e, b * kv * 2 * kv_len * d * kv_e
        nbytes = 3 * q + 2 * kv_read if bwd else 2 * q + kv_read
        return flops / (self.flops_rate(k.dtype) * ATTN_EFFICIENCY / self.gpu.matmul_efficiency), nbytes / self.bw

    def _serving(self, k: KernelSpec) -> tuple[float, float]:
        # the serving families: their work (serving_work), each unit at its rate
        spec = SERVING_PARAMS[k.family]
        p = {n: float(k.get(n, d)) for n, d in spec.items()}
        e = float(DTYPE_BYTES[k.dtype])
        kv_e = p.get("kv_bytes", np.nan)
        work = serving_work(k.family, p, e, e if np.isnan(kv_e) else kv_e)
        attn = ATTN_EFFICIENCY / self.gpu.matmul_efficiency
        peaks = self.gpu.peak_tflops
        rates = {"mm": self.flops_rate(k.dtype), "attn": self.flops_rate(k.dtype) * attn,
                 "attn16": self.flops_rate("bf16") * attn,
                 "attn8": self.flops_rate("fp8" if "fp8" in peaks else "bf16") * attn,
                 "vec": self.vector_rate(k.dtype)}
        compute = sum(float(np.sum(v)) / rates[u] for u, v in work.items() if u != "bytes")
        return compute, float(np.sum(work["bytes"])) / self.bw

    def _embedding(self, k: KernelSpec) -> tuple[float, float]:
        return 0.0, lookup_seconds(self.gpu, k.family, float(DTYPE_BYTES[k.dtype]), kernel_params(k))

    def _elementwise(self, k: KernelSpec) -> tuple[float, float]:
        e = DTYPE_BYTES[k.dtype]
        numel = k.get("numel")
        flops = numel * k.get("flops_per_element", 1.0)
        return flops / self.vector_rate(k.dtype), numel * (k.get("reads", 1.0) + k.get("writes", 1.0)) * e / self.bw

    def _rowwise(self, k: KernelSpec) -> tuple[float, float]:
        e = DTYPE_BYTES[k.dtype]
        passes = 3.0 if k.get("bwd", 0.0) else 2.0  # read x (and dy), write y (or dx)
        return 0.0, k.get("rows") * k.get("cols") * passes * e / self.bw

    def _optimizer(self, k: KernelSpec) -> tuple[float, float]:
        # fp32 param and grad read, param written, each state read and written
        states = k.get("states", 0.0)
        return 0.0, k.get("numel") * 4.0 * (3.0 + 2.0 * states) / self.bw


@register("analytical")
def _factory(platform: PlatformSpec) -> Analytical:
    return Analytical(platform)
