"""DLRM embedding sharding: every sharding type's shards and collectives, explicit plans, the planner."""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any

import numpy as np
import pytest

from simgpu.config.checks import check_dlrm
from simgpu.config.dlrm import DLRMModel
from simgpu.config.workload import WorkloadSpec
from simgpu.errors import ConfigError
from simgpu.graph import Workload
from simgpu.workload import World
from simgpu.workload.dlrm import arch as dlrm_arch
from simgpu.workload.dlrm import builder as dlrm
from simgpu.workload.dlrm import embedding, sharding

TYPES = ("table_wise", "column_wise", "row_wise", "table_row_wise", "data_parallel")
B = 64  # samples per GPU


def spec(sharding_cfg: Any = "table_wise", *, tables: list[dict[str, Any]] | None = None, batch: int = B,
         interaction: str = "cat", dcn: dict[str, Any] | None = None, seed: int = 0,
         embedding_optimizer: str = "adagrad") -> WorkloadSpec:
    if tables is None:  # varied rows, dims and pooling; table 5 has fewer rows than 8 GPUs
        tables = [{"rows": 1000 * (1 + 7 * i % 11), "dim": (16, 32, 8)[i % 3], "pooling_factor": 1.0 + i % 4}
                  for i in range(5)] + [{"rows": 5, "dim": 16, "pooling_factor": 2.0}]
    model: dict[str, Any] = {"kind": "dlrm", "dense_features": 13, "bottom_mlp": [32, 16], "top_mlp": [64, 1],
                             "embedding_dim": 16, "tables": tables, "interaction": interaction}
    if dcn is not None:
        model["dcn"] = dcn
    return WorkloadSpec.model_validate({
        "name": "dlrm", "platform": "test", "seed": seed, "model": model,
        "training": {"batch_per_gpu": batch, "optimizer": "adam", "embedding_optimizer": embedding_optimizer},
        "parallelism": {"sharding": sharding_cfg}, "comm": {"bucket_mib": 0.05},
    })


def model_of(s: WorkloadSpec) -> DLRMModel:
    assert isinstance(s.model, DLRMModel)
    return s.model


def plan_of(s: WorkloadSpec, world: World) -> tuple[list[embedding.Table], sharding.Plan]:
    tables = embedding.expand_tables(model_of(s), np.random.default_rng(s.seed))
    return tables, sharding.resolve_plan(s, dlrm_arch.make_arch(model_of(s), tables), tables, world)


def calls(w: Workload) -> dict[str, dict[int, Any]]:
    """key -> {rank: CollectiveCall}"""
    out: dict[str, dict[int, Any]] = defaultdict(dict)
    for p in w.programs:
        for op in p.ops:
            if op.coll is not None:
                assert p.rank not in out[op.coll.key], f"{op.coll.key} twice on rank {p.rank}"
                out[op.coll.key][p.rank] = op.coll
    return out


def matrix(members: dict[int, Any]) -> dict[tuple[int, int], int]:
    """(sender, receiver) -> bytes of an all-to-all-v."""
    group = next(iter(members.values())).group
    return {(i, j): members[i].send_bytes[k] for i in group for k, j in enumerate(group)}


def lookup_ids(w: Workload, rank: int, short: str) -> float:
    """Ids the forward lookups of one sharding type read on ``rank``."""
    total = 0.0
    for op in w.programs[rank].ops:
        if op.name.startswith(f"emb.{short}.group") and op.phase == "fwd":
            k = w.kernels[op.kernel]
            total += k.get("batch") * k.get("pooling") * k.get("tables")
    return total


MIXED = {"default": "table_wise", "tables": {0: {"type": "row_wise"}, 1: {"type": "column_wise", "shards": 3},
                                             2: {"type": "table_row_wise"}, 3: {"type": "data_parallel"},
                                             4: {"type": "table_row_wise", "node": 1}}}
CASES = [pytest.param(t, (2, 4), id=t) for t in TYPES] + [
    pytest.param(MIXED, (2, 4), id="mixed-2x4"), pytest.param(MIXED, (4, 2), id="mixed-4x2"),
    pytest.param("row_wise", (1, 8), id="row_wise-more-ranks-than-rows")]


