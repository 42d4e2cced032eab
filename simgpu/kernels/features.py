"""Features of the learned kernel models: shape parameters in log space plus derived quantities.

This module owns what a kernel family's shape parameters are (:data:`FAMILY_PARAMS`, the same names
as :class:`~simgpu.graph.KernelSpec` carries), the index-reuse statistics of embedding
lookups (:mod:`simgpu.kernels.lookups`), and the feature table of a batch of kernels on one GPU
(:func:`feature_frame`): every parameter as ``log2(1 + x)``, FLOPs, bytes moved, arithmetic
intensity, waves of 128x128 output tiles per SM for GEMMs, the dtype's width, the GPU's datasheet
figures in dimensionless form (intensity relative to the ridge point, compute time over memory
time: they carry over to GPUs a model has not seen) and the analytical model's time of the kernel.
Times are in seconds, bytes in bytes, FLOPs in floating-point operations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final

import numpy as np
import pandas as pd

from ..config.platform import GPUSpec
from ..elementwise import DEFAULT_FLOPS_PER_ELEMENT, flops_per_element
from ..errors import ConfigError
from ..graph import KernelSpec
from .analytical import (
    DTYPE_BYTES,
    SERVING_PARAMS,
    VECTOR_DTYPE,
    Analytical,
    attention_pairs,
    operand_bytes,
    peak_dtype,
    serving_work,
)
from .lookups import LOOKUP_PARAMS, REUSE, lookup_params, with_defaults

#: Attention's optional parameters: ``kv_heads`` (GQA; NaN: as many as ``heads``), ``window`` (a
#: sliding window of keys, 0: the whole sequence) and ``kv_bytes`` (the K/V cache's element width;
#: NaN: the dtype's). :func:`kernel_params` resolves the NaNs.
ATTENTION_OPTIONAL: Final[Mapping[str, float]] = {"kv_heads": np.nan, "window": 0.0, "kv_bytes": np.nan}

#: Each family's shape parameters and their defaults (None: required). Optional ones are features
#: that measurements may carry and simulated kernels may omit; :func:`kernel_params` fills them in.
#: An elementwise kernel's ``flops_per_element`` is the arithmetic of its op per output element
#: (:mod:`simgpu.elementwise`): what tells a GELU from a copy of the same shape. A ``moe`` kernel is
#: one rank's expert FFNs of an MoE layer: ``rows`` token copies (tokens x ``topk``, those routed to
#: this rank's experts) over ``experts`` local experts, ``hidden`` -> ``inter`` (after tensor
#: parallelism; ``gated``: SwiGLU's gate and up projections) -> ``hidden``; ``skew`` is the exponent
#: of a power law of tokens over experts (0: balanced routing); ``bwd`` 0 the forward, 1 the input
#: gradients, 2 the weight gradients (:func:`~simgpu.kernels.analytical.moe_gemms`); ``group_tokens``
#: the tokens the whole expert-parallel group routes, every one of which a serving engine's fused MoE
#: reads (NaN: this rank's own, ``rows / topk``). The serving
#: families (``mla_context``, ``mla_decode``, ``linear_attention``, ``sparse_attention``, ``quantize``)
#: are :data:`~simgpu.kernels.analytical.SERVING_PARAMS`, their work
#: :func:`~simgpu.kernels.analytical.serving_work`.
FAMILY_PARAMS: Final[Mapping[str, Mapping[str, float | None]]] = {
    "gemm": {"m": None, "n": None, "k": None},
    "bmm": {"b": None, "m": None, "n": None, "k": None},
    "attention_fwd": {"batch": None, "heads": None, "seq_q": None, "seq_kv": None, "head_dim": None,
                      "causal": 0.0, **ATTENTION_OPTIONAL},
    "attention_bwd": {"batch": None, "heads": None, "seq_q": None, "seq_kv": None, "head_dim": None,
                      "causal": 0.0, **ATTENTION_OPTIONAL},
    "embedding_fwd": LOOKUP_PARAMS,
    "embedding_bwd": LOOKUP_PARAMS,
    "elementwise": {"numel": None, "reads": 1.0, "writes": 1.0, "flops_per_element": DEFAULT_FLOPS_PER_ELEMENT},
    "norm": {"rows": None, "cols": None, "bwd": 0.0, "rms": 0.0},
    "softmax": {"rows": None, "cols": None, "bwd": 0.0},
    "optimizer": {"numel": None, "states": 0.0},
    "memcpy": {"nbytes": None, "to_device": 1.0},
    "moe": {"rows": None, "experts": None, "hidden": None, "inter": None, "topk": 1.0, "gated": 1.0,
            "skew": 0.0, "bwd": 0.0, "group_tokens": np.nan},
    **SERVING_PARAMS,
}
#: Families the analytical model has no formula for: their models learn the time itself.
NO_BASELINE: Final = frozenset({"memcpy"})
#: Parameters that follow from a measurement's torch op (its ``op`` column) rather than being
#: measured: a measurement table need not carry them (:func:`kernels_from_table` derives them, and
#: the harness does not write them), a simulated kernel gets them from the builder that emits it.
FROM_OP: Final[Mapping[str, Mapping[str, Callable[[str], float]]]] = {
    "elementwise": {"flops_per_element": flops_per_element},
}
_TILE = 128  # output tile edge used for the waves feature


def kernel_params(kernel: KernelSpec) -> dict[str, float]:
    """The family's parameters of ``kernel`` with defaults filled in; unknown families raise."""
    spec = FAMILY_PARAMS.get(kernel.family)
    if spec is None:
        raise KeyError(f"no features for kernel family {kernel.family!r}; known: {', '.join(FAMILY_PARAMS)}")
    if kernel.family.startswith("embedding"):
        out = lookup_params(kernel)
        if np.isnan(out["out_bytes"]):
            out["out_bytes"] = float(DTYPE_BYTES[kernel.dtype])
        return out
    out = with_defaults(kernel.family, spec, dict(kernel.params))
    if kernel.family.startswith("attention") and np.isnan(out["kv_heads"]):
        out["kv_heads"] = out["heads"]
    if "kv_bytes" in out and np.isnan(out["kv_bytes"]):
        out["kv_bytes"] = float(DTYPE_BYTES[kernel.dtype])
    if kernel.family == "moe" and np.isnan(out["group_tokens"]):
        out["group_tokens"] = out["rows"] / max(out["topk"], 1.0)
    return out


