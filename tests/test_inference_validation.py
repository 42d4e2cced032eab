"""Inference iterations against measurements (``../shared/data/inference``): Splitwise's prefill and
decode-iteration times, MLPerf Llama-2-70B Offline tokens/s. Skips where the data is absent."""

from __future__ import annotations

import pytest

from simgpu.kernels.importers import data_root
from simgpu.serve.timer import EngineTimer
from simgpu.validate import inference as v
from simgpu.validate import inference_jobs as jobs
from simgpu.validate import mlperf_inference as mi
from simgpu.validate import splitwise as sw
from simgpu.workload.inference import Step

DATA = data_root()
needs_splitwise = pytest.mark.skipif(not (DATA / sw.SPLITWISE).is_file(),
                                     reason=f"no Splitwise measurements at {DATA / sw.SPLITWISE}")
needs_mlperf = pytest.mark.skipif(not (DATA / mi.MLPERF).is_file(), reason=f"no MLPerf results at {DATA / mi.MLPERF}")

#: Machines whose held-out Splitwise geomean is above the issue's 12%, with the figure recorded when
#: it was last measured: the test fails if it gets worse (none now: both machines meet the 12%).
KNOWN_GAPS: dict[str, float] = {}


@pytest.fixture(scope="module")
def splitwise():  # type: ignore[no-untyped-def]
    return sw.validate_splitwise(DATA)


@needs_splitwise
@pytest.mark.parametrize("hw", sw.SCORED_HARDWARE)
def test_splitwise_geomean_error(splitwise, hw: str) -> None:  # type: ignore[no-untyped-def]
    """Held out: every scored row is predicted with the figures fitted to the machine's other groups."""
    t = splitwise[splitwise["scored"] & (splitwise["hardware"] == hw)]
    assert len(t) == 144  # 18 points x 4 groups x prefill and decode; batch 64 left out
    assert t["held_out"].all()
    err = jobs.geomean_error(t["predicted_ms"], t["measured_ms"])
    assert err <= max(sw.SPLITWISE_MAX, KNOWN_GAPS.get(hw, 0.0) + 0.002), f"{hw}: {err:.1%}"


@needs_splitwise
def test_splitwise_without_the_stack_figures_is_far_off() -> None:
    """The defaults describe TensorRT-LLM's kernels and a 5 us launch: Splitwise's stack is slower
    (the before-tuning figures of docs/inference.md)."""
    t = sw.validate_splitwise(DATA, stack={}, hardware=["h100-80gb"])
    t = t[t["scored"]]
    assert jobs.geomean_error(t["predicted_ms"], t["measured_ms"]) > 0.3
    assert (t["predicted_ms"] < t["measured_ms"]).mean() > 0.9


@needs_splitwise
@pytest.mark.parametrize("hw", sw.SCORED_HARDWARE)
def test_every_group_has_figures_fitted_without_it(hw: str) -> None:
    folds = sw.SPLITWISE_FOLDS[hw]
    assert set(folds) == set(sw.splitwise_groups(DATA, hw)) and len(folds) == 4
    for fig in folds.values():
        assert set(fig) == set(sw.FIT_KEYS)
        assert all(sw.FIT_BOUNDS[k][0] <= fig[k] <= sw.FIT_BOUNDS[k][1] for k in sw.FIT_BOUNDS)
        # the shares well inside their bounds, and the large all-reduces slower, never faster
        assert all(0.2 <= fig[k] <= 1.0 for k in sw.FIT_BOUNDS if k.endswith("efficiency"))
        assert fig["platform.collectives.slow_all_reduce"] > 1.5


@needs_splitwise
def test_the_step_at_large_all_reduces_is_what_the_rows_show() -> None:
    """In sample, with the stack's figures: the prefills below the slow all-reduces' size and those
    above are each predicted within 10% per token on the H100's TP8 Llama, where a single share for
    every size was 14-23% too slow below and 17-26% too fast above (the table of docs/inference.md)."""
    t = sw.validate_splitwise(DATA, hardware=["h100-80gb"], held_out=False)
    t = t[t["scored"] & (t["what"] == "prefill") & (t["model"] == "llama2-70b") & (t["tp"] == 8)
          & (t["output"] == 128)]
    tokens = t["prompt"] * t["batch"]
    for part in (t[(tokens >= 1024) & (tokens <= 2048)], t[tokens >= 4096]):
        assert len(part) >= 3
        assert jobs.geomean_error(part["predicted_ms"], part["measured_ms"]) <= 0.10