@pytest.mark.parametrize(("cfg", "shape"), CASES)
def test_every_shard_placed_once_and_sizes_sum_to_the_table(cfg: Any, shape: tuple[int, int]) -> None:
    world = World(*shape)
    tables, plan = plan_of(spec(cfg), world)
    shards = plan.shards(tables)
    for t in tables:
        mine = [s for s in shards if s.table.index == t.index]
        kind = mine[0].type
        assert {s.type for s in mine} == {kind}
        if kind == "data_parallel":  # a full replica on every rank
            assert sorted(s.rank for s in mine) == list(range(world.size))
            assert all((s.rows, s.dim) == (t.rows, t.dim) for s in mine)
            continue
        assert len({s.rank for s in mine}) == len(mine)  # never two shards of a table on one rank
        if kind in ("row_wise", "table_row_wise"):
            assert sum(s.rows for s in mine) == t.rows and all(s.dim == t.dim for s in mine)
            offsets = [s.row_offset for s in sorted(mine, key=lambda s: s.row_offset)]
            assert offsets == list(itertools.accumulate([0] + [s.rows for s in mine][:-1]))
            ranks = {s.rank for s in mine}
            if kind == "row_wise":
                assert ranks == set(range(world.size))
            else:  # one node's GPUs
                assert len({r // world.gpus_per_node for r in ranks}) == 1 and len(ranks) == world.gpus_per_node
        else:
            assert sum(s.dim for s in mine) == t.dim and all(s.rows == t.rows for s in mine)
            cols = sorted((s.col_offset, s.col_offset + s.dim) for s in mine)
            assert cols[0][0] == 0 and cols[-1][1] == t.dim
            assert all(a[1] == b[0] for a, b in itertools.pairwise(cols))
            assert len(mine) == (1 if kind == "table_wise" else len(mine))


@pytest.mark.parametrize(("cfg", "shape"), CASES)
def test_collectives_are_consistent_across_ranks(cfg: Any, shape: tuple[int, int]) -> None:
    world = World(*shape)
    s = spec(cfg)
    w = dlrm.build(s, world)
    tables, plan = plan_of(s, world)
    shards = plan.shards(tables)
    g = world.gpus_per_node
    by = defaultdict(list)
    for sh in shards:
        by[sh.type].append(sh)
    every = calls(w)
    for key, members in every.items():
        first = next(iter(members.values()))
        assert sorted(members) == sorted(first.group), key  # every member issues it, nobody else
        for c in members.values():
            assert (c.op, c.group) == (first.op, first.group), key
            if c.send_bytes is None:
                assert c.nbytes == first.nbytes, key
    # relative order of shared collectives is the same on every pair of ranks (no deadlock)
    keys = [[op.coll.key for op in p.ops if op.coll is not None] for p in w.programs]
    for a, b in itertools.combinations(range(world.size), 2):
        shared = set(keys[a]) & set(keys[b])
        assert [k for k in keys[a] if k in shared] == [k for k in keys[b] if k in shared]

    def dims_on(kind: str, rank: int) -> int:
        return sum(sh.dim for sh in by[kind] if sh.rank == rank)

    def table_dims(kind: str, node: int | None = None) -> int:
        return sum(t.dim for t, p in zip(tables, plan.placements, strict=True)
                   if p.type == kind and (node is None or p.ranks[0] // g == node))

    for kind, short in (("table_wise", "tw"), ("column_wise", "cw"), ("row_wise", "rw"), ("table_row_wise", "twrw")):
        if not by[kind]:
            assert not any(k.startswith(f"emb.{short}.") for k in every)
            continue
        # input: what i sends j is the ids of i's samples that j's shards look up
        ids = matrix(every[f"emb.{short}.input_a2a"])
        for (i, j), nbytes in ids.items():
            want = 0
            for sh in by[kind]:
                if sh.rank == j:
                    n = round(B * sh.table.pooling)
                    want += (round(n * sh.rows / sh.table.rows) if sh.by_rows else n) * 8 + B * 4
            assert nbytes == want, (kind, i, j)
        for j in range(world.size):  # and j's lookup kernels read exactly the ids it receives
            got = sum(ids[i, j] for i in range(world.size))
            lengths = world.size * B * 4 * sum(sh.rank == j for sh in by[kind])
            empty = sum(sh.rank == j and sh.rows == 0 for sh in by[kind])
            assert lookup_ids(w, j, short) * 8 == got - lengths, (kind, j, empty)
        if kind in ("table_wise", "column_wise"):
            out, grad = matrix(every[f"emb.{short}.output_a2a"]), matrix(every[f"emb.{short}.grad_a2a"])
            for (i, j), nbytes in out.items():
                assert nbytes == B * dims_on(kind, i) * 4  # i's columns of j's samples
                assert grad[j, i] == nbytes  # the gradients travel back
            for j in range(world.size):  # j receives every column of its samples
                assert sum(out[i, j] for i in range(world.size)) == B * table_dims(kind) * 4
        elif kind == "row_wise":
            (rs,) = {c.nbytes for c in every["emb.rw.output_rs"].values()}
            (ag,) = {c.nbytes for c in every["emb.rw.grad_ag"].values()}
            assert rs == ag == world.size * B * table_dims(kind) * 4
            assert every["emb.rw.output_rs"][0].op == "reduce_scatter" and every["emb.rw.grad_ag"][0].op == "all_gather"
        else:
            for node in range(world.nodes):
                rs = every[f"emb.twrw.output_rs.node{node}"]
                assert sorted(rs) == list(range(node * g, (node + 1) * g))
                assert {c.nbytes for c in rs.values()} == {world.size * B * table_dims(kind, node) * 4}
                assert {c.nbytes for c in every[f"emb.twrw.grad_ag.node{node}"].values()} == \
                    {world.size * B * table_dims(kind, node) * 4}
            for local in range(g):
                out = matrix(every[f"emb.twrw.output_a2a.local{local}"])
                grad = matrix(every[f"emb.twrw.grad_a2a.local{local}"])
                assert {i % g for i, _ in out} == {local}
                for (i, j), nbytes in out.items():
                    assert nbytes == B * table_dims(kind, i // g) * 4 and grad[j, i] == nbytes
                for j in {j for _, j in out}:
                    assert sum(v for (_, jj), v in out.items() if jj == j) == B * table_dims(kind) * 4


def test_data_parallel_tables_are_all_reduced_and_stepped_by_the_dense_optimizer() -> None:
    s = spec({"default": "table_wise", "tables": {3: {"type": "data_parallel"}, 5: {"type": "data_parallel"}}})
    world = World(1, 4)
    w = dlrm.build(s, world)
    tables, _ = plan_of(s, world)
    arch = dlrm_arch.make_arch(model_of(s), tables)
    replicated = tables[3].rows * tables[3].dim + tables[5].rows * tables[5].dim
    for p in w.programs:
        reduced = sum(op.nbytes for op in p.ops if op.category == "all_reduce")
        assert reduced == 4 * (arch.dense_numel + replicated)
        (opt,) = [w.kernels[op.kernel] for op in p.ops if op.category == "optimizer"]
        assert opt.get("numel") == arch.dense_numel + replicated
        # no ids leave the rank for replicated tables: their lookups use the local batch
        dp = [w.kernels[op.kernel] for op in p.ops if op.name.startswith("emb.dp.group")]
        assert dp and all(k.get("batch") == B for k in dp)


def test_explicit_ranks_are_kept_and_the_rest_balanced() -> None:
    cfg = {"default": "table_wise", "tables": {0: {"type": "table_wise", "ranks": [3]},
                                               1: {"type": "column_wise", "ranks": [2, 0]}}}
    tables, plan = plan_of(spec(cfg), World(1, 4))
    assert plan.placements[0] == sharding.Placement("table_wise", (3,))
    assert plan.placements[1] == sharding.Placement("column_wise", (2, 0))
    shards = plan.shards(tables)
    assert [s.dim for s in shards if s.table.index == 1] == [16, 16]


@pytest.mark.parametrize("cfg", ["table_wise", MIXED, {"planner": "column_wise_hot"}])
def test_plan_as_config_reproduces_the_plan(cfg: Any) -> None:
    world = World(2, 4)
    _, plan = plan_of(spec(cfg), world)
    again = spec(plan.as_config(world))
    assert plan_of(again, world)[1].placements == plan.placements


def _memory(s: WorkloadSpec, plan: sharding.Plan, world: World) -> list[float]:
    """Bytes per GPU of ``s`` built with ``plan`` given explicitly."""
    explicit = s.model_copy(update={"parallelism": s.parallelism.model_copy(
        update={"sharding": type(s.parallelism.sharding).model_validate(plan.as_config(world))})})
    return [m.total for m in dlrm.build(explicit, world).memory]


def test_planner_plans_fit_in_memory_and_spread_what_does_not() -> None:
    big = [{"rows": 400_000, "dim": 64, "pooling_factor": 4.0, "count": 2},
           {"rows": 2000, "dim": 64, "pooling_factor": 20.0, "count": 6}]
    s = spec(tables=big, interaction="cat")
    world = World(2, 2)
    unlimited = sharding.propose_plans(s, world)
    assert {p.name for p in unlimited} >= {"greedy_size", "row_wise_large", "table_row_wise_large",
                                           "column_wise_hot"}
    biggest = max(max(_memory(s, p, world)) for p in unlimited)
    # the largest table (102 MB) no longer fits on one GPU next to the rest: plans must spread it
    cap_gib = 0.95 * biggest / 2**30
    plans = sharding.propose_plans(s, world, cap_gib)
    assert plans
    for p in plans:
        assert all(t <= cap_gib * 2**30 for t in _memory(s, p, World(2, 2, cap_gib))), p.name
    # greedy by size cannot keep both large tables whole any more: one of them is spread
    assert any(x.type == "row_wise" for x in plans[0].placements[:2])
    names = [p.name for p in plans]
    assert len(set(map(lambda p: p.placements, plans))) == len(plans)  # distinct plans
    assert names[0] == "greedy_size"
    assert sharding.propose_plans(s, world, 0.001) == []  # nothing fits in 1 MiB


def test_workload_planner_key_uses_the_named_plan_and_rejects_what_does_not_fit() -> None:
    s = spec({"planner": "row_wise_large"})
    world = World(2, 2, 80.0)
    _, plan = plan_of(s, world)
    assert plan.name == "row_wise_large" and "row_wise" in {p.type for p in plan.placements}
    # the same plan is among the proposals (under this name, or an earlier one's if they coincide)
    assert any(p.placements == plan.placements for p in sharding.propose_plans(s, world))
    with pytest.raises(ConfigError, match="does not fit"):
        dlrm.build(s, World(2, 2, 1e-4))


@pytest.mark.parametrize(("cfg", "key", "match"), [
    ({"tables": {6: {"type": "row_wise"}}}, "parallelism.sharding.tables.6", "below 6"),
    ({"tables": {0: {"type": "table_wise", "ranks": [16]}}}, "parallelism.sharding.tables.0.ranks", "below 16"),
    ({"tables": {0: {"type": "table_row_wise", "node": 2}}}, "parallelism.sharding.tables.0.node", "below 2"),
    ({"tables": {0: {"type": "column_wise", "shards": 17}}}, "parallelism.sharding.tables.0.shards", "one per GPU"),
    ({"tables": {2: {"type": "column_wise", "ranks": list(range(9))}}}, "parallelism.sharding.tables.2.ranks",
     "8 columns"),
    ({"planner": "table_row_wise_large"}, "parallelism.sharding.planner", "2 or more nodes"),
])
def test_plan_rules_name_the_key(cfg: dict[str, Any], key: str, match: str) -> None:
    nodes = 1 if "planner" in cfg else 2
    with pytest.raises(ConfigError, match=match) as e:
        check_dlrm(spec(cfg), nodes, 8, file="w.yaml")
    assert e.value.key == key and e.value.file == "w.yaml"
    with pytest.raises(ConfigError, match=match):
        dlrm.build(spec(cfg), World(nodes, 8))


@pytest.mark.parametrize(("cfg", "match"), [
    ({"tables": {0: {"type": "row_wise", "ranks": [1]}}}, "every GPU"),
    ({"tables": {0: {"type": "table_wise", "ranks": [1, 2]}}}, "one rank"),
    ({"tables": {0: {"type": "column_wise", "ranks": [1, 1]}}}, "distinct"),
    ({"tables": {0: {"type": "table_wise", "node": 1}}}, "node is for"),
    ({"planner": "greedy_cost", "default": "row_wise"}, "either planner"),
    ("rowwise", "table_wise"),
])
def test_sharding_section_rejects_bad_input(cfg: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        spec(cfg)


def test_comm_precision_halves_the_pooled_embeddings_on_the_wire() -> None:
    world = World(2, 2)
    full = calls(dlrm.build(spec(MIXED), world))
    half = calls(dlrm.build(spec({**MIXED, "comm_precision": "bf16"}), world))
    assert full.keys() == half.keys()
    pooled = [k for k in full if k.startswith("emb.") and "input" not in k]
    assert len(pooled) >= 6
    for key, members in full.items():
        for r, c in members.items():
            want = c.nbytes // 2 if key in pooled else c.nbytes  # ids and DDP buckets are unchanged
            assert half[key][r].nbytes == want, key
