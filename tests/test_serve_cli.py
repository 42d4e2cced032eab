"""``simgpu serve``: the shipped examples' files, and bad serving files refused in one line naming
the key (a model that does not fit, SLOs no request can meet, an unknown scheduler, a missing trace
file, a request that can never fit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, edit_keys, refused_in_one_line

from simgpu.serve.__main__ import main

LLAMA = ROOT / "workloads" / "inference" / "llama2_70b_dgx_h100_tp4.yaml"
SERVING = ROOT / "workloads" / "serving"
needs_llama = pytest.mark.skipif(not LLAMA.is_file(), reason="no inference workload of Llama-2-70B")


def serving_file(tmp_path: Path, **changes) -> Path:
    data = {"name": "t", "deployment": {"workload": str(LLAMA)},
            "requests": {"kind": "fixed", "count": 20, "prompt_tokens": 200, "output_tokens": 20}}
    edit_keys(data, changes, "__")
    path = tmp_path / "serving.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def refused(capsys, argv: list[str]) -> str:
    return refused_in_one_line(capsys, main, argv)


@pytest.mark.parametrize(("changes", "where"), [
    ({"scheduler": {"kind": "fifo"}}, "scheduler.kind: unknown scheduler 'fifo'"),
    ({"requests__kind": "trace", "requests__file": "no_such.csv"}, "requests.file: trace file"),
    ({"deployment__workload": "nowhere.yaml"}, "deployment.workload: workload"),
    ({"requests__rate": 3}, "requests.rate: unknown key"),
    ({"requests__count": None}, "requests: fixed requests need count"),
    ({"deployment": None}, "missing deployment"),
    ({"prefill": {"workload": str(LLAMA)}}, "give deployment, or prefill and decode"),
    ({"slo__ttft_ms": -1}, "slo.ttft_ms: expected a value greater than 0"),
])
def test_bad_serving_files_before_any_timing(tmp_path, capsys, changes, where):
    line = refused(capsys, [str(serving_file(tmp_path, **changes)), "--out", str(tmp_path / "o")])
    assert where in line and "serving.yaml" in line
    assert not (tmp_path / "o").exists()


@needs_llama
@pytest.mark.parametrize(("changes", "where"), [
    ({"deployment__set": {"parallelism.tp": 1}}, "deployment.set: the model does not fit"),
    ({"slo__tpot_ms": 1}, "slo.tpot_ms: 1 ms can never be met"),
    ({"slo__ttft_ms": 1}, "slo.ttft_ms: 1 ms can never be met"),
    ({"requests__prompt_tokens": 2_000_000}, "requests: request 0 needs KV for 2,000,019 tokens"),
    ({"scheduler": {"kind": "continuous", "max_batch": 512}, "deployment__set": {"inference.max_batch_size": 128}},
     "deployment.set.inference.max_batch_size: scheduler.max_batch = 512 but"),
])
def test_bad_serving_configs_of_the_deployment(tmp_path, capsys, changes, where):
    line = refused(capsys, [str(serving_file(tmp_path, **changes)), "--out", str(tmp_path / "o")])
    assert where in line


@needs_llama
def test_the_memory_plan_holds_the_schedulers_largest_iteration(tmp_path):
    """Unless the deployment sets them, the workload's batch limits follow the scheduler's, so the
    KV blocks left are what the scheduler's largest iteration leaves."""
    from simgpu.serve.deploy import pool_job
    from simgpu.serve.spec import load_serving

    small = load_serving(serving_file(tmp_path, scheduler={"kind": "chunked", "max_batch": 64, "max_tokens": 1024}))
    large = load_serving(serving_file(tmp_path, scheduler={"kind": "chunked", "max_batch": 512, "max_tokens": 16384}))
    inf = [pool_job(s, "deployment").workload.inference for s in (small, large)]
    assert [(i.max_batch_size, i.max_batch_tokens) for i in inf if i is not None] == [(64, 1024), (512, 16384)]


def test_bad_sweep_argument(tmp_path, capsys):
    line = refused(capsys, [str(serving_file(tmp_path)), "--sweep", "1,x"])
    assert "--sweep" in line


