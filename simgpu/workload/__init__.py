"""Workload builders: a job's model, batch and parallelism -> the per-rank op graph
(:mod:`simgpu.graph`).

Each model family has its folder (``dlrm/``, ``transformer/``, ``inference/``); the pieces they share (parameters and
DDP buckets, elementwise costs, the parallel layout, the pipeline-stage emitter) live here. Importing
this package registers every family's builder with :mod:`.registry`, which itself imports none.
"""

from .dlrm import builder as _dlrm  # noqa: F401  (registers "dlrm")
from .inference import builder as _inference  # noqa: F401  (registers "transformer_inference")
from .inference import dlrm as _dlrm_inference  # noqa: F401  (registers "dlrm_inference")
from .registry import Builder, World, get_builder, register
from .transformer import builder as _transformer  # noqa: F401  (registers "transformer")

__all__ = ["Builder", "World", "get_builder", "register"]
