"""What the serving stage asks of an inference deployment: the time of one iteration's batch, and
how much KV cache a replica holds.

:class:`Step` is one iteration's batch on one model replica; :class:`IterationTimer` times steps
on the engine (each distinct step once) and says what a replica holds in memory. The serving stage
(:mod:`simgpu.serve`) speaks only this interface to the inference builder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True, slots=True)
class Step:
    """One iteration's batch on one replica.

    ``prefill``: per request prefilling this iteration, ``(new, cached)``: the prompt tokens it
    processes now (a whole prompt, or a chunk of it) and the tokens already in its KV cache (earlier
    chunks). ``decode``: per decoding request, the tokens in its KV cache; it adds one token that
    attends over them.
    """

    prefill: tuple[tuple[int, int], ...] = ()
    decode: tuple[int, ...] = ()

    @property
    def tokens(self) -> int:
        return sum(n for n, _ in self.prefill) + len(self.decode)


@dataclass(frozen=True, slots=True)
class ReplicaMemory:
    """What one replica's GPUs hold, per GPU (bytes), and the KV cache that is left for requests."""

    weights_bytes: float
    activation_bytes: float      # the largest step's activations (max tokens per iteration)
    workspace_bytes: float
    kv_bytes_per_token: float    # per GPU: layers on it x KV heads on it x head dim x 2 x bytes
    gpu_bytes: float             # usable memory per GPU
    block_tokens: int            # tokens per KV-cache block (paged attention)
    kv_blocks: int               # blocks one replica can hold (the least over its GPUs)
    state_bytes: float = 0.0     # per GPU: sliding windows and linear-attention state of max_batch_size requests

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * self.block_tokens


class IterationTimer(Protocol):
    """Times steps of one deployment (an inference workload job) on the engine."""

    #: GPUs per replica (tp x pp x ...) and replicas in the job; replica r holds global ranks
    #: ``r * replica_gpus`` to ``(r + 1) * replica_gpus - 1``
    replica_gpus: int
    replicas: int
    memory: ReplicaMemory

    def time(self, steps: Sequence[Step]) -> np.ndarray:
        """Seconds of each step on one replica (host overhead, sampling included), in order."""
        ...


def stages_of(timer: object) -> int:
    """The pipeline stages of a timer's replica. A timer of ``pp > 1`` replicas has ``stages`` and
    ``stage_times(steps)`` (seconds per step and stage, each row summing to ``time``'s figure, as
    :meth:`~simgpu.serve.timer.EngineTimer.stage_times`); one without is one stage."""
    return int(getattr(timer, "stages", 1))
