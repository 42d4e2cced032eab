"""A workload study with ``uncertainty: N``: each row's 80% interval, the ranking's overlaps, error bars."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import ROOT

from simgpu.variant import Variant
from simgpu.whatif.__main__ import main
from simgpu.whatif.study import load_study
from simgpu.whatif.workload import job_key


def _study(tmp_path: Path, draws: int, base: str = "workloads/gpt_2x_dgx_h100.yaml") -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "u", "base": str(ROOT / base), "uncertainty": draws,
                                    "grid": {"platform.network.nic_gbps": [200, 400]}}))
    return path


def test_rows_carry_their_interval_and_the_ranking_says_what_overlaps(tmp_path: Path, capsys) -> None:
    assert main([str(_study(tmp_path, 6)), "--out", str(tmp_path / "out"), "--workers", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    table = pd.read_csv(tmp_path / "out" / "results.csv")
    assert {"iteration_p10_ms", "iteration_p50_ms", "iteration_p90_ms"} <= set(table.columns)
    assert (table["iteration_p10_ms"] <= table["iteration_p50_ms"]).all()
    assert (table["iteration_p50_ms"] <= table["iteration_p90_ms"]).all()
    assert (table["iteration_p10_ms"] < table["iteration_p90_ms"]).all()
    assert "80% interval" in out
    # the NIC barely matters to this job: the two variants' intervals overlap, and the ranking says so
    assert "overlaps the best's" in out
    assert (tmp_path / "out" / "bars.png").is_file()


def test_draws_are_part_of_the_row_key_and_zero_changes_nothing(tmp_path: Path) -> None:
    base = ROOT / "workloads/gpt_2x_dgx_h100.yaml"
    plain, drawn = Variant("v", ()), Variant("v", (), draws=4)
    assert job_key(base, plain) != job_key(base, drawn)
    assert all(v.draws == 0 for v in load_study(_study(tmp_path, 0)).variants)
    assert all(v.draws == 3 for v in load_study(_study(tmp_path, 3)).variants)


def test_a_serving_study_with_draws_is_refused(tmp_path: Path, capsys) -> None:
    path = _study(tmp_path, 4, "workloads/serving/llama2_70b_2x_dgx_h100_10k.yaml")
    data = yaml.safe_load(path.read_text())
    data["grid"] = {"scheduler.max_batch": [64, 128]}
    path.write_text(yaml.safe_dump(data))
    assert main([str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "uncertainty" in err[0] and "workload studies" in err[0]


@pytest.mark.parametrize("bad", [-1, "many"])
def test_a_bad_number_of_draws_is_refused(tmp_path: Path, capsys, bad: object) -> None:
    path = _study(tmp_path, 0)
    data = yaml.safe_load(path.read_text())
    data["uncertainty"] = bad
    path.write_text(yaml.safe_dump(data))
    assert main([str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "uncertainty" in capsys.readouterr().err


def test_a_search_ranks_with_intervals(tmp_path: Path, capsys) -> None:
    from simgpu.search import main as search

    args = ["parallelism", str(ROOT / "workloads/gpt_2x_dgx_h100.yaml"), "--tp", "1,2", "--micro-batch", "1",
            "--recompute", "none", "--zero", "0", "--out", str(tmp_path / "s"), "--quiet", "--top", "0",
            "--workers", "1"]
    assert search([*args, "--uncertainty", "4"]) == 0
    out = capsys.readouterr().out
    assert "80% interval" in out
    table = pd.read_csv(tmp_path / "s" / "results.csv")
    assert table.loc[table["feasible"], "iteration_p90_ms"].notna().all()
    assert search(["serving", str(ROOT / "workloads/serving/llama2_70b_2x_dgx_h100_10k.yaml"), "--uncertainty", "4",
                   "--out", str(tmp_path / "v"), "--quiet"]) == 2
