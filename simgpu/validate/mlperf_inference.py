"""MLPerf Inference Offline throughput against the results in ``../shared/data/inference/``.

**MLPerf Inference Llama-2-70B Offline** (``mlperf-llama2-70b/mlperf_llama2_70b.csv``): every
system whose TP, PP, precision and batch are published, on the shipped platform of its GPU (H100
SXM -> ``dgx_h100``, B200 -> ``dgx_b200``, GB200 -> ``gb200_nvl72``). Offline
throughput is continuous batching at its steady state, computed from the iteration timer: every
engine keeps ``gpu_batch_size`` requests (fewer where their KV caches, paged, at the mean context,
do not fit) of the OpenOrca
mix's mean lengths (:data:`ORCA_INPUT`, :func:`orca_output`) in flight; each iteration decodes one
token of each over the mean cache (input + output / 2) and prefills the prompts of the requests
that finish (``batch / output`` per iteration), each a causal sequence of its own; an iteration
holds at most ``max_num_tokens`` tokens, a decode's one included, so at most ``max_num_tokens /
(1 + input / output)`` requests decode in it; tokens/s = decodes / iteration time per engine. Scored: geomean
|error| of tokens/s and Spearman's rank correlation of tokens/s per GPU. ``--breakdown`` prints
each configuration's iteration by kernel.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..serve.timer import EngineTimer
from ..workload.inference import Step
from .inference_jobs import LLAMA2_70B, make_job

MLPERF = Path("inference") / "mlperf-llama2-70b" / "mlperf_llama2_70b.csv"
MLPERF_MAX, MLPERF_SPEARMAN = 0.20, 0.8
#: Mean prompt tokens of MLPerf's llama2-70b OpenOrca set (24,576 samples of at most 1,024 input
#: tokens): not in the data here; an assumption (the offline prediction falls by about 15% per 100
#: more prompt tokens: 294 -> 394 on both configurations). The mean output is measured: the Offline rows'
#: tokens/s over samples/s (:func:`orca_output`).
ORCA_INPUT = 294


#: MLPerf accelerator -> the shipped platform of its machine and the overrides that make it that
#: machine. The GB200's GPU is the B200's at the superchip's higher power limit: ``gb200_nvl72``
#: times it with the B200's fitted kernel models at its own datasheet peaks (``gpu.kernel_models``).
ACCELERATORS: dict[str, tuple[str, tuple[tuple[str, Any], ...]]] = {
    "NVIDIA H100-SXM-80GB": ("dgx_h100", ()),
    "NVIDIA B200-SXM-180GB": ("dgx_b200", ()),
    "NVIDIA GB200": ("gb200_nvl72", ()),
}


def offline_step(timer: EngineTimer, batch: int, isl: int, osl: int, chunk: int) -> tuple[Step, int]:
    """The steady-state iteration of one engine keeping ``batch`` requests in flight (fewer if their
    KV caches do not fit), and how many of them decode in it (see the module docstring)."""
    mem = timer.memory
    ctx = isl + osl // 2
    # paged: a request holds the blocks of its current length, on average the mean context
    per_request = -(-ctx // mem.block_tokens)
    b = max(1, min(batch, mem.kv_blocks // per_request))
    # TensorRT-LLM's max_num_tokens bounds an iteration's tokens, a decoding request's one token
    # included (its tuning guide's scheduler walk-through): d decodes bring d / osl new prompts of
    # isl tokens each, so at most chunk / (1 + isl / osl) of the requests decode per iteration
    b = max(1, min(b, int(chunk / (1 + isl / osl))))
    new_prompts = b / osl             # requests finishing (and starting) per iteration
    prompt_tokens = new_prompts * isl
    # each new request's prompt is a causal sequence of its own (TensorRT-LLM's context phase packs
    # the prompts of an iteration, each attending to itself only): round(new_prompts) prompts
    # holding the iteration's prompt tokens (within the budget above, so never chunked)
    n = max(1, round(new_prompts))
    prefill = ((max(1, round(prompt_tokens / n)), 0),) * n
    return Step(prefill=prefill, decode=(ctx,) * b), b


def offline_tokens_per_s(timer: EngineTimer, batch: int, isl: int, osl: int, chunk: int) -> tuple[float, int]:
    """Steady-state output tokens/s of one engine (:func:`offline_step`), and its decodes an iteration."""
    step, b = offline_step(timer, batch, isl, osl, chunk)
    t = timer.time([step])[0]
    return b / t, b


#: The serving settings of every MLPerf engine: TensorRT-LLM, 95% of the memory
#: (``kvcache_free_gpu_mem_frac`` of the submissions' configs), limits above any batch here.
MLPERF_INFERENCE: dict[str, Any] = {"gpu_memory_utilization": 0.95, "framework": "tensorrt_llm",
                                    "max_batch_size": 4096, "max_batch_tokens": 16384}


def mlperf_rows(data: Path) -> pd.DataFrame:
    """The Offline rows whose TP, PP, precision and batch are published, one per system; each with
    ``token_budget``, the scheduler's tokens an iteration (:func:`runtime_max_num_tokens`)."""
    m = pd.read_csv(data / MLPERF)
    m = m[(m["scenario"] == "Offline") & m["tp"].notna() & m["precision"].notna() & m["gpu_batch_size"].notna()]
    m = m.drop_duplicates(["round", "submitter", "system"]).reset_index(drop=True)
    raw = (data / MLPERF).parent / "raw"
    budget = []
    for r in m.itertuples():
        path = raw / str(r.round) / str(r.config_path)
        got = runtime_max_num_tokens(path) if path.is_file() else None
        if got is None:  # no config to read: the CSV's figure, else TensorRT-LLM's default
            got = int(r.max_num_tokens) if pd.notna(r.max_num_tokens) else 8192
        budget.append(got)
    return m.assign(token_budget=budget)


