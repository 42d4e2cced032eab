"""The pipeline in one call: job -> op graph -> kernel times -> engine -> result.

``simulate(job)`` returns a :class:`~simgpu.engine.SimResult` and writes nothing; writing files is
:func:`simgpu.report.write_outputs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .comm.planner import Planner
from .config.checks import check_memory, gpus_per_node
from .config.loader import Job, load_job
from .engine import Engine, EngineOptions, SimResult
from .kernels.base import make_predictor
from .platform.topology import Topology
from .workload.graph import Workload
from .workload.registry import World, get_builder


def build(job: Job) -> Workload:
    """The per-rank op graph of ``job``, after checking that it fits in GPU memory."""
    world = World(job.workload.nodes, gpus_per_node(job), job.platform.gpu.memory_gib)
    workload = get_builder(job.workload.model.kind)(job.workload, world)
    check_memory(job, workload)
    return workload


#: The default kernel models, in order: a platform's fitted models for the families it has measured
#: (none for a platform without ``platforms/<name>/models/``), then the analytical model.
DEFAULT_KERNEL_MODEL = ("learned", "analytical")


def simulate(job: Job, *, kernel_model: str | Sequence[str] = DEFAULT_KERNEL_MODEL,
             record_links: bool = False) -> SimResult:
    """Simulate one training iteration of ``job``; ``kernel_model`` names a model or a chain of them."""
    p = job.platform
    workload = build(job)
    topo = Topology(p, job.workload.nodes, gpus_per_node(job))
    durations, models = make_predictor(kernel_model, p).predict(workload.kernels)
    planner = Planner(topo, p.collectives, job.workload.comm.algorithm, job.workload.comm.protocol)
    options = EngineOptions(launch_s=p.host.launch_us * 1e-6, cpu_threads_per_node=p.host.cpu_threads,
                            overlap_slowdown=p.gpu.overlap_slowdown, record_links=record_links)
    result = Engine(topo, workload, durations, models, planner, options).run()
    kernels = result.records[result.records["kind"] == "kernel"]
    share = (kernels.assign(d=kernels["end_s"] - kernels["start_s"]).groupby("model")["d"].sum())
    result.meta.update(
        workload=job.workload.name, platform=p.name, gpu=p.gpu.name, nodes=topo.nodes, gpus=topo.world,
        samples=workload.samples, tokens=workload.tokens, model_flops=workload.model_flops,
        peak_flops_per_gpu=float(p.gpu.peak_tflops.get(workload.compute_dtype, np.nan)) * 1e12,  # type: ignore[call-overload]
        gpu_memory_gib=p.gpu.memory_gib, memory_gib=[m.as_gib() for m in workload.memory],
        kernel_model_share={str(k): float(v) for k, v in share.items()}, seed=job.workload.seed,
        workload_file=job.workload_file, platform_file=job.platform_file,
    )
    return result


def simulate_file(path: str | Path, overrides: Sequence[str] = (), **kwargs: object) -> SimResult:
    """Load a workload file (with ``key.path=value`` overrides) and simulate it."""
    return simulate(load_job(path, overrides), **kwargs)  # type: ignore[arg-type]
