"""Serving keys in what-if studies and ``simgpu search serving``."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml
from conftest import ROOT

LLAMA = ROOT / "workloads" / "inference" / "llama2_70b_dgx_h100_tp4.yaml"
pytestmark = pytest.mark.skipif(not LLAMA.is_file(), reason="no inference workload of Llama-2-70B")


def serving(tmp_path, **extra):
    data = {"name": "s", "deployment": {"workload": str(LLAMA)},
            "requests": {"kind": "poisson", "count": 80, "rate_per_s": 2.0,
                         "prompt_tokens": {"mean": 300, "max": 1000}, "output_tokens": {"mean": 30, "max": 100}},
            "slo": {"ttft_ms": 2000, "tpot_ms": 60}, **extra}
    p = tmp_path / "serving.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_whatif_study_over_serving_keys(tmp_path, capsys):
    from simgpu.whatif.__main__ import main

    base = serving(tmp_path)
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"name": "st", "base": str(base),
                                     "grid": {"scheduler.kind": ["continuous", "chunked"],
                                              "deployment.set.parallelism.tp": [4, 8]}}))
    out = tmp_path / "o"
    assert main([str(study), "--out", str(out), "--workers", "1", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "tokens/s per GPU" in printed
    t = pd.read_csv(out / "results.csv")
    assert len(t) == 4 and {"ttft_p99_ms", "tpot_p99_ms", "output_tokens_per_s_per_gpu"} <= set(t.columns)
    assert set(t.gpus) == {8}
    # a rerun reuses every row
    assert main([str(study), "--out", str(out), "--workers", "1", "--quiet"]) == 0
    assert "reused 4 of 4" in capsys.readouterr().out


def test_whatif_study_with_a_bad_serving_key(tmp_path, capsys):
    from simgpu.whatif.__main__ import main

    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"name": "st", "base": str(serving(tmp_path)),
                                     "grid": {"scheduler.max_batc": [4, 8]}}))
    assert main([str(study), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "scheduler.max_batc" in err and "expected" in err


def test_search_serving_prefers_fewer_gpus_within_the_slo(tmp_path, capsys):
    from simgpu.search import main

    base = serving(tmp_path)
    out = tmp_path / "o"
    assert main(["serving", str(base), "--tp", "4", "--replicas", "1,2", "--max-batch", "64",
                 "--out", str(out), "--workers", "1", "--top", "1", "--quiet"]) == 0
    t = pd.read_csv(out / "results.csv")
    assert sorted(t.gpus) == [4, 8]
    ok = t[t.feasible]
    best = ok.sort_values("output_tokens_per_s_per_gpu", ascending=False).iloc[0]
    # at a load both keep up with, the same tokens/s over half the GPUs is twice as much per GPU
    if len(ok) == 2:
        assert best.gpus == 4
        eight = ok[ok.gpus == 8].output_tokens_per_s_per_gpu.iloc[0]
        assert best.output_tokens_per_s_per_gpu == pytest.approx(2 * eight, rel=0.1)
    assert (out / "top1" / "summary.json").is_file()


def test_search_serving_ranks_pp_beside_tp_replicas(tmp_path, capsys):
    """Offline (400 requests at once) on one DGX H100: PP2 x TP4 keeps two batches in flight, so it
    serves as much as two TP4 replicas of the same GPUs (450.5 against 457.0 tokens/s per GPU), where
    one batch at a time it gave 303.1."""
    from simgpu.search import main

    base = serving(tmp_path, requests={"kind": "fixed", "count": 400, "prompt_tokens": {"mean": 300, "max": 1000},
                                       "output_tokens": {"mean": 100, "max": 300}},
                   scheduler={"kind": "chunked", "max_batch": 256, "max_tokens": 2048},
                   slo={"ttft_ms": 60000, "tpot_ms": 300})
    out = tmp_path / "o"
    assert main(["serving", str(base), "--tp", "4", "--pp", "1,2", "--out", str(out), "--workers", "1",
                 "--top", "0", "--quiet"]) == 0
    t = pd.read_csv(out / "results.csv").set_index("pp")
    assert t.feasible.all() and set(t.gpus) == {8}
    ratio = t.output_tokens_per_s_per_gpu[2] / t.output_tokens_per_s_per_gpu[1]
    assert 0.93 < ratio < 1.05


DLRM = ROOT / "workloads" / "inference" / "dlrm_dcnv2_dgx_a100.yaml"


def dlrm_serving(tmp_path, **extra):
    data = {"name": "d", "deployment": {"workload": str(DLRM)},
            "queries": {"kind": "poisson", "count": 300, "rate_per_s": 2000, "samples": 200},
            "batcher": {"max_batch_samples": 2048, "max_queue_delay_us": 500, "bucket_samples_per_gpu": 256},
            "slo": {"latency_ms": 60}, **extra}
    p = tmp_path / "dlrm_serving.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_whatif_study_over_dlrm_serving_keys(tmp_path, capsys):
    from simgpu.whatif.__main__ import main

    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"name": "dl", "base": str(dlrm_serving(tmp_path)),
                                     "grid": {"batcher.max_queue_delay_us": [0, 2000]}}))
    out = tmp_path / "o"
    assert main([str(study), "--out", str(out), "--workers", "1", "--quiet"]) == 0
    assert "samples/s per GPU" in capsys.readouterr().out
    t = pd.read_csv(out / "results.csv").sort_values("batcher.max_queue_delay_us")
    assert len(t) == 2 and t.feasible.all() and set(t.gpus) == {8}
    # at a load far below saturation both serve every query; waiting for fuller batches costs latency
    assert t.queries_per_s.to_numpy() == pytest.approx([t.queries_per_s.iloc[0]] * 2, rel=0.05)
    assert t.latency_p50_ms.iloc[0] < t.latency_p50_ms.iloc[1]
    assert main([str(study), "--out", str(out), "--workers", "1", "--quiet"]) == 0
    assert "reused 2 of 2" in capsys.readouterr().out


def test_whatif_study_with_a_bad_dlrm_serving_key(tmp_path, capsys):
    from simgpu.whatif.__main__ import main

    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"name": "dl", "base": str(dlrm_serving(tmp_path)),
                                     "grid": {"batcher.max_delay_us": [0, 5]}}))
    assert main([str(study), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "batcher.max_delay_us" in err and "expected" in err


def test_search_dlrm_serving_ranks_by_samples_per_gpu(tmp_path, capsys):
    from simgpu.search import main

    base = dlrm_serving(tmp_path)
    out = tmp_path / "o"
    assert main(["serving", str(base), "--gpus", "4,8", "--max-batch", "100,2048", "--out", str(out),
                 "--workers", "1", "--top", "1", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "samples/s per GPU" in printed and "never fits a batch of 100" in printed
    t = pd.read_csv(out / "results.csv")
    assert sorted(t.gpus) == [4, 8]
    ok = t[t.feasible].sort_values("samples_per_s_per_gpu", ascending=False)
    # both keep up with the load: the same samples/s over half the GPUs is twice as much per GPU
    assert len(ok) == 2 and ok.gpus.iloc[0] == 4
    assert ok.samples_per_s_per_gpu.iloc[0] == pytest.approx(2 * ok.samples_per_s_per_gpu.iloc[1], rel=0.05)
    assert (out / "top1" / "summary.json").is_file()


@pytest.mark.parametrize("error, status", [
    ("deployment: the model does not fit in the GPUs' memory, expected fewer layers", "infeasible"),
    ("slo.ttft_ms: never met, expected a larger budget", "infeasible"),
    ("scheduler.kind: expected one of static, continuous, chunked", "invalid"),
])
def test_a_variant_that_cannot_be_served_becomes_a_row_saying_why(error, status):
    from simgpu.errors import ConfigError
    from simgpu.serve.study import failure

    row = failure(ConfigError(error, file="serving.yaml", key="k"))
    assert row["status"] == status and row["feasible"] is False
    assert row["why"].startswith("serving.yaml: k: ")
    other = failure(ValueError("bad shape"))
    assert other == {"status": "error", "feasible": False, "why": "ValueError: bad shape"}