@needs_mlperf
def test_mlperf_offline_tokens_per_second() -> None:
    m, skipped = mi.validate_mlperf(DATA)
    assert len(m) == 16 and not skipped  # H100, twelve B200, three GB200 (gb200_nvl72)
    assert jobs.geomean_error(m["predicted"], m["measured"]) <= mi.MLPERF_MAX
    c = mi.configurations(m)
    assert len(c) == 3
    assert mi.spearman(c["per_gpu_predicted"], c["per_gpu_measured"]) >= mi.MLPERF_SPEARMAN
    # over the systems: as high as a model that predicts one configuration's systems alike can be
    # (twelve of the sixteen are B200 TP1 fp4 at batch 2,048, three GB200 alike; see docs/inference.md)
    bound = mi.spearman_bound(m)
    assert bound < mi.MLPERF_SPEARMAN
    assert mi.spearman(m["per_gpu_predicted"], m["per_gpu_measured"]) == pytest.approx(bound)


@needs_mlperf
def test_the_token_budget_is_the_runtimes() -> None:
    """Azure's GB200 config builds its engine for 4,096 tokens an iteration and runs its scheduler at
    3,584 (the CSV's max_num_tokens is the build flag): the runtime's bounds an iteration."""
    m = mi.mlperf_rows(DATA)
    azure = m[m["submitter"] == "Azure"].iloc[0]
    assert int(azure["max_num_tokens"]) == 4096 and int(azure["token_budget"]) == 3584
    assert (m.loc[m["submitter"] != "Azure", "token_budget"].isin([3584, 8192])).all()


def test_dlrm_batch_is_within_a_few_times_its_envelope() -> None:
    """The shipped DLRM inference batch: no faster than its rows read once over HBM or its FLOPs at
    the GEMM ceiling, and within 4x their sum (the serial input copy and the row-wise reduce-scatter
    of partial sums are the rest; see docs/inference.md)."""
    d = v.dlrm_envelope()
    assert d["batch_ms"] > max(d["lookups_ms"], d["dense_ms"])
    assert d["batch_ms"] < 4 * (d["lookups_ms"] + d["dense_ms"])
    assert d["samples_per_s"] == pytest.approx(d["samples"] / d["batch_ms"] * 1e3)


def test_decode_floor_is_the_weights_over_hbm() -> None:
    f = v.decode_floor()
    assert 1.0 < f["ratio"] < 1.7


def test_fp4_keeps_the_activations_in_bf16() -> None:
    """NVFP4 quantises the weights and each GEMM's input; the norms and the residual stream stay in
    bf16 (as under fp8), so a norm moves 2 bytes an element, not fp32's 4."""
    job = jobs.make_job(jobs.LLAMA2_70B, "dgx_b200", 1, "fp4", inference={"framework": "tensorrt_llm"})
    timer = EngineTimer(job)
    timer.time([Step(prefill=((512, 0),), decode=(400,) * 64)])
    norms = {s.dtype for s in timer.kernels.specs if s.family == "norm"}
    gemms = {s.dtype for s in timer.kernels.specs if s.family == "gemm"}
    assert norms == {"bf16"} and gemms == {"fp4"}


def test_offline_prompts_are_sequences_of_their_own() -> None:
    """The requests finishing per iteration (batch / output length) start prompts of ~isl tokens
    each, not one sequence of all their tokens (whose causal attention would have n x the pairs)."""
    job = jobs.make_job(jobs.LLAMA2_70B, "dgx_h100", 2, "fp8", inference={"framework": "tensorrt_llm",
                                                                          "gpu_memory_utilization": 0.95})
    timer = EngineTimer(job)
    seen: list[Step] = []
    time = timer.time

    def spy(steps: list[Step]) -> object:
        seen.extend(steps)
        return time(steps)
    timer.time = spy  # type: ignore[method-assign,assignment]
    _, b = mi.offline_tokens_per_s(timer, 896, 294, 291, 8192)
    (step,) = seen
    assert len(step.prefill) == round(b / 291) == 3
    assert all(abs(n - 294 * b / 291 / 3) <= 1 and c == 0 for n, c in step.prefill)
    seen.clear()
    # max_num_tokens bounds an iteration's tokens, a decode's one token included
    _, b = mi.offline_tokens_per_s(timer, 896, 294, 291, 1000)
    assert b == int(1000 / (1 + 294 / 291)) == 497
    assert len(seen[0].decode) == b and b + sum(n for n, _ in seen[0].prefill) <= 1000


def test_kernel_times_add_up_to_a_tp1_iteration() -> None:
    """TP1 has no collective: the kernels of one GPU's stream are the iteration, less the host's
    head start (the breakdown of ``--breakdown``)."""
    timer = EngineTimer(jobs.make_job(jobs.LLAMA2_70B, "dgx_b200", 1, "fp4", inference=mi.MLPERF_INFERENCE))
    step = Step(prefill=((300, 0),) * 4, decode=(440,) * 512)
    kt = timer.kernel_times(step)
    t = float(timer.time([step])[0])
    assert sum(kt.values()) == pytest.approx(t, rel=0.02)
    assert kt[("mlp.fc1.fwd", "gemm", "fp4")] > kt[("attn.qkv.fwd", "gemm", "fp4")] > 0
    assert ("ln1.fwd", "norm", "bf16") in kt
