"""Several jobs on one cluster (:mod:`simgpu.cluster`): shared links slow jobs down only where the
fabric is short of capacity, a job alone is ``simgpu run``'s job, and neighbours never help."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simgpu
from simgpu.cluster.__main__ import main
from simgpu.cluster.run import ClusterResult, _Setup, job_ends, link_table, simulate_cluster
from simgpu.cluster.spec import load_cluster
from simgpu.config.loader import job_kind, load_job
from simgpu.sim import simulate

EXAMPLE = ROOT / "workloads" / "clusters" / "two_gpt_jobs_2to1_spine.yaml"

#: a data-parallel job whose iteration is mostly its gradient all-reduce across its two nodes
TINY = {"name": "tiny", "platform": "dgx_h100", "nodes": 2,
        "model": {"kind": "transformer", "layers": 2, "hidden": 4096, "heads": 32, "seq_len": 512, "vocab": 32000},
        "training": {"batch_per_gpu": 1, "precision": "bf16", "optimizer": "adam"}}  # dp: every GPU


def write(tmp: Path, jobs: list[dict[str, Any]], layers: int = 2, **cluster: Any) -> Path:
    (tmp / "tiny.yaml").write_text(yaml.safe_dump(TINY | {"model": TINY["model"] | {"layers": layers}}))
    data = {"name": "c", "platform": "dgx_h100", "nodes": 4} | cluster | {"jobs": jobs}
    path = tmp / "c.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


TWO = [{"name": "a", "workload": "tiny.yaml", "nodes": 2}, {"name": "b", "workload": "tiny.yaml", "nodes": 2}]
SPINE_2TO1 = {"network.nodes_per_leaf": 2, "network.oversubscription": 2}


def comm_s(res: ClusterResult, job: str, alone: bool = False) -> float:
    """The job's collective seconds on its first rank."""
    rec = (res.alone[job] if alone else res.together).records
    d = rec[(rec["kind"] == "collective") & (rec["rank"] == int(res.ranks[job][0]))]
    return float((d["end_s"] - d["start_s"]).sum())


@pytest.mark.parametrize("placement", ["packed", "spread"])
def test_jobs_on_a_non_blocking_fabric_do_not_slow_each_other(tmp_path: Path, placement: str) -> None:
    # two nodes per leaf: packed keeps each job under one leaf, spread sends both across the spine
    res = simulate_cluster(load_cluster(write(tmp_path, TWO, placement=placement,
                                              platform_set={"network.nodes_per_leaf": 2})))
    assert res.cluster.jobs[0].nodes == ((0, 1) if placement == "packed" else (0, 2))
    for name in ("a", "b"):
        assert res.slowdown(name) == pytest.approx(1.0, abs=0.02)


def test_jobs_across_a_2to1_spine_slow_each_other_by_about_the_oversubscription(tmp_path: Path) -> None:
    res = simulate_cluster(load_cluster(write(tmp_path, TWO, placement="spread", platform_set=SPINE_2TO1)))
    assert [cj.nodes for cj in res.cluster.jobs] == [(0, 2), (1, 3)]
    for name in ("a", "b"):
        # alone, each job has a leaf's uplinks to itself; together the two halve them: the all-reduces'
        # time across nodes doubles, their phases inside nodes and their latencies do not
        ratio = comm_s(res, name) / comm_s(res, name, alone=True)
        assert 1.4 < ratio <= 2.0 + 1e-9, ratio
        assert res.slowdown(name) > 1.1
    # the same jobs packed under one leaf each share no link
    packed = simulate_cluster(load_cluster(write(tmp_path, TWO, placement="packed", platform_set=SPINE_2TO1)))
    assert all(packed.slowdown(n) == pytest.approx(1.0, abs=1e-9) for n in ("a", "b"))


def test_each_jobs_bytes_add_up_to_the_shared_runs(tmp_path: Path) -> None:
    res = simulate_cluster(load_cluster(write(tmp_path, TWO, placement="spread", platform_set=SPINE_2TO1)))
    links = link_table(res, top=1000, fabric=res.fabric)
    assert len(links) and set(links["link_kind"]) == {"spine"}
    total = links["bytes:a"] + links["bytes:b"]
    assert np.allclose(total, links["nbytes"], rtol=1e-9)
    assert (links["bytes:a"] > 0).all() and (links["bytes:b"] > 0).all()  # every uplink carries both jobs


@pytest.mark.parametrize("nodes, at", [(2, None), (4, [3, 1])])
def test_a_single_job_cluster_is_simgpu_run(tmp_path: Path, nodes: int, at: list[int] | None) -> None:
    job = {"name": "only", "workload": "tiny.yaml"} | ({"nodes": at} if at else {})
    res = simulate_cluster(load_cluster(write(tmp_path, [job], nodes=nodes)))
    alone = simulate(load_job(tmp_path / "tiny.yaml"))
    assert res.together_s["only"] == pytest.approx(alone.iteration_time_s, rel=1e-12)
    assert res.alone_s["only"] == res.together_s["only"]


def test_the_cluster_is_deterministic(tmp_path: Path) -> None:
    path = write(tmp_path, TWO, placement="random", seed=3, platform_set=SPINE_2TO1)
    a, b = simulate_cluster(load_cluster(path)), simulate_cluster(load_cluster(path))
    assert [cj.nodes for cj in a.cluster.jobs] == [cj.nodes for cj in b.cluster.jobs]
    assert a.together_s == b.together_s and a.alone_s == b.alone_s
    assert a.together.link_stats.equals(b.together.link_stats)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 50), sizes=st.lists(st.sampled_from([1, 2]), min_size=2, max_size=3),
       per_leaf=st.sampled_from([1, 2]), over=st.sampled_from([1, 2, 4]))
def test_adding_a_job_never_makes_another_faster(tmp_path: Path, seed: int, sizes: list[int], per_leaf: int,
                                                 over: int) -> None:
    jobs = [{"name": f"j{i}", "workload": "tiny.yaml", "nodes": n} for i, n in enumerate(sizes)]
    c = load_cluster(write(tmp_path, jobs, layers=1, nodes=6, placement="random", seed=seed,
                           platform_set={"network.nodes_per_leaf": per_leaf, "network.oversubscription": over}))
    setup = _Setup(c, ("analytical",), False)
    ranks = {p.name: p.ranks for p in setup.placed}
    before: dict[str, float] = {}
    for k in range(1, len(jobs) + 1):
        now = job_ends(setup.run(range(k)), {f"j{i}": ranks[f"j{i}"] for i in range(k)})
        for name, t in before.items():
            assert now[name] >= t * (1 - 1e-9), (k, name, now[name], t)
        before = now


def test_the_example_runs_and_writes_its_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert job_kind(EXAMPLE) == "cluster"
    loaded = simgpu.load(EXAMPLE)
    assert simgpu.kind(loaded) == "cluster"
    assert main([str(EXAMPLE), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "neighbour noise" in out and "leaf0.0->spine" in out
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert [j["nodes"] for j in summary["jobs"]] == [[0, 2], [1, 3]]
    assert all(j["slowdown"] > 1.05 for j in summary["jobs"])
    assert summary["links_shared"] > 0
    assert (tmp_path / "o" / "timeline.png").stat().st_size > 0
