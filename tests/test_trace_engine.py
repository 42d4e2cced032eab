"""The engine's replay hooks: per-op CPU time, CPU-only ops, collectives of a given duration."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_programs

from simgpu.config.loader import load_platform
from simgpu.graph import CollectiveCall, KernelSpec, Op, Program
from simgpu.kernels.measured import Measured
from simgpu.kernels.registry import make_predictor


def test_cpu_s_replaces_the_launch_overhead_for_that_op_only(dgx_a100) -> None:
    p = Program(0)
    p.add(Op("a", "kernel", "gemm", kernel=0, cpu_s=20e-6))
    p.add(Op("b", "kernel", "gemm", kernel=0))                  # default launch: 5 us
    res = run_programs(dgx_a100, 1, [p], [1e-6], gpus_per_node=1, launch_s=5e-6)
    launches = res.records[res.records["kind"] == "launch"].set_index("name")
    assert launches.loc["a", "end_s"] - launches.loc["a", "start_s"] == pytest.approx(20e-6)
    assert launches.loc["b", "end_s"] - launches.loc["b", "start_s"] == pytest.approx(5e-6)
    assert res.iteration_time_s == pytest.approx(25e-6 + 1e-6)


def test_host_op_keeps_only_the_cpu_busy(dgx_a100) -> None:
    p = Program(0)
    p.add(Op("python", "host", "host", cpu_s=50e-6))
    p.add(Op("k", "kernel", "gemm", kernel=0, cpu_s=0.0))
    res = run_programs(dgx_a100, 1, [p], [10e-6], gpus_per_node=1, launch_s=5e-6)
    rec = res.records
    host = rec[rec["name"] == "python"]
    assert len(host) == 1  # one record: no launch record for a host op
    assert (host["kind"].iloc[0], host["stream"].iloc[0], host["category"].iloc[0]) == ("host", "cpu", "host")
    kernel = rec[rec["kind"] == "kernel"]
    assert kernel["start_s"].iloc[0] == pytest.approx(50e-6)
    assert res.iteration_time_s == pytest.approx(60e-6)


def test_program_rejects_host_ops_with_deps_and_negative_cpu_time() -> None:
    p = Program(0)
    p.add(Op("k", "kernel", "gemm", kernel=0))
    with pytest.raises(ValueError, match="host op"):
        p.add(Op("h", "host", "host", deps=(0,)))
    with pytest.raises(ValueError, match="cpu_s"):
        p.add(Op("k2", "kernel", "gemm", kernel=0, cpu_s=-1.0))


def test_collective_with_a_duration_starts_when_the_last_member_arrives(dgx_a100) -> None:
    call = CollectiveCall("c", "all_reduce", (0, 1), 1 << 30, duration_s=300e-6)
    progs = []
    for r, host in ((0, 10e-6), (1, 110e-6)):
        p = Program(r)
        p.add(Op("h", "host", "host", cpu_s=host))
        p.add(Op("ar", "collective", "all_reduce", stream="comm", coll=call, nbytes=call.nbytes, cpu_s=0.0))
        progs.append(p)
    res = run_programs(dgx_a100, 1, progs, [], gpus_per_node=2)
    coll = res.records[res.records["kind"] == "collective"].set_index("rank")
    assert coll.loc[0, "start_s"] == pytest.approx(10e-6) and coll.loc[1, "start_s"] == pytest.approx(110e-6)
    assert coll["end_s"].tolist() == pytest.approx([410e-6, 410e-6])
    assert len(res.link_stats) == 0  # nothing crossed the network


def test_measured_model_times_only_measured_kernels() -> None:
    m = Measured()
    specs = [KernelSpec.make("measured", "none", us=12.5), KernelSpec.make("measured", "none", us=0.0)]
    secs, names = m.predict(specs)
    assert secs.tolist() == pytest.approx([12.5e-6, 0.0]) and names == ["measured", "measured"]
    gemm = KernelSpec.make("gemm", "bf16", m=1024, n=1024, k=1024)
    assert m.supports(specs[0]) and not m.supports(gemm)
    chain = make_predictor(("measured", "analytical"), load_platform("dgx_a100")[0])
    secs, names = chain.predict([specs[0], gemm])
    assert names == ["measured", "analytical"] and secs[0] == pytest.approx(12.5e-6) and np.isfinite(secs[1])
    with pytest.raises(ValueError):
        m.predict([gemm])


def test_delay_holds_the_stream_before_the_op_starts(dgx_a100) -> None:
    p = Program(0)
    a = p.add(Op("a", "kernel", "gemm", kernel=0, cpu_s=0.0))
    p.add(Op("b", "kernel", "gemm", stream="copy", kernel=0, deps=(a,), cpu_s=0.0, delay_s=7e-6))
    p.add(Op("c", "kernel", "gemm", stream="copy", kernel=0, cpu_s=0.0))
    with pytest.raises(ValueError, match="delay_s"):
        p.add(Op("d", "kernel", "gemm", kernel=0, delay_s=-1.0))
    res = run_programs(dgx_a100, 1, [p], [10e-6], gpus_per_node=1)
    k = res.records[res.records["kind"] == "kernel"].set_index("name")
    assert k.loc["b", "start_s"] == pytest.approx(17e-6)       # after its dep, then its delay
    assert k.loc["c", "start_s"] == pytest.approx(27e-6)       # the stream was held meanwhile
