"""Embedding sharding plans, their greedy placement, and the planner that proposes them.

This module owns :class:`Plan` (a sharding type and the ranks of every table, as a TorchRec
``ShardingPlan``), turning the workload's ``parallelism.sharding`` into a plan, memory-aware
greedy placement of the shards that were given no ranks, and :func:`propose_plans`, which proposes
alternative plans for a what-if search to rank by simulating each.

Greedy placement takes the shards largest first and gives each to the least-loaded rank that has
room for it (and holds no other column of its table); the load is what ``balance`` says: ``size``
(bytes of rows and optimizer state), ``lookups`` (bytes the lookups read: ids of the global batch
times the shard's width, i.e. pooling x batch x dim) or ``cost`` (the sum of the two, each as a
share of its total over all tables). Table-row-wise tables are first given to the least-loaded node.
Hybrid tables (HugeCTR's hybrid embedding) span every rank; their frequent rows are counted when
the plan is made (:mod:`~simgpu.workload.dlrm.hybrid`) and kept in the plan.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, get_args

import numpy as np

from ...config.dlrm import DLRMModel
from ...config.sharding import PlannerName, ShardingType
from ...config.workload import WorkloadSpec
from ...errors import ConfigError
from ..registry import World
from .arch import Arch, make_arch
from .embedding import EMB_BYTES, Shard, Table, expand_tables, table_shards
from .hybrid import frequent_counts
from .memory import base_memory, memory_per_rank, shard_footprint

PLANNERS: tuple[str, ...] = get_args(PlannerName)
_MIN_COLUMNS = 32  # default column shards are at least this wide


@dataclass(frozen=True)
class Placement:
    """One table's sharding: its type and the ranks of its shards (every rank for row_wise,
    data_parallel and hybrid, the node's ranks for table_row_wise); ``frequent``: a hybrid
    table's replicated rows."""

    type: ShardingType
    ranks: tuple[int, ...]
    frequent: int = 0


@dataclass(frozen=True)
class Plan:
    """A sharding plan: one :class:`Placement` per table, in table order."""

    name: str
    placements: tuple[Placement, ...]

    def shards(self, tables: Sequence[Table]) -> list[Shard]:
        if len(tables) != len(self.placements):
            raise ValueError(f"plan {self.name!r} places {len(self.placements)} tables, not {len(tables)}")
        return [s for t, p in zip(tables, self.placements, strict=True)
                for s in table_shards(t, p.type, p.ranks, p.frequent)]

    def as_config(self, world: World) -> dict[str, Any]:
        """The ``parallelism.sharding`` value that reproduces this plan exactly."""
        tables: dict[int, dict[str, Any]] = {}
        for i, p in enumerate(self.placements):
            entry: dict[str, Any] = {"type": p.type}
            if p.type in ("table_wise", "column_wise"):
                entry["ranks"] = list(p.ranks)
            elif p.type == "table_row_wise":
                entry["node"] = p.ranks[0] // world.gpus_per_node
            elif p.type == "hybrid":
                entry["frequent_rows"] = p.frequent
            tables[i] = entry
        return {"tables": tables}


