"""HugeCTR's hybrid embedding as a sharding type: the frequent/infrequent split, the ops a hybrid
table adds, its plan round-trip, the planner's proposal and the errors of bad input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_dlrm_sharding import B, calls, matrix, plan_of, spec

from simgpu.config.checks import check_dlrm
from simgpu.config.sharding import HybridSettings
from simgpu.errors import ConfigError
from simgpu.workload import World
from simgpu.workload.dlrm import builder as dlrm
from simgpu.workload.dlrm import embedding, hybrid, sharding

SKEWED = [{"rows": 200_000, "dim": 16, "pooling_factor": 2.0, "distribution": {"kind": "zipf", "alpha": 1.1}},
          {"rows": 20_000, "dim": 16, "pooling_factor": 1.0, "distribution": {"kind": "zipf", "alpha": 0.9}},
          {"rows": 6, "dim": 16, "pooling_factor": 1.0, "distribution": {"kind": "uniform"}},
          {"rows": 3000, "dim": 16, "pooling_factor": 3.0}]
HYBRID = {"default": "hybrid", "tables": {3: {"type": "table_wise"}}}


def test_harmonic_and_share_match_exact_sums() -> None:
    for n, alpha in ((10, 1.05), (5000, 0.8), (300_000, 1.2)):
        k = np.arange(1, n + 1, dtype=float) ** -alpha
        assert embedding.zipf_harmonic(n, alpha) == pytest.approx(k.sum(), rel=1e-5)
        assert embedding.zipf_share(n, n // 10, alpha) == pytest.approx(k[: n // 10].sum() / k.sum(), rel=1e-4)
    assert embedding.zipf_share(1000, 100, 0.0) == pytest.approx(0.1)
    assert (embedding.zipf_share(1000, 0, 1.1), embedding.zipf_share(1000, 1000, 1.1)) == (0.0, 1.0)


def test_more_skew_replicates_more_rows_and_uniform_ids_none() -> None:
    rows, lookups, h = 10_000_000, 65_536, 5.0
    alphas = (0.6, 0.8, 0.9, 1.0, 1.2, 1.5)
    counts = [hybrid.frequent_rows(rows, lookups, a, h) for a in alphas]
    # up to alpha 1 more skew replicates more rows; beyond, the hits crowd into fewer rows, but
    # the share of the lookups the replicas serve keeps growing
    assert counts[:4] == sorted(counts[:4]) and 0 < counts[0] < counts[3]
    served = [embedding.zipf_share(rows, f, a) for f, a in zip(counts, alphas, strict=True)]
    assert served == sorted(served) and served[-1] > 0.5 > served[0]
    assert hybrid.frequent_rows(rows, lookups, 0.0, h) == 0          # uniform: no row is hit 5 times
    assert hybrid.frequent_rows(1000, lookups, 0.0, h) == 1000       # ... unless the table is small
    # every frequent row has at least h expected hits, the first infrequent one fewer
    for a, f in zip(alphas, counts, strict=True):
        p = np.array([f, f + 1], dtype=float) ** -a / embedding.zipf_harmonic(rows, a)
        hits = lookups * p
        assert f == 0 or hits[0] >= h * (1 - 1e-9)
        assert hits[1] < h
    assert hybrid.frequent_rows(rows, lookups * 4, 1.0, h) > hybrid.frequent_rows(rows, lookups, 1.0, h)


def test_threshold_is_hugectrs() -> None:
    s = HybridSettings()
    # across nodes: n^2 / (n - 1) * (B_a2a / B_ar)
    assert hybrid.threshold_hits(s, 8, 64, 71680) == pytest.approx(64 / 7 * 190 / 130)
    # inside a node: G sqrt(2 p_dup / (M (M - 1))), M the per-GPU batch
    assert hybrid.threshold_hits(s, 1, 8, 55296) == pytest.approx(55296 * np.sqrt(0.02 / (6912 * 6911)))
    assert hybrid.threshold_hits(s, 1, 8, 8) == float("inf")  # one sample a GPU: nothing duplicates


def test_cap_keeps_the_most_hit_rows_across_tables() -> None:
    tables = [embedding.Table(0, 5_000_000, 16, 1.0, 1.2), embedding.Table(1, 5_000_000, 16, 1.0, 0.9)]
    free = hybrid.frequent_counts(tables, {}, HybridSettings(max_frequent_per_batch=1e6), 2, 16, 8192)
    capped = hybrid.frequent_counts(tables, {}, HybridSettings(max_frequent_per_batch=0.01), 2, 16, 8192)
    assert sum(free.values()) > 81.92 >= sum(capped.values()) > 0.9 * 81.92
    assert all(capped[i] <= free[i] for i in free)
    given = hybrid.frequent_counts(tables, {1: 7}, HybridSettings(), 2, 16, 8192)
    assert given[1] == 7 and given[0] == free[0]


def test_hybrid_shards_split_rows_and_ids() -> None:
    world = World(2, 4)
    tables, plan = plan_of(spec(HYBRID, tables=SKEWED), world)
    assert [p.type for p in plan.placements] == ["hybrid"] * 3 + ["table_wise"]
    f0, f1, f2 = (p.frequent for p in plan.placements[:3])
    assert 0 < f0 < tables[0].rows and 0 < f1 < tables[1].rows and f2 == tables[2].rows  # 6 rows: all hot
    shards = plan.shards(tables)
    for t, f in zip(tables[:3], (f0, f1, f2), strict=True):
        mine = [s for s in shards if s.table.index == t.index]
        hot = [s for s in mine if s.frequent]
        cold = [s for s in mine if not s.frequent]
        assert sorted(s.rank for s in hot) == list(range(world.size)) and all(s.rows == f for s in hot)
        assert sum(s.rows for s in cold) == t.rows - f
        assert (len(cold) == world.size) == (f < t.rows)
        # every id lands once: on the local replica or on one block
        assert hot[0].share + sum(s.share or 0 for s in cold) == pytest.approx(1.0)
        assert hot[0].share == pytest.approx(embedding.zipf_share(t.rows, f, t.zipf_alpha))


def test_builder_all_reduces_frequent_gradients_and_exchanges_the_rest() -> None:
    world = World(2, 4)
    s = spec({**HYBRID, "comm_precision": "fp16"}, tables=SKEWED)
    w = dlrm.build(s, world)
    tables, plan = plan_of(s, world)
    shards = plan.shards(tables)
    every = calls(w)
    # the frequent rows' gradients: one all-reduce over every GPU, fp16 on the wire
    (ar,) = {c.nbytes for c in every["emb.hy.frequent_ar"].values()}
    assert every["emb.hy.frequent_ar"][0].op == "all_reduce"
    assert ar == 2 * sum(p.frequent * t.dim for p, t in zip(plan.placements, tables, strict=True) if p.type == "hybrid")
    assert sorted(every["emb.hy.frequent_ar"]) == list(range(world.size))
    # the infrequent ids go to their owners; the vectors come back and their gradients return
    ids = matrix(every["emb.hy.input_a2a"])
    out, grad = matrix(every["emb.hy.output_a2a"]), matrix(every["emb.hy.grad_a2a"])
    for (_, j), nbytes in ids.items():
        cold = [x for x in shards if x.type == "hybrid" and not x.frequent and x.rank == j]
        assert nbytes == sum(x.ids_from_each_rank(B) * 8 + B * 4 for x in cold)
    for (i, j), nbytes in out.items():
        cold = [x for x in shards if x.type == "hybrid" and not x.frequent and x.rank == i]
        assert nbytes == sum(x.bags_from_each_rank(B) * x.dim for x in cold) * 2 > 0
        assert grad[j, i] == nbytes
    for p in w.programs:
        ops = {op.name: op for op in p.ops}
        hot = [w.kernels[op.kernel] for op in p.ops if op.name.startswith("emb.hy.frequent.group")]
        assert hot and all(k.get("batch") == B for k in hot)  # replicas read the local batch
        cold = [w.kernels[op.kernel] for op in p.ops
                if op.name.startswith("emb.hy.infrequent.group") and op.phase == "fwd"]
        got = sum(k.get("batch") * k.get("pooling") * k.get("tables") for k in cold)
        blocks = sum(x.type == "hybrid" and not x.frequent and x.rank == p.rank for x in shards)
        assert blocks == 2  # the 6-row table is replicated whole
        assert got * 8 == pytest.approx(sum(ids[i, p.rank] for i in range(world.size)) - world.size * B * 4 * blocks)
        # the replicas are stepped once their gradients are reduced
        step = ops["emb.hy.frequent_step"]
        assert p.ops.index(ops["emb.hy.frequent_ar"]) in step.deps
        assert w.kernels[step.kernel].get("numel") == sum(x.rows * x.dim for x in shards
                                                         if x.frequent and x.rank == p.rank)


def test_hybrid_memory_is_the_replica_plus_a_share() -> None:
    world = World(2, 4)
    s = spec(HYBRID, tables=SKEWED)
    tables, plan = plan_of(s, world)
    shards = plan.shards(tables)
    hot = [x for x in shards if x.frequent and x.rank == 0]
    cold = [x for x in shards if x.type == "hybrid" and not x.frequent and x.rank == 0]
    mem = [embedding.footprint(x, B, world.size, "adagrad", 2) for x in hot + cold]
    assert sum(m.embeddings for m in mem) == sum(x.rows * x.dim * 4 for x in hot) + \
        sum(x.rows * (x.dim * 4 + 4) for x in cold)
    assert all(m.gradients == x.nbytes for m, x in zip(mem, hot, strict=False))


@pytest.mark.parametrize("cfg", [HYBRID, {**HYBRID, "tables": {0: {"type": "hybrid", "frequent_rows": 10}}},
                                 {"planner": "hybrid_skewed"}])
def test_plan_as_config_reproduces_the_hybrid_plan(cfg: Any) -> None:
    world = World(2, 4)
    _, plan = plan_of(spec(cfg, tables=SKEWED), world)
    assert "hybrid" in {p.type for p in plan.placements}
    again = spec(plan.as_config(world), tables=SKEWED)
    assert plan_of(again, world)[1].placements == plan.placements
    if "tables" in cfg and 0 in cfg["tables"]:
        assert plan.placements[0].frequent == 10


def test_planner_proposes_hybrid_only_for_skewed_tables() -> None:
    world = World(2, 4)
    names = {p.name for p in sharding.propose_plans(spec(tables=SKEWED), world)}
    assert "hybrid_skewed" in names
    plan = next(p for p in sharding.propose_plans(spec(tables=SKEWED), world) if p.name == "hybrid_skewed")
    assert [p.type for p in plan.placements][:2] == ["hybrid", "hybrid"] and plan.placements[3].type != "hybrid"
    assert "hybrid_skewed" not in {p.name for p in sharding.propose_plans(spec(), world)}
    with pytest.raises(ConfigError, match="skewed id distribution") as e:
        check_dlrm(spec({"planner": "hybrid_skewed"}), 2, 4)
    assert e.value.key == "parallelism.sharding.planner"


@pytest.mark.parametrize(("cfg", "key", "match"), [
    ("hybrid", "parallelism.sharding.default", r"table 0 is hybrid but model\.tables\.0\.distribution is not given"
                                               r".*expected .*kind: zipf"),
    ({"tables": {1: {"type": "hybrid"}}}, "parallelism.sharding.tables.1", "frequent_rows"),
    ({"tables": {5: {"type": "hybrid", "frequent_rows": 6}}}, "parallelism.sharding.tables.5.frequent_rows",
     "at most 5"),
])
def test_hybrid_rules_name_the_key(cfg: Any, key: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        check_dlrm(spec(cfg), 2, 4, file="w.yaml")
    assert e.value.key == key and e.value.file == "w.yaml"
    with pytest.raises(ConfigError, match=match):
        dlrm.build(spec(cfg), World(2, 4))


def test_frequent_rows_given_need_no_distribution_and_belong_to_hybrid() -> None:
    w = dlrm.build(spec({"tables": {1: {"type": "hybrid", "frequent_rows": 100}}}), World(1, 4))
    assert "emb.hy.frequent_ar" in calls(w)
    with pytest.raises(ValueError, match="frequent_rows is for hybrid tables"):
        spec({"tables": {1: {"type": "row_wise", "frequent_rows": 100}}})
