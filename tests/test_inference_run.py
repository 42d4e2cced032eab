"""The shipped inference workloads run as any workload does (summary, timeline, trace), the same
for a seed, and their memory is the inference plan's (weights, KV cache, no optimizer state)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT

from simgpu import run
from simgpu.config.loader import load_job
from simgpu.serve.timer import EngineTimer
from simgpu.sim import simulate
from simgpu.workload.inference.memory import kv_bytes_per_token

INFERENCE = sorted((ROOT / "workloads" / "inference").glob("*.yaml"))


def test_the_three_examples_are_shipped() -> None:
    names = {p.stem for p in INFERENCE}
    assert {"llama2_70b_dgx_h100_tp4", "mixtral_8x7b_8x_h100_ep", "dlrm_dcnv2_dgx_a100"} <= names


@pytest.mark.parametrize("path", INFERENCE, ids=[p.stem for p in INFERENCE])
def test_a_shipped_inference_workload_runs(path: Path, tmp_path: Path) -> None:
    assert run.main([str(path), "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["iteration_time_ms"] > 0
    for f in ("timeline.png", "trace.json", "records.csv"):
        assert (tmp_path / f).is_file()
    mem = summary["memory_gib"]
    text = json.dumps(mem)
    assert "optimizer_states" not in text or all(v == 0 for v in _values(mem, "optimizer_states"))


def _values(tree: object, key: str) -> list[float]:
    if isinstance(tree, dict):
        return [v for k, v in tree.items() if k == key and isinstance(v, (int, float))] + \
            [x for v in tree.values() for x in _values(v, key)]
    if isinstance(tree, list):
        return [x for v in tree for x in _values(v, key)]
    return []


def test_run_and_timer_agree_and_repeat() -> None:
    job = load_job(ROOT / "workloads" / "inference" / "llama2_70b_dgx_h100_tp4.yaml")
    a, b = simulate(job), simulate(job)
    assert a.iteration_time_s == b.iteration_time_s
    assert a.meta["gpus"] == 8 and a.meta["tokens"] == 2 * (2 * 512 + 32)
    timer = EngineTimer(job, exact=True)
    from simgpu.workload.inference.builder import spec_step
    assert timer.time([spec_step(job.workload.serve)])[0] == pytest.approx(a.iteration_time_s, rel=1e-9)


def test_a_pipelined_iteration_is_one_batch_through_the_stages_and_says_so(tmp_path: Path, capsys) -> None:
    """PP2 x TP4: the iteration is one batch through both stages (their shares from the timer sum
    to it), and the summary says that serving keeps two batches in flight."""
    path = ROOT / "workloads" / "inference" / "llama2_70b_dgx_h100_tp4.yaml"
    assert run.main([str(path), "--set", "parallelism.pp=2", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "2 stages one after another" in summary["pipeline"] and "2 batches in flight" in summary["pipeline"]
    assert "pipeline  one batch passes the 2 stages" in capsys.readouterr().out
    job = load_job(path, ["parallelism.pp=2"])
    from simgpu.workload.inference.builder import spec_step
    stages = EngineTimer(job, exact=True).stage_times([spec_step(job.workload.serve)])[0]
    assert stages.sum() * 1e3 == pytest.approx(summary["iteration_time_ms"], rel=1e-3)
    assert 0.8 < stages[0] / stages[1] < 1.25
    assert run.main([str(path), "--out", str(tmp_path / "tp4")]) == 0
    tp4 = json.loads((tmp_path / "tp4" / "summary.json").read_text())
    assert "pipeline" not in tp4


def test_kv_cache_per_token_is_gqa_aware() -> None:
    """Llama-2-70B: 80 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 320 KiB per token over the
    model, a quarter on each of 4 GPUs, an eighth (one KV head) on each of 8."""
    job = load_job(ROOT / "workloads" / "inference" / "llama2_70b_dgx_h100_tp4.yaml")
    dep = EngineTimer(job).deployment
    assert kv_bytes_per_token(dep.setup, 2.0) == 80 * 2 * 128 * 2 * 2
    big = load_job(ROOT / "workloads" / "inference" / "llama2_70b_dgx_h100_tp4.yaml", ["parallelism.tp=8"])
    assert EngineTimer(big).memory.kv_bytes_per_token == 80 * 1 * 128 * 2 * 2


def test_weights_are_the_parameters_over_tp() -> None:
    job = load_job(ROOT / "workloads" / "inference" / "llama2_70b_dgx_h100_tp4.yaml")
    mem = EngineTimer(job).memory
    assert mem.weights_bytes == pytest.approx(68.98e9 * 2 / 4, rel=0.01)
    assert mem.gpu_bytes == pytest.approx(0.9 * 80 * 2**30)
    per_block = mem.kv_bytes_per_token * mem.block_tokens
    room = mem.gpu_bytes - mem.weights_bytes - mem.activation_bytes - mem.workspace_bytes
    assert mem.kv_blocks == int(room // per_block)


def test_dlrm_inference_holds_no_optimizer_state() -> None:
    job = load_job(ROOT / "workloads" / "inference" / "dlrm_dcnv2_dgx_a100.yaml")
    r = simulate(job)
    mem = r.meta["memory_gib"]
    assert all(m["optimizer_states"] == 0 and m["gradients"] == 0 for m in mem)
    assert r.meta["samples"] == 8 * 2048
    assert (r.records["phase"] == "fwd").all() or set(r.records["phase"]) <= {"fwd", "data"}


def test_dlrm_inference_runs_the_training_forward_without_weight_casts() -> None:
    """The two builders share one forward: the served batch's ops are the training forward's up to
    the top MLP, less the per-iteration casts of fp32 weights (a served model stores them cast)."""
    from simgpu.workload import World
    from simgpu.workload.dlrm.builder import build as train_build
    from simgpu.workload.inference.dlrm import build as serve_build

    serve = load_job(ROOT / "workloads" / "inference" / "dlrm_dcnv2_dgx_a100.yaml",
                     ["inference.batch_per_gpu=512"])
    train = load_job(ROOT / "workloads" / "dlrm_dcnv2_dgx_a100.yaml",
                     ["training.batch_per_gpu=512", "training.precision=fp16"])
    world = World(1, 8, 80)
    s, t = serve_build(serve.workload, world), train_build(train.workload, world)
    names = [op.name for op in s.programs[0].ops if op.kind != "host_wait"]
    fwd = [op.name for op in t.programs[0].ops
           if (op.phase == "fwd" or op.kind == "memcpy") and not op.name.endswith(".cast")]
    assert not any(n.endswith(".cast") for n in names)
    assert names[0] == "queries.h2d" and fwd[0] == "batch.h2d"
    assert names[1:-1] == fwd[1:fwd.index("loss.fwd")] and names[-1] == "sigmoid"
