"""simgpu from Python: load any of its files, simulate a training iteration, serve a deployment.

::

    import simgpu

    job = simgpu.load("workloads/gpt_2x_dgx_h100.yaml")                     # a Job
    result = simgpu.simulate(job)                                           # a SimResult
    faster = simgpu.simulate(simgpu.load("workloads/gpt_2x_dgx_h100.yaml",
                                         ["platform.network.nic_gbps=800"]))
    served = simgpu.serve(simgpu.load("workloads/serving/llama2_70b_2x_dgx_h100_disagg.yaml"))
    served.summary["ttft_ms"]["p99"], served.table                           # figures, one row a request

:func:`load` reads what the file is once (:func:`simgpu.config.loader.job_kind`) and returns the
typed object of that kind: a :class:`~simgpu.config.loader.Job` (a training or inference workload
with its platform), a :class:`~simgpu.serve.spec.Serving` (an LLM serving file), a
:class:`~simgpu.serve.dlrm.DlrmServing` (a DLRM serving file), a
:class:`~simgpu.whatif.study.Study` or a :class:`~simgpu.cluster.spec.Cluster` (several jobs on one
cluster; :func:`simgpu.cluster.run.simulate_cluster` simulates it). :func:`kind` says which. Bad input raises
:class:`~simgpu.errors.ConfigError`, whose message names the file, the key and what was expected;
the command line prints that same line. docs/api.md describes every type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .cluster.spec import Cluster, load_cluster
from .config.loader import Job, JobKind, job_kind, load_job
from .errors import ConfigError
from .report.summary import summarize
from .serve.dlrm import DlrmServing, build_dlrm, load_dlrm_serving, query_table, serve_dlrm
from .serve.spec import Serving, load_serving
from .whatif.study import Study, load_study

__all__ = ["Loaded", "Served", "kind", "load", "serve", "summarize"]

#: What :func:`load` returns: one type per kind of file.
Loaded = Job | Serving | DlrmServing | Study | Cluster


def load(path: str | Path, overrides: Sequence[str] = ()) -> Loaded:
    """The file at ``path`` as the object of its kind, with ``--set``-style ``overrides``
    (``"key=value"``; a workload's ``platform.`` keys change its platform)."""
    what = job_kind(path, overrides, "simgpu")
    if what == "workload":
        return load_job(path, overrides)
    if what == "llm_serving":
        return load_serving(path, list(overrides))
    if what == "dlrm_serving":
        return load_dlrm_serving(path, list(overrides))
    if overrides:
        why = ("a study takes no overrides; expected them as the study's own variants or grid" if what == "study"
               else "a cluster file takes no overrides; expected them in the file (platform_set, its workloads)")
        raise ConfigError(why, file=str(path), key="overrides")
    if what == "cluster":
        return load_cluster(path)
    return load_study(path)


def kind(obj: Loaded) -> JobKind:
    """The kind of what :func:`load` returned."""
    if isinstance(obj, Job):
        return "workload"
    if isinstance(obj, Serving):
        return "llm_serving"
    if isinstance(obj, DlrmServing):
        return "dlrm_serving"
    if isinstance(obj, Study):
        return "study"
    if isinstance(obj, Cluster):
        return "cluster"
    raise TypeError(f"not something simgpu.load returns: {type(obj).__name__}")


@dataclass(frozen=True)
class Served:
    """What :func:`serve` returns.

    ``summary``: the figures ``simgpu serve`` prints and writes to ``summary.json`` (throughput,
    TTFT / TPOT / end-to-end latency percentiles and SLO attainment for LLM serving; queries per
    second and latency percentiles for DLRM). ``table``: one row per request (LLM: arrival, first
    token, finish, tokens, TTFT, TPOT) or per query (DLRM), as ``requests.csv`` / ``queries.csv``.
    ``raw``: the simulation's own result (:class:`~simgpu.serve.loop.ServeResult` or
    :class:`~simgpu.serve.dlrm.DlrmResult`) for the Gantt chart and the KV occupancy.
    """

    kind: JobKind
    summary: dict[str, Any]
    table: pd.DataFrame = field(repr=False)
    raw: Any = field(repr=False)


def serve(serving: Serving | DlrmServing, rate_per_s: float | None = None) -> Served:
    """Serve the requests of ``serving`` on its deployment (at ``rate_per_s`` instead of the file's
    arrival rate, if given), as ``simgpu serve`` does, without writing files."""
    if isinstance(serving, DlrmServing):
        queries, figures = serve_dlrm(serving, build_dlrm(serving), rate_per_s)
        return Served("dlrm_serving", figures, query_table(queries), queries)
    if not isinstance(serving, Serving):
        raise TypeError(f"serve takes what simgpu.load returns for a serving file, not {type(serving).__name__}")
    from .serve.deploy import build
    from .serve.deploy import serve as run
    from .serve.metrics import request_table

    res, summary = run(serving, build(serving), rate_per_s)
    return Served("llm_serving", summary, request_table(res), res)
