"""ZeRO-3 / FSDP parameter gathering: when each wrapped unit's weights are all-gathered and freed.

This module owns the all-gathers of the Transformer builder under ``zero: 3`` as PyTorch FSDP
issues them (``torch.distributed.fsdp``; PyTorch docs "FullyShardedDataParallel" and "FSDP Notes:
FSDP Prefetch Nuances"). A unit (a block, the embedding, the output head) is gathered before it
computes unless its weights are still unsharded, and its gathered weights are copied out on the
compute stream, which its kernels follow. Per pass over a model chunk:

- forward: the all-gather of unit i is issued after unit i-1's kernels (implicit prefetch: on its
  own stream it runs under them), or before them under ``forward_prefetch``;
- backward, ``backward_prefetch``: ``backward_pre`` issues unit i+1's all-gather before unit i's
  gradient kernels (it runs under them); ``backward_post`` issues unit i's in unit i-1's
  post-backward hook, after its gradients are produced and before its reduce-scatter
  (``_post_backward_reshard`` frees and prefetches, then ``_reduce_grad`` runs, in
  ``torch/distributed/fsdp/_runtime_utils.py``): exposed, with unit i-1's reduce-scatter behind it
  under unit i; ``none`` when unit i's backward starts, after unit i-1's reduce-scatter (no
  overlap);
- one NCCL stream per process group: FSDP issues its all-gathers from ``_unshard_stream`` and its
  reduce-scatters from ``_post_backward_stream``, but ProcessGroupNCCL enqueues every collective of
  a communicator on that communicator's own internal stream (one per device; ``ProcessGroupNCCL.hpp``:
  "each NCCL call is scheduled on a separate CUDA stream"), which waits for the issuing stream.
  So one group's all-gathers and reduce-scatters run one at a time in the order the CPU issued
  them (:data:`PG_STREAMS`): under ``backward_pre`` unit i+2's all-gather waits for unit i's
  reduce-scatter; the expert parameters' group (``edp_cp``) is another communicator, with its own;
- ``reshard_after_forward``: a unit is freed after its forward (and gathered again in backward) or
  kept until the end of its backward; a backward always frees;
- ``limit_all_gathers``: FSDP's rate limiter (``_FreeEventQueue``, at most two pending frees):
  each free records an event; before issuing an all-gather, when two frees are pending the CPU
  synchronises on the older one (a host wait).

It emits the all-gathers, the copies out, the rate limiter's host waits and (:class:`UnitReducer`)
the reduce-scatters' place after the post-backward prefetch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Final

from ..common import Param
from ..dataparallel import Reducer
from ..stage import StageEmitter

#: Frees the rate limiter lets be pending before the CPU waits for the oldest
#: (``_FreeEventQueue._max_num_inflight_all_gathers``, torch/distributed/fsdp/_limiter_utils.py).
MAX_PENDING_FREES: Final = 2

#: The simulated stream of each process group FSDP communicates over: its NCCL communicator's one
#: internal stream per device (ProcessGroupNCCL), which all-gathers and reduce-scatters share.
PG_STREAMS: Final = {"dp_cp": "comm", "edp_cp": "comm.edp"}

#: A unit as the gatherer sees it: its name, dense and expert parameters.
Unit = tuple[str, Sequence[Param], Sequence[Param]]
#: Emits a unit's copy out of the gathered buffer: (name, elements, phase, deps).
CopyOut = Callable[[str, int, str, tuple[int, ...]], None]


class Gatherer:
    """One rank's FSDP state over an iteration: which units are unsharded, the pending frees."""

    def __init__(self, em: StageEmitter, weight_bytes: int, copy_out: CopyOut, *, forward_prefetch: bool,
                 backward_prefetch: str, limit_all_gathers: bool, reshard_after_forward: bool) -> None:
        if backward_prefetch not in ("backward_pre", "backward_post", "none"):
            raise ValueError(f"backward_prefetch {backward_prefetch!r}: expected backward_pre, backward_post or none")
        self.em, self.wb, self.copy_out = em, weight_bytes, copy_out
        self.forward_prefetch, self.backward_prefetch = forward_prefetch, backward_prefetch
        self.limit, self.reshard_after_forward = limit_all_gathers, reshard_after_forward
        self.unsharded: set[str] = set()
        self.frees: deque[int] = deque()

    def run(self, units: Sequence[Unit], phase: str, key: str) -> Pass:
        """A pass over ``units`` in the order they compute; ``key`` makes its collectives' keys unique
        (the micro-batch)."""
        return Pass(self, units, phase, key)

    def _limit(self, phase: str) -> None:
        if self.limit and len(self.frees) >= MAX_PENDING_FREES:
            self.em.host_wait("fsdp.rate_limiter", (self.frees.popleft(),), phase=phase)