def measured_params(family: str) -> list[str]:
    """The parameters of ``family`` that a measurement table carries (all but :data:`FROM_OP` ones)."""
    derived = FROM_OP.get(family, {})
    return [p for p in FAMILY_PARAMS[family] if p not in derived]


def kernels_from_table(family: str, table: pd.DataFrame) -> list[KernelSpec]:
    """One KernelSpec per row of a measurement table (columns: ``dtype`` and the family's params).

    A parameter of :data:`FROM_OP` that the table has no column for is derived from its ``op``
    column (a platform's microbenchmarks: ``gelu`` rows get the GELU's per-element cost); an
    imported table that gives the column (NeuSight's, the default cost) keeps its values.
    """
    table = table.copy()
    for name, of_op in FROM_OP.get(family, {}).items():
        if name not in table.columns:
            if "op" not in table.columns:
                raise ConfigError(f"a {family} table needs a {name!r} or an 'op' column", key="op")
            ops = table["op"].astype(str)
            try:
                costs = {op: of_op(op) for op in ops.unique()}
            except KeyError as e:
                raise ConfigError(str(e.args[0]), key="op") from None
            table[name] = ops.map(costs).astype(float)
    names = [p for p in FAMILY_PARAMS[family] if p in table.columns]
    cols = [table[p].to_numpy(dtype=float) for p in names]
    dtypes = table["dtype"].astype(str).to_numpy()
    out = []
    for i in range(len(table)):
        params = {p: c[i] for p, c in zip(names, cols, strict=True) if not np.isnan(c[i])}
        out.append(KernelSpec.make(family, str(dtypes[i]), **params))
    return out


