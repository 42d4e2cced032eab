"""LLM inference: the forward of a batch mixing prefill and decode tokens over a paged KV cache,
and the interface of the iteration timer the serving stage asks (:mod:`.api`).

The timer of a deployment runs the engine, so it belongs to the serving stage
(:mod:`simgpu.serve.timer`); it is built from the deployment's workload (a ``transformer_inference``
model with an ``inference`` section, e.g. ``workloads/inference/llama2_70b_dgx_h100_tp4.yaml``)::

    from simgpu.config.loader import load_job
    from simgpu.serve.timer import make_timer
    from simgpu.workload.inference import Step

    timer = make_timer(load_job("workloads/inference/llama2_70b_dgx_h100_tp4.yaml", ["inference.precision=fp8"]))
    timer.replica_gpus, timer.replicas, timer.memory.kv_blocks   # 4, 2, blocks per replica
    timer.time([Step(prefill=((512, 0),)), Step(decode=(600, 700, 800))])   # seconds, one per step

``make_timer(job)`` is ``EngineTimer(job)``; ``EngineTimer(job, exact=True)`` simulates every block
of unrounded steps (slower; for checks). Modules: :mod:`.api` (the interface), :mod:`.shape` (a
step reduced to its kernels' sizes, on a geometric grid), :mod:`.forward` (one stage's program),
:mod:`.memory` (weights, KV cache, activations, workspace), :mod:`.builder` (the
``transformer_inference`` builder), :mod:`.dlrm` (the ``dlrm_inference`` builder).
"""

from .api import IterationTimer, ReplicaMemory, Step

__all__ = ["IterationTimer", "ReplicaMemory", "Step"]
