"""Workload builders, chosen by the model's ``kind``.

This module imports no builder: each model family's builder registers itself with
:func:`register`, and :mod:`simgpu.workload` imports the families. A builder is
``build(spec: WorkloadSpec, world: World) -> Workload``. Registering a name twice is an error, and
asking for an unknown name lists the valid ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..config.workload import WorkloadSpec
from ..graph import PipelineShape, Workload


@dataclass(frozen=True)
class World:
    """Where the job runs: ``nodes`` x ``gpus_per_node`` ranks; rank r is GPU ``r % gpus_per_node``
    of node ``r // gpus_per_node``. ``gpu_memory_gib`` (None: unknown) lets a builder that makes
    placement choices, such as the DLRM's sharding planner, keep them within memory. ``fold``: the
    caller accepts a folded workload (programs for one data-parallel replica only, with
    :class:`~simgpu.graph.Replicas` saying which ranks they stand for) where the builder
    can prove the replicas identical. ``micro_batches``: given the job's pipeline shape, how many
    micro-batches per pipeline the programs run (the engine's periodic shortcut runs fewer than the
    job); None: the job's."""

    nodes: int
    gpus_per_node: int
    gpu_memory_gib: float | None = None
    fold: bool = False
    #: given a block of consecutive GPUs inside a node, the smallest shift of the GPUs within every
    #: such block that maps the topology onto itself (the block's size where none does); None: no
    #: shift inside nodes is known to be a symmetry
    local_unit: Callable[[int], int] | None = None
    micro_batches: Callable[[PipelineShape], int] | None = None
    #: with ``fold``: whole nodes (data-parallel replicas) may fold too; False: only ranks inside nodes
    #: (where the network core may limit replicas that share it, see :mod:`simgpu.engine.fold`)
    whole_nodes: bool = True
    #: the dtypes the GPU has tensor-core peaks for (a served model's precision picks its GEMM path
    #: from them, :func:`simgpu.precision.gemm_path`); None: every precision runs as itself
    gpu_dtypes: tuple[str, ...] | None = None

    @property
    def size(self) -> int:
        return self.nodes * self.gpus_per_node


Builder = Callable[[WorkloadSpec, World], Workload]
_BUILDERS: dict[str, Builder] = {}


def register(name: str) -> Callable[[Builder], Builder]:
    def deco(fn: Builder) -> Builder:
        if name in _BUILDERS:
            raise ValueError(f"workload builder {name!r} is registered twice")
        _BUILDERS[name] = fn
        return fn
    return deco


def get_builder(name: str) -> Builder:
    """The builder registered as ``name``; the families register themselves when
    :mod:`simgpu.workload` is imported, which importing this module does first."""
    try:
        return _BUILDERS[name]
    except KeyError:
        raise KeyError(f"unknown workload kind {name!r}; known: {', '.join(sorted(_BUILDERS))}") from None
