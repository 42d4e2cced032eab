"""What a served iteration costs beyond its kernels' sizes: vLLM's unfused epilogues of a LayerNorm
model with biases (BLOOM), the host's time per request and per prefilling block, and the padding of
large batches to whole GEMM tiles."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simgpu.graph import KernelTable
from simgpu.kernels.importers import data_root
from simgpu.serve.timer import EngineTimer
from simgpu.validate import inference_jobs as jobs
from simgpu.validate import splitwise as sw
from simgpu.workload.inference import Step
from simgpu.workload.inference.builder import replica_programs
from simgpu.workload.inference.shape import EXACT_BELOW, ROW_ALIGN, TILE_ROWS, pad, shape_of

SMALL_BLOOM: dict[str, Any] = {**jobs.BLOOM_176B, "layers": 4, "hidden": 2048, "heads": 16, "vocab": 32000}
SMALL_LLAMA: dict[str, Any] = {**jobs.LLAMA2_70B, "layers": 4, "hidden": 2048, "heads": 16, "kv_heads": 4,
                               "ffn_hidden": 5632}


def _names(model: dict[str, Any], framework: str = "vllm", tp: int = 2) -> list[str]:
    timer = EngineTimer(jobs.make_job(model, "dgx_h100", tp, "fp16", inference={"framework": framework}))
    progs = replica_programs(timer.deployment, shape_of(Step(decode=(100,) * 4)), KernelTable())
    return [op.name for op in progs[0].ops]


def test_a_layernorm_model_with_biases_adds_them_after_each_all_reduce() -> None:
    names = _names(SMALL_BLOOM)
    for blk in range(4):
        for lin in ("proj", "fc2"):
            at = [i for i, n in enumerate(names) if n.startswith(f"h{blk}.") and n.endswith(f"{lin}.all_reduce")]
            assert len(at) == 1, names
            after = names[at[0] + 1:at[0] + 3]
            assert after[0].endswith(f"{lin}.bias") and after[1].endswith(f"{lin}.residual"), after
    assert not any(n.endswith(".rope") for n in names)  # ALiBi: no kernel of its own


def test_rmsnorm_models_and_tensorrt_llm_fuse_them() -> None:
    for names in (_names(SMALL_LLAMA), _names(SMALL_BLOOM, "tensorrt_llm")):
        assert not any(n.endswith((".bias", ".residual")) for n in names)
    assert sum(n.endswith(".rope") for n in _names(SMALL_LLAMA)) == 4


def _timer(**inference: float) -> EngineTimer:
    return EngineTimer(jobs.make_job(jobs.LLAMA2_70B, "dgx_h100", 8, "fp16",
                                     inference={"host_overhead_us": 30.0, **inference}))


@pytest.mark.parametrize("batch", [1, 8, 40])
def test_the_host_time_per_request_adds_to_the_iteration(batch: int) -> None:
    step = [Step(decode=(600,) * batch), Step(prefill=((300, 0),) * batch)]
    base = _timer().time(step)
    more = _timer(request_overhead_us=250.0, iteration_overhead_us=1000.0).time(step)
    assert more - base == pytest.approx([1e-3 + batch * 250e-6] * 2, rel=1e-6)


def test_the_cached_fit_path_adds_the_serial_figures_exactly() -> None:
    data = data_root()
    if not (data / sw.SPLITWISE).is_file():
        pytest.skip(f"no Splitwise measurements at {data / sw.SPLITWISE}")
    fig = {**sw.SPLITWISE_STACK["h100-80gb"], "iteration_overhead_us": 700.0}
    kw: dict[str, Any] = {"stack": {"h100-80gb": fig}, "hardware": ["h100-80gb"],
                          "exclude": [("bloom-176b", 8), ("llama2-70b", 2), ("llama2-70b", 4)]}
    a = sw.validate_splitwise(data, cached=True, **kw)
    b = sw.validate_splitwise(data, **kw)
    assert a["predicted_ms"].to_numpy() == pytest.approx(b["predicted_ms"].to_numpy(), rel=1e-9)


def test_the_prefill_host_time_per_block_hides_behind_a_gpu_bound_prefill() -> None:
    """80 blocks x 300 us: fully exposed where the host launches faster than nothing (a 128-token
    prompt at TP8 is host-bound), mostly hidden under an 8,192-token prompt's GEMMs."""
    steps = [Step(prefill=((128, 0),)), Step(prefill=((8192, 0),)), Step(decode=(600,) * 8)]
    base = _timer().time(steps)
    more = _timer(prefill_block_overhead_us=300.0).time(steps)
    exposed = (more - base) / (80 * 300e-6)
    assert exposed[0] > 0.9
    assert exposed[1] < 0.5
    assert exposed[2] == 0.0  # a decode-only iteration prepares no prompts


@given(st.integers(min_value=1, max_value=100_000))
def test_rows_are_padded_to_whole_tiles_above_the_exact_range(n: int) -> None:
    p = pad(n)
    align = TILE_ROWS if n > EXACT_BELOW else ROW_ALIGN
    assert p >= n and p % align == 0 and p - n < align
