"""Importers of published kernel microbenchmarks into simgpu's measurement tables.

A measurement table (see :mod:`simgpu.kernels.store`) has one row per measured kernel shape:
``family``, ``op``, ``dtype``, the family's parameters (KernelSpec names), ``median_s`` and, for
imported sets, ``gpu``. This module reads NeuSight's per-op CSVs (``data/dataset/test/*.csv`` of
github.com/sitar-lab/NeuSight, latencies in milliseconds of fp32 PyTorch 2.1 ops) and its GPU spec
files (``device_configs/*.json``) into those tables and :class:`~simgpu.config.platform.GPUSpec` s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

import numpy as np
import pandas as pd

from ...config.platform import GPUSpec
from ...elementwise import DEFAULT_FLOPS_PER_ELEMENT
from ...errors import ConfigError

#: NeuSight's file of each op -> simgpu's kernel family.
NEUSIGHT_FILES: Final = {"linear": "gemm", "bmm": "bmm", "elem": "elementwise", "ln": "norm",
                         "softmax": "softmax"}
#: Elementwise ops with two tensor inputs; the others (``addu``: tensor and scalar, ``relu``, ...)
#: read one tensor. All write one.
_BINARY: Final = frozenset({"add", "sub", "mul", "div", "pow"})


def _test_dir(root: Path) -> Path:
    for cand in (root / "data" / "dataset" / "test", root):
        if (cand / "linear.csv").is_file():
            return cand
    raise ConfigError("no NeuSight test set here; expected data/dataset/test/linear.csv", file=str(root))


def read_neusight(root: str | Path, families: tuple[str, ...] | None = None) -> dict[str, pd.DataFrame]:
    """NeuSight's measurements under ``root`` (its ``scripts/asplos`` folder), one table per family.

    ``linear`` rows become ``gemm`` kernels (``m=M``, ``n=N``, ``k=K``: ``x[M,K] @ W[N,K]^T``),
    ``bmm`` rows ``bmm`` (``b=B``), ``elem`` rows ``elementwise`` over ``numel=B*H`` elements,
    ``ln`` rows ``norm`` and ``softmax`` rows ``softmax`` over ``rows=B``, ``cols=H``; all fp32.
    Elementwise rows get the default ``flops_per_element`` whatever their op: NeuSight's ops (``div``,
    ``pow``, ``tanh``, scalar forms ``addu``...) are mostly not in simgpu's table of op costs, and
    on these GPUs every one of them is memory-bound (a GELU takes a ReLU's time).
    """
    test = _test_dir(Path(root))
    out: dict[str, pd.DataFrame] = {}
    for name, family in NEUSIGHT_FILES.items():
        if families is not None and family not in families:
            continue
        raw = pd.read_csv(test / f"{name}.csv")
        t = pd.DataFrame({"family": family, "op": raw["OPName"].astype(str), "dtype": "fp32",
                          "gpu": raw["Device"].astype(str)})
        if family in ("gemm", "bmm"):
            if family == "bmm":
                t["b"] = raw["B"].astype(float)
            t["m"], t["n"], t["k"] = (raw[c].astype(float) for c in ("M", "N", "K"))
        elif family == "elementwise":
            t["numel"] = raw["B"].astype(float) * raw["H"].astype(float)
            t["reads"] = np.where(t["op"].isin(_BINARY), 2.0, 1.0)
            t["writes"] = 1.0
            t["flops_per_element"] = DEFAULT_FLOPS_PER_ELEMENT
        else:
            t["rows"], t["cols"] = raw["B"].astype(float), raw["H"].astype(float)
            t["bwd"] = 0.0
        t["median_s"] = raw["Latency"].astype(float) * 1e-3
        t["source"] = "neusight"
        out[family] = t[t["median_s"] > 0].reset_index(drop=True)
    return out


#: SM counts where NeuSight's spec files disagree with the GPU: the L4 has 58 SMs (7,424 CUDA cores of
#: 128 per SM, NVIDIA L4 datasheet; NeuSight's own profiler rows of the L4 give grid / blocks-per-SM =
#: 58), the P4 20 (2,560 cores of 128 per Pascal GP104 SM; the file has 40 SMs of 64 cores).
SMS_CORRECTED: Final = {"NVIDIA L4": 58, "Tesla P4": 20}


def neusight_gpus(root: str | Path) -> dict[str, GPUSpec]:
    """The GPU spec of every device NeuSight measured, keyed by its ``Device`` string.

    NeuSight's spec files give memory (GB), bandwidth (GB/s), SMs (corrected where they are wrong,
    :data:`SMS_CORRECTED`) and the fp32 peak (GFLOP/s). The efficiencies are left at simgpu's
    defaults: they are what the analytical model assumes of a GPU it has no measurements of.
    """
    test = _test_dir(Path(root))
    folder = test / "device_configs"
    if not folder.is_dir():
        raise ConfigError("no device_configs folder beside the NeuSight test set", file=str(folder))
    out: dict[str, GPUSpec] = {}
    for path in sorted(folder.glob("*.json")):
        d = json.loads(path.read_text())
        name = str(d["Device"])
        out[name] = GPUSpec(name=name, memory_gib=float(d["Dev_Mem"]), hbm_gbytes_per_s=float(d["Mem_Bw"]),
                            sms=SMS_CORRECTED.get(name, int(d["Num_Sm"])),
                            peak_tflops={"fp32": float(d["SingleFLOPs"]) / 1e3}, kernel_min_us=2.0)
    return out
