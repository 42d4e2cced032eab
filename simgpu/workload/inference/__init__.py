"""LLM inference: the forward of a batch mixing prefill and decode tokens over a paged KV cache,
and the iteration timer the serving stage asks.

The timer of a deployment is built from its workload (a ``transformer_inference`` model with an
``inference`` section, e.g. ``workloads/inference/llama2_70b_dgx_h100_tp4.yaml``)::

    from simgpu.config.loader import load_job
    from simgpu.workload.inference import Step, make_timer

    timer = make_timer(load_job("workloads/inference/llama2_70b_dgx_h100_tp4.yaml", ["inference.precision=fp8"]))
    timer.replica_gpus, timer.replicas, timer.memory.kv_blocks   # 4, 2, blocks per replica
    timer.time([Step(prefill=((512, 0),)), Step(decode=(600, 700, 800))])   # seconds, one per step

``make_timer(job)`` is ``EngineTimer(job)``; ``EngineTimer(job, exact=True)`` simulates every block
of unrounded steps (slower; for checks). Modules: :mod:`.api` (the interface), :mod:`.shape` (a
step reduced to its kernels' sizes, on a geometric grid), :mod:`.forward` (one stage's program),
:mod:`.memory` (weights, KV cache, activations, workspace), :mod:`.builder` (the
``transformer_inference`` builder), :mod:`.timer`, :mod:`.dlrm` (the ``dlrm_inference`` builder).
"""

from .api import IterationTimer, ReplicaMemory, Step
from .timer import EngineTimer, make_timer

__all__ = ["EngineTimer", "IterationTimer", "ReplicaMemory", "Step", "make_timer"]