class Pass:
    """Call :meth:`before` ahead of unit i's kernels and :meth:`after` once they are emitted."""

    def __init__(self, g: Gatherer, units: Sequence[Unit], phase: str, key: str) -> None:
        self.g, self.units, self.phase, self.key = g, units, phase, key
        self.issued: dict[int, tuple[int, ...]] = {}
        self._at = -1                         # the unit whose kernels are being emitted
        self._prev: tuple[int, ...] = ()      # the previous unit's free (its last compute kernel)

    def _issue(self, i: int, deps: tuple[int, ...] = ()) -> None:
        if i >= len(self.units) or i in self.issued:
            return
        name, dense, expert = self.units[i]
        if name in self.g.unsharded:
            return
        g, em, phase = self.g, self.g.em, self.phase
        g._limit(phase)
        ops = []
        for kind, params, tag in (("dp_cp", dense, ""), ("edp_cp", expert, ".experts")):
            if params:
                ag = em.group_op(kind, f"{name}{tag}.all_gather", f"{name}{tag}.{phase}.{self.key}", "all_gather",
                                 sum(p.numel for p in params) * g.wb, phase=phase, deps=deps,
                                 stream=PG_STREAMS[kind])
                if ag is not None:
                    ops.append(ag)
        self.issued[i] = tuple(ops)
        g.unsharded.add(name)

    def before(self, i: int) -> None:
        self._at = i
        fwd = self.phase == "fwd"
        mode = self.g.backward_prefetch
        if fwd or mode == "backward_pre":
            self._issue(i)
            if not fwd or self.g.forward_prefetch:
                self._issue(i + 1)
        else:  # backward_post: only the pass's first unit is still to gather here
            self._issue(i, self._prev)
        ags = self.issued.get(i, ())
        if ags:
            name, dense, expert = self.units[i]
            self.g.copy_out(name, sum(p.numel for p in (*dense, *expert)), self.phase, ags)

    def after(self, i: int) -> None:
        g = self.g
        end = _last_kernel(g.em)
        if self.phase == "bwd" or g.reshard_after_forward:
            g.unsharded.discard(self.units[i][0])
            if g.limit:
                g.frees.append(end)
        self._prev = (end,)

    def post_backward(self, producer: int) -> None:
        """The current unit's post-backward hook, before its reduce-scatter is issued: under
        ``backward_post`` the next unit's all-gather, once ``producer`` (its last gradient) ends."""
        if self.phase == "bwd" and self.g.backward_prefetch == "backward_post":
            self._issue(self._at + 1, (producer,))


class UnitReducer(Reducer):
    """The reduce-scatters of a backward pass's units (a bucket per unit) on their process group's
    stream; the dense group's runs the pass's post-backward hook before each (:meth:`Pass.post_backward`)."""

    def __init__(self, em: StageEmitter, buckets: Sequence[tuple[Param, ...]], kind: str, *, key: str,
                 hook: Pass | None = None) -> None:
        super().__init__(em, buckets, kind, op="reduce_scatter", key=key, stream=PG_STREAMS[kind])
        self._hook = hook

    def _issue(self, i: int, nbytes: int, producer: int) -> int | None:
        if self._hook is not None:
            self._hook.post_backward(producer)
        return super()._issue(i, nbytes, producer)


def _last_kernel(em: StageEmitter) -> int:
    """The last op on the compute stream (a unit's free follows its kernels, not its collectives)."""
    ops = em.program.ops
    for i in range(len(ops) - 1, -1, -1):
        if ops[i].stream == "compute" and ops[i].kind == "kernel":
            return i
    return em.last
