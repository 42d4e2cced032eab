"""The analytical kernel model: a roofline with achievable peaks and wave quantisation.

A kernel takes ``max(flops / achievable FLOP/s, bytes / achievable HBM bandwidth)``, but never less
than the platform's shortest kernel. GEMMs are tiled: the work is rounded up to whole waves of
output tiles over the SMs, so a GEMM one tile larger than a wave costs nearly two waves, as on the
real GPU. An MoE layer's experts (``moe``) are two grouped GEMMs in turn, each tiled in the same
way and bound by its compute or by its operand bytes (the weights of every expert that gets a
token: a decode step reads them all for a few tokens). Embedding lookups read whole 32-byte
sectors per row, so narrow rows cost more per byte.
Elementwise kernels do their op's arithmetic (``flops_per_element``, see
:mod:`simgpu.elementwise`) on the vector units at the fp32 peak, whatever the storage dtype
(PyTorch computes bf16 and fp16 elementwise ops in fp32, tensor cores do not run them): a GELU is
memory-bound on a GPU, but can be compute-bound on a CPU core.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..config.platform import GPUSpec, PlatformSpec
from ..graph import KernelSpec
from .base import register

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp4": 0.5}
#: GEMM output tiles (rows, columns, efficiency relative to the largest tile)
TILES = ((256, 128, 1.0), (128, 128, 0.95), (128, 64, 0.85), (64, 64, 0.7))
SECTOR = 32     # bytes of one DRAM sector: the unit of a random row read
INDEX_BYTES = 8  # int64 ids
ATTN_EFFICIENCY = 0.6  # flash attention reaches a lower share of the matmul peak (softmax, masking)
#: Tensor-core GEMMs load their operands in 16-byte vectors; when a dimension is not a multiple of
#: 16 bytes the kernels fall back to narrower loads and run at about this share of the aligned rate.
#: Source: padding GPT-2's vocabulary from 50,257 to 50,304 (the output layer's N) sped nanoGPT's
#: training steps up by ~25% (A. Karpathy, nanoGPT), i.e. its output-layer GEMMs ran ~2x slower.
MISALIGNED_EFFICIENCY = 0.5
ALIGN_BYTES = 16
TENSOR_CORE_DTYPES = ("tf32", "bf16", "fp16", "fp8", "fp4")
#: The dtype whose peak elementwise arithmetic runs at (the vector units' fp32 rate).
VECTOR_DTYPE = "fp32"


def attention_pairs(sq: Any, skv: Any, causal: Any, window: Any) -> Any:
    """(query, key) pairs one head attends: ``sq skv``, half of it when causal (as the balanced chunks
    of context parallelism and a full causal prefill have it); a sliding ``window`` > 0 of keys caps
    each query's keys (causal: the first ``window`` queries attend fewer). Works on arrays too."""
    sq, skv, causal, window = (np.asarray(x, dtype=float) for x in (sq, skv, causal, window))
    full = sq * skv * np.where(causal > 0, 0.5, 1.0)
    w = np.where(window > 0, window, np.inf)
    capped = np.where(causal > 0, sq * np.minimum(w, skv) - np.minimum(w, skv) ** 2 / 2, sq * np.minimum(w, skv))
    return np.where(w < skv, np.minimum(full, capped), full)


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
        }

    @classmethod
    def for_gpu(cls, gpu: GPUSpec) -> Analytical:
        """The model of one GPU alone (the only part of a platform it uses)."""
        return cls(gpu)

    def flops_rate(self, dtype: str) -> float:
        peaks = self.gpu.peak_tflops
        peak = peaks.get(dtype)  # type: ignore[call-overload]
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
        nbytes = b * (m * kk + kk * n + m * n) * e
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

    def _embedding(self, k: KernelSpec) -> tuple[float, float]:
        batch, tables, pooling, dim = (k.get(x) for x in ("batch", "tables", "pooling", "dim"))
        e = DTYPE_BYTES[k.dtype]
        row = np.ceil(dim * e / SECTOR) * SECTOR
        lookups = batch * tables * pooling
        nbytes = lookups * (row + INDEX_BYTES) + batch * tables * dim * e
        if k.family == "embedding_bwd":
            nbytes += lookups * row * 2  # read-modify-write of each touched row by the fused optimizer
        return 0.0, nbytes / self.bw

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
