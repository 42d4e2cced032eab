"""NVIDIA AIConfigurator's measured kernel tables as simgpu measurement tables.

AIConfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) ships, per GPU, parquet tables of
CUDA-event timings collected on the real GPU (``latency`` in milliseconds per call). This module
reads one GPU's folder into the tables of :mod:`simgpu.kernels.store`. A table may lie at the
family's top level (``<gpu>/gemm/gemm_perf.parquet``: TensorRT-LLM's) and per framework
(``<gpu>/gemm/<trtllm|vllm|sglang>/``); each simgpu dtype of a family is taken from the first
framework that measured it, TensorRT-LLM's (top level, else ``trtllm/``) first, then vLLM's, then
SGLang's (:data:`FRAMEWORKS`), and the ``framework`` column says which (the fit's manifest records it).

- ``gemm``: ``C[m, n] = A[m, k] B[k, n]`` in bf16, fp8 (per-tensor scaled), block-scaled fp8
  (``fp8_block``: DeepSeek's 128 x 128 weight blocks, 1 x 128 activation groups) and, where the GPU
  has them (Blackwell), NVFP4 (``nvfp4``: 4-bit values with an fp8 scale per 16, simgpu's ``fp4``).
  Weight-only integer and SmoothQuant rows (A100) are left out.
- ``attention_fwd``: prefill (``context``: ``batch_size`` causal sequences of ``isl`` tokens,
  ``seq_q = seq_kv = isl``) and decode (``generation``: one new token per sequence over a KV cache of
  ``isl + step`` tokens, ``seq_q = 1``), with GQA (``kv_heads``), a sliding window (``window``,
  0 = full) and the KV cache's element width (``kv_bytes``); the ``op`` column says ``prefill`` or
  ``decode``.
- ``moe``: the fused MoE layer (routing, the experts' fc1 with its activation, fc2 and the weighted
  sum of each token's ``topk`` outputs) as one rank's ``moe`` kernel
  (:data:`~simgpu.kernels.features.FAMILY_PARAMS`), in bf16, fp8, ``fp8_block``, ``fp4`` (NVFP4),
  ``mxfp4`` (``w4a8_mxfp4_mxfp8``: MXFP4 weights, MXFP8 activations) and ``w4a16`` (``w4a16_mxfp4``
  and ``int4_wo``: 4-bit weights, 16-bit activations; where a framework measured both, the one with
  more rows). ``num_tokens`` are read as the tokens of the whole expert-parallel group, of which this
  rank's experts take their share of copies, ``rows = num_tokens x topk / moe_ep_size``; the rank
  holds ``num_experts / moe_ep_size`` experts of ``inter_size / moe_tp_size``, and ``group_tokens``
  is ``num_tokens`` (the kernel routes every token of the group: the same local shape takes longer
  at a larger expert-parallel degree). Non-gated experts
  (``gated`` 0, op ``moe_nongated``) are TensorRT-LLM's ``moe_torch_flow_nongated`` rows and, in the
  frameworks' tables, which do not say, the shapes of those rows (:data:`NONGATED_SHAPES`: the
  Nemotron models' relu^2 experts); ``distribution`` ``balanced`` is ``skew`` 0, ``power_law_<a>``
  is ``skew`` a. Where two kernels of a framework measured the same shape, the kernel with more rows
  in the table is kept.
- ``bmm`` (``mla_bmm/<fw>/mla_bmm_perf.parquet``): MLA's absorbed batched GEMMs of decode, per head
  (``b = num_heads``, ``m = num_tokens``): ``mla_gen_pre`` (q_nope x W_UK, ``k`` = qk_nope_head_dim
  128, ``n`` = kv_lora 512, op ``mla_pre``) and ``mla_gen_post`` (attention output x W_UV, ``k`` =
  512, ``n`` = v_head_dim 128, op ``mla_post``), bf16 and fp8.
- ``mla_context`` (``mla/<fw>/context_mla_perf.parquet``): prefill MLA attention kernels (un-absorbed,
  qk 192 / v 128 per head), ``batch_size`` causal sequences of ``isl`` tokens, ``num_heads`` this
  rank's heads (the table's ``tp_size`` is the TP degree they came from), ``kv_bytes`` of
  ``kv_cache_dtype``.
- ``mla_decode`` (``mla/<fw>/generation_mla_perf.parquet``): absorbed MLA decode over the latent
  cache, one token per sequence over ``isl + step`` cached tokens.
- ``linear_attention`` (``linear_attention/<fw>/gdn_perf.parquet``): the Gated DeltaNet kernel alone
  (``chunk_gated_delta_rule*`` in prefill: ``batch_size`` sequences of ``seq_len`` new tokens;
  ``fused_recurrent_gated_delta_rule*`` in decode: one token each, ``decode`` 1); the table's
  causal-conv1d rows are other kernels and are left out. ``num_k_heads`` / ``num_v_heads`` as given.
- ``sparse_attention`` (``sparse_attention/<fw>/dsa_{context,generation}_module_perf.parquet``):
  DeepSeek-V3.2's whole attention *module* with DSA (the collector runs the model's attention layer
  forward): its projections (fused q_a/kv_a, q_b, o_proj, the indexer's wq_b, wk, weights_proj, in
  ``gemm_type``: the kernel's dtype), the absorbed BMMs, the lightning indexer with its top-k, and the
  sparse MLA over the top-2,048 keys. Rows of DeepSeek-V3.2 with a bf16 KV cache (the shapes the
  family's parameters describe; GLM-5's rows have another hidden size and index heads; the
  ``*_skip_indexer`` rows, another op, are left out); context rows are ``batch_size`` causal sequences
  of ``isl`` new tokens over ``isl + step`` keys, generation rows one token over ``isl + step``.
  Where a framework measured a shape with two backends, the backend with more rows is kept.
- ``quantize`` (``quantize/<fw>/scale_matrix_perf.parquet``): the activation quantize before a
  quantized GEMM, an ``m x k`` bf16 tensor to ``quant_dtype`` (fp8, per-tensor scale: ``block`` 0).
  The ``computescale`` tables (the scale's reduction, timed apart) are another kernel and are left out.

Rows with a non-positive latency are dropped. Times become seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final

import numpy as np
import pandas as pd

from ...errors import ConfigError
from ..analytical import DTYPE_BYTES

#: AIConfigurator's dtype names -> simgpu's; others are not imported.
DTYPES: Final = {"bfloat16": "bf16", "float16": "fp16", "fp8": "fp8"}
#: The GEMM table's dtypes: those of :data:`DTYPES`, block-scaled fp8 and NVFP4.
GEMM_DTYPES: Final = {**DTYPES, "fp8_block": "fp8_block", "nvfp4": "fp4"}
#: The MoE table's dtypes (4-bit weight-only formats are ``w4a16``; MXFP4 with MXFP8 activations ``mxfp4``).
MOE_DTYPES: Final = {**GEMM_DTYPES, "w4a16_mxfp4": "w4a16", "int4_wo": "w4a16", "w4a8_mxfp4_mxfp8": "mxfp4"}
FAMILIES: Final = ("gemm", "attention_fwd", "moe", "bmm", "mla_context", "mla_decode", "linear_attention",
                   "sparse_attention", "quantize")
#: The frameworks' folders in the order a dtype's rows are taken from (the top-level tables are TensorRT-LLM's).
FRAMEWORKS: Final = ("trtllm", "vllm", "sglang")
#: AIConfigurator's MoE kernel sources whose experts are not gated (the rest run SwiGLU experts).
NONGATED: Final = ("moe_torch_flow_nongated",)
#: (hidden, inter) of the non-gated experts in TensorRT-LLM's tables (``moe_torch_flow_nongated`` on
#: A100, H100, H200: Nemotron's relu^2 experts), by which the frameworks' tables' rows are told apart.
NONGATED_SHAPES: Final = frozenset({(2048, 5120), (2688, 1856), (8192, 5120)})
#: MLA's absorbed BMMs: op name -> (simgpu op, k, n).
MLA_BMM: Final = {"mla_gen_pre": ("mla_pre", 128.0, 512.0), "mla_gen_post": ("mla_post", 512.0, 128.0)}
#: The model whose DSA module rows the ``sparse_attention`` family is fitted on.
DSA_MODEL: Final = "deepseek-ai/DeepSeek-V3.2"
MOE_COLUMNS: Final = ("family", "op", "dtype", "rows", "experts", "hidden", "inter", "topk", "gated", "skew",
                      "group_tokens", "median_s")


def _read(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise ConfigError("expected an AIConfigurator table here", file=str(path))
    return pd.read_parquet(path)


def tables(folder: Path, family: str, name: str) -> list[tuple[str, Path]]:
    """The tables ``<family>/<name>`` of a GPU folder, per framework in :data:`FRAMEWORKS` order
    (the top-level one is TensorRT-LLM's)."""
    out: list[tuple[str, Path]] = []
    top = folder / family / name
    if top.is_file():
        out.append(("trtllm", top))
    for fw in FRAMEWORKS:
        path = folder / family / fw / name
        if path.is_file() and not (fw == "trtllm" and top.is_file()):
            out.append((fw, path))
    return out


def first_framework(parts: list[tuple[str, pd.DataFrame]]) -> pd.DataFrame:
    """Per simgpu dtype, the rows of the first framework that has any (``framework`` column added)."""
    kept: list[pd.DataFrame] = []
    taken: set[str] = set()
    for fw, t in parts:
        new = t[~t["dtype"].isin(taken)]
        if len(new):
            kept.append(new.assign(framework=fw))
            taken |= set(new["dtype"].unique())
    return pd.concat(kept, ignore_index=True) if kept else pd.DataFrame()


def _most_rows(raw: pd.DataFrame, column: str, within: list[str], key: list[str]) -> pd.DataFrame:
    """Of rows measuring the same ``key`` with several ``column`` values (kernels, backends), those of
    the value with the most rows (within each ``within`` group)."""
    counts = raw.groupby([*within, column], sort=False)[column].transform("size")
    order = raw.assign(_n=counts).sort_values(["_n", column], ascending=[False, True], kind="stable")
    return order.drop_duplicates([*within, *key]).drop(columns="_n").sort_index()


def _gemm(raw: pd.DataFrame) -> pd.DataFrame:
    raw = raw[raw["gemm_dtype"].isin(GEMM_DTYPES)]
    return pd.DataFrame({"family": "gemm", "op": "gemm", "dtype": raw["gemm_dtype"].map(GEMM_DTYPES),
                         "m": raw["m"].astype(float), "n": raw["n"].astype(float), "k": raw["k"].astype(float),
                         "median_s": raw["latency"].astype(float) * 1e-3})


def read_gemm(folder: Path) -> pd.DataFrame:
    found = tables(folder, "gemm", "gemm_perf.parquet")
    if not found:
        raise ConfigError("expected an AIConfigurator table here", file=str(folder / "gemm" / "gemm_perf.parquet"))
    return first_framework([(fw, _gemm(_read(p))) for fw, p in found])


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
    parts = []
    for name, decode in (("context_attention_perf.parquet", False), ("generation_attention_perf.parquet", True)):
        found = tables(folder, "attention", name)
        if not found:
            raise ConfigError("expected an AIConfigurator table here", file=str(folder / "attention" / name))
        parts.append(first_framework([(fw, _attention(_read(p), decode)) for fw, p in found]))
    return pd.concat(parts, ignore_index=True)


def _skew(distribution: str) -> float:
    if distribution == "balanced":
        return 0.0
    head, _, exponent = distribution.partition("power_law_")
    try:
        return float(exponent) if not head else float("nan")
    except ValueError:
        return float("nan")


def _moe(raw: pd.DataFrame, path: Path) -> pd.DataFrame:
    raw = raw[raw["moe_dtype"].isin(MOE_DTYPES)]
    if raw.empty:
        return pd.DataFrame(columns=MOE_COLUMNS)
    skews = {d: _skew(str(d)) for d in raw["distribution"].unique()}
    bad = [d for d, v in skews.items() if np.isnan(v)]
    if bad:
        raise ConfigError(f"distribution {bad[0]!r}: expected 'balanced' or 'power_law_<exponent>'", file=str(path),
                          key="distribution")
    raw = raw.assign(dtype=raw["moe_dtype"].map(MOE_DTYPES))
    shape = ["num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size",
             "distribution"]
    # one raw dtype per simgpu dtype (w4a16: MXFP4 or int4 weights), then one kernel per shape
    raw = raw[raw["moe_dtype"] == raw.groupby("dtype")["moe_dtype"].transform(lambda s: s.value_counts().index[0])]
    nongated = raw["kernel_source"].isin(NONGATED) | pd.Series(
        [(int(h), int(i)) in NONGATED_SHAPES for h, i in zip(raw["hidden_size"], raw["inter_size"], strict=True)],
        index=raw.index)
    raw = _most_rows(raw.assign(_gated=~nongated), "kernel_source", ["dtype", "_gated"], shape)
    nongated = ~raw["_gated"]
    ep, tp = raw["moe_ep_size"].astype(float), raw["moe_tp_size"].astype(float)
    return pd.DataFrame({
        "family": "moe", "op": np.where(nongated, "moe_nongated", "moe"), "dtype": raw["dtype"],
        "rows": raw["num_tokens"].astype(float) * raw["topk"].astype(float) / ep,
        "experts": raw["num_experts"].astype(float) / ep, "hidden": raw["hidden_size"].astype(float),
        "inter": raw["inter_size"].astype(float) / tp, "topk": raw["topk"].astype(float),
        "gated": np.where(nongated, 0.0, 1.0), "skew": raw["distribution"].map(skews).astype(float),
        "group_tokens": raw["num_tokens"].astype(float),
        "median_s": raw["latency"].astype(float) * 1e-3})


def read_moe(folder: Path) -> pd.DataFrame:
    found = tables(folder, "moe", "moe_perf.parquet")
    t = first_framework([(fw, _moe(_read(p), p)) for fw, p in found])
    return t if len(t) else pd.DataFrame(columns=MOE_COLUMNS)


def read_mla_bmm(folder: Path) -> pd.DataFrame:
    parts = []
    for fw, path in tables(folder, "mla_bmm", "mla_bmm_perf.parquet"):
        raw = _read(path)
        raw = raw[raw["bmm_dtype"].isin(DTYPES) & raw["op_name"].isin(MLA_BMM)]
        ops = raw["op_name"].map(MLA_BMM)
        parts.append((fw, pd.DataFrame({
            "family": "bmm", "op": ops.map(lambda o: o[0]), "dtype": raw["bmm_dtype"].map(DTYPES),
            "b": raw["num_heads"].astype(float), "m": raw["num_tokens"].astype(float),
            "n": ops.map(lambda o: o[2]).astype(float), "k": ops.map(lambda o: o[1]).astype(float),
            "median_s": raw["latency"].astype(float) * 1e-3})))
    return first_framework(parts)


def _kv_bytes(col: pd.Series) -> pd.Series:
    return col.astype(str).str.replace("fp8_e4m3", "fp8").map(DTYPES).map(DTYPE_BYTES).astype(float)


def read_mla(folder: Path, decode: bool) -> pd.DataFrame:
    name = "generation_mla_perf.parquet" if decode else "context_mla_perf.parquet"
    parts = []
    for fw, path in tables(folder, "mla", name):
        raw = _read(path)
        raw = raw[raw["mla_dtype"].isin(DTYPES) & raw["kv_cache_dtype"].isin(DTYPES)]
        isl, step = raw["isl"].astype(float), raw["step"].astype(float)
        base = {"family": "mla_decode" if decode else "mla_context", "op": "decode" if decode else "prefill",
                "dtype": raw["mla_dtype"].map(DTYPES), "batch": raw["batch_size"].astype(float),
                "heads": raw["num_heads"].astype(float), "kv_bytes": _kv_bytes(raw["kv_cache_dtype"])}
        shape = {"seq_q": 1.0, "seq_kv": isl + step} if decode else {"seq_q": isl, "seq_kv": isl + step,
                                                                      "causal": 1.0}
        parts.append((fw, pd.DataFrame({**base, **shape, "median_s": raw["latency"].astype(float) * 1e-3})))
    return first_framework(parts)


def read_linear_attention(folder: Path) -> pd.DataFrame:
    parts = []
    for fw, path in tables(folder, "linear_attention", "gdn_perf.parquet"):
        raw = _read(path)
        raw = raw[raw["kernel_source"].str.contains("gated_delta_rule")]
        dec = (raw["phase"] == "generation").to_numpy()
        parts.append((fw, pd.DataFrame({
            "family": "linear_attention", "op": np.where(dec, "decode", "prefill"), "dtype": "bf16",
            "batch": raw["batch_size"].astype(float), "seq_q": np.where(dec, 1.0, raw["seq_len"].astype(float)),
            "heads_k": raw["num_k_heads"].astype(float), "heads_v": raw["num_v_heads"].astype(float),
            "head_k_dim": raw["head_k_dim"].astype(float), "head_v_dim": raw["head_v_dim"].astype(float),
            "decode": dec.astype(float), "median_s": raw["latency"].astype(float) * 1e-3})))
    return first_framework(parts)


def read_sparse_attention(folder: Path) -> pd.DataFrame:
    parts = []
    for name, decode in (("dsa_context_module_perf.parquet", False), ("dsa_generation_module_perf.parquet", True)):
        for fw, path in tables(folder, "sparse_attention", name):
            raw = _read(path)
            raw = raw[(raw["model"] == DSA_MODEL) & (raw["kv_cache_dtype"] == "bfloat16")
                      & raw["gemm_type"].isin(GEMM_DTYPES) & ~raw["op_name"].str.endswith("skip_indexer")]
            raw = raw.assign(dtype=raw["gemm_type"].map(GEMM_DTYPES))
            raw = _most_rows(raw, "kernel_source", ["dtype"], ["num_heads", "batch_size", "isl", "step"])
            isl, step = raw["isl"].astype(float), raw["step"].astype(float)
            parts.append((fw, pd.DataFrame({
                "family": "sparse_attention", "op": "decode" if decode else "prefill", "dtype": raw["dtype"],
                "batch": raw["batch_size"].astype(float), "seq_q": 1.0 if decode else isl, "seq_kv": isl + step,
                "heads": raw["num_heads"].astype(float), "topk": 2048.0, "index_heads": 64.0,
                "index_head_dim": 128.0, "decode": 1.0 if decode else 0.0,
                "median_s": raw["latency"].astype(float) * 1e-3})))
    # the context and generation tables are picked apart: one op may come from another framework
    by_op = [first_framework([(fw, t) for fw, t in parts if len(t) and t["op"].iloc[0] == op])
             for op in ("prefill", "decode")]
    return pd.concat([t for t in by_op if len(t)], ignore_index=True) if any(len(t) for t in by_op) else pd.DataFrame()


def read_quantize(folder: Path) -> pd.DataFrame:
    parts = []
    for fw, path in tables(folder, "quantize", "scale_matrix_perf.parquet"):
        raw = _read(path)
        raw = raw[raw["quant_dtype"].isin(DTYPES)]
        parts.append((fw, pd.DataFrame({
            "family": "quantize", "op": "quantize", "dtype": raw["quant_dtype"].map(DTYPES),
            "m": raw["m"].astype(float), "k": raw["k"].astype(float), "block": 0.0,
            "median_s": raw["latency"].astype(float) * 1e-3})))
    return first_framework(parts)


def device(folder: str | Path) -> str:
    """The GPU the tables of ``folder`` were measured on (their ``device`` column)."""
    raw = pd.read_parquet(tables(Path(folder), "gemm", "gemm_perf.parquet")[0][1], columns=["device"])
    return str(raw["device"].iloc[0])


def read_aiconfigurator(folder: str | Path, families: tuple[str, ...] | None = None) -> dict[str, pd.DataFrame]:
    """One GPU's AIConfigurator tables (``folder`` = ``.../aiconfigurator/<gpu>``), per family."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError("no AIConfigurator folder here", file=str(folder))
    readers: dict[str, Callable[[Path], pd.DataFrame]] = {
        "gemm": read_gemm, "attention_fwd": read_attention, "moe": read_moe, "bmm": read_mla_bmm,
        "mla_context": lambda f: read_mla(f, decode=False), "mla_decode": lambda f: read_mla(f, decode=True),
        "linear_attention": read_linear_attention, "sparse_attention": read_sparse_attention,
        "quantize": read_quantize}
    out = {}
    for family, reader in readers.items():
        if families is None or family in families:
            t = reader(folder)
            if t.empty and family not in ("gemm", "attention_fwd"):
                continue
            t = t[np.isfinite(t["median_s"]) & (t["median_s"] > 0)]
            out[family] = t.assign(source="aiconfigurator").reset_index(drop=True)
    return out
