"""Gradient reduction and parameter gathering over data-parallel ranks: DDP, ZeRO 1-3 and FSDP.

This module owns the reducers the Transformer builder hands its backward: a :class:`Reducer`
reduces gradients bucket by bucket as their last gradient is produced (PyTorch DDP and Megatron's
``overlap_grad_reduce``: all-reduce, or reduce-scatter under ZeRO 1-3 / the distributed optimizer;
FSDP reduce-scatters each wrapped unit, a bucket per unit), launching buckets strictly in order;
:class:`NoSync` is the reducer of micro-batches before the last (``no_sync``: gradients only
accumulate). Gradients travel as fp32. It emits collectives only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from .common import GRAD_BYTES, Param
from .graph import CollectiveOp
from .stage import StageEmitter


class GradSink(Protocol):
    """What a backward tells about the gradients it produced."""

    def ready(self, params: Iterable[Param], op: int) -> None: ...


class NoSync:
    """Gradients accumulate locally; nothing is reduced (``DDP.no_sync``)."""

    def ready(self, params: Iterable[Param], op: int) -> None:
        pass


class Reducer:
    """Reduces ``buckets`` of gradients over the rank's group of ``kind`` with ``op``.

    A bucket is launched once its gradients are all ready, and only after the buckets before it;
    its collective depends on the op that produced its last gradient (a CUDA event on the compute
    stream).
    """

    def __init__(self, em: StageEmitter, buckets: Sequence[tuple[Param, ...]], kind: str, *,
                 op: CollectiveOp = "all_reduce", key: str = "grads", stream: str = "comm") -> None:
        self._em, self._kind, self._op, self._key, self._stream = em, kind, op, key, stream
        self._buckets = list(buckets)
        self._pending = [{p.name for p in b} for b in self._buckets]
        self._bucket_of: dict[str, int] = {}
        for i, b in enumerate(self._buckets):
            for p in b:
                if p.name in self._bucket_of:
                    raise ValueError(f"parameter {p.name} is in two buckets")
                self._bucket_of[p.name] = i
        self._producer = [-1] * len(self._buckets)
        self._next = 0
        self.issued: list[int] = []

    def ready(self, params: Iterable[Param], op: int) -> None:
        for p in params:
            b = self._bucket_of[p.name]
            if p.name not in self._pending[b]:
                raise ValueError(f"gradient of {p.name} marked ready twice")
            self._pending[b].discard(p.name)
            self._producer[b] = max(self._producer[b], op)
        while self._next < len(self._buckets) and not self._pending[self._next]:
            i = self._next
            nbytes = sum(p.numel for p in self._buckets[i]) * GRAD_BYTES
            idx = self._em.group_op(self._kind, f"{self._key}.bucket{i}.{self._op}", f"{self._key}.bucket{i}",
                                    self._op, nbytes, phase="bwd", deps=(self._producer[i],),
                                    stream=self._stream)
            if idx is not None:
                self.issued.append(idx)
            self._next += 1

    def flush(self, op: int) -> None:
        """Mark every gradient not yet ready as produced by ``op`` (reduction after the backward)."""
        for i in range(self._next, len(self._buckets)):
            pending = [p for p in self._buckets[i] if p.name in self._pending[i]]
            if pending:
                self.ready(pending, op)

    def done(self) -> tuple[int, ...]:
        """Indices of the reductions issued; raises if a gradient never became ready."""
        if self._next < len(self._buckets):
            missing = sorted(set().union(*self._pending[self._next:]))
            raise RuntimeError(f"gradients never produced: {', '.join(missing[:5])}")
        return tuple(self.issued)
