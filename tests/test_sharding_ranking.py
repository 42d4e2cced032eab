"""The sharding-choice study (``python -m simgpu.validate.sharding``) and the planner's cost model."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu.validate import sharding as study
from simgpu.workload import World
from simgpu.workload.dlrm.cost import Bandwidths, plan_cost, shard_cost
from simgpu.workload.dlrm.embedding import Table
from simgpu.workload.dlrm.sharding import Placement, Plan, propose_plans

MODELS = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[pd.DataFrame, Path, str]:
    """A small study through its command: the rows it wrote, the figure and what it printed."""
    out = tmp_path_factory.mktemp("sharding")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert study.main(["--models", str(MODELS), "--seed", "0", "--figure", str(out / "f.png"),
                           "--csv", str(out / "rows.csv")]) == 0
    return pd.read_csv(out / "rows.csv"), out / "f.png", buf.getvalue()


def test_every_candidate_plan_is_simulated_and_ranked(run: tuple[pd.DataFrame, Path, str]) -> None:
    rows, fig, printed = run
    models = study.draw_models(MODELS, 0)
    assert sorted(rows["model"].unique()) == [m.index for m in models]
    for m in models:
        job = study.job_of(m)
        world = World(m.nodes, study.GPUS_PER_NODE, job.platform.gpu.memory_gib)
        names = [p.name for p in propose_plans(job.workload, world)]
        assert rows.loc[rows["model"] == m.index, "plan"].tolist() == names
    for r in study.RANKERS:
        assert (rows[r] > 0).all() and np.isfinite(rows[r]).all()
    scores = study.score(rows).set_index("ranker")
    assert set(scores.index) == {*study.RANKERS, "random pick"}
    for col in ("top1", "top3"):
        assert scores[col].between(0, 1).all()
    assert (scores["top3"] >= scores["top1"]).all()
    assert (scores["mean_slowdown"] >= 0).all()
    sim = scores.loc["simulation"]
    assert sim["top1"] == 1 and sim["top3"] == 1 and sim["mean_slowdown"] == 0  # by construction
    assert fig.stat().st_size > 0
    assert "| planner cost |" in printed and "wall time" in printed


def test_same_seed_same_study(run: tuple[pd.DataFrame, Path, str]) -> None:
    """Models are drawn in order from one generator: a shorter study of the same seed repeats the
    longer one's first models exactly, and another seed draws other models."""
    assert study.draw_models(5, 7) == study.draw_models(5, 7)
    assert study.draw_models(5, 7) != study.draw_models(5, 8)
    assert study.draw_models(5, 7)[:2] == study.draw_models(2, 7)
    rows = run[0]
    again = study.study(2, 0)
    first = rows[rows["model"] < 2].reset_index(drop=True)
    pd.testing.assert_frame_equal(again, first, check_dtype=False, rtol=1e-12)
    pd.testing.assert_frame_equal(study.score(again), study.score(first), rtol=1e-12)


def test_score_counts_ties_and_slowdowns() -> None:
    """Hand-made times: plan 1 is fastest; plan 0 is within the 1% tie."""
    rows = pd.DataFrame({"model": [0, 0, 0, 0], "nodes": [1, 1, 1, 1], "plan": list("abcd"), "order": [0, 1, 2, 3],
                         "simulation": [1.005, 1.0, 1.2, 1.5], "fast estimate": [3.0, 2.0, 1.0, 4.0],
                         "planner cost": [1.0, 2.0, 3.0, 4.0]})
    s = study.score(rows).set_index("ranker")
    assert s.loc["planner cost", "top1"] == 1  # picks a tie
    assert s.loc["fast estimate", "top1"] == 0 and s.loc["fast estimate", "top3"] == 1
    assert s.loc["fast estimate", "mean_slowdown"] == pytest.approx(0.2)
    assert s.loc["random pick", "top1"] == pytest.approx(0.5)
    assert s.loc["random pick", "top3"] == pytest.approx(1.0)
    strict = study.score(rows, tie=0.0).set_index("ranker")
    assert strict.loc["planner cost", "top1"] == 0


@given(st.lists(st.tuples(st.integers(1_000, 10_000_000), st.sampled_from([16, 32, 64, 128]),
                          st.floats(1.0, 100.0)), min_size=2, max_size=24),
       st.sampled_from([1, 2]), st.sampled_from([256, 1024]))
@settings(max_examples=60)
def test_planner_cost_puts_one_hot_rank_behind_a_balanced_plan(
        spec: list[tuple[int, int, float]], nodes: int, batch: int) -> None:
    """All tables table-wise on rank 0 costs more than the same tables dealt round-robin: the
    planner's cost is the busiest rank's, and rank 0 then holds every lookup."""
    tables = [Table(i, rows, dim, pooling) for i, (rows, dim, pooling) in enumerate(spec)]
    world = World(nodes, 8)
    bw = Bandwidths.of(study.shipped_platform()[0])
    one = Plan("one_rank", tuple(Placement("table_wise", (0,)) for _ in tables))
    dealt = Plan("dealt", tuple(Placement("table_wise", (i % world.size,)) for i in range(len(tables))))
    assert plan_cost(one, tables, batch, world, bw) > plan_cost(dealt, tables, batch, world, bw)
    total = sum(shard_cost(s, batch, world).seconds(bw) for s in one.shards(tables))
    assert plan_cost(one, tables, batch, world, bw) == pytest.approx(total)


def test_fast_estimate_puts_one_hot_rank_behind_a_balanced_plan() -> None:
    model = study.draw_models(1, 0)[0]
    n = len(model.tables)
    fast = study.FastEstimator(study.shipped_platform()[0])
    world = model.nodes * study.GPUS_PER_NODE
    one = {"tables": {i: {"type": "table_wise", "ranks": [0]} for i in range(n)}}
    dealt = {"tables": {i: {"type": "table_wise", "ranks": [i % world]} for i in range(n)}}
    assert fast(study.job_of(model, one)) > fast(study.job_of(model, dealt))