_RUNTIME_FLAGS = re.compile(r"trtllm_runtime_flags\s*:\s*\{(.*?)\}", re.S)
_MAX_NUM_TOKENS = re.compile(r"['\"]max_num_tokens['\"]\s*:\s*(\d+)")


def runtime_max_num_tokens(config: Path) -> int | None:
    """The scheduler's token budget of a submission's TensorRT-LLM config: ``max_num_tokens`` of
    its first ``trtllm_runtime_flags`` (what bounds an iteration's tokens; the engine's build flag of
    the same name is its ceiling, 4,096 against 3,584 in Azure's GB200 config), else None."""
    got = _RUNTIME_FLAGS.search(config.read_text(errors="replace"))
    found = _MAX_NUM_TOKENS.search(got.group(1)) if got else None
    return int(found.group(1)) if found else None


def orca_output(data: Path) -> int:
    """Mean output tokens per sample: the median over Offline rows of tokens/s over samples/s."""
    m = pd.read_csv(data / MLPERF)
    o = m[m["scenario"] == "Offline"]
    return round(float((o["tokens_per_s"] / o["samples_per_s"]).median()))


def validate_mlperf(data: Path, isl: int = ORCA_INPUT) -> tuple[pd.DataFrame, list[str]]:
    out, skipped = [], []
    osl = orca_output(data)
    timers: dict[tuple[str, int, int, str], EngineTimer] = {}
    for r in mlperf_rows(data).itertuples():
        machine = ACCELERATORS.get(str(r.accelerator))
        if machine is None:
            skipped.append(f"{r.round} {r.submitter} {r.system}: no shipped platform for {r.accelerator}")
            continue
        plat, overrides = machine
        tp, pp, prec = int(r.tp), int(r.pp), str(r.precision)
        key = (str(r.accelerator), tp, pp, prec)
        if key not in timers:
            timers[key] = EngineTimer(make_job(LLAMA2_70B, plat, tp, prec, pp=pp, platform_overrides=overrides,
                                               inference=MLPERF_INFERENCE))
        timer = timers[key]
        chunk = int(r.token_budget)
        per_engine, used = offline_tokens_per_s(timer, int(r.gpu_batch_size), isl, osl, chunk)
        engines = int(r.total_accelerators) // (tp * pp)
        pred = per_engine * engines
        out.append({"round": r.round, "submitter": r.submitter, "system": r.system,
                    "accelerator": str(r.accelerator), "platform": plat,
                    "gpus": int(r.total_accelerators), "tp": tp, "pp": pp, "precision": prec,
                    "batch": int(r.gpu_batch_size), "token_budget": chunk, "batch_fits": used, "predicted": pred,
                    "measured": float(r.tokens_per_s), "per_gpu_predicted": pred / int(r.total_accelerators),
                    "per_gpu_measured": float(r.tokens_per_s) / int(r.total_accelerators)})
    t = pd.DataFrame(out)
    return t.assign(error=t["predicted"] / t["measured"] - 1), skipped