def default_column_shards(dim: int, world: int) -> int:
    """Column shards of at least 32 columns (one if narrower), at most one per rank."""
    return max(1, min(world, dim // _MIN_COLUMNS))


def _node_ranks(node: int, world: World) -> tuple[int, ...]:
    return tuple(range(node * world.gpus_per_node, (node + 1) * world.gpus_per_node))


@dataclass
class _Request:
    """What a plan asks of each table before placement: its type, and its ranks or node if fixed."""

    type: ShardingType
    ranks: tuple[int, ...] | None = None
    shards: int = 1
    node: int | None = None
    frequent: int | None = None


class _NoRoom(Exception):
    def __init__(self, table: int) -> None:
        super().__init__(f"table {table} fits on no GPU")
        self.table = table


def _weights(spec: WorkloadSpec, tables: Sequence[Table], world: World, balance: str) -> list[float]:
    """Load per row-and-column of each table (the shard's load is this times its rows x dim)."""
    gb = spec.train.batch_per_gpu * world.size
    ada = spec.train.embedding_optimizer == "adagrad"
    size = [t.nbytes + (4 * t.rows if ada else 0) for t in tables]
    look = [t.ids(gb) * t.dim * EMB_BYTES for t in tables]
    tot_size, tot_look = sum(size) or 1, sum(look) or 1
    if balance == "size":
        load = [float(s) for s in size]
    elif balance == "lookups":
        load = [float(x) for x in look]
    else:
        load = [s / tot_size + x / tot_look for s, x in zip(size, look, strict=True)]
    return [w / (t.rows * t.dim) for w, t in zip(load, tables, strict=True)]


def place(spec: WorkloadSpec, arch: Arch, tables: Sequence[Table], world: World, requests: Sequence[_Request],
          balance: str, capacity: float | None, *, strict: bool, name: str = "plan") -> Plan:
    """Place the shards of ``requests`` greedily (see the module docstring).

    ``capacity`` is bytes per GPU (None: unlimited). With ``strict``, a shard that fits nowhere
    raises :class:`_NoRoom`; otherwise it goes to the least-loaded rank anyway (the memory check
    then reports the overflow).
    """
    n = world.size
    weight = _weights(spec, tables, world, balance)
    requests = _count_frequent(spec, tables, world, requests)
    # provisional ranks give every shard its size; only the ranks of unplaced ones change below
    ranks: list[tuple[int, ...]] = []
    for r in requests:
        if r.ranks is not None:
            ranks.append(r.ranks)
        elif r.type == "table_wise":
            ranks.append((0,))
        elif r.type == "column_wise":
            ranks.append(tuple(range(r.shards)))
        elif r.type == "table_row_wise":
            ranks.append(_node_ranks(r.node or 0, world))
        else:
            ranks.append(tuple(range(n)))
    shards = {t.index: table_shards(t, r.type, rk, r.frequent or 0)
              for t, r, rk in zip(tables, requests, ranks, strict=True)}
    base = base_memory(spec, arch, [s for ss in shards.values() for s in ss]).total
    used = [base] * n
    load = [0.0] * n

    def cost(s: Shard) -> tuple[float, float]:
        return weight[s.table.index] * s.rows * s.dim, shard_footprint(spec, s, n).total

    def fits(rank: int, need: float) -> bool:
        return capacity is None or used[rank] + need <= capacity

    def put(s: Shard, rank: int) -> Shard:
        c, m = cost(s)
        load[rank] += c
        used[rank] += m
        return dataclasses.replace(s, rank=rank)

    pending_nodes = [t.index for t, r in zip(tables, requests, strict=True)
                     if r.type == "table_row_wise" and r.node is None]
    pending_ranks = [t.index for t, r in zip(tables, requests, strict=True)
                     if r.type in ("table_wise", "column_wise") and r.ranks is None]
    pending = set(pending_nodes) | set(pending_ranks)
    for i, ss in shards.items():
        if i not in pending:
            shards[i] = [put(s, s.rank) for s in ss]
    for i in sorted(pending_nodes, key=lambda i: (-sum(cost(s)[0] for s in shards[i]), i)):
        per = [cost(s) for s in shards[i]]
        options = [(sum(load[r] for r in _node_ranks(nd, world)), nd) for nd in range(world.nodes)
                   if all(fits(r, m) for r, (_, m) in zip(_node_ranks(nd, world), per, strict=True))]
        if not options:
            if strict:
                raise _NoRoom(i)
            options = [(sum(load[r] for r in _node_ranks(nd, world)), nd) for nd in range(world.nodes)]
        node = min(options)[1]
        shards[i] = [put(s, r) for s, r in zip(shards[i], _node_ranks(node, world), strict=True)]
    units = [(i, k) for i in pending_ranks for k in range(len(shards[i]))]
    units.sort(key=lambda u: (-cost(shards[u[0]][u[1]])[0], u))
    taken: dict[int, set[int]] = {i: set() for i in pending_ranks}
    for i, k in units:
        s = shards[i][k]
        need = cost(s)[1]
        free = [r for r in range(n) if r not in taken[i]]
        room = [r for r in free if fits(r, need)]
        if not room:
            if strict:
                raise _NoRoom(i)
            room = free
        rank = min(room, key=lambda r: (load[r], r))
        taken[i].add(rank)
        shards[i][k] = put(s, rank)
    return Plan(name, tuple(Placement(r.type, rk, r.frequent or 0) if r.type == "hybrid"
                            else Placement(r.type, tuple(s.rank for s in shards[t.index]))
                            for t, r, rk in zip(tables, requests, ranks, strict=True)))


def _count_frequent(spec: WorkloadSpec, tables: Sequence[Table], world: World,
                    requests: Sequence[_Request]) -> list[_Request]:
    """``requests`` with every hybrid table's frequent rows counted (those given kept), all hybrid
    tables together under HugeCTR's cap (:func:`~simgpu.workload.dlrm.hybrid.frequent_counts`)."""
    out = list(requests)
    mixed = [(t, r) for t, r in zip(tables, requests, strict=True) if r.type == "hybrid"]
    if not mixed:
        return out
    given = {t.index: r.frequent for t, r in mixed if r.frequent is not None}
    counts = frequent_counts([t for t, _ in mixed], given, spec.parallelism.sharding.hybrid, world.nodes,
                             world.size, spec.train.batch_per_gpu * world.size)
    for t, r in mixed:
        out[t.index] = dataclasses.replace(r, frequent=counts[t.index])
    return out


def _fits(spec: WorkloadSpec, arch: Arch, tables: Sequence[Table], plan: Plan, world: World,
          capacity: float | None) -> bool:
    if capacity is None:
        return True
    return all(m.total <= capacity for m in memory_per_rank(spec, arch, plan.shards(tables), world.size))


def _place_or_spread(spec: WorkloadSpec, arch: Arch, tables: Sequence[Table], world: World,
                     requests: list[_Request], balance: str, capacity: float | None, name: str) -> Plan | None:
    """Strict placement; a table that fits on no GPU becomes row-wise (spread over all), then retry.
    None if even that does not fit."""
    requests = [dataclasses.replace(r) for r in requests]
    for _ in range(len(tables) + 1):
        try:
            plan = place(spec, arch, tables, world, requests, balance, capacity, strict=True, name=name)
        except _NoRoom as e:
            if requests[e.table].type == "row_wise":
                return None
            requests[e.table] = _Request("row_wise")
            continue
        return plan if _fits(spec, arch, tables, plan, world, capacity) else None
    return None


def _proposals(spec: WorkloadSpec, arch: Arch, tables: Sequence[Table], world: World,
               gpu_memory_gib: float | None) -> dict[str, Plan | None]:
    """Every named proposal (None where it does not fit in memory)."""
    n = world.size
    gb = spec.train.batch_per_gpu * n
    capacity = None if gpu_memory_gib is None else gpu_memory_gib * 2**30
    size = [t.nbytes for t in tables]
    look = [t.ids(gb) * t.dim for t in tables]
    # tables above half an even share of all bytes (lookups) would unbalance table-wise placement
    big = {t.index for t in tables if size[t.index] > sum(size) / (2 * n)}
    hot = {t.index for t in tables if look[t.index] > sum(look) / (2 * n)}

    def tw(t: Table) -> _Request:
        return _Request("table_wise")

    def hot_cw(t: Table) -> _Request:
        if t.index not in hot:
            return tw(t)
        k = min(n, t.dim, max(2, math.ceil(look[t.index] / (sum(look) / n))))
        return _Request("column_wise", shards=k)

    def with_types(kind: str) -> list[_Request]:
        out = []
        for t in tables:
            if kind == "row_wise_large" and t.index in big:
                out.append(_Request("row_wise"))
            elif kind == "table_row_wise_large" and t.index in big:
                out.append(_Request("table_row_wise"))
            elif kind == "column_wise_hot":
                out.append(hot_cw(t))
            elif kind == "data_parallel_small" and t.rows <= gb:
                out.append(_Request("data_parallel"))
            elif kind == "hybrid_skewed" and t.zipf_alpha > 0:
                out.append(_Request("hybrid", ranks=tuple(range(n))))
            else:
                out.append(tw(t))
        return out

    out: dict[str, Plan | None] = {}
    for name in PLANNERS:
        balance = {"greedy_size": "size", "greedy_lookups": "lookups"}.get(name, "cost")
        if (name == "table_row_wise_large" and world.nodes < 2) or \
                (name == "hybrid_skewed" and not any(t.zipf_alpha > 0 for t in tables)):
            out[name] = None
            continue
        out[name] = _place_or_spread(spec, arch, tables, world, with_types(name), balance, capacity, name)
    return out


def _dlrm(spec: WorkloadSpec) -> DLRMModel:
    if not isinstance(spec.model, DLRMModel):
        raise TypeError(f"sharding plans are for DLRM models, not {spec.model.kind}")
    return spec.model


def propose_plans(spec: WorkloadSpec, world: World, gpu_memory_gib: float | None = None) -> list[Plan]:
    """Distinct sharding plans of ``spec``'s DLRM on ``world`` that fit in ``gpu_memory_gib`` per
    GPU (default ``world.gpu_memory_gib``; None: no limit), for a search to rank by simulating each.

    ``greedy_size``, ``greedy_lookups``, ``greedy_cost``: every table table-wise, balanced by
    size, lookups or both; ``row_wise_large`` / ``table_row_wise_large``: tables larger than half
    an even share of all table bytes row-wise / table-row-wise (2+ nodes), the rest as greedy_cost;
    ``column_wise_hot``: tables with more than half an even share of the lookups split into column
    shards (as many as even shares they hold, at least 2);
    ``data_parallel_small``: tables with no more rows than the global batch replicated;
    ``hybrid_skewed`` (only where some table's ids are Zipf-distributed): those tables hybrid
    (HugeCTR's hybrid embedding, frequent rows by its rule), the rest as greedy_cost. In every
    plan a table that fits on no GPU is made row-wise. A plan equal to an earlier one is left out.
    Use a plan with ``spec.parallelism.sharding = plan.as_config(world)``.
    """
    model = _dlrm(spec)
    tables = expand_tables(model, np.random.default_rng(spec.seed))
    mem = world.gpu_memory_gib if gpu_memory_gib is None else gpu_memory_gib
    plans: list[Plan] = []
    for plan in _proposals(spec, make_arch(model, tables), tables, world, mem).values():
        if plan is not None and all(plan.placements != p.placements for p in plans):
            plans.append(plan)
    return plans


def resolve_plan(spec: WorkloadSpec, arch: Arch, tables: Sequence[Table], world: World) -> Plan:
    """The plan ``spec.parallelism.sharding`` asks for (validated by :func:`simgpu.config.checks.check_dlrm`)."""
    cfg = spec.parallelism.sharding
    if cfg.planner is not None:
        plan = _proposals(spec, arch, tables, world, world.gpu_memory_gib)[cfg.planner]
        if plan is None:
            if cfg.planner == "table_row_wise_large" and world.nodes < 2:
                why = "needs 2 or more nodes"
            elif cfg.planner == "hybrid_skewed" and not any(t.zipf_alpha > 0 for t in tables):
                why = "needs a table with a skewed id distribution (distribution: {kind: zipf, alpha: ...})"
            else:
                why = f"does not fit in {world.gpu_memory_gib:g} GiB per GPU"
            raise ConfigError(f"the planner's {cfg.planner} plan {why}; expected another planner or more GPUs",
                              key="parallelism.sharding.planner")
        return plan
    requests = []
    for t in tables:
        ts = cfg.tables.get(t.index)
        type_ = ts.type if ts is not None else cfg.default
        r = _Request(type_)
        if ts is not None and ts.ranks is not None:
            r.ranks = tuple(ts.ranks)
        elif type_ in ("row_wise", "data_parallel", "hybrid"):
            r.ranks = tuple(range(world.size))
            r.frequent = ts.frequent_rows if ts is not None else None
        elif type_ == "table_row_wise" and ts is not None and ts.node is not None:
            r.ranks = _node_ranks(ts.node, world)
            r.node = ts.node
        elif type_ == "column_wise":
            r.shards = ts.shards if ts is not None and ts.shards else default_column_shards(t.dim, world.size)
        requests.append(r)
    capacity = None if world.gpu_memory_gib is None else world.gpu_memory_gib * 2**30
    return place(spec, arch, tables, world, requests, cfg.balance, capacity, strict=False, name="explicit")
