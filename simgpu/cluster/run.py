"""Simulating the jobs of a cluster together, and each alone, on one topology.

:func:`simulate_cluster` builds every job's programs with its own node count (unfolded: every rank),
places them on their nodes (:func:`simgpu.cluster.merge.merge`) and runs one engine over the union
on the cluster's topology, where the jobs' transfers share every link they cross. It then runs each
job alone, the same way on the same nodes of the same topology with the other nodes idle. A job's
time is the end of its ranks' last record (the jobs start together at 0). The bytes each job moves
over a link are its run alone's: a job's collectives are planned from the topology and their
sizes, not from the load, so they cross the same links with the same bytes beside neighbours
(the shared run's bytes are the jobs' sums).

The shared run keeps the busy intervals of the links between switches with whose transfers kept
them busy (:attr:`~simgpu.result.SimResult.link_records`, one row per link and collective, whose
key starts with its job's name): :func:`job_link_records` gives each job's stretches on a link
(two jobs' overlap where they shared it at once), and :func:`link_table` each job's busy seconds
on the busiest links and the seconds more than one job was on them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

import numpy as np
import pandas as pd

from ..comm.plan import CollectivePlan, CollectiveRequest
from ..comm.planner import Planner
from ..config.workload import INFERENCE_KINDS
from ..engine import Engine, EngineOptions
from ..graph import Workload
from ..kernels.registry import make_predictor
from ..platform.topology import Topology
from ..result import SimResult
from ..sim import DEFAULT_KERNEL_MODEL, build
from .merge import Placed, global_ranks, merge
from .spec import Cluster, ClusterJob


class _JobPlanners(Planner):
    """Each job's collectives planned by its own planner (its workload's algorithm and protocol)."""

    def __init__(self, topo: Topology, planners: Sequence[Planner], owner: np.ndarray) -> None:
        first = planners[0]
        super().__init__(topo, first.spec, first.algorithm, first.protocol)
        self._planners, self._owner = list(planners), owner

    def _of(self, req: CollectiveRequest) -> Planner:
        return self._planners[int(self._owner[req.group[0]])]

    def plan(self, req: CollectiveRequest) -> CollectivePlan:
        return self._of(req).plan(req)

    def candidates(self, req: CollectiveRequest) -> list[CollectivePlan]:
        return self._of(req).candidates(req)


@dataclass
class ClusterResult:
    """The shared run, each job's run alone, and which ranks are whose."""

    cluster: Cluster
    together: SimResult
    alone: dict[str, SimResult]
    ranks: dict[str, np.ndarray]           # job -> its global ranks, in job rank order
    together_s: dict[str, float]
    alone_s: dict[str, float]
    fabric: frozenset[str] = frozenset()   # the links between switches (the only ones jobs can share)
    meta: dict[str, Any] = field(default_factory=dict)

    def slowdown(self, name: str) -> float:
        return self.together_s[name] / self.alone_s[name] if self.alone_s[name] > 0 else float("nan")


def job_ends(result: SimResult, ranks: dict[str, np.ndarray]) -> dict[str, float]:
    """Per job, when its ranks' last record ends."""
    ends = result.records.groupby("rank", observed=True)["end_s"].max()
    return {name: float(ends.reindex(r).max()) if len(r) else 0.0 for name, r in ranks.items()}


