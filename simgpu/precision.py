"""Serving precisions as deployed, and the GEMM path each takes on a GPU.

A served model's linears run in one of: ``bf16`` / ``fp16`` / ``fp32``; ``fp8`` (per-tensor scaled
fp8 weights and activations); ``fp8_block`` (DeepSeek's 128 x 128 block-scaled fp8: a scale per
weight block and per 128 activation values); ``mxfp8`` (OCP MX fp8: a shared exponent per 32);
``fp4`` (NVFP4: e2m1 values with an fp8 scale per 16, activations quantised too; ``nvfp4`` is its
other name); ``mxfp4`` (OCP MXFP4 weights, activations in MXFP8, as gpt-oss's experts on
Blackwell); ``w4a16`` (4-bit weights with 16-bit activations: int4 AWQ, ``int4`` its other name,
or MXFP4 weights dequantised in the kernel).

A GPU without fp4 tensor cores (Hopper) runs 4-bit weights dequantised into 16-bit GEMMs: ``fp4``
and ``mxfp4`` there take the ``w4a16`` path, timed as such. A GPU without 16-bit tensor cores
(Volta has fp16 only, no bf16) has no path for 4-bit weights.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

#: Other names of the precisions, as frameworks and checkpoints write them.
ALIASES: Final = {"nvfp4": "fp4", "int4": "w4a16", "int4_awq": "w4a16", "w4a16_mxfp4": "w4a16"}
#: Precisions whose activations are quantised before each GEMM (a quantize kernel, unless fused).
QUANTIZED_ACTIVATIONS: Final = frozenset({"fp8", "fp8_block", "mxfp8", "fp4", "mxfp4"})


#: The tensor-core peak (a platform's ``peak_tflops`` key) each GEMM path runs at, where not its own.
PEAK_OF: Final = {"fp8_block": "fp8", "mxfp8": "fp8", "mxfp4": "fp4", "w4a16": "bf16"}


def canonical(precision: str) -> str:
    return ALIASES.get(precision, precision)


def gemm_path(precision: str, peaks: Iterable[str]) -> str | None:
    """The GEMM kernel dtype ``precision`` runs as on a GPU with tensor-core peaks ``peaks``; None
    where it has no path."""
    p, have = canonical(precision), set(peaks)
    if p in ("fp8_block", "mxfp8"):
        return p if "fp8" in have else None
    if p in ("fp4", "mxfp4"):
        if "fp4" in have:
            return p
        return "w4a16" if "bf16" in have else None
    if p == "w4a16":
        return p if "bf16" in have else None
    return p if p in have else None


def why_no_path(precision: str, gpu: str, peaks: Iterable[str]) -> str:
    """One line saying why ``precision`` has no path on ``gpu``."""
    p, have = canonical(precision), list(peaks)
    ok = [q for q in ("fp32", "fp16", "bf16", "fp8", "fp8_block", "mxfp8", "fp4", "mxfp4", "w4a16")
          if gemm_path(q, have) is not None]
    if p in ("fp4", "mxfp4", "w4a16"):
        return (f"{precision} weights need fp4 tensor cores or a 16-bit (bf16) GEMM to dequantise into; {gpu} has "
                f"neither (peaks: {', '.join(have)}); expected one of: {', '.join(ok)}")
    return f"{precision} is not supported by {gpu}; expected one of: {', '.join(ok)}"
