"""Real traces are messy: truncated files, missing fields, files that are not traces at all."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from test_trace_synthetic import GEMM, Synth, simple_trace

from simgpu.errors import ConfigError
from simgpu.replay import main
from simgpu.trace import ReplayOptions, load_rank_trace, load_traces, replay


def test_truncated_gzip_is_read_up_to_the_last_whole_event(tmp_path: Path) -> None:
    raw = gzip.compress(json.dumps(simple_trace(steps=4).doc()).encode())
    path = tmp_path / "cut.json.gz"
    path.write_bytes(raw[: int(len(raw) * 0.7)])
    tr = load_rank_trace(path)
    assert tr.truncated
    assert any("truncated" in w for w in tr.warnings)
    whole = load_rank_trace(simple_trace(steps=4).write(tmp_path / "whole.json.gz"))
    assert 0 < len(tr.calls) + len(tr.gpu_ops) < len(whole.calls) + len(whole.gpu_ops)


def test_truncated_json_replays_with_incomplete_steps_flagged(tmp_path: Path, dgx_a100) -> None:
    s = simple_trace(steps=4)
    # keep the header, cut inside the last step's GPU events (the steps' spans come first below)
    steps = [e for e in s.events if e["name"].startswith("ProfilerStep")]
    others = [e for e in s.events if not e["name"].startswith("ProfilerStep")]
    doc = dict(s.doc(), traceEvents=steps + others)
    text = json.dumps(doc)
    path = tmp_path / "cut.json"
    path.write_text(text[: int(len(text) * 0.85)])
    out = replay(load_traces([path]), ReplayOptions(dgx_a100))
    assert any("truncated" in w for w in out.warnings)
    incomplete = out.steps[~out.steps["complete"]]
    assert 4 in set(incomplete["step"])  # the last step lost its events
    assert out.step in set(out.steps.loc[out.steps["complete"], "step"])


def test_missing_fields_are_warned_and_counted_not_fatal(tmp_path: Path, dgx_a100) -> None:
    s = simple_trace(steps=2)
    kernels = [e for e in s.events if e["cat"] == "kernel"]
    del kernels[0]["args"]["stream"]            # no stream: the thread id stands in
    del kernels[1]["args"]["correlation"]       # no correlation, no flow: issued at its start
    del kernels[2]["dur"]                       # no duration: dropped
    s.events.append({"ph": "X", "cat": "kernel", "name": "mystery_kernel_xyz", "pid": 0, "tid": 7,
                     "ts": kernels[-1]["ts"] + kernels[-1]["dur"] + 1.0, "dur": 3.0,
                     "args": {"stream": 7, "correlation": 999999}})  # unknown kernel, launch not traced
    out = replay(load_traces([s.write(tmp_path / "m.json.gz")]), ReplayOptions(dgx_a100))
    w = {k.split(": ", 1)[-1]: v for k, v in out.warnings.items()}
    assert w["GPU activities without a stream id (thread id used)"] == 1
    assert w["events without a valid ts / dur dropped"] == 1
    assert w["GPU activities without their launching runtime call (issued at their start)"] == 2
    assert w["kernels of unknown class (scaled by memory bandwidth in a what-if)"] == 1
    assert out.result.iteration_time_s > 0


def test_no_rank_in_header_takes_it_from_the_file_name(tmp_path: Path) -> None:
    s = Synth()
    s.launch(GEMM)
    doc = s.doc()
    del doc["distributedInfo"]
    path = tmp_path / "job_rank-5.json"
    path.write_text(json.dumps(doc))
    tr = load_rank_trace(path)
    assert tr.rank == 5 and tr.world_size is None
    assert any("rank" in w for w in tr.warnings)


@pytest.mark.parametrize("content, expect", [
    (b"", "empty"),
    (b"\x00\x01\x02 binary \xff", "not a JSON document"),
    (b"name: dgx_a100\ngpu: {}\n", "not a JSON document"),
    (b'{"model": "resnet", "layers": [1, 2]}', "no traceEvents"),
    (b'{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1}]}', "no CUDA runtime calls"),
    (b'{"schema": "1.0.1", "nodes": []}', "Execution Trace"),
])
def test_a_file_that_is_not_a_trace_is_a_config_error_naming_it(tmp_path: Path, content: bytes, expect: str) -> None:
    path = tmp_path / "input.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        load_traces([path])
    assert str(path) in str(err.value) and expect in str(err.value)


def test_command_exits_2_with_one_line_for_a_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("this is not a trace\n")
    assert main([str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {bad}:")
    assert main([str(tmp_path / "missing.json"), "--out", str(tmp_path / "o")]) == 2


def test_two_traces_of_one_rank_are_an_error(tmp_path: Path, dgx_a100) -> None:
    a = simple_trace().write(tmp_path / "a.json.gz")
    b = simple_trace().write(tmp_path / "b.json.gz")
    with pytest.raises(ConfigError, match="two traces of rank 0"):
        replay(load_traces([a, b]), ReplayOptions(dgx_a100))


def test_unknown_step_number_is_a_config_error(tmp_path: Path, dgx_a100) -> None:
    path = simple_trace().write(tmp_path / "t.json.gz")
    with pytest.raises(ConfigError, match="no ProfilerStep#42"):
        replay(load_traces([path]), ReplayOptions(dgx_a100, step=42))
