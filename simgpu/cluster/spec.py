"""The cluster file: one platform, a number of nodes, and the jobs that share them.

::

    name: two_gpt_jobs
    platform: dgx_h100                 # one platform for the whole cluster ...
    platform_set:                      # ... with keys set as --set platform.KEY=VALUE does
      network.oversubscription: 2
    nodes: 4
    placement: spread                  # for jobs given a count: packed | spread | random (seed)
    jobs:
      - {name: a, workload: ../gpt_2x_dgx_h100.yaml, nodes: 2}
      - {name: b, workload: ../gpt_2x_dgx_h100.yaml, nodes: [1, 3]}

:func:`load_cluster` reads and validates the file, loads every job's workload with its node count
(``nodes=<count>`` as ``--set`` would set it) and places each job on its nodes: explicit ids
first, then the jobs given a count, in file order, by ``placement``. A workload must name the
cluster's platform (by name); the cluster's ``platform_set`` keys then apply to every job. Every
failure is a :class:`~simgpu.errors.ConfigError` naming the file, the key and the line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, NonNegativeInt, PositiveInt

from ..config.base import Spec
from ..config.checks import check_job
from ..config.loader import Job, check_name, load_job, load_platform, read_yaml, resolve_path, validate
from ..config.platform import PlatformSpec
from ..errors import ConfigError

Placement = Literal["packed", "spread", "random"]


class JobEntry(Spec):
    """One job of the cluster."""

    name: str = Field(description="names the job in the tables (unique in the cluster)")
    workload: str = Field(description="the job's workload YAML (relative to this file); it must name the "
                                      "cluster's platform")
    set: dict[str, Any] = Field(
        default_factory=dict, description="workload keys set by dotted path, as `--set KEY=VALUE` does for "
                                          "`simgpu run` (`training.batch_per_gpu: 1`); not `nodes` nor `platform`")
    nodes: list[NonNegativeInt] | PositiveInt | None = Field(
        None, description="the job's nodes: a list of node ids (0 to nodes - 1; the job's rank r runs on node "
                          "ids[r // GPUs per node]), or a count placed by `placement`; absent: the workload's "
                          "own `nodes`, placed by `placement`")


class ClusterSpec(Spec):
    """A cluster file (``simgpu cluster``)."""

    name: str = Field(description="names the output folder")
    platform: str = Field(description="the platform of every node: a name in platforms/ or a path (relative to "
                                      "this file)")
    platform_set: dict[str, Any] = Field(
        default_factory=dict, description="platform keys set by dotted path, as `--set platform.KEY=VALUE` does "
                                          "(`network.oversubscription: 2`, `network.nodes_per_leaf: 2`)")
    nodes: PositiveInt = Field(description="nodes of the cluster (one topology of this many nodes)")
    placement: Placement = Field(
        "packed", description="where jobs given a count go, in file order after the explicit ones: packed (the "
                              "lowest free ids), spread (one node per leaf switch in turn, so a job spans leaves), "
                              "random (free ids drawn with `seed`)")
    seed: int = Field(0, ge=0, description="seed of random placement")
    jobs: list[JobEntry] = Field(min_length=1, description="the jobs sharing the cluster; they start together")


@dataclass(frozen=True)
class ClusterJob:
    """A job placed: its workload (on the cluster's platform, with its node count) and its nodes."""

    name: str
    job: Job
    nodes: tuple[int, ...]


@dataclass(frozen=True)
class Cluster:
    """A cluster file read, with its platform and every job loaded and placed."""

    spec: ClusterSpec
    file: str
    platform: PlatformSpec
    platform_file: str
    jobs: tuple[ClusterJob, ...]

    @property
    def gpus_per_node(self) -> int:
        return self.platform.node.gpus


def _err(msg: str, file: str, key: str, lines: dict[tuple[str, ...], int]) -> ConfigError:
    return ConfigError(msg, file=file, key=key, line=lines.get(tuple(key.split("."))))


def place(spec: ClusterSpec, counts: list[int], explicit: dict[int, tuple[int, ...]], nodes_per_leaf: int,
          file: str, lines: dict[tuple[str, ...], int]) -> list[tuple[int, ...]]:
    """Every job's nodes: the explicit ones as given, then each job given a count by ``placement``."""
    taken: dict[int, str] = {}
    for i, ids in explicit.items():
        key = f"jobs.{i}.nodes"
        for n in ids:
            if n >= spec.nodes:
                raise _err(f"node {n} is not in the cluster; expected node ids 0 to {spec.nodes - 1}", file, key, lines)
            if n in taken:
                who = taken[n]
                raise _err(f"node {n} is given twice" + ("" if who == spec.jobs[i].name else
                                                         f" (job {who!r} has it too)")
                           + "; expected each node in one job only", file, key, lines)
            taken[n] = spec.jobs[i].name
    rng = np.random.default_rng(spec.seed)
    out: list[tuple[int, ...]] = []
    for i, count in enumerate(counts):
        if i in explicit:
            out.append(explicit[i])
            continue
        free = [n for n in range(spec.nodes) if n not in taken]
        if count > len(free):
            raise _err(f"job {spec.jobs[i].name!r} needs {count} nodes but only {len(free)} of the cluster's "
                       f"{spec.nodes} are free; expected at most {len(free)} (or more cluster nodes)", file,
                       f"jobs.{i}.nodes", lines)
        if spec.placement == "packed":
            got = free[:count]
        elif spec.placement == "spread":  # one node per leaf in turn
            got = sorted(free, key=lambda n: (n % nodes_per_leaf, n // nodes_per_leaf))[:count]
        else:
            got = rng.choice(free, size=count, replace=False).tolist()
        ids = tuple(sorted(int(n) for n in got))
        for n in ids:
            taken[n] = spec.jobs[i].name
        out.append(ids)
    return out


def load_cluster(path: str | Path) -> Cluster:
    """Read, validate, load and place a cluster file (nothing is simulated)."""
    file = str(path)
    data, lines = read_yaml(path, "cluster")
    spec = validate(ClusterSpec, data, file, lines)
    check_name(spec.name, file, lines.get(("name",)))
    names = [j.name for j in spec.jobs]
    for i, j in enumerate(spec.jobs):
        check_name(j.name, file, lines.get(("jobs", str(i), "name")))
        if names.index(j.name) != i:
            raise _err(f"job name {j.name!r} is used twice; expected a unique name per job", file,
                       f"jobs.{i}.name", lines)
    try:
        platform, pfile = load_platform(spec.platform, list(spec.platform_set.items()), relative_to=Path(file).parent)
    except ConfigError as e:
        key = "platform" if e.key is None else f"platform_set.{e.key}"
        line = lines.get(("platform_set", e.key or "")) or lines.get(("platform",))
        raise ConfigError(f"{e.message} (platform {spec.platform!r} of the cluster file)", file=file, key=key,
                          line=line) from None
    gpn = platform.node.gpus
    counts: list[int] = []
    explicit: dict[int, tuple[int, ...]] = {}
    jobs: list[Job] = []
    for i, j in enumerate(spec.jobs):
        wkey = f"jobs.{i}.workload"
        wpath = resolve_path(file, j.workload)
        if not wpath.is_file():
            raise _err(f"workload file {wpath} not found; expected the path of a workload YAML (relative to this "
                       "file)", file, wkey, lines)
        own = read_yaml(wpath, "workload")[0].get("nodes")
        if isinstance(j.nodes, list):
            if not j.nodes:
                raise _err("no nodes given; expected a list of node ids or a count", file, f"jobs.{i}.nodes", lines)
            explicit[i] = tuple(j.nodes)
            count = len(j.nodes)
        elif isinstance(j.nodes, int):
            count = j.nodes
        elif isinstance(own, int) and not isinstance(own, bool) and own > 0:
            count = own
        else:
            raise _err("missing nodes and the workload gives none; expected a count or a list of node ids", file,
                       f"jobs.{i}.nodes", lines)
        counts.append(count)
        if count > spec.nodes:
            raise _err(f"job {j.name!r} is placed on {count} nodes but the cluster has {spec.nodes}; expected at "
                       f"most {spec.nodes}", file, f"jobs.{i}.nodes", lines)
        for k in j.set:
            if k in ("nodes", "platform") or k.startswith("platform."):
                raise _err(f"{k} is the cluster's to give; expected workload keys only (the job's nodes in "
                           "jobs[].nodes, the platform's keys in platform_set)", file, f"jobs.{i}.set.{k}", lines)
        try:
            job = load_job(wpath, [*(f"{k}={json.dumps(v)}" for k, v in j.set.items()), f"nodes={count}"])
        except ConfigError as e:  # the workload's own key at fault, as this cluster runs it
            raise ConfigError(f"{e.message} (as job {j.name!r} of {file} on {count} nodes)", file=e.file, key=e.key,
                              line=e.line) from None
        if job.platform.name != platform.name:
            raise _err(f"workload {j.workload} runs on platform {job.platform.name!r} but the cluster is "
                       f"{platform.name!r}; expected a workload on the cluster's platform", file, wkey, lines)
        if job.workload.gpus_per_node not in (None, gpn):
            raise _err(f"workload {j.workload} uses {job.workload.gpus_per_node} GPUs per node; expected every "
                       f"GPU of a node ({gpn}) in a cluster", file, wkey, lines)
        if job.workload.variability is not None:
            raise _err(f"workload {j.workload} has a variability section; expected none (ranks at different "
                       "speeds are not simulated in a cluster)", file, wkey, lines)
        job = replace(job, platform=platform, platform_file=pfile)
        check_job(job)  # again, on the cluster's platform with its keys set
        jobs.append(job)
    placed = place(spec, counts, explicit, platform.network.nodes_per_leaf, file, lines)
    return Cluster(spec, file, platform, pfile,
                   tuple(ClusterJob(e.name, job, ids) for e, job, ids in zip(spec.jobs, jobs, placed, strict=True)))
