"""Gradient reduction and parameter gathering over data-parallel ranks: DDP, ZeRO 1-3 and FSDP.

This module owns the reducers the Transformer builder hands its backward: a :class:`Reducer`
reduces gradients bucket by bucket as their last gradient is produced (PyTorch DDP and Megatron's
``overlap_grad_reduce``: all-reduce, or reduce-scatter under ZeRO 1-3 / the distributed optimizer;
FSDP reduce-scatters each wrapped unit, a bucket per unit), launching buckets strictly in order;
:class:`NoSync` is the reducer of micro-batches before the last (``no_sync``: gradients only
accumulate); :class:`BucketCopies` adds PyTorch DDP's copies of the gradients into each bucket
and back when they are not views into it. Gradients travel as fp32.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from ..graph import CollectiveOp
from .common import GRAD_BYTES, BucketTracker, Param
from .stage import StageEmitter


class GradSink(Protocol):
    """What a backward tells about the gradients it produced."""

    def ready(self, params: Iterable[Param], op: int) -> None: ...


class NoSync:
    """Gradients accumulate locally; nothing is reduced (``DDP.no_sync``)."""

    def ready(self, params: Iterable[Param], op: int) -> None:
        pass


class Reducer(BucketTracker):
    """Reduces ``buckets`` of gradients over the rank's group of ``kind`` with ``op``.

    A bucket is launched once its gradients are all ready, and only after the buckets before it;
    its collective depends on the op that produced its last gradient (a CUDA event on the compute
    stream).
    """

    def __init__(self, em: StageEmitter, buckets: Sequence[tuple[Param, ...]], kind: str, *,
                 op: CollectiveOp = "all_reduce", key: str = "grads", stream: str = "comm") -> None:
        super().__init__(buckets)
        self._em, self._kind, self._op, self._key, self._stream = em, kind, op, key, stream

    def _issue(self, i: int, nbytes: int, producer: int) -> int | None:
        return self._em.group_op(self._kind, f"{self._key}.bucket{i}.{self._op}", f"{self._key}.bucket{i}",
                                 self._op, nbytes, phase="bwd", deps=(producer,), stream=self._stream)

    def flush(self, op: int) -> None:
        """Mark every gradient not yet ready as produced by ``op`` (reduction after the backward)."""
        for i in range(self._next, len(self._buckets)):
            pending = [p for p in self._buckets[i] if p.name in self._pending[i]]
            if pending:
                self.ready(pending, op)


class BucketCopies(Reducer):
    """PyTorch DDP without ``gradient_as_bucket_view``: a bucket's gradients are copied into it on
    the compute stream once its last gradient is ready, before its all-reduce, and copied back into
    the gradients after it (:meth:`copy_back`, DDP's ``finalize_backward``). DDP copies each gradient
    as it becomes ready; one copy per bucket moves the same bytes."""

    def __init__(self, em: StageEmitter, buckets: list[tuple[Param, ...]], kind: str, *, op: CollectiveOp,
                 key: str = "grads") -> None:
        super().__init__(em, buckets, kind, op=op, key=key)
        self._reduced: list[tuple[int, int, int]] = []   # bucket, elements, its all-reduce

    def _issue(self, i: int, nbytes: int, producer: int) -> int | None:
        if len(self._em.group(self._kind)) < 2:
            return None
        numel = nbytes // GRAD_BYTES
        copy = self._em.elementwise(f"{self._key}.bucket{i}.copy_in", numel, 1, 1, "fp32", op="copy", phase="bwd",
                                     deps=(producer,))
        idx = super()._issue(i, nbytes, copy)
        if idx is not None:
            self._reduced.append((i, numel, idx))
        return idx

    def copy_back(self) -> list[int]:
        """The copies of the reduced buckets into the gradients, each after its all-reduce."""
        return [self._em.elementwise(f"{self._key}.bucket{i}.copy_back", numel, 1, 1, "fp32", op="copy",
                                      phase="bwd", deps=(idx,)) for i, numel, idx in self._reduced]
