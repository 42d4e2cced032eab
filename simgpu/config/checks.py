"""Cross-field rules of a job, checked in one place before anything runs.

Single-key rules live on the spec models; rules that tie the workload to the platform (world size,
parallel degrees, dtypes the GPU supports, memory fit) live here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..workload.graph import Workload
    from .loader import Job


def gpus_per_node(job: Job) -> int:
    return job.workload.gpus_per_node or job.platform.node.gpus


def world_size(job: Job) -> int:
    return job.workload.nodes * gpus_per_node(job)


def check_job(job: Job) -> None:
    """Rules that need both files; raises ConfigError naming the workload key at fault."""
    w, p, f = job.workload, job.platform, job.workload_file
    if w.gpus_per_node is not None and w.gpus_per_node > p.node.gpus:
        raise ConfigError(f"{w.gpus_per_node} GPUs per node requested but a {p.name} node has "
                          f"{p.node.gpus}", file=f, key="gpus_per_node")
    world = world_size(job)
    dp = w.parallelism.dp
    if dp is not None and dp != world:
        raise ConfigError(
            f"dp={dp} does not match the world size: {w.nodes} node(s) x {gpus_per_node(job)} GPUs "
            f"= {world} (expected dp={world})", file=f, key="parallelism.dp")
    if w.training.precision not in p.gpu.peak_tflops:
        raise ConfigError(
            f"{w.training.precision} is not supported by {p.gpu.name} on platform {p.name}; "
            f"expected one of: {', '.join(p.gpu.peak_tflops)}", file=f, key="training.precision")
    if w.model.kind == "dlrm":
        tables = sum(t.count for t in w.model.tables)
        if tables < 1:
            raise ConfigError("at least one embedding table is needed", file=f, key="model.tables")


def check_memory(job: Job, workload: Workload) -> None:
    """Reject a job whose busiest GPU needs more memory than the GPU has."""
    cap = job.platform.gpu.memory_gib * 2**30
    worst = max(range(len(workload.memory)), key=lambda r: workload.memory[r].total)
    need = workload.memory[worst]
    if need.total > cap:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in need.as_gib().items() if k != "total" and v >= 0.05)
        raise ConfigError(
            f"does not fit in GPU memory: rank {worst} needs {need.total / 2**30:.1f} GiB ({parts} GiB) "
            f"but a {job.platform.gpu.name} has {job.platform.gpu.memory_gib:g} GiB; expected a smaller "
            f"model.* or training.batch_per_gpu, or more GPUs", file=job.workload_file, key="model")
