"""The workload's ``variability`` section: slow GPUs, jitter and measured speeds (docs/variability.md).

A slow rank on a data-parallel job whose all-reduce is not hidden stretches the iteration by its own
extra compute; a straggler never makes an iteration faster; jitter with cv 0 is no jitter; a seed
gives the same run; the summary says how much the iteration stretched and who waited for whom.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu import load_job, simulate
from simgpu.config.variability import Variability, lognormal, picked
from simgpu.report import summarize
from simgpu.report.summary import rank_breakdown
from simgpu.report.table import format_summary
from simgpu.result import SimResult

GPT = ROOT / "workloads" / "gpt_2x_dgx_h100.yaml"
#: data parallelism over 4 GPUs of one node, one DDP bucket: the all-reduce runs after the backward
ONE_BUCKET = ["nodes=1", "gpus_per_node=4", "parallelism.dp=4", "model.layers=2", "comm.bucket_mib=100000"]
SMALL = ["nodes=1", "gpus_per_node=4", "parallelism.dp=4", "model.layers=1"]


def vary(section: str, base: list[str] = SMALL, seed: int = 0) -> SimResult:
    """The small job with ``variability`` set to the YAML flow mapping ``section``."""
    return simulate(load_job(GPT, [*base, f"seed={seed}", f"variability={section}"]))


def plain(base: list[str] = SMALL) -> SimResult:
    """The job without the section, every rank and micro-batch simulated (as a run with one is)."""
    return simulate(load_job(GPT, base), fold=False, periodic=False, steady_cut=False)


@pytest.mark.parametrize("s", [1.5, 2.0])
def test_one_slow_rank_stretches_the_iteration_by_its_extra_compute(s: float) -> None:
    r = vary(f"{{slow: [{{ranks: [2], factor: {s}}}]}}", ONE_BUCKET)
    base = float(r.meta["variability"]["baseline_iteration_s"])
    compute = float(rank_breakdown(plain(ONE_BUCKET)).loc[2, "compute_s"])
    stretch = r.iteration_time_s - base
    assert stretch == pytest.approx((s - 1) * compute, rel=0.03)
    slow_compute = float(rank_breakdown(r).loc[2, "compute_s"])
    assert slow_compute == pytest.approx(s * compute, rel=0.01)
    assert r.iteration_time_s >= slow_compute
    rv = r.meta["variability"]["rendezvous"]
    assert rv["slowest"][0]["last_rank"] == 2  # every all-reduce waits for the slow rank
    assert rv["wait_s"][2] == min(rv["wait_s"].values())
    assert rv["wait_s"][0] >= 0.95 * stretch  # the others wait for its extra compute (and its slower optimizer)


@settings(max_examples=5, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(1.0, 2.5)), min_size=1, max_size=2))
def test_removing_a_straggler_never_makes_an_iteration_slower(slow: list[tuple[int, float]]) -> None:
    def section(entries: list[tuple[int, float]]) -> str:
        return "{slow: [" + ", ".join(f"{{ranks: [{r}], factor: {f!r}}}" for r, f in entries) + "]}"

    every = vary(section(slow))
    fewer = vary(section(slow[1:])) if len(slow) > 1 else None
    base = float(every.meta["variability"]["baseline_iteration_s"])
    tol = 1e-12
    if fewer is not None:
        assert fewer.iteration_time_s <= every.iteration_time_s + tol
        assert base <= fewer.iteration_time_s + tol
    assert base <= every.iteration_time_s + tol


@pytest.mark.parametrize("per", ["kernel", "gpu"])
def test_jitter_with_cv_zero_is_no_jitter(per: str) -> None:
    r = vary(f"{{jitter: {{cv: 0, per: {per}}}}}")
    p = plain()
    assert r.iteration_time_s == p.iteration_time_s
    pd.testing.assert_frame_equal(r.records, p.records, check_exact=True)
    assert r.meta["variability"]["baseline_iteration_s"] == pytest.approx(p.iteration_time_s, rel=1e-12)


def test_a_seed_gives_the_same_run_and_another_seed_another() -> None:
    section = "{slow: [{fraction: 0.5, factor: 1.4}], jitter: {cv: 0.1, per: kernel}}"
    a, b, c = vary(section), vary(section), vary(section, seed=7)
    pd.testing.assert_frame_equal(a.records, b.records, check_exact=True)
    assert summarize(a) == summarize(b)
    assert c.iteration_time_s != a.iteration_time_s
    assert a.iteration_time_s > a.meta["variability"]["baseline_iteration_s"]


def test_no_section_leaves_the_run_as_it_was() -> None:
    job = load_job(GPT, SMALL)
    assert job.workload.variability is None
    r = simulate(job)
    assert "variability" not in r.meta and "variability" not in summarize(r)
    assert "variability" not in format_summary(summarize(r))
    again = simulate(load_job(GPT, [*SMALL, "variability=null"]))
    pd.testing.assert_frame_equal(r.records, again.records, check_exact=True)


def test_lognormal_has_mean_one_and_the_cv_asked() -> None:
    x = lognormal(np.random.default_rng(0), 0.2, 400_000)
    assert x.mean() == pytest.approx(1.0, abs=2e-3)
    assert x.std() / x.mean() == pytest.approx(0.2, rel=0.02)
    assert (lognormal(np.random.default_rng(0), 0.0, 10) == 1.0).all()


def test_fraction_picks_with_the_seed_and_nodes_pick_their_gpus() -> None:
    v = Variability.model_validate({"slow": [{"fraction": 0.25, "factor": 2}, {"nodes": [1], "factor": 2}]})
    a = picked(v.slow[0], 0, 16, 8, seed=3)
    assert len(a) == 4 and a == picked(v.slow[0], 0, 16, 8, seed=3) and all(0 <= x < 16 for x in a)
    assert any(picked(v.slow[0], 0, 16, 8, seed=s) != a for s in range(4, 10))
    assert picked(v.slow[1], 1, 16, 8, seed=3) == list(range(8, 16))


def test_host_and_memory_slowdowns() -> None:
    p = plain()
    host = vary("{slow: [{ranks: [1], factor: 3, what: host}]}")
    b = rank_breakdown(host)
    assert b.loc[1, "cpu_busy_s"] == pytest.approx(3 * float(rank_breakdown(p).loc[1, "cpu_busy_s"]), rel=1e-9)
    assert b.loc[0, "cpu_busy_s"] == pytest.approx(float(rank_breakdown(p).loc[0, "cpu_busy_s"]), rel=1e-9)
    compute = vary("{slow: [{ranks: [1], factor: 2}]}")
    memory = vary("{slow: [{ranks: [1], factor: 2, what: memory}]}")
    assert p.iteration_time_s < memory.iteration_time_s < compute.iteration_time_s


def test_speeds_csv_is_the_same_as_slow_ranks(tmp_path: Path) -> None:
    with open(tmp_path / "speeds.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rank", "factor"])
        w.writerows([[1, 1.5], [3, 1.2]])
    data = yaml.safe_load(GPT.read_text())
    data["variability"] = {"speeds_csv": "speeds.csv"}
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(data))
    from_csv = simulate(load_job(tmp_path / "w.yaml", SMALL))
    slow = vary("{slow: [{ranks: [1], factor: 1.5}, {ranks: [3], factor: 1.2}]}")
    pd.testing.assert_frame_equal(from_csv.records, slow.records, check_exact=True)


def test_summary_and_table_say_how_much_and_why() -> None:
    r = vary("{slow: [{ranks: [3], factor: 1.5}]}")
    s = summarize(r)["variability"]
    assert s["stretch"] > 1 and s["stretch_ms"] > 0
    assert s["without_variability_ms"] == pytest.approx(r.meta["variability"]["baseline_iteration_s"] * 1e3,
                                                        rel=1e-5)
    assert s["entries"] == ["rank 3: kernels x 1.5"]
    assert s["rendezvous_wait_ms"]["longest"][0]["rank"] != 3
    assert s["rendezvous_wait_ms"]["shortest"]["rank"] == 3
    assert 1 <= len(s["slowest_to_gather"]) <= 5 and s["slowest_to_gather"][0]["last_rank"] == 3
    assert "every rank" in r.meta["fold_note"]
    text = format_summary(summarize(r))
    assert "without it" in text and "slowest to gather" in text and "waited at rendezvous" in text


def test_a_study_sweeps_the_straggler(tmp_path: Path) -> None:
    from simgpu.whatif.__main__ import main

    study = {"name": "s", "base": str(ROOT / "workloads" / "gpt_straggler_2x_dgx_h100.yaml"),
             "set": {"model.layers": 1}, "grid": {"variability.slow.0.factor": [1.0, 2.0]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(study))
    assert main([str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o"), "--workers", "1", "--no-plots",
                 "--quiet"]) == 0
    rows = pd.read_csv(tmp_path / "o" / "results.csv").sort_values("variability.slow.0.factor")
    t = rows["iteration_time_ms"].tolist()
    assert t[1] > 1.5 * t[0]
