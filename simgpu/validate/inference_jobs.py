"""What the inference validations share: the one-replica job they time, the models they serve, and
the geomean error they score.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..config.checks import check_job
from ..config.loader import Job, load_platform, validate
from ..config.workload import WorkloadSpec

LLAMA2_70B: dict[str, Any] = {  # Touvron et al. 2023
    "kind": "transformer_inference", "arch": "llama", "layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8,
    "ffn_hidden": 28672, "seq_len": 16384, "vocab": 32000}
#: BigScience's config.json: 70 layers, d_model 14336, 112 heads (multi-head: 112 KV heads), GELU
#: MLP of 4 x d_model, LayerNorms and linears with biases, a 250,880 vocabulary tied to the output
#: layer. ALiBi adds its bias inside the attention kernels (vLLM passes the slopes to them): no kernel
#: of its own, so the positions are the one lookup of learned positions (as validate/bloom.py does).
BLOOM_176B: dict[str, Any] = {
    "kind": "transformer_inference", "arch": "gpt", "layers": 70, "hidden": 14336, "heads": 112,
    "seq_len": 16384, "vocab": 250880, "position": "learned", "tied_embeddings": True}
MODELS = {"llama2-70b": LLAMA2_70B, "bloom-176b": BLOOM_176B}


def make_job(model: dict[str, Any], platform: str, tp: int, precision: str, *, gpus: int | None = None,
             pp: int = 1, inference: dict[str, Any] | None = None,
             platform_overrides: Sequence[tuple[str, Any]] = ()) -> Job:
    """A one-replica inference job of ``model`` at ``tp`` x ``pp`` on ``platform``."""
    n = tp * pp if gpus is None else gpus
    plat, pfile = load_platform(platform, platform_overrides)
    gpn = min(n, plat.node.gpus)
    data = {"name": f"{model['layers']}l_tp{tp}", "platform": platform, "nodes": max(n // gpn, 1),
            "gpus_per_node": gpn, "model": model,
            "inference": {"precision": precision, "decode_requests": 1, "gpu_memory_utilization": 1.0,
                          **(inference or {})},
            "parallelism": {"tp": tp, "pp": pp}}
    spec = validate(WorkloadSpec, data, "<validation>")
    job = Job(spec, plat, "<validation>", pfile)
    check_job(job)
    return job


def geomean_error(pred: Any, meas: Any) -> float:
    r = np.log(np.asarray(pred, dtype=float) / np.asarray(meas, dtype=float))
    return float(np.exp(np.mean(np.abs(r))) - 1) if len(r) else float("nan")
