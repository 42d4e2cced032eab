"""Who used which link when: link busy intervals carry their owner (a collective's key, a job's name
first in a cluster), each job's stretches on the links between switches, and the link timeline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT
from test_cluster import SPINE_2TO1, TWO, write

from simgpu.cluster.__main__ import main
from simgpu.cluster.run import ClusterResult, job_link_records, link_table, shared_s, simulate_cluster
from simgpu.cluster.spec import load_cluster
from simgpu.config.loader import load_job
from simgpu.report.summary import union_measure
from simgpu.result import LINK_RECORD_COLUMNS
from simgpu.sim import simulate


def union_by_link(lr: pd.DataFrame) -> dict[str, float]:
    return {str(lk): union_measure(d["start_s"], d["end_s"]) for lk, d in lr.groupby("link", observed=True)}


@pytest.fixture(scope="module")
def spread(tmp_path_factory: pytest.TempPathFactory) -> ClusterResult:
    """Two data-parallel jobs whose nodes sit under both leaves of a 2:1 spine (one layer: fast)."""
    tmp = tmp_path_factory.mktemp("spread")
    return simulate_cluster(load_cluster(write(tmp, TWO, layers=1, placement="spread", platform_set=SPINE_2TO1)))


def test_the_shared_runs_links_between_switches_carry_their_jobs(spread: ClusterResult) -> None:
    lr = spread.together.link_records
    assert lr is not None and list(lr.columns) == list(LINK_RECORD_COLUMNS)
    assert set(lr["link"]) <= spread.fabric  # the links between switches only, unless --links
    assert lr["owner"].str.startswith(("a/", "b/")).all()  # collective keys, the job's name first
    assert (lr["end_s"] > lr["start_s"]).all()
    # each job's stretches lie on links its own traffic crosses (its run alone moves bytes over them)
    spans = job_link_records(spread)
    assert set(spans["job"]) == {"a", "b"}
    for name, d in spans.groupby("job", observed=True):
        alone = spread.alone[str(name)].link_stats
        assert set(d["link"]) <= set(alone.loc[alone["nbytes"] > 0, "link"])
        assert (d["end_s"] <= spread.together_s[str(name)] + 1e-12).all()
    # a job's stretches on a link never overlap each other
    for _, d in spans.groupby(["link", "job"], observed=True):
        assert (d["start_s"].to_numpy()[1:] >= d["end_s"].to_numpy()[:-1]).all()


def test_each_jobs_busy_time_adds_up_to_the_links(spread: ClusterResult) -> None:
    links = link_table(spread, top=1000, fabric=spread.fabric)
    stats = spread.together.link_stats.set_index("link")["busy_s"]
    spans = job_link_records(spread)
    assert len(links) and set(links["link"]) == set(spans["link"])
    for row in links.to_dict(orient="records"):
        busy_a, busy_b, both, busy = row["busy_s:a"], row["busy_s:b"], row["shared_s"], row["busy_s"]
        assert 0 < busy_a <= busy * (1 + 1e-9) and 0 < busy_b <= busy * (1 + 1e-9)
        # the jobs' union is the link's busy time: a + b - (both at once)
        assert busy_a + busy_b - both == pytest.approx(stats[row["link"]], rel=1e-9)
        d = spans[spans["link"] == row["link"]]
        assert union_measure(d["start_s"], d["end_s"]) == pytest.approx(busy, rel=1e-9)
        assert both == pytest.approx(shared_s(d), rel=1e-12)
        assert both > 0  # both jobs' all-reduces cross every uplink at once


def test_a_job_under_one_leaf_leaves_no_stretch_between_switches(tmp_path: Path) -> None:
    jobs = [{"name": "a", "workload": "tiny.yaml", "nodes": [0, 1]}, {"name": "b", "workload": "tiny.yaml",
                                                                     "nodes": [2, 3]}]
    res = simulate_cluster(load_cluster(write(tmp_path, jobs, layers=1, platform_set=SPINE_2TO1)))
    assert job_link_records(res).empty
    assert "busy_s:a" not in link_table(res, fabric=res.fabric)  # no link between switches carried bytes


@pytest.mark.parametrize("over", [1, 2])
def test_owner_intervals_cover_every_links_busy_time(tmp_path: Path, over: int) -> None:
    # every link recorded (--links): NVLink, NICs and the uplinks (implied ones on a 1:1 core too)
    res = simulate_cluster(load_cluster(write(tmp_path, TWO, layers=1, placement="spread", platform_set={
        "network.nodes_per_leaf": 2, "network.oversubscription": over})), record_links=True, alone=False)
    lr = res.together.link_records
    assert lr is not None
    stats = res.together.link_stats.set_index("link")["busy_s"]
    got = union_by_link(lr)
    assert set(got) == set(stats.index)
    for lk, busy in got.items():
        assert busy == pytest.approx(float(stats[lk]), rel=1e-9, abs=1e-15), lk
    for _, d in lr.groupby(["link", "owner"]):  # one owner's stretches on a link are apart
        d = d.sort_values("start_s")
        assert (d["start_s"].to_numpy()[1:] >= d["end_s"].to_numpy()[:-1]).all()


@pytest.mark.parametrize("workload", ["tiny", "dlrm_2x_dgx_a100.yaml"])  # all-to-alls: aggregate flows
def test_a_single_runs_link_records_name_the_collectives(tmp_path: Path, workload: str) -> None:
    write(tmp_path, TWO, layers=1)
    job = load_job(tmp_path / "tiny.yaml" if workload == "tiny" else ROOT / "workloads" / workload)
    plain, linked = simulate(job), simulate(job, record_links=True)
    assert plain.link_records is None
    assert linked.iteration_time_s == plain.iteration_time_s
    lr = linked.link_records
    assert lr is not None and (lr["owner"] != "").all()
    stats = linked.link_stats.set_index("link")["busy_s"]
    for lk, busy in union_by_link(lr).items():
        assert busy == pytest.approx(float(stats[lk]), rel=1e-9, abs=1e-15), lk


def test_the_cluster_writes_its_link_timeline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, TWO, layers=1, placement="spread", platform_set=SPINE_2TO1)
    assert main([str(path), "--out", str(tmp_path / "o"), "--top-links", "3"]) == 0
    out = capsys.readouterr().out
    assert "links.png" in out and "a busy" in out and "shared" in out
    png = (tmp_path / "o" / "links.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert len(summary["links"]) == 3
    assert all(lk["busy_s:a"] > 0 and lk["busy_s:b"] > 0 and lk["shared_s"] > 0 for lk in summary["links"])
    # the same again: deterministic
    assert main([str(path), "--out", str(tmp_path / "p"), "--top-links", "3"]) == 0
    assert (tmp_path / "p" / "summary.json").read_text() == (tmp_path / "o" / "summary.json").read_text()
    assert main([str(path), "--out", str(tmp_path / "q"), "--no-plots"]) == 0
    assert not (tmp_path / "q" / "links.png").exists()


def test_no_link_recorded_no_busy_columns(tmp_path: Path) -> None:
    res = simulate_cluster(load_cluster(write(tmp_path, TWO, layers=1, placement="spread", platform_set=SPINE_2TO1)),
                           fabric_links=False, alone=False)
    assert res.together.link_records is None and job_link_records(res).empty
    assert not any(c.startswith("busy_s:") for c in link_table(res, fabric=res.fabric).columns)
    assert np.isfinite(res.together_s["a"])