def mlperf_breakdown(data: Path, isl: int = ORCA_INPUT) -> pd.DataFrame:
    """Per MLPerf configuration, its steady-state iteration's kernel time per kind (ms, on the first
    GPU of an engine), as :meth:`EngineTimer.kernel_times` gives it."""
    osl = orca_output(data)
    out, seen = [], set()
    for r in mlperf_rows(data).itertuples():
        machine = ACCELERATORS.get(str(r.accelerator))
        key = (str(r.accelerator), int(r.tp), int(r.pp), str(r.precision), int(r.gpu_batch_size),
               int(r.token_budget))
        if machine is None or key in seen:
            continue
        seen.add(key)
        timer = EngineTimer(make_job(LLAMA2_70B, machine[0], key[1], key[3], pp=key[2],
                                     platform_overrides=machine[1], inference=MLPERF_INFERENCE))
        chunk = int(r.token_budget)
        step, b = offline_step(timer, key[4], isl, osl, chunk)
        t = float(timer.time([step])[0])
        kt = timer.kernel_times(step)
        rest = t - sum(kt.values())  # communication, host time and gaps the kernels leave
        for (name, family, dtype), sec in [*kt.items(), (("(not kernels)", "", ""), rest)]:
            out.append({"accelerator": key[0], "tp": key[1], "precision": key[3], "batch_fits": b,
                        "iteration_ms": t * 1e3, "kernel": name, "family": family, "dtype": dtype,
                        "ms": sec * 1e3, "share": sec / t})
    return pd.DataFrame(out).sort_values(["accelerator", "ms"], ascending=[True, False])


#: What a configuration is: every input of the prediction a system's published config gives.
CONFIGURATION = ["accelerator", "tp", "pp", "precision", "batch", "token_budget"]


def configurations(m: pd.DataFrame) -> pd.DataFrame:
    """The systems grouped by configuration (:data:`CONFIGURATION`): the median of their measured
    tokens/s per GPU beside the one prediction they share."""
    return m.groupby(CONFIGURATION, as_index=False).agg(
        systems=("system", "size"), per_gpu_predicted=("per_gpu_predicted", "first"),
        per_gpu_measured=("per_gpu_measured", "median"))


def spearman_bound(m: pd.DataFrame) -> float:
    """The highest Spearman over the systems that a model predicting every system of one
    configuration alike can reach: each system ranked by its configuration's measured median."""
    return spearman(m.groupby(CONFIGURATION)["per_gpu_measured"].transform("median"), m["per_gpu_measured"])


def spearman(a: Any, b: Any) -> float:
    ra = pd.Series(a).rank().to_numpy()
    rb = pd.Series(b).rank().to_numpy()
    return float(np.corrcoef(ra, rb)[0, 1])
