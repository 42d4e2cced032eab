"""Inference iterations against Splitwise's measurements in ``../shared/data/inference/``.

**Splitwise** (``splitwise-perf-model/perf_model.csv``: Llama-2-70B at TP 2/4/8 and BLOOM-176B at TP
8 on DGX-A100 and DGX-H100, fp16, batch 1-64, prompts 128-8192, outputs 128-8192; the median of the
five repetitions of each point): the prefill of a batch against ``prompt_time``, and the decode
iteration of the batch at the middle of its generation (each request's cache ``prompt + output / 2``
tokens) against ``token_time``, the mean over the generation. A batch's prompts are one prefill:
``prompt_time`` depends on the batch's tokens, not on how many prompts hold them (H100 TP8: 4 x 512
in 132 ms, one 2,048 in 137; 16 x 512 in 812, one 8,192 in 845). The measured stack is slower than
the one the kernel models were measured with (TensorRT-LLM's, through AIConfigurator): a decode
iteration takes 30 ms on four or eight H100s alike (host-bound), and seven figures describe it per
machine (:data:`FIT_KEYS`: the host's time per op, per request and per prefilling block, the GEMM,
HBM and NVLink shares, and how much slower its all-reduces of 60 MiB and more run;
:data:`SPLITWISE_FIXED` beside them). They are fitted, so they are scored held out: each (model,
TP) group's rows are predicted with the figures fitted to the machine's other three groups
(:data:`SPLITWISE_FOLDS`); :data:`SPLITWISE_STACK`, fitted to all four, is reported as the in-sample
figure beside it. The machines are the shipped ``dgx_a100`` and
``dgx_h100``; the power-capped H100 (``h100-80gb-pcap``) is reported, not scored: on every row its
prompt time is the H100's x 1.30 and its token time the H100's, a derived figure. Batch-64 rows are
reported, not scored: their prompt times fall from batch 32 to 64 on TP2 (6,633 to 794 ms on the
A100; 64 caches of 640 tokens need 6.3 GiB a GPU at TP2, about what the 64 GiB of weights leave)
and e2e times do not add up, which the data's provenance flags as another measurement mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..serve.timer import EngineTimer
from ..workload.inference import Step
from .inference_jobs import MODELS, geomean_error, make_job

SPLITWISE = Path("inference") / "splitwise-perf-model" / "perf_model.csv"
SPLITWISE_MAX = 0.12
#: Splitwise's hardware -> the shipped platform of that machine (None: reported, not scored)
HARDWARE = {"a100-80gb": "dgx_a100", "h100-80gb": "dgx_h100", "h100-80gb-pcap": "dgx_h100"}
SCORED_HARDWARE = ("a100-80gb", "h100-80gb")
SUSPECT_BATCH = 64


#: The serving stack Splitwise measured, per machine (inference keys, and platform keys prefixed
#: ``platform.``). Not a published figure: fitted (``python -m simgpu.validate.inference --fit``) to
#: the scored rows of that machine as a whole, never per row, from :data:`FIT_START`. These
#: in-sample figures are reported beside the scored ones, which come from :data:`SPLITWISE_FOLDS`.
SPLITWISE_STACK: dict[str, dict[str, Any]] = {
    "a100-80gb":
        {"host_overhead_us": 45.36, "request_overhead_us": 345.6, "prefill_block_overhead_us": 274.286,
         "platform.gpu.matmul_efficiency": 0.735, "platform.gpu.memory_efficiency": 0.756,
         "platform.node.nvlink.efficiency": 0.315, "platform.collectives.slow_all_reduce": 2.592},
    "h100-80gb":
        {"host_overhead_us": 31.5, "request_overhead_us": 274.286, "prefill_block_overhead_us": 288.0,
         "platform.gpu.matmul_efficiency": 0.613, "platform.gpu.memory_efficiency": 0.63,
         "platform.node.nvlink.efficiency": 0.331, "platform.collectives.slow_all_reduce": 1.89},
}
#: What the stack is taken to be beside its fitted figures, per machine: its all-reduces run as
#: rings over NVLink, without NVLink SHARP's in-switch reduction, at a fitted share of the links
#: (``platform.node.nvlink.efficiency``). The data's TP scaling says they are that slow: at a fixed
#: batch the prefill is a part divided by TP (the GEMMs, linear in the tokens: 54% of the H100's
#: fp16 peak, 72% of the A100's) and ~22 us (H100) or ~29 us (A100) a token x 2(tp-1)/tp that is
#: not (one 2,048-token prompt at TP 2/4/8), the two all-reduces of 16 KiB a token and block at
#: ~120 GB/s of the H100's NVLink of 450 (A100: ~90 of 300); NVLS would move them several times faster.
#: And its all-reduces of 60 MiB or more are slower still (``collectives.slow_all_reduce_bytes``, the
#: factor fitted as ``collectives.slow_all_reduce``): on both machines, for both models, at TP 4 and
#: 8, a prefill of 4,096 tokens or more, one prompt or several, costs 1.1-1.5x per token what one of
#: 2,048 does, and the more the higher the TP; the step lies between BLOOM's 2,048-token prefill
#: (all-reduces of 56 MiB, no step) and Llama's 4,096 (64 MiB, the step). Why the stack slows there is
#: not known (no kernel or NCCL mechanism modelled here gives it): a measured property, like the share.
SPLITWISE_FIXED: dict[str, dict[str, Any]] = {
    "a100-80gb": {"platform.collectives.slow_all_reduce_bytes": 60 << 20},
    "h100-80gb": {"platform.node.nvlink.nvls": False, "platform.collectives.slow_all_reduce_bytes": 60 << 20}}
#: Leave-one-group-out figures: per machine, per held-out (model, TP) group, the stack fitted to the
#: machine's other three groups from :data:`FIT_START` (``--fit``). A group's rows are scored with
#: the figures that did not see them, so the scored error is a held-out one.
SPLITWISE_FOLDS: dict[str, dict[tuple[str, int], dict[str, Any]]] = {
    "a100-80gb": {
        ('bloom-176b', 8):
            {"host_overhead_us": 45.36, "request_overhead_us": 371.365, "prefill_block_overhead_us": 261.224,
             "platform.gpu.matmul_efficiency": 0.735, "platform.gpu.memory_efficiency": 0.784,
             "platform.node.nvlink.efficiency": 0.25, "platform.collectives.slow_all_reduce": 2.351},
        ('llama2-70b', 2):
            {"host_overhead_us": 45.36, "request_overhead_us": 313.469, "prefill_block_overhead_us": 274.286,
             "platform.gpu.matmul_efficiency": 0.735, "platform.gpu.memory_efficiency": 0.756,
             "platform.node.nvlink.efficiency": 0.262, "platform.collectives.slow_all_reduce": 2.16},
        ('llama2-70b', 4):
            {"host_overhead_us": 45.36, "request_overhead_us": 400.075, "prefill_block_overhead_us": 288.0,
             "platform.gpu.matmul_efficiency": 0.772, "platform.gpu.memory_efficiency": 0.756,
             "platform.node.nvlink.efficiency": 0.331, "platform.collectives.slow_all_reduce": 2.592},
        ('llama2-70b', 8):
            {"host_overhead_us": 45.36, "request_overhead_us": 345.6, "prefill_block_overhead_us": 288.0,
             "platform.gpu.matmul_efficiency": 0.735, "platform.gpu.memory_efficiency": 0.756,
             "platform.node.nvlink.efficiency": 0.397, "platform.collectives.slow_all_reduce": 3.266},
    },
    "h100-80gb": {
        ('bloom-176b', 8):
            {"host_overhead_us": 30.0, "request_overhead_us": 302.4, "prefill_block_overhead_us": 302.4,
             "platform.gpu.matmul_efficiency": 0.613, "platform.gpu.memory_efficiency": 0.63,
             "platform.node.nvlink.efficiency": 0.315, "platform.collectives.slow_all_reduce": 1.959},
        ('llama2-70b', 2):
            {"host_overhead_us": 30.0, "request_overhead_us": 288.0, "prefill_block_overhead_us": 302.4,
             "platform.gpu.matmul_efficiency": 0.51, "platform.gpu.memory_efficiency": 0.476,
             "platform.node.nvlink.efficiency": 0.438, "platform.collectives.slow_all_reduce": 2.084},
        ('llama2-70b', 4):
            {"host_overhead_us": 31.5, "request_overhead_us": 329.143, "prefill_block_overhead_us": 288.0,
             "platform.gpu.matmul_efficiency": 0.613, "platform.gpu.memory_efficiency": 0.63,
             "platform.node.nvlink.efficiency": 0.476, "platform.collectives.slow_all_reduce": 2.722},
        ('llama2-70b', 8):
            {"host_overhead_us": 31.5, "request_overhead_us": 333.396, "prefill_block_overhead_us": 345.6,
             "platform.gpu.matmul_efficiency": 0.583, "platform.gpu.memory_efficiency": 0.63,
             "platform.node.nvlink.efficiency": 0.571, "platform.collectives.slow_all_reduce": 3.11},
    },
}


def splitwise_rows(data: Path) -> pd.DataFrame:
    raw = pd.read_csv(data / SPLITWISE)
    keys = ["model", "hardware", "tensor_parallel", "prompt_size", "batch_size", "token_size"]
    return raw.groupby(keys, as_index=False)[["prompt_time", "token_time"]].median()


#: The stack figures added to an iteration's host time outside the ops, before the GPUs start: an
#: iteration's time grows by exactly these (``tests/test_inference_validation.py`` checks it), so a
#: fit moves them without simulating again (:func:`group_times`).
SERIAL_KEYS = ("iteration_overhead_us", "request_overhead_us")


def _split(fig: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    fig = dict(fig)
    return fig, [(k.removeprefix("platform."), fig.pop(k)) for k in list(fig) if k.startswith("platform.")]


def group_steps(g: pd.DataFrame) -> tuple[list[Step], list[Step]]:
    """Each row's prefill, one iteration over all the batch's prompts, and its decode iteration at
    the middle of the generation (see the module docstring)."""
    pre = [Step(prefill=((int(r.prompt_size), 0),) * int(r.batch_size)) for r in g.itertuples()]
    dec = [Step(decode=(int(r.prompt_size) + int(r.token_size) // 2,) * int(r.batch_size)) for r in g.itertuples()]
    return pre, dec


def _times(model: str, hw: str, tp: int, g: pd.DataFrame, fig: dict[str, Any], exact: bool
           ) -> tuple[np.ndarray, np.ndarray]:
    inf, plat = _split(fig)
    timer = EngineTimer(make_job(MODELS[model], HARDWARE[hw], tp, "fp16", inference=inf, platform_overrides=plat),
                        exact=exact)
    pre, dec = group_steps(g)
    return timer.time(pre) * 1e3, timer.time(dec) * 1e3


_GROUP_CACHE: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = {}


def group_times(model: str, hw: str, tp: int, g: pd.DataFrame, fig: dict[str, Any]
                ) -> tuple[np.ndarray, np.ndarray]:
    """Predicted prefill and decode ms of a group's rows ``g`` under the stack figures ``fig``: the
    rows simulated once per setting of the figures that are not :data:`SERIAL_KEYS` (cached), the
    serial host time added to each iteration."""
    sim = {k: v for k, v in fig.items() if k not in SERIAL_KEYS}
    key = (model, hw, tp, tuple(sorted(sim.items())), tuple(g.index))
    if key not in _GROUP_CACHE:
        _GROUP_CACHE[key] = _times(model, hw, tp, g, sim, False)
    pre, dec = _GROUP_CACHE[key]
    per_req = g["batch_size"].to_numpy() * float(fig.get("request_overhead_us", 0.0))
    serial = (float(fig.get("iteration_overhead_us", 0.0)) + per_req) * 1e-3
    return pre + serial, dec + serial


def validate_splitwise(data: Path, *, exact: bool = False, stack: dict[str, dict[str, Any]] | None = None,
                       hardware: Sequence[str] | None = None, held_out: bool = True,
                       exclude: Sequence[tuple[str, int]] = (), cached: bool = False) -> pd.DataFrame:
    """One row per measured point: predicted and measured prefill and decode-iteration ms. The
    serving stack's figures: ``stack`` per machine where given (``{}``: the defaults), else each
    group's held-out figures from :data:`SPLITWISE_FOLDS` (``held_out``) or the in-sample
    :data:`SPLITWISE_STACK`. ``exclude``: (model, TP) groups left out. ``cached``: through
    :func:`group_times` (the fit's path) rather than every row simulated with every figure."""
    rows = splitwise_rows(data)
    if hardware is not None:
        rows = rows[rows["hardware"].isin(hardware)]
    out = []
    for (model, hw, tp), g in rows.groupby(["model", "hardware", "tensor_parallel"]):
        group = (str(model), int(tp))
        if group in exclude:
            continue
        machine = str(hw).removesuffix("-pcap")
        fold = SPLITWISE_FOLDS.get(machine, {}).get(group) if stack is None and held_out else None
        src = stack if stack is not None else SPLITWISE_STACK
        fig = dict(fold if fold is not None else src.get(machine, {}))
        if stack is None or machine in stack:
            fig = {**SPLITWISE_FIXED.get(machine, {}), **fig}
        if cached and not exact:
            tp_, td = group_times(str(model), str(hw), int(tp), g, fig)
        else:
            tp_, td = _times(str(model), str(hw), int(tp), g, fig, exact)
        for r, a, b in zip(g.itertuples(), tp_, td, strict=True):
            scored = hw in SCORED_HARDWARE and r.batch_size != SUSPECT_BATCH
            for what, pred, meas in (("prefill", a, r.prompt_time), ("decode", b, r.token_time)):
                out.append({"model": model, "hardware": hw, "tp": int(tp), "prompt": int(r.prompt_size),
                            "batch": int(r.batch_size), "output": int(r.token_size), "what": what,
                            "predicted_ms": float(pred), "measured_ms": float(meas), "scored": scored,
                            "held_out": fold is not None})
    t = pd.DataFrame(out)
    return t.assign(error=t["predicted_ms"] / t["measured_ms"] - 1)


#: The stack figures :func:`fit_stack` fits by multiplicative steps from :data:`FIT_START`:
#: per-op host time (the launch of every kernel), per-request host time per iteration (outside the
#: ops, which the GPU does not overlap), per-block host time of a prefilling iteration (which it
#: does: the GPU works through the kernels already queued), the GEMM and HBM shares of the peaks,
#: the NVLink share the tensor-parallel all-reduces reach (see :data:`SPLITWISE_FIXED`).
FIT_KEYS = ("host_overhead_us", "request_overhead_us", "prefill_block_overhead_us",
            "platform.gpu.matmul_efficiency", "platform.gpu.memory_efficiency", "platform.node.nvlink.efficiency",
            "platform.collectives.slow_all_reduce")
FIT_BOUNDS: dict[str, tuple[float, float]] = {"platform.gpu.matmul_efficiency": (0.2, 1.0),
                                              "platform.gpu.memory_efficiency": (0.2, 1.0),
                                              "platform.node.nvlink.efficiency": (0.05, 1.0),
                                              "platform.collectives.slow_all_reduce": (1.0, 5.0)}
#: Where every fit starts, on both machines and for every fold (round figures, not fitted).
FIT_START: dict[str, float] = {"host_overhead_us": 30.0, "request_overhead_us": 200.0,
                               "prefill_block_overhead_us": 200.0, "platform.gpu.matmul_efficiency": 0.7,
                               "platform.gpu.memory_efficiency": 0.6, "platform.node.nvlink.efficiency": 0.5,
                               "platform.collectives.slow_all_reduce": 1.5}


def splitwise_groups(data: Path, hw: str) -> list[tuple[str, int]]:
    """The (model, TP) groups measured on machine ``hw``."""
    rows = splitwise_rows(data)
    g = rows[rows["hardware"] == hw][["model", "tensor_parallel"]].drop_duplicates()
    return [(str(m), int(t)) for m, t in g.itertuples(index=False)]


def fit_stack(data: Path, hw: str, start: dict[str, float] | None = None, steps: Sequence[float] = (1.2, 1.05),
              exclude: Sequence[tuple[str, int]] = ()) -> tuple[dict[str, float], float]:
    """The stack figures of machine ``hw`` that minimise the geomean |error| of its scored rows as a
    whole (``exclude``: groups left out of the fit): coordinate descent over :data:`FIT_KEYS` from
    ``start`` (default :data:`FIT_START`), by each of ``steps`` in turn."""
    start = FIT_START if start is None else start
    fig = {k: float(start[k]) for k in FIT_KEYS}

    def score(f: dict[str, float]) -> float:
        t = validate_splitwise(data, stack={hw: f}, hardware=[hw], exclude=exclude, cached=True)
        t = t[t["scored"]]
        return geomean_error(t.predicted_ms, t.measured_ms)

    best = score(fig)
    for step in steps:
        improved = True
        while improved:
            improved = False
            for k in fig:
                lo, hi = FIT_BOUNDS.get(k, (0.0, float("inf")))
                for m in (step, 1 / step):
                    trial = {**fig, k: round(min(max(fig[k] * m, lo), hi), 6)}
                    e = score(trial)
                    if e < best - 1e-4:
                        fig, best, improved = trial, e, True
                        break
    return {k: round(v, 3) for k, v in fig.items()}, best


def fit_folds(data: Path, hw: str) -> dict[tuple[str, int], tuple[dict[str, float], float]]:
    """Leave-one-group-out: per (model, TP) group of ``hw``, the stack fitted to the other groups
    and the fit's in-sample error."""
    return {g: fit_stack(data, hw, exclude=[g]) for g in splitwise_groups(data, hw)}


def splitwise_summary(t: pd.DataFrame) -> pd.DataFrame:
    """Geomean |error| per hardware (scored rows) and per hardware and kind of time."""
    s = t[t["scored"]]
    out = []
    for hw, g in s.groupby("hardware"):
        out.append({"hardware": hw, "what": "all", "rows": len(g),
                    "geomean": geomean_error(g.predicted_ms, g.measured_ms)})
        for what, h in g.groupby("what"):
            out.append({"hardware": hw, "what": what, "rows": len(h),
                        "geomean": geomean_error(h.predicted_ms, h.measured_ms)})
    return pd.DataFrame(out)
