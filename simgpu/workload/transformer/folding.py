"""What the engine's shortcuts need from a Transformer job: which of its ranks are identical
(:func:`replicas`, for folding them), how its pipeline schedule repeats (:func:`pipeline_shape`, for
the periodic steady state), and the setup with the micro-batch count the programs are built with
(:func:`simulated_setup`).
"""

from __future__ import annotations

from dataclasses import replace

from ...graph import PipelineShape, Replicas
from ..parallel import Layout
from ..registry import World
from .shapes import Setup


def replicas(lay: Layout, world: World, tp_ring: bool = False) -> Replicas | None:
    """The identical ranks of ``lay`` as levels of :class:`Replicas`, or None.

    Every rank of a stage runs the same program, so shifting the data-parallel coordinate by a
    multiple of ``ep`` (expert groups stay whole) maps the job onto itself; where one expert group
    holds every data-parallel rank of a stage (``ep == dp``), any shift maps it onto itself (its
    members move round it, and its even all-to-all with them). The data-parallel level's unit is the
    smallest such shift whose ranks fill whole nodes and that divides ``dp`` (none where
    ``world.whole_nodes`` is off). Shifting
    the tensor-parallel coordinate does too; where a tensor-parallel group lies inside a node, its
    level's unit is the smallest shift of GPUs that the node's topology allows
    (``world.local_unit``), unless ``tp_ring`` (tp_comm_overlap's ring exchange, whose pairs wrap
    around the group and map onto no representative pair). Levels that leave one copy are dropped.
    """
    gpn = world.gpus_per_node
    per_dp = lay.tp * lay.cp
    levels: list[tuple[int, int]] = []
    step = lay.ep if lay.ep < lay.dp else 1
    for u in range(step, lay.dp // 2 + 1 if world.whole_nodes else 0, step):
        if lay.dp % u == 0 and (u * per_dp) % gpn == 0:
            levels.append((per_dp * lay.dp, per_dp * u))
            break
    if world.local_unit is not None and not tp_ring and 1 < lay.tp <= gpn and gpn % lay.tp == 0:
        unit = world.local_unit(lay.tp)
        if unit < lay.tp:
            levels.append((lay.tp, unit))
    return Replicas(world=lay.world, levels=tuple(levels)) if levels else None


def pipeline_shape(s: Setup) -> PipelineShape | None:
    """How the schedule of ``s`` repeats (see :class:`~simgpu.graph.PipelineShape`), or None where
    there is no pipeline or its schedule does not repeat one period at a time (GPipe runs every
    forward before any backward). Under 1F1B every stage has a steady state once there are ``pp``
    micro-batches and one more adds one forward and one backward; the interleaved schedule needs
    ``2 pp`` (its warm-up is ``2 (pp - stage - 1) + (v - 1) pp`` chunk steps, and ``pp``
    micro-batches run every forward first) and takes micro-batches ``pp`` at a time."""
    pp = s.layout.pp
    if pp < 2 or s.schedule == "gpipe":
        return None
    if s.schedule == "interleaved":
        return PipelineShape(micro_batches=s.m, period=pp, least=2 * pp, simulated=s.m)
    return PipelineShape(micro_batches=s.m, period=1, least=pp, simulated=s.m)


def simulated_setup(s: Setup, shape: PipelineShape | None, world: World) -> tuple[Setup, PipelineShape | None]:
    """The setup the programs are built from: ``s`` with the micro-batch count ``world.micro_batches``
    chooses (the job's where it chooses none)."""
    if shape is None or world.micro_batches is None:
        return s, shape
    m = world.micro_batches(shape)
    if m == s.m:
        return s, shape
    if m < shape.least or (m - shape.least) % shape.period:
        raise ValueError(f"cannot run {m} micro-batches of a pipeline that takes {shape.least} plus a multiple "
                         f"of {shape.period}")
    return replace(s, m=m), replace(shape, simulated=m)
