"""What-if on a trace: another NIC, another GPU, another data-parallel world size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_trace_synthetic import ELTWISE, GEMM, NCCL_AR, Synth, training_step

from simgpu.comm.plan import CollectiveRequest
from simgpu.comm.planner import Planner
from simgpu.config.loader import load_platform
from simgpu.platform.topology import Topology
from simgpu.replay import main
from simgpu.trace import ReplayOptions, build_programs, load_traces, replay_programs
from simgpu.trace.classify import KernelInfo
from simgpu.trace.whatif import Retimer, SizeInference, group_of

AR_BYTES = 256 << 20


@pytest.fixture(scope="module")
def dp_job(tmp_path_factory: pytest.TempPathFactory):
    """Rank 0 of a 16-GPU data-parallel job whose step ends waiting for a 256 MB all-reduce."""
    s = Synth(0, 16)
    for n in (1, 2, 3):
        training_step(s, n, gemms=3, ar_bytes=AR_BYTES)
    path = s.write(tmp_path_factory.mktemp("dp") / "rank0.json.gz")
    return build_programs(load_traces([path])), path


def _what_if(programs, platform, **kw):
    return replay_programs(programs, ReplayOptions(platform, load_platform("dgx_a100")[0], what_if=True, **kw))


def test_collectives_are_retimed_by_the_collective_model(dp_job, dgx_a100) -> None:
    programs, _ = dp_job
    out = _what_if(programs, dgx_a100)
    assert out.result.meta["gpus"] == 16 and out.result.meta["nodes"] == 2
    rec = out.result.records
    ar = rec[(rec["kind"] == "collective") & (rec["rank"] == 0)]
    assert len(ar) == 1
    topo = Topology(dgx_a100, 2, 8)
    plan = Planner(topo, dgx_a100.collectives).plan(CollectiveRequest("all_reduce", tuple(range(16)), AR_BYTES))
    # all 16 clones arrive together and nothing else crosses the network: the isolated time
    assert float(ar["end_s"].iloc[0] - ar["start_s"].iloc[0]) == pytest.approx(plan.isolated_time(topo), rel=1e-6)
    assert float(ar["nbytes"].iloc[0]) == AR_BYTES


@pytest.mark.parametrize("slow, fast", [(50, 100), (100, 200), (200, 400), (400, 1600)])
def test_a_faster_nic_is_never_slower(dp_job, slow: int, fast: int) -> None:
    programs, _ = dp_job
    times = []
    for gbps in (slow, fast):
        plat, _ = load_platform("dgx_a100", [("network.nic_gbps", gbps)])
        times.append(_what_if(programs, plat).steps["replayed_ms"].to_numpy())
    assert (times[1] <= times[0] * (1 + 1e-9)).all()
    if slow <= 100:
        assert times[1].sum() < times[0].sum()  # the all-reduce is exposed: a faster NIC shows


def test_more_data_parallel_ranks_never_make_the_step_faster(dp_job, dgx_a100) -> None:
    programs, _ = dp_job
    prev = None
    for world in (8, 16, 32):
        out = _what_if(programs, dgx_a100, world=world)
        assert out.result.meta["gpus"] == world
        t = out.steps["replayed_ms"].to_numpy()
        if prev is not None:
            assert (t >= prev * (1 - 1e-9)).all()
        prev = t
    # one node (8 ranks on NVLink) against four nodes: the all-reduce goes over the NIC
    eight = _what_if(programs, dgx_a100, world=8).steps["replayed_ms"].sum()
    assert prev is not None and prev.sum() > eight


def test_another_gpu_retimes_compute_kernels(dp_job, dgx_a100, dgx_h100) -> None:
    programs, _ = dp_job
    a100 = _what_if(programs, dgx_a100).result
    h100 = _what_if(programs, dgx_h100).result

    def busy(res, cat: str) -> float:
        r = res.records[(res.records["kind"] == "kernel") & (res.records["category"] == cat)]
        return float((r["end_s"] - r["start_s"]).sum())

    assert busy(h100, "gemm") < busy(a100, "gemm")
    assert busy(h100, "elementwise") < busy(a100, "elementwise")
    ret = Retimer(dgx_a100, dgx_h100)
    mem = KernelInfo("elementwise", "memory")
    want = (dgx_a100.gpu.hbm_gbytes_per_s * dgx_a100.gpu.memory_efficiency
            / (dgx_h100.gpu.hbm_gbytes_per_s * dgx_h100.gpu.memory_efficiency))
    gemm = KernelInfo("gemm", "flops", "fp32", True, (1.0, 1024, 1024, 512))
    factors = ret.factors([mem, gemm, KernelInfo("conv", "flops", "bf16")])
    assert factors[0] == pytest.approx(want)
    assert ret.by_model == 1 and 0 < factors[1] < 1
    assert factors[2] == pytest.approx(312 * dgx_a100.gpu.matmul_efficiency
                                       / (float(dgx_h100.gpu.peak_tflops["bf16"]) * dgx_h100.gpu.matmul_efficiency))
    assert Retimer(dgx_a100, dgx_a100).factors([mem, gemm]) == [1.0, 1.0]


def test_collective_sizes_missing_from_the_trace_are_inferred(tmp_path: Path, dgx_a100) -> None:
    s = Synth(0, 16)
    with s.step(1):
        k = s.launch(GEMM, dur=100.0)
        s.launch(NCCL_AR, stream=20, dur=5000.0, after=[k])  # no collective arguments at all
        s.launch(ELTWISE, dur=5.0)
        s.sync()
    programs = build_programs(load_traces([s.write(tmp_path / "r0.json.gz")]))
    out = _what_if(programs, dgx_a100)
    assert any("inferred" in w for w in out.warnings)
    coll = programs[0].items[[it.kind for it in programs[0].items].index("collective")].coll
    assert coll is not None and coll.nbytes == -1 and coll.group == tuple(range(16))
    inf = SizeInference(dgx_a100, 16)
    nbytes = inf.nbytes("all_reduce", 16, 5e-3)
    plan = inf.planner.plan(CollectiveRequest("all_reduce", tuple(range(16)), nbytes))
    assert plan.isolated_time(inf.topo) == pytest.approx(5e-3, rel=0.02)


@pytest.mark.parametrize("group, traced, world, rank, want", [
    ((0, 1, 2, 3), 4, 16, 13, tuple(range(16))),        # the whole world stays the whole world
    ((2, 3), 8, 8, 5, (4, 5)),                           # tensor-parallel pairs
    ((1, 3, 5, 7), 8, 16, 10, (8, 10, 12, 14)),          # data-parallel over a stride of 2
    ((0, 1, 3), 8, 8, 0, None),                          # irregular
    ((0, 4, 8), 12, 16, 1, None),                        # does not tile the new world
])
def test_group_mapping_for_another_world_size(group, traced, world, rank, want) -> None:
    assert group_of(rank, group, traced, world) == want


def test_command_what_if_prints_and_records_both_times(dp_job, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    _, path = dp_job
    out = tmp_path / "fast"
    assert main([str(path), "--set", "network.nic_gbps=800", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "what-if" in printed and "traced" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["gpus"] == 16 and summary["measured_step_time_ms"] > 0
    assert summary["iteration_time_ms"] > 0 and "breakdown_ms" in summary
