"""Searches: the sharding planner's plans ranked by simulation; parallel configurations pruned by the
job's rules before any is simulated."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import ROOT

from simgpu.search import main, parallelism_candidates, sharding_candidates

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
