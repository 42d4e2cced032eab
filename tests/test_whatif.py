"""What-if studies: variant expansion, resuming, failures recorded, a real local Dask cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import ROOT

from simgpu.errors import ConfigError
from simgpu.whatif.__main__ import main
from simgpu.whatif.runner import load_rows, run_study
from simgpu.whatif.study import StudySpec, expand, load_study

BASE = ROOT / "workloads" / "gpt2_small_pcie_4gpu.yaml"


def study_file(tmp_path: Path, **extra) -> Path:
    data = {"name": "t", "base": str(BASE), "set": {"model.layers": 1, "model.seq_len": 256}} | extra
    p = tmp_path / "study.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_grid_and_list_expand_in_a_stable_order():
    spec = StudySpec.model_validate({"name": "s", "base": "x.yaml", "set": {"a": 1},
                                     "variants": [{"name": "v", "set": {"b": 2}}],
                                     "grid": {"c": [1, 2], "d": ["x", "y"]}})
    vs = expand(spec)
    assert [v.name for v in vs] == ["v", "c=1, d=x", "c=1, d=y", "c=2, d=x", "c=2, d=y"]
    assert all(v.overrides[0] == ("a", 1) for v in vs)
    assert [v.id for v in vs] == [v.id for v in expand(spec)] and len({v.id for v in vs}) == 5


def test_bad_study_files(tmp_path):
    with pytest.raises(ConfigError, match=r"grid\.nodes: expected a non-empty list"):
        load_study(study_file(tmp_path, grid={"nodes": []}))
    with pytest.raises(ConfigError, match="base workload"):
        load_study(study_file(tmp_path, base="nope.yaml"))
    with pytest.raises(ConfigError, match="unknown key"):
        load_study(study_file(tmp_path, gird={"nodes": [1]}))


def test_study_runs_records_failures_and_resumes(tmp_path, capsys):
    p = study_file(tmp_path, grid={"platform.network.nic_gbps": [100, 400]},
                   variants=[{"name": "typo", "set": {"parallelism.dp": 3}},
                             {"name": "huge", "set": {"training.batch_per_gpu": 4096}}])
    out = tmp_path / "out"
    assert main([str(p), "--out", str(out), "--workers", "2", "--quiet"]) == 0
    table = pd.read_csv(out / "results.csv").set_index("name")
    assert table.loc["typo", "status"] == "invalid" and "parallelism.dp" in table.loc["typo", "why"]
    assert table.loc["huge", "status"] == "infeasible" and "does not fit" in table.loc["huge", "why"]
    ok = table[table["status"] == "ok"]
    assert len(ok) == 2 and (ok["iteration_time_ms"] > 0).all()
    assert (out / "bars.png").stat().st_size > 0 and (out / "lines.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "rank" in printed and "infeasible" in printed
    # an interrupted study resumes: drop one row and truncate the file mid-line
    rows = load_rows(out / "results.jsonl")
    (out / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:-1]) + '\n{"id": "trunc')
    study = load_study(p)
    ran = []
    again = run_study(study, out, workers=1, progress=lambda i, n, r: ran.append(r["name"]))
    assert len(ran) == 1 and len(again) == 4


def test_dask_local_cluster(tmp_path):
    distributed = pytest.importorskip("distributed")
    p = study_file(tmp_path, grid={"platform.network.nic_gbps": [100, 800]})
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        rows = run_study(load_study(p), tmp_path / "dask", scheduler=cluster.scheduler_address)
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert rows[1]["iteration_time_ms"] <= rows[0]["iteration_time_ms"]


def test_shipped_study_is_valid():
    study = load_study(ROOT / "workloads" / "studies" / "faster_nic.yaml")
    assert len(study.variants) == 8 and study.base.is_file()


def _table(n: int) -> pd.DataFrame:
    return pd.DataFrame({"name": [f"variant {i}" for i in range(n)], "feasible": True,
                         "a": [i % 4 + 1 for i in range(n)], "b": [i // 4 for i in range(n)],
                         "iteration_time_ms": [10.0 + i for i in range(n)], "compute_ms": 8.0,
                         "exposed_communication_ms": 1.0, "idle_ms": 1.0})


@pytest.mark.parametrize("n, pages", [(5, 1), (48, 1), (300, 4)])
def test_bars_wrap_and_paginate(tmp_path, n, pages):
    import struct

    from simgpu.whatif.plots import bars

    paths = bars(_table(n), tmp_path / "bars.png", "t")
    assert len(paths) == pages and paths[0] == tmp_path / "bars.png"
    for p in paths:
        width, _ = struct.unpack(">II", p.read_bytes()[16:24])
        assert width <= 13 * 120
    assert len(bars(_table(5), tmp_path / "bars.png", "t")) == 1
    assert sorted(q.name for q in tmp_path.iterdir()) == ["bars.png"]  # stale pages removed


def test_lines_never_reuse_a_colour(tmp_path):
    import matplotlib.pyplot as plt

    from simgpu.whatif import plots

    seen = []
    real = plots.plt.subplots

    def spy(*a, **k):
        fig, ax = real(*a, **k)
        seen.append(ax)
        return fig, ax

    plots.plt.subplots = spy
    try:
        assert plots.lines(_table(100), ["a", "b"], tmp_path / "lines.png", "t")
    finally:
        plots.plt.subplots = real
    solid = [ln for ln in seen[0].lines if ln.get_linestyle() == "-"]
    assert len(solid) == 25
    assert len({tuple(plt.matplotlib.colors.to_rgba(ln.get_color())) for ln in solid}) == 25


def test_variants_that_differ_in_work_are_ranked_by_throughput():
    from simgpu.whatif.__main__ import ranking

    table = pd.DataFrame({"name": ["small batch", "big batch"], "feasible": True, "status": "ok", "why": "",
                          "iteration_time_ms": [10.0, 15.0], "samples_per_s": [1000.0, 2000.0],
                          "samples": [10, 30], "exposed_communication_ms": 1.0, "mfu": 0.5})
    text = ranking(table)
    assert "ranked by throughput" in text
    assert text.index("big batch") < text.index("small batch")
    same = table.assign(samples=10, samples_per_s=[1000.0, 666.7])
    assert "ranked by throughput" not in ranking(same)
    assert ranking(same).index("small batch") < ranking(same).index("big batch")


def test_many_failures_are_summarised_by_reason():
    from simgpu.whatif.__main__ import ranking

    bad = pd.DataFrame({"name": [f"v{i}" for i in range(30)], "feasible": False, "status": "invalid",
                        "why": [f"w.yaml: parallelism.dp: dp={i} does not match the world size" for i in range(30)],
                        "iteration_time_ms": None, "samples_per_s": None, "samples": None,
                        "exposed_communication_ms": None, "mfu": None})
    text = ranking(bad)
    assert "30 variants did not run, by reason:" in text and text.count("does not match") == 1


def test_a_base_value_the_grid_replaces_is_not_an_error(tmp_path):
    base = tmp_path / "b.yaml"
    base.write_text(BASE.read_text().replace("nodes: 1", "nodes: 0"))
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "s", "base": str(base), "grid": {"nodes": [1, 2]}}))
    assert len(load_study(p).variants) == 2
    p.write_text(yaml.safe_dump({"name": "s", "base": str(base), "grid": {"platform.network.nic_gbps": [100]}}))
    with pytest.raises(ConfigError, match="nodes"):
        load_study(p)


def test_lines_group_by_a_list_valued_key(tmp_path):
    """A grid over a list-valued key (a straggler's ranks) draws one line per list."""
    import pandas as pd

    from simgpu.whatif.plots import lines

    table = pd.DataFrame({"feasible": [True] * 4, "variability.slow.0.factor": [1.0, 2.0, 1.0, 2.0],
                          "variability.slow.0.ranks": [[5], [5], [5, 13], [5, 13]],
                          "iteration_time_ms": [10.0, 20.0, 10.0, 20.5], "exposed_communication_ms": [1.0] * 4})
    assert lines(table, ["variability.slow.0.factor", "variability.slow.0.ranks"], tmp_path / "l.png", "t")
    assert (tmp_path / "l.png").stat().st_size > 0
