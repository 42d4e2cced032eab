"""Communication that slows compute: the figure per collective op (gpu.overlap_slowdown_by_op) and
its measurement on profiler traces (python -m simgpu.trace.overlap)."""

from __future__ import annotations

import pytest
from conftest import ROOT, run_programs

from simgpu.graph import CollectiveCall, Op, Program
from simgpu.trace.overlap import HTA, main, measure


def _programs(op: str) -> list[Program]:
    out = []
    for r in (0, 1):
        call = CollectiveCall("c", op, (0, 1), 1 << 30)
        out.append(Program(r, [Op("c", "collective", op, stream="comm", coll=call, nbytes=1 << 30),
                               Op("k", "kernel", "gemm", kernel=0)]))
    return out


@pytest.mark.parametrize(("by_op", "want"), [((), 0.05), ((("all_reduce", 0.2),), 0.2),
                                             ((("send_recv", 0.2),), 0.05)])
def test_kernel_beside_a_collective_slows_by_its_op(dgx_a100, by_op, want):
    res = run_programs(dgx_a100, 1, _programs("all_reduce"), [1e-3], gpus_per_node=2, overlap=0.05, by_op=by_op)
    k = res.records[(res.records["name"] == "k") & (res.records["rank"] == 0)].iloc[0]
    assert k["end_s"] - k["start_s"] == pytest.approx(1e-3 * (1 + want), rel=1e-9)


def test_platform_key_rejects_unknown_ops():
    from pydantic import ValidationError

    from simgpu.config.platform import GPUSpec
    base = {"name": "g", "memory_gib": 80, "hbm_gbytes_per_s": 3000, "sms": 132, "peak_tflops": {"bf16": 989}}
    assert GPUSpec.model_validate({**base, "overlap_slowdown_by_op": {"all_reduce": 0.1}}).overlap_slowdown_by_op
    with pytest.raises(ValidationError):
        GPUSpec.model_validate({**base, "overlap_slowdown_by_op": {"allreduce": 0.1}})


@pytest.mark.skipif(not (HTA / "nccl_parser_config" / "nccl_data.json.gz").is_file(),
                    reason="../shared/data/traces/hta is absent")
def test_measured_on_hta_traces(capsys):
    """A100 (PG509-200), ResNet-style DDP: kernels under an NCCL all-reduce run 5-15% longer."""
    got = {s.op: s for s in measure(HTA / "nccl_parser_config" / "nccl_data.json.gz")}
    assert got["all_reduce"].shapes >= 10
    assert 0.05 < got["all_reduce"].slowdown < 0.15
    assert main([str(HTA / "nccl_parser_config" / "nccl_data.json.gz")]) == 0
    assert "all_reduce" in capsys.readouterr().out
    assert main([str(ROOT / "missing.json")]) == 2