class _Setup:
    """What every run of the cluster shares: the topology, each job's programs, kernel times."""

    def __init__(self, cluster: Cluster, kernel_model: str | Sequence[str], record_links: bool) -> None:
        p = cluster.platform
        self.cluster = cluster
        self.topo = Topology(p, cluster.spec.nodes, cluster.gpus_per_node)
        self.placed: list[Placed] = []
        self.planners: list[Planner] = []
        for cj in cluster.jobs:
            w = build(cj.job, fold=False)
            self.placed.append(Placed(cj.name, w, global_ranks(cj.nodes, len(w.programs), cluster.gpus_per_node)))
            comm = cj.job.workload.comm
            self.planners.append(Planner(self.topo, p.collectives, comm.algorithm, comm.protocol))
        self.predictor = cache(lambda: make_predictor(kernel_model, p))
        self.movers: dict[tuple[str, tuple[int, ...]], Any] = {}  # each job's moved ops, between runs
        self.memory_flags = bool(p.gpu.overlap_slowdown_memory) and any(
            cj.job.workload.model.kind not in INFERENCE_KINDS for cj in cluster.jobs)
        self.options = EngineOptions(
            launch_s=p.host.launch_us * 1e-6, cpu_threads_per_node=p.host.cpu_threads,
            overlap_slowdown=p.gpu.overlap_slowdown, record_links=record_links, sms=p.gpu.sms,
            overlap_slowdown_by_op=tuple(sorted(p.gpu.overlap_slowdown_by_op.items())),
            overlap_slowdown_memory=tuple(sorted(p.gpu.overlap_slowdown_memory.items())), periodic=False)

    def run(self, which: Sequence[int], links: Sequence[int] = ()) -> SimResult:
        """One engine over the jobs ``which`` (indices into the cluster's jobs), keeping the busy
        intervals of the links ``links`` (every link's where links are recorded anyway)."""
        jobs = [self.placed[i] for i in which]
        w: Workload = merge(jobs, self.topo.world, self.cluster.spec.name, self.movers)
        if self.memory_flags:
            from ..kernels.overlap import memory_bound

            w.memory_bound = memory_bound(w.kernels, self.cluster.platform.gpu, {})
        durations, models = self.predictor().predict(w.kernels)
        owner = np.zeros(self.topo.world, dtype=np.int64)
        for i in which:
            owner[self.placed[i].ranks] = i
        planner = _JobPlanners(self.topo, self.planners, owner)
        options = self.options if self.options.record_links else replace(self.options, record_link_ids=tuple(links))
        return Engine(self.topo, w, durations, models, planner, options).run()


def simulate_cluster(cluster: Cluster, *, kernel_model: str | Sequence[str] = DEFAULT_KERNEL_MODEL,
                     record_links: bool = False, alone: bool = True, fabric_links: bool = True,
                     on_stage: Callable[[str], None] | None = None) -> ClusterResult:
    """Simulate every job of ``cluster`` together on its topology, and (with ``alone``) each job alone
    on the same nodes, for the slowdown its neighbours cause. ``record_links`` keeps every link's
    busy intervals in every run; ``fabric_links`` those of the links between switches in the shared
    run (who used which link when: :func:`job_link_records`)."""
    say = on_stage or (lambda _: None)
    say("building the jobs' programs")
    setup = _Setup(cluster, kernel_model, record_links)
    ranks = {p.name: p.ranks for p in setup.placed}
    say(f"simulating {len(cluster.jobs)} jobs together")
    spine = setup.topo.spine_links()
    together = setup.run(range(len(cluster.jobs)), spine if fabric_links else ())
    alone_runs: dict[str, SimResult] = {}
    if alone:
        for i, cj in enumerate(cluster.jobs):
            say(f"simulating job {cj.name} alone")
            alone_runs[cj.name] = setup.run([i])
    t = job_ends(together, ranks)
    a = {name: job_ends(r, {name: ranks[name]})[name] for name, r in alone_runs.items()}
    meta = {"jobs": [job_meta(cj, setup.placed[i].workload) for i, cj in enumerate(cluster.jobs)]}
    fabric = frozenset(setup.topo.links[i].name for i in spine)
    return ClusterResult(cluster, together, alone_runs, ranks, t, a, fabric, meta)


def job_meta(cj: ClusterJob, w: Workload) -> dict[str, Any]:
    return {"name": cj.name, "workload": cj.job.workload.name, "workload_file": cj.job.workload_file,
            "nodes": list(cj.nodes), "gpus": len(w.programs), "iterations": w.iterations}


