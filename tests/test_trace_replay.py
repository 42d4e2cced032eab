"""Replaying synthetic traces: the replay must reproduce the traced steps and GPU timeline exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_trace_synthetic import ELTWISE, GEMM, Synth, simple_trace, training_step

from simgpu.__main__ import main as simgpu_main
from simgpu.replay import main
from simgpu.trace import ReplayOptions, build_program, load_traces, replay
from simgpu.trace.kineto import parse_kineto


def _replay(tmp_path: Path, platform, *synths: Synth, **kw):
    paths = [s.write(tmp_path / f"rank{s.rank}.json.gz") for s in synths]
    return replay(load_traces(paths), ReplayOptions(platform, **kw))


def test_replay_reproduces_every_step_and_gpu_start(tmp_path: Path, dgx_a100) -> None:
    s = simple_trace(steps=4, ar_bytes=8 << 20)
    out = _replay(tmp_path, dgx_a100, s)
    traced = {int(e["name"].split("#")[1]): e["dur"] for e in s.events if e["name"].startswith("ProfilerStep")}
    got = dict(zip(out.steps["step"], out.steps["replayed_ms"], strict=True))
    for n, dur in traced.items():
        assert got[n] == pytest.approx(dur * 1e-3, rel=1e-9)
    assert out.steps["complete"].all()
    assert len(out.start_error_us) == sum(1 for e in s.events if e["cat"] in ("kernel", "gpu_memcpy"))
    assert np.abs(out.start_error_us).max() < 1e-3
    # the result is one step, shifted to start at 0, with its traced time beside it
    res = out.result
    assert res.records["start_s"].min() >= 0 and res.records["end_s"].max() <= res.iteration_time_s + 1e-12
    assert res.iteration_time_s * 1e3 == pytest.approx(got[out.step])
    assert res.meta["measured_step_time_ms"] == pytest.approx(traced[out.step] * 1e-3)


def test_median_step_is_reported_by_default(tmp_path: Path, dgx_a100) -> None:
    s = Synth()
    for n, host in zip((1, 2, 3), (500.0, 50.0, 200.0), strict=True):
        training_step(s, n, host_us=host)
    out = _replay(tmp_path, dgx_a100, s)
    assert out.step == 3  # durations rank 2 < 3 < 1
    assert _replay(tmp_path, dgx_a100, s, step=1).step == 1


def test_cross_stream_wait_becomes_a_dependency(tmp_path: Path, dgx_a100) -> None:
    s = Synth()
    with s.step(1):
        side = s.launch(ELTWISE, stream=9, dur=5.0)        # an early, short op on a side stream
        gemm = s.launch(GEMM, stream=7, dur=400.0)
        s.host(20.0)
        s.launch(ELTWISE, stream=9, dur=30.0, after=[gemm])  # waits for the GEMM (cudaStreamWaitEvent)
        s.sync()
    prog = build_program(parse_kineto(s.doc(), "mem"))
    gpu = [i for i, it in enumerate(prog.items) if it.kind == "gpu"]
    waiter = prog.items[gpu[2]]
    assert gpu[1] in waiter.deps and gpu[0] not in waiter.deps
    assert prog.unexplained == 0
    # the wait holds on another GPU too: the waiter still starts right after the (faster) GEMM
    out = _replay(tmp_path, dgx_a100, s)
    assert np.abs(out.start_error_us).max() < 1e-3
    del side


def test_synchronisation_waits_for_the_gpu_and_the_cpu_row_is_the_trace(tmp_path: Path, dgx_a100) -> None:
    s = Synth()
    with s.step(1):
        s.host(100.0, "aten::something_on_the_host")
        s.launch(GEMM, dur=2000.0)
        s.host(10.0)
        s.sync("cudaStreamSynchronize", stream=7)
        s.host(40.0)
    out = _replay(tmp_path, dgx_a100, s)
    rec = out.result.records
    waits = rec[rec["kind"] == "host_wait"]
    assert len(waits) == 1 and waits["end_s"].iloc[0] - waits["start_s"].iloc[0] > 1.9e-3
    host = rec[(rec["kind"] == "host") & (rec["category"] == "host")]
    assert "aten::something_on_the_host" in set(host["name"])
    step = next(e for e in s.events if e["name"] == "ProfilerStep#1")
    assert out.result.iteration_time_s == pytest.approx(step["dur"] * 1e-6, rel=1e-9)


def _two_ranks(skew_us: float = 0.0) -> tuple[Synth, Synth]:
    """Two ranks of a data-parallel job: rank 1 reaches the all-reduce 300 us later than rank 0."""
    r0, r1 = Synth(0, 2), Synth(1, 2, pid=5000, skew_us=skew_us)
    for n in (1, 2):
        with r0.step(n), r1.step(n):
            for s, host in ((r0, 20.0), (r1, 320.0)):
                s.host(host, "forward")
                s.launch(GEMM, dur=200.0)
            k0, k1 = (s.allreduce(4 << 20, dur=50.0) for s in (r0, r1))
            end = max(k0["ts"], k1["ts"]) + 150.0  # both leave together, 150 us after the last arrived
            r0.set_end(k0, end)
            r1.set_end(k1, end)
            for s in (r0, r1):
                s.host(10.0)
                s.sync()
            # both step markers end at the later rank's time, as ProfilerStep boundaries line up
            t = max(r0.t, r1.t)
            r0.t = r1.t = t
    return r0, r1


def test_collectives_meet_across_ranks_and_replay_exactly(tmp_path: Path, dgx_a100) -> None:
    r0, r1 = _two_ranks()
    out = _replay(tmp_path, dgx_a100, r0, r1)
    assert np.abs(out.start_error_us).max() < 1e-3
    coll = out.result.records[out.result.records["kind"] == "collective"]
    assert set(coll["rank"]) == {0, 1}
    ends = coll.groupby("rank")["end_s"].max()
    assert ends[0] == pytest.approx(ends[1])  # one collective, left together
    traced = max(e["dur"] for e in r0.events + r1.events if e["name"] == "ProfilerStep#1")
    assert out.steps.set_index("step").loc[1, "replayed_ms"] == pytest.approx(traced * 1e-3, rel=1e-9)


def test_clock_skew_between_ranks_is_removed(tmp_path: Path, dgx_a100) -> None:
    base = _replay(tmp_path, dgx_a100, *_two_ranks())
    (tmp_path / "skew").mkdir()
    skewed = _replay(tmp_path / "skew", dgx_a100, *_two_ranks(skew_us=3000.0))
    assert any("clock skew" in w and "3000 us" in w for w in skewed.warnings)
    assert np.abs(skewed.start_error_us).max() < 1e-3
    assert skewed.steps["replayed_ms"].tolist() == pytest.approx(base.steps["replayed_ms"].tolist(), rel=1e-9)


def test_execution_trace_gives_gemm_shapes(tmp_path: Path) -> None:
    s = Synth()
    s.launch(GEMM, op="aten::addmm")
    op = next(e for e in s.events if e["name"] == "aten::addmm")
    op["args"]["Record function id"] = 77
    et = {"schema": "1.0.1", "pid": s.pid, "nodes": [
        {"id": 5, "name": "aten::addmm", "rf_id": 77, "input_shapes": [[256], [128, 64], [64, 256], [], []],
         "input_types": ["Tensor(c10::BFloat16)"] * 3 + ["Scalar", "Scalar"]}]}
    kin = s.write(tmp_path / "k.json.gz")
    (tmp_path / "et.json").write_text(json.dumps(et))
    (tr, et_parsed), = load_traces([kin, tmp_path / "et.json"])
    assert et_parsed is not None
    info = build_program(tr, et_parsed).items[-1].info
    assert info is not None and info.gemm == (1.0, 128, 256, 64)
    assert build_program(tr).items[-1].info.gemm is None  # type: ignore[union-attr]


def test_command_writes_the_outputs_of_run_with_both_times(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = simple_trace(steps=3, ar_bytes=1 << 20).write(tmp_path / "t.json.gz")
    out = tmp_path / "out"
    assert main([str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "traced" in printed and "replayed" in printed and "median" in printed
    for name in ("summary.json", "timeline.png", "trace.json", "records.csv"):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["measured_step_time_ms"] == pytest.approx(summary["iteration_time_ms"], rel=1e-5)
    assert list(summary).index("measured_step_time_ms") == list(summary).index("iteration_time_ms") + 1
    assert summary["platform"] == "dgx_a100"  # the traced A100's platform
    assert simgpu_main(["replay", str(path), "--out", str(out), "--quiet"]) == 0
    assert "traced" in capsys.readouterr().out