def _flops_bytes(family: str, p: Mapping[str, np.ndarray], e: np.ndarray,
                 ops: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """FLOPs and bytes moved of each kernel (the same accounting as the analytical model); ``ops``: a
    GEMM's (or MoE's) bytes per element of activations, weights and output
    (:func:`~simgpu.kernels.analytical.operand_bytes`), all ``e`` when omitted."""
    a, w, c = ops if ops is not None else (e, e, e)
    uniform = (a == w) & (w == c)
    if family in SERVING_PARAMS:
        kv = p["kv_bytes"] if "kv_bytes" in p else np.full_like(e, 2.0)
        work = serving_work(family, p, e, kv)
        flops = sum((np.asarray(v, dtype=float) for u, v in work.items() if u != "bytes"), np.zeros_like(e))
        return flops, np.asarray(work["bytes"], dtype=float) + np.zeros_like(e)
    if family in ("gemm", "bmm"):
        b = p.get("b", np.ones_like(p["m"]))
        m, n, k = p["m"], p["n"], p["k"]
        nbytes = np.where(uniform, b * (m * k + k * n + m * n) * e, b * (m * k * a + k * n * w + m * n * c))
        return 2 * b * m * n * k, nbytes
    if family.startswith("attention"):
        bh = p["batch"] * p["heads"]
        flops = 4 * bh * p["head_dim"] * attention_pairs(p["seq_q"], p["seq_kv"], p["causal"], p["window"])
        kv_len = np.where(p["window"] > 0, np.minimum(p["seq_kv"], p["window"]), p["seq_kv"])
        nbytes = (2 * bh * p["seq_q"] * e + 2 * p["batch"] * p["kv_heads"] * kv_len * p["kv_bytes"]) * p["head_dim"]
        return flops, nbytes
    if family.startswith("embedding"):
        lookups = p["batch"] * p["tables"] * p["pooling"]
        return lookups * p["dim"], lookups * p["dim"] * e + p["batch"] * p["tables"] * p["dim"] * e
    if family == "elementwise":
        return p["numel"] * p["flops_per_element"], p["numel"] * (p["reads"] + p["writes"]) * e
    if family in ("norm", "softmax"):
        n = p["rows"] * p["cols"]
        return 5 * n, n * (2 + p["bwd"]) * e
    if family == "optimizer":
        return p["numel"] * (2 + 5 * p["states"]), p["numel"] * 4 * (3 + 2 * p["states"])
    if family == "memcpy":
        return np.zeros_like(p["nbytes"]), p["nbytes"]
    if family == "moe":
        width = 2 + p["gated"]  # fc1's outputs and fc2's inputs, in units of inter
        active = np.minimum(p["experts"], np.maximum(p["rows"], 1.0))
        flops = 2 * p["rows"] * p["hidden"] * p["inter"] * width
        weights = active * width * p["hidden"] * p["inter"]   # of every expert that gets a token
        acts = p["rows"] * (2 * p["hidden"] + width * p["inter"])
        return flops, np.where(uniform, (weights + acts) * e, weights * w + acts * a)
    raise KeyError(f"no features for kernel family {family!r}")


def feature_frame(family: str, kernels: Sequence[KernelSpec], gpu: GPUSpec,
                  baseline: np.ndarray | None = None) -> pd.DataFrame:
    """:func:`feature_columns` as a table (for fitting)."""
    return pd.DataFrame(feature_columns(family, kernels, gpu, baseline))


def feature_matrix(family: str, kernels: Sequence[KernelSpec], gpu: GPUSpec, baseline: np.ndarray | None,
                   features: Sequence[str]) -> np.ndarray:
    """The named features of ``kernels`` as a matrix, one row per kernel (for predicting)."""
    cols = feature_columns(family, kernels, gpu, baseline)
    return np.column_stack([cols[f] for f in features]) if features else np.zeros((len(kernels), 0))


def feature_columns(family: str, kernels: Sequence[KernelSpec], gpu: GPUSpec,
                    baseline: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The feature table of ``kernels`` (all of ``family``) on ``gpu``, one row per kernel.

    ``baseline`` is the analytical model's seconds per kernel (computed here when omitted); it is
    a feature in log space (``log_analytical_us``) and the reference that correction models learn from.
    """
    rows = [kernel_params(k) for k in kernels]
    names = list(FAMILY_PARAMS[family])
    p = {n: np.array([r[n] for r in rows], dtype=float) for n in names}
    e = np.array([DTYPE_BYTES[k.dtype] for k in kernels], dtype=float)
    f: dict[str, np.ndarray] = {f"log_{n}": np.log2(1.0 + np.maximum(p[n], 0.0)) for n in names}
    if family.startswith("embedding"):
        for n in REUSE:
            f[n] = p[n]
    peaks = gpu.peak_tflops
    opb = [operand_bytes(k.dtype, peaks) for k in kernels]
    ops = (np.array([o[0] for o in opb]), np.array([o[1] for o in opb]), np.array([o[2] for o in opb]))
    flops, nbytes = _flops_bytes(family, p, e, ops)
    # elementwise arithmetic runs on the vector units, in fp32 whatever the storage dtype
    peak = np.array([_peak(gpu, k.dtype, vector=family == "elementwise") for k in kernels])
    bw = gpu.hbm_gbytes_per_s * 1e9
    f["log_flops"] = np.log2(1.0 + flops)
    f["log_bytes"] = np.log2(1.0 + nbytes)
    f["log_intensity"] = np.log2((1.0 + flops) / (1.0 + nbytes))
    # Dimensionless ones carry the GPU's datasheet over to GPUs a model has not seen: intensity
    # relative to the ridge point (peak / bandwidth), and the ratio of compute to memory time.
    f["ridge_rel"] = f["log_intensity"] - np.log2(peak / bw)
    f["bound"] = np.log2((flops / peak + 1e-12) / (nbytes / bw + 1e-12))
    f["dtype_bytes"] = e
    if family in ("gemm", "bmm", "moe"):
        # the operands' widths with their scales: what tells fp8 from block-scaled fp8 (the same peak
        # and element width) and 4-bit weights beside 16-bit activations from a 4-bit GEMM
        f["act_bytes"], f["weight_bytes"] = ops[0], ops[1]
    if family in ("gemm", "bmm"):
        b = p.get("b", np.ones_like(p["m"]))
        tiles = b * np.ceil(p["m"] / _TILE) * np.ceil(p["n"] / _TILE)
        waves = tiles / gpu.sms
        f["log_waves"] = np.log2(waves)
        f["wave_tail"] = np.ceil(waves) - waves  # idle share of the last wave
        for n in ("m", "n", "k"):
            f[f"{n}_align"] = np.mod(p[n], _TILE) / _TILE
    if family.startswith("embedding"):
        lookups = p["batch"] * p["tables"] * p["pooling"]
        f["log_lookups"] = np.log2(1.0 + lookups)
        f["log_distinct_rows"] = np.log2(1.0 + lookups * p["reuse_unique"])  # rows touched
        f["log_table_bytes"] = np.log2(1.0 + p["tables"] * p["rows"] * p["dim"] * e)
    if family in ("norm", "softmax"):
        f["log_rows_per_sm"] = np.log2(p["rows"] / gpu.sms)
    if family == "moe":
        # token copies per expert (the GEMMs' m), experts with work, and waves of fc1's output tiles
        active = np.minimum(p["experts"], np.maximum(p["rows"], 1.0))
        per_expert = np.ceil(np.maximum(p["rows"], 1.0) / active)
        f["log_rows_per_expert"] = np.log2(per_expert)
        f["log_active_experts"] = np.log2(active)
        waves = active * np.ceil(per_expert / _TILE) * np.ceil(p["inter"] * (1 + p["gated"]) / _TILE) / gpu.sms
        f["log_waves"] = np.log2(waves)
        f["wave_tail"] = np.ceil(waves) - waves
        f["log_mem_us"] = np.log2(nbytes / bw * 1e6 + 1e-3)
        f["log_compute_us"] = np.log2(flops / peak * 1e6 + 1e-3)
    if family in SERVING_PARAMS:
        # this GPU's compute and memory times in microseconds, and the thread blocks per SM of the
        # kernels' usual grid (a block per sequence and head; per 128 rows of a quantized activation)
        f["log_mem_us"] = np.log2(nbytes / bw * 1e6 + 1e-3)
        f["log_compute_us"] = np.log2(flops / peak * 1e6 + 1e-3)
        heads = p["m"] / _TILE if family == "quantize" else p["batch"] * p.get("heads", p.get("heads_v"))
        f["log_ctas_per_sm"] = np.log2(np.maximum(heads, 1e-3) / gpu.sms)
    if family.startswith("attention"):
        # this GPU's compute and memory times in microseconds, and how the work spreads over its
        # SMs: a decode kernel runs a block per sequence and KV head, a prefill one per query tile
        f["log_mem_us"] = np.log2(nbytes / bw * 1e6 + 1e-3)
        f["log_compute_us"] = np.log2(flops / peak * 1e6 + 1e-3)
        f["log_ctas_per_sm"] = np.log2(p["batch"] * p["kv_heads"] / gpu.sms)
        f["log_q_tiles_per_sm"] = np.log2(p["batch"] * p["heads"] * np.ceil(p["seq_q"] / _TILE) / gpu.sms)
        f["gqa"] = np.log2(p["heads"] / np.maximum(p["kv_heads"], 1.0))
    if family not in NO_BASELINE:
        if baseline is None:
            baseline, _ = analytical_for(gpu).predict(kernels)
        f["log_analytical_us"] = np.log2(np.asarray(baseline, dtype=float) * 1e6)
    count = len(kernels)
    return {k: np.broadcast_to(np.asarray(v, dtype=float), (count,)) for k, v in f.items()}


def analytical_for(gpu: GPUSpec) -> Analytical:
    """The analytical model of one GPU alone: it reads nothing of a platform but its GPU."""
    return Analytical.for_gpu(gpu)


def _peak(gpu: GPUSpec, dtype: str, vector: bool = False) -> float:
    """FLOP/s peak of ``dtype`` (the fp32 one where the GPU lists none); with ``vector``, the fp32 peak
    first (elementwise arithmetic, as :meth:`Analytical.vector_rate`)."""
    peaks = {str(k): float(v) for k, v in gpu.peak_tflops.items()}
    peak = (peaks.get(VECTOR_DTYPE) if vector else None) or peaks.get(peak_dtype(dtype, peaks)) or peaks.get("fp32")
    if peak is None:
        raise ValueError(f"{gpu.name} has no {dtype} (or fp32) peak in its platform file")
    return float(peak) * 1e12
