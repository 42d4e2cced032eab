"""NVIDIA AIConfigurator's measured kernel tables as simgpu measurement tables.

AIConfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) ships, per GPU, parquet tables of
CUDA-event timings collected on the real GPU (``latency`` in milliseconds per call). This module
reads one GPU's folder (``<gpu>/gemm/gemm_perf.parquet``, ``<gpu>/attention/*_attention_perf.parquet``)
into the tables of :mod:`simgpu.kernels.store`:

- ``gemm``: ``C[m, n] = A[m, k] B[k, n]`` in bf16, fp8 (per-tensor scaled) and, where the GPU
  has them (B200), NVFP4 (``nvfp4``: 4-bit values with an fp8 scale per 16, Blackwell's fp4 GEMM,
  simgpu's ``fp4``). Weight-only integer, SmoothQuant and block-scaled fp8 (``fp8_block``) rows are
  other kernels than any simgpu builder emits and are left out.
- ``attention_fwd``: prefill (``context``: ``batch_size`` causal sequences of ``isl`` tokens,
  ``seq_q = seq_kv = isl``) and decode (``generation``: one new token per sequence over a KV cache of
  ``isl + step`` tokens, ``seq_q = 1``), with GQA (``kv_heads``), a sliding window (``window``,
  0 = full) and the KV cache's element width (``kv_bytes``); the ``op`` column says ``prefill`` or
  ``decode``.
- ``moe``: TensorRT-LLM's fused MoE layer (``moe/moe_perf.parquet``: routing, the experts' fc1
  with its activation, fc2 and the weighted sum of each token's ``topk`` outputs) in bf16 and fp8,
  as one rank's ``moe`` kernel (:data:`~simgpu.kernels.features.FAMILY_PARAMS`). ``num_tokens`` are
  read as the tokens of the whole expert-parallel group, of which this rank's experts take their
  share of copies, ``rows = num_tokens x topk / moe_ep_size`` (read as tokens per rank, rows with
  the same local experts and another ``moe_ep_size`` would be one kernel, yet differ up to 30x in
  time); the rank holds ``num_experts / moe_ep_size`` experts of ``inter_size / moe_tp_size``.
  ``moe_torch_flow_nongated`` rows are plain (non-gated) experts, the others SwiGLU ones (``gated``);
  ``distribution`` ``balanced`` is ``skew`` 0, ``power_law_<a>`` is ``skew`` a. Block-scaled fp8 and
  4-bit rows are other kernels than any simgpu builder emits and are left out; a GPU folder without
  a MoE table (or without bf16 / fp8 rows in it) has no ``moe`` table.

Rows with a non-positive latency are dropped. Times become seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import numpy as np
import pandas as pd

from ...errors import ConfigError
from ..analytical import DTYPE_BYTES

#: AIConfigurator's dtype names -> simgpu's; others are not imported.
DTYPES: Final = {"bfloat16": "bf16", "float16": "fp16", "fp8": "fp8"}
#: The GEMM table's dtypes: those of :data:`DTYPES` and NVFP4, which only GEMMs are read in (the MoE
#: table's 4-bit rows, MXFP4 weights with MXFP8 activations, are kernels no builder emits).
GEMM_DTYPES: Final = {**DTYPES, "nvfp4": "fp4"}
FAMILIES: Final = ("gemm", "attention_fwd", "moe")
#: AIConfigurator's MoE kernel sources whose experts are not gated (the rest run SwiGLU experts).
NONGATED: Final = ("moe_torch_flow_nongated",)
MOE_COLUMNS: Final = ("family", "op", "dtype", "rows", "experts", "hidden", "inter", "topk", "gated", "skew",
                      "median_s")


def _read(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise ConfigError("expected an AIConfigurator table here", file=str(path))
    return pd.read_parquet(path)


def read_gemm(folder: Path) -> pd.DataFrame:
    raw = _read(folder / "gemm" / "gemm_perf.parquet")
    raw = raw[raw["gemm_dtype"].isin(GEMM_DTYPES)]
    t = pd.DataFrame({"family": "gemm", "op": "gemm", "dtype": raw["gemm_dtype"].map(GEMM_DTYPES),
                      "m": raw["m"].astype(float), "n": raw["n"].astype(float), "k": raw["k"].astype(float),
                      "median_s": raw["latency"].astype(float) * 1e-3})
    return t


def _attention(raw: pd.DataFrame, decode: bool) -> pd.DataFrame:
    raw = raw[raw["attn_dtype"].isin(DTYPES) & raw["kv_cache_dtype"].isin(DTYPES)]
    isl = raw["isl"].astype(float)
    kv_len = isl + raw["step"].astype(float) if decode else isl
    return pd.DataFrame({
        "family": "attention_fwd", "op": "decode" if decode else "prefill",
        "dtype": raw["attn_dtype"].map(DTYPES),
        "batch": raw["batch_size"].astype(float), "heads": raw["num_heads"].astype(float),
        "seq_q": 1.0 if decode else isl, "seq_kv": kv_len, "head_dim": raw["head_dim"].astype(float),
        "causal": 0.0 if decode else 1.0, "kv_heads": raw["num_key_value_heads"].astype(float),
        "window": raw["window_size"].astype(float),
        "kv_bytes": raw["kv_cache_dtype"].map(DTYPES).map(DTYPE_BYTES).astype(float),
        "median_s": raw["latency"].astype(float) * 1e-3})


def read_attention(folder: Path) -> pd.DataFrame:
    pre = _attention(_read(folder / "attention" / "context_attention_perf.parquet"), decode=False)
    dec = _attention(_read(folder / "attention" / "generation_attention_perf.parquet"), decode=True)
    return pd.concat([pre, dec], ignore_index=True)


def _skew(distribution: str) -> float:
    if distribution == "balanced":
        return 0.0
    head, _, exponent = distribution.partition("power_law_")
    try:
        return float(exponent) if not head else float("nan")
    except ValueError:
        return float("nan")


def read_moe(folder: Path) -> pd.DataFrame:
    path = folder / "moe" / "moe_perf.parquet"
    if not path.is_file():
        return pd.DataFrame(columns=MOE_COLUMNS)
    raw = _read(path)
    raw = raw[raw["moe_dtype"].isin(DTYPES)]
    if raw.empty:
        return pd.DataFrame(columns=MOE_COLUMNS)
    skews = {d: _skew(str(d)) for d in raw["distribution"].unique()}
    bad = [d for d, v in skews.items() if np.isnan(v)]
    if bad:
        raise ConfigError(f"distribution {bad[0]!r}: expected 'balanced' or 'power_law_<exponent>'", file=str(path),
                          key="distribution")
    ep, tp = raw["moe_ep_size"].astype(float), raw["moe_tp_size"].astype(float)
    nongated = raw["kernel_source"].isin(NONGATED)
    return pd.DataFrame({
        "family": "moe", "op": np.where(nongated, "moe_nongated", "moe"), "dtype": raw["moe_dtype"].map(DTYPES),
        "rows": raw["num_tokens"].astype(float) * raw["topk"].astype(float) / ep,
        "experts": raw["num_experts"].astype(float) / ep, "hidden": raw["hidden_size"].astype(float),
        "inter": raw["inter_size"].astype(float) / tp, "topk": raw["topk"].astype(float),
        "gated": np.where(nongated, 0.0, 1.0), "skew": raw["distribution"].map(skews).astype(float),
        "median_s": raw["latency"].astype(float) * 1e-3})


def device(folder: str | Path) -> str:
    """The GPU the tables of ``folder`` were measured on (their ``device`` column)."""
    raw = pd.read_parquet(Path(folder) / "gemm" / "gemm_perf.parquet", columns=["device"])
    return str(raw["device"].iloc[0])


def read_aiconfigurator(folder: str | Path, families: tuple[str, ...] | None = None) -> dict[str, pd.DataFrame]:
    """One GPU's AIConfigurator tables (``folder`` = ``.../aiconfigurator/<gpu>``), per family."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError("no AIConfigurator folder here", file=str(folder))
    readers = {"gemm": read_gemm, "attention_fwd": read_attention, "moe": read_moe}
    out = {}
    for family, reader in readers.items():
        if families is None or family in families:
            t = reader(folder)
            if t.empty and family == "moe":
                continue
            t = t[np.isfinite(t["median_s"]) & (t["median_s"] > 0)]
            out[family] = t.assign(source="aiconfigurator").reset_index(drop=True)
    return out