@needs_llama
def test_serve_writes_its_files_and_a_sweep(tmp_path, capsys):
    path = serving_file(tmp_path, requests={"kind": "poisson", "count": 60, "rate_per_s": 2.0,
                                            "prompt_tokens": {"mean": 300, "max": 1000},
                                            "output_tokens": {"mean": 30, "max": 100}})
    out = tmp_path / "o"
    assert main([str(path), "--out", str(out), "--sweep", "1,4"]) == 0
    printed = capsys.readouterr().out
    assert "TTFT ms" in printed and "goodput" in printed
    for f in ("requests.csv", "summary.json", "kv_occupancy.csv", "latency_cdf.png", "kv_occupancy.png",
              "timeline.png", "sweep.csv", "throughput_vs_load.png"):
        assert (out / f).is_file(), f
    s = json.loads((out / "summary.json").read_text())
    assert s["requests"] == 60 and s["gpus"] == 8 and s["ttft_ms"]["p99"] >= s["ttft_ms"]["p50"] > 0
    assert s["throughput"]["output_tokens_per_s_per_gpu"] > 0 and s["goodput"]["attained"] <= 1


@pytest.mark.parametrize("name", sorted(p.name for p in SERVING.glob("*.yaml")))
def test_shipped_serving_files_load(name):
    from simgpu.config.loader import job_kind
    from simgpu.serve.dlrm import load_dlrm_serving
    from simgpu.serve.spec import load_serving

    if job_kind(SERVING / name) == "dlrm_serving":
        assert load_dlrm_serving(SERVING / name).workload_path().is_file()
        return
    serving = load_serving(SERVING / name)
    for pool in ("deployment", "prefill", "decode"):
        dep = getattr(serving.spec, pool)
        if dep is not None:
            assert serving.resolve(dep.workload).is_file()


def test_mlperf_server_rows_are_read(tmp_path):
    from conftest import DATA

    from simgpu.serve.mlperf import SERVING as SERVING_FILES
    from simgpu.serve.mlperf import server_rows

    if not (DATA / "inference" / "mlperf-llama2-70b").is_dir():
        pytest.skip("no MLPerf Llama-2-70B results in ../shared/data")
    rows = server_rows(DATA)
    assert len(rows) >= 1 and (rows.tp.notna()).all()
    # every row has its machine's serving file: DGX-H100 and 8 x B200 (8 GPUs), GB200 (a tray of 4)
    assert {(a, n) for a, n in zip(rows.accelerator, rows.total_accelerators, strict=True)} <= set(SERVING_FILES)
    assert all(f.is_file() for f in SERVING_FILES.values())
    assert server_rows(DATA, every=True).shape[0] > len(rows)


@needs_llama
def test_the_shipped_pipeline_parallel_example_runs(tmp_path, capsys):
    """``llama2_70b_2x_dgx_h100_pp2.yaml`` (two PP2 x TP4 replicas) as shipped, on its first 300
    requests: every request served on 16 GPUs with as many output tokens/s as the four TP4 replicas
    of ``llama2_70b_2x_dgx_h100_10k.yaml`` give the same requests (both keep up with the load)."""
    from conftest import DATA

    if not (DATA / "inference" / "azure-llm-trace-2023").is_dir():
        pytest.skip("no Azure LLM trace in ../shared/data")
    out = {}
    for name in ("llama2_70b_2x_dgx_h100_pp2", "llama2_70b_2x_dgx_h100_10k"):
        assert main([str(SERVING / f"{name}.yaml"), "--set", "requests.count=300", "--out", str(tmp_path / name),
                     "--quiet"]) == 0
        out[name] = json.loads((tmp_path / name / "summary.json").read_text())
        assert (tmp_path / name / "timeline.png").is_file()
    pp, tp = out["llama2_70b_2x_dgx_h100_pp2"], out["llama2_70b_2x_dgx_h100_10k"]
    assert pp["requests"] == 300 and pp["gpus"] == 16 and "2 x 8 GPUs" in pp["deployment"]
    assert pp["goodput"]["p99_meets_slo"]
    rate = pp["throughput"]["output_tokens_per_s"]
    assert rate == pytest.approx(tp["throughput"]["output_tokens_per_s"], rel=0.05)
