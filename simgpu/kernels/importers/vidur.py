"""Microsoft Vidur's measured per-operator times of LLM layers as simgpu measurement tables.

Vidur (github.com/microsoft/vidur, MIT) profiled the layers of Llama-2-7B/70B and CodeLlama-34B on
A100-80GB and H100 (``compute/<gpu>/<org>/<model>/mlp.csv``): one row per number of tokens
(1-4,096) and tensor-parallel degree (1-8), the median of each operator's CUDA-timed runs in
milliseconds, fp16. Each operator becomes the kernel simgpu's Transformer builder emits for it
(:mod:`simgpu.workload.transformer.blocks`), with ``t`` tokens, hidden ``h``, ``a`` / ``g`` query / KV heads of
``d = h / a``, MLP width ``f`` and tensor parallelism ``p``:

| Vidur op | kernel |
|---|---|
| ``input_layernorm``, ``post_attention_layernorm`` | RMS ``norm`` of ``t`` rows of ``h`` |
| ``attn_pre_proj`` | ``gemm`` ``t x (a + 2g) d / p x h`` (QKV) |
| ``attn_rope`` | elementwise ``rope`` of ``t (a + g) d / p`` (queries and keys, in place) |
| ``attn_post_proj`` | ``gemm`` ``t x h x a d / p`` |
| ``mlp_up_proj`` | ``gemm`` ``t x 2f / p x h`` (gate and up, one GEMM) |
| ``mlp_act`` | elementwise ``swiglu`` of ``t f / p`` (reads two, writes one) |
| ``mlp_down_proj`` | ``gemm`` ``t x h x f / p`` |
| ``add`` | elementwise ``add`` of ``t h`` (the residual: reads two, writes one) |

Repeated shapes (the norms at every ``p``, the same GEMM in two models) keep every measurement.
``emb`` (the vocabulary-parallel embedding) is left out: it times several kernels (the lookup and
the masking of rows of other ranks' shards, 0.3 TB/s on A100 where an add reaches 1.8), which no
single kernel of the builders is.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final

import numpy as np
import pandas as pd

from ...errors import ConfigError

DTYPE: Final = "fp16"
#: Vidur's operator -> (family, op, shape of the kernel from the row's model columns).
Shape = Callable[[pd.DataFrame], dict[str, np.ndarray | float]]


def _cols(r: pd.DataFrame) -> tuple[np.ndarray, ...]:
    t = r["num_tokens"].to_numpy(float)
    p = r["num_tensor_parallel_workers"].to_numpy(float)
    h = r["n_embd"].to_numpy(float)
    a, g = r["n_head"].to_numpy(float), r["n_kv_head"].to_numpy(float)
    f = r["n_expanded_embd"].to_numpy(float)
    return t, p, h, a, g, h / a, f


def _ew(numel: Callable[..., np.ndarray], reads: float, writes: float) -> Shape:
    return lambda r: {"numel": numel(*_cols(r)), "reads": reads, "writes": writes}


def _gemm(n: Callable[..., np.ndarray], k: Callable[..., np.ndarray]) -> Shape:
    return lambda r: {"m": _cols(r)[0], "n": n(*_cols(r)), "k": k(*_cols(r))}


def _norm(r: pd.DataFrame) -> dict[str, np.ndarray | float]:
    t, _, h, *_ = _cols(r)
    return {"rows": t, "cols": h, "bwd": 0.0, "rms": 1.0}


OPS: Final[dict[str, tuple[str, str, Shape]]] = {
    "input_layernorm": ("norm", "rmsnorm", _norm),
    "post_attention_layernorm": ("norm", "rmsnorm", _norm),
    "attn_pre_proj": ("gemm", "linear", _gemm(lambda t, p, h, a, g, d, f: (a + 2 * g) * d / p,
                                              lambda t, p, h, a, g, d, f: h)),
    "attn_rope": ("elementwise", "rope", _ew(lambda t, p, h, a, g, d, f: t * (a + g) * d / p, 1, 1)),
    "attn_post_proj": ("gemm", "linear", _gemm(lambda t, p, h, a, g, d, f: h, lambda t, p, h, a, g, d, f: a * d / p)),
    "mlp_up_proj": ("gemm", "linear", _gemm(lambda t, p, h, a, g, d, f: 2 * f / p, lambda t, p, h, a, g, d, f: h)),
    "mlp_act": ("elementwise", "swiglu", _ew(lambda t, p, h, a, g, d, f: t * f / p, 2, 1)),
    "mlp_down_proj": ("gemm", "linear", _gemm(lambda t, p, h, a, g, d, f: h, lambda t, p, h, a, g, d, f: f / p)),
    "add": ("elementwise", "add", _ew(lambda t, p, h, a, g, d, f: t * h, 2, 1)),
}
FAMILIES: Final = ("gemm", "elementwise", "norm")


def read_vidur(folder: str | Path, families: tuple[str, ...] | None = None) -> dict[str, pd.DataFrame]:
    """Every model's ``mlp.csv`` under ``folder`` (``.../vidur/compute/<gpu>``), one table per family."""
    folder = Path(folder)
    files = sorted(folder.glob("*/*/mlp.csv"))
    if not files:
        raise ConfigError("no Vidur profiles here; expected <org>/<model>/mlp.csv", file=str(folder))
    parts: dict[str, list[pd.DataFrame]] = {}
    for path in files:
        raw = pd.read_csv(path)
        gated = raw["use_gated_mlp"].astype(bool)
        if not gated.all():
            raise ConfigError("expected gated (SwiGLU) MLPs only", file=str(path), key="use_gated_mlp")
        for name, (family, op, shape) in OPS.items():
            col = f"time_stats.{name}.median"
            if (families is not None and family not in families) or col not in raw.columns:
                continue
            t = pd.DataFrame({"family": family, "op": op, "dtype": DTYPE, **shape(raw),
                              "median_s": raw[col].astype(float) * 1e-3, "model": path.parent.name})
            parts.setdefault(family, []).append(t[np.isfinite(t["median_s"]) & (t["median_s"] > 0)])
    out = {f: pd.concat(ts, ignore_index=True).assign(source="vidur") for f, ts in parts.items()}
    if "elementwise" in out:  # the op's arithmetic is a feature; the builders' table gives it
        from ...elementwise import flops_per_element
        out["elementwise"]["flops_per_element"] = out["elementwise"]["op"].map(flops_per_element)
    return out
