"""Searches: the sharding planner's plans ranked by simulation; parallel configurations pruned by the
job's rules before any is simulated."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import ROOT

from simgpu.search import main, parallelism_candidates, reasons, sharding_candidates

DLRM = str(ROOT / "workloads" / "dlrm_2x_dgx_a100.yaml")
GPT = str(ROOT / "workloads" / "gpt_2x_dgx_h100.yaml")


def test_sharding_search_ranks_plans_and_writes_the_best(tmp_path, capsys):
    variants = sharding_candidates(DLRM)
    assert len(variants) >= 3 and len({v.name for v in variants}) == len(variants)
    out = tmp_path / "s"
    assert main(["sharding", DLRM, "--out", str(out), "--top", "2", "--workers", "2", "--quiet"]) == 0
    table = pd.read_csv(out / "results.csv")
    assert table["feasible"].all() and len(table) == len(variants)
    best = table.sort_values("iteration_time_ms").iloc[0]
    summary = json.loads((out / "top1" / "summary.json").read_text())
    assert summary["iteration_time_ms"] == pytest.approx(best["iteration_time_ms"], rel=1e-6)
    assert (out / "top1" / "timeline.png").stat().st_size > 0 and (out / "top2" / "trace.json").is_file()
    assert "rank" in capsys.readouterr().out


def test_parallelism_candidates_respect_the_rules():
    keep, pruned = parallelism_candidates(GPT, ["model.layers=4"], micro_batch=[1, 2], recompute=["none"],
                                          zero=[0])
    assert keep, pruned[:2]
    for v in keep:
        d = dict(v.swept)
        assert d["tp"] * d["pp"] * d["dp"] == 16 and d["tp"] <= 8
    assert all(not r["feasible"] and r["why"] for r in pruned)


def test_search_rejects_the_wrong_model_kind(capsys):
    assert main(["sharding", GPT, "--quiet"]) == 2
    assert "needs a DLRM" in capsys.readouterr().err


TRANSFORMERS = [p for p in sorted((ROOT / "workloads").glob("*.yaml")) if "kind: transformer" in p.read_text()]


@pytest.mark.parametrize("path", TRANSFORMERS, ids=[p.stem for p in TRANSFORMERS])
def test_parallelism_search_works_out_of_the_box(path):
    keep, pruned = parallelism_candidates(str(path))
    assert keep, reasons(pruned)
    text = path.read_text()
    for v in keep:
        keys = {k for k, _ in v.overrides}
        # the workload's own batch keys, never both names of the micro-batch
        assert ("training.micro_batch" in keys) == ("micro_batch:" in text)
        assert not {"training.micro_batch", "training.batch_per_gpu"} <= keys
        assert not ({"training.global_batch", "training.grad_accumulation"} <= keys)


def test_candidates_keep_the_global_batch():
    from simgpu import load_job

    keep, _ = parallelism_candidates(GPT, micro_batch=[1, 2], recompute=["none"], zero=[0])
    totals = set()
    for v in keep:
        t = load_job(GPT, v.as_args()).workload.training
        totals.add(t.global_batch or t.batch_per_gpu * (t.grad_accumulation or 1) * dict(v.swept)["dp"])
    assert len(keep) > 4 and totals == {32}


def test_pruned_candidates_are_summarised_by_reason(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["parallelism", GPT, "--set", "model.layers=2", "--set", "model.seq_len=256", "--tp", "1,2",
                 "--pp", "1,4", "--micro-batch", "2,3", "--recompute", "none", "--zero", "0", "--top", "1",
                 "--workers", "1", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "candidates pruned by the job's rules" in printed
    assert "x model.layers: 2 layers do not divide" in printed
    assert printed.count("not a multiple of micro_batch") == 1  # once, with its count, not per candidate
    assert (out / "pruned.csv").is_file() and (out / "top1" / "summary.json").is_file()