def job_link_records(res: ClusterResult, links: Sequence[str] | None = None) -> pd.DataFrame:
    """Each job's busy stretches on the links of the shared run (on ``links`` only, if given): link,
    link_kind, job, start_s, end_s, by link, job and start. A job's collectives on one link merged
    where they overlap (touching stretches are kept apart), so a job's stretches on a link never
    overlap each other; two jobs' do where they shared the link at once. Empty where the shared run
    kept no link's intervals; transfers of no job (a copy's, named by its op) are left out."""
    lr = res.together.link_records
    cols = ["link", "link_kind", "job", "start_s", "end_s"]
    if lr is None or lr.empty:
        return pd.DataFrame(columns=cols)
    if links is not None:
        lr = lr[lr["link"].isin(list(links))]
    job = lr["owner"].astype(str).str.split("/", n=1).str[0]
    keep = job.isin(list(res.ranks)).to_numpy()
    lr, job = lr.loc[keep], job.loc[keep]
    if lr.empty:
        return pd.DataFrame(columns=cols)
    names = list(res.ranks)
    key = pd.MultiIndex.from_arrays([lr["link"].astype(str), job]).unique().sort_values()
    row = key.get_indexer(pd.MultiIndex.from_arrays([lr["link"].astype(str), job]))
    s, e = lr["start_s"].to_numpy(dtype=float), lr["end_s"].to_numpy(dtype=float)
    order = np.lexsort((s, row))
    row, s, e = row[order], s[order], e[order]
    frontier = pd.Series(e).groupby(row, sort=False).cummax().to_numpy(dtype=float)
    new = np.ones(len(row), dtype=bool)
    new[1:] = (row[1:] != row[:-1]) | (s[1:] >= frontier[:-1])
    first = np.flatnonzero(new)
    kinds = dict(zip(lr["link"].astype(str), lr["link_kind"].astype(str), strict=True))
    link = key.get_level_values(0)[row[first]]
    out = pd.DataFrame({"link": link, "link_kind": [kinds[x] for x in link],
                        "job": key.get_level_values(1)[row[first]], "start_s": s[first],
                        "end_s": np.maximum.reduceat(e, first)})
    out["job"] = pd.Categorical(out["job"], categories=names)
    return out.sort_values(["link", "job", "start_s"], kind="stable").reset_index(drop=True)


def shared_s(spans: pd.DataFrame) -> float:
    """Seconds during which more than one job was on a link, from its jobs' stretches ``spans``
    (:func:`job_link_records` of one link: each job's never overlap each other)."""
    if spans.empty:
        return 0.0
    t = np.concatenate([spans["start_s"].to_numpy(dtype=float), spans["end_s"].to_numpy(dtype=float)])
    step = np.concatenate([np.ones(len(spans)), -np.ones(len(spans))])
    order = np.lexsort((step, t))  # at one instant, ends before starts: touching is not sharing
    t, on = t[order], np.cumsum(step[order])
    return float(np.sum(np.diff(t)[on[:-1] > 1]))


def link_table(res: ClusterResult, top: int = 8, fabric: frozenset[str] | None = None) -> pd.DataFrame:
    """The ``top`` busiest links of the shared run (of ``fabric`` only, if given) with each job's bytes
    over them (its run alone's): link, kind, capacity, busy seconds, bytes, busy share of the longest
    job, then one column ``bytes:<job>`` per job; where the shared run kept these links' intervals,
    one column ``busy_s:<job>`` per job (the seconds it had transfers on the link; two jobs' overlap)
    and ``shared_s`` (the seconds more than one job had)."""
    stats = res.together.link_stats
    if fabric is not None:
        stats = stats[stats["link"].isin(fabric)]
    if stats.empty:
        return stats
    span = max(res.together_s.values(), default=0.0) or 1.0
    rows = stats.sort_values(["busy_s", "nbytes", "link"], ascending=[False, False, True]).head(top)
    out = rows[["link", "link_kind", "capacity_gbytes_per_s", "busy_s", "nbytes"]].reset_index(drop=True)
    out["busy_share"] = out["busy_s"] / span
    for name, r in res.alone.items():
        by = r.link_stats.set_index("link")["nbytes"]
        out[f"bytes:{name}"] = out["link"].map(by).fillna(0.0).to_numpy()
    spans = job_link_records(res, out["link"].tolist())
    if res.together.link_records is not None:
        busy = (spans["end_s"] - spans["start_s"]).groupby([spans["link"], spans["job"]], observed=False).sum()
        for name in res.ranks:
            out[f"busy_s:{name}"] = [float(busy.get((lk, name), 0.0)) for lk in out["link"]]
        by_link = dict(tuple(spans.groupby("link", sort=False)))
        out["shared_s"] = [shared_s(by_link[lk]) if lk in by_link else 0.0 for lk in out["link"]]
    return out


def shared_links(res: ClusterResult, fabric: frozenset[str] | None = None) -> int:
    """How many links (of ``fabric`` only, if given) carry bytes of more than one job."""
    users: dict[str, int] = {}
    for r in res.alone.values():
        for link in r.link_stats.loc[r.link_stats["nbytes"] > 0, "link"]:
            if fabric is not None and link not in fabric:
                continue
            users[link] = users.get(link, 0) + 1
    return sum(1 for n in users.values() if n > 1)
