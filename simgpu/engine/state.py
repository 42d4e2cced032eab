"""The engine's state while a program runs: per rank (:class:`_Rank`), per template of ranks
(:class:`_Shape`), per stream and per collective waiting for its members (:class:`_Rendezvous`),
and the engine's own events on SimPy's queue (:class:`_Call`, :class:`_Ends`, :class:`_Wakes`)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..graph import CollectiveCall, Op


@dataclass(slots=True)
class _Rendezvous:
    call: CollectiveCall
    needed: int  # members that arrive (the representatives among them, when folded)
    arrived: dict[int, tuple[CollectiveCall, int]] = field(default_factory=dict)  # rank -> (call, op index)
    across: bool | None = None  # the group spans nodes (found where memory-bound kernels need it)


class _Stream:
    __slots__ = ("busy", "queue", "waking")

    def __init__(self) -> None:
        self.queue: deque[int] = deque()
        self.busy = False
        self.waking = False


class _Shape:
    """What the ranks of one template share (:attr:`Program.template`; a program without one is its
    own): each op's dependents and count of distinct dependencies."""

    __slots__ = ("counts", "dependents", "deps_left", "ends_on", "left", "ops", "ranks", "starts_on", "times")

    def __init__(self, ops: list[Op]) -> None:
        n = len(ops)
        self.ops = ops
        self.ranks: list[_Rank] = []
        self.left = 0  # ranks whose records are still to be made
        #: every rank's four times per op and its dependency counts, one block for all the ranks
        #: (given back at once when the last rank's records are made), set by :meth:`allocate`
        self.times = np.zeros((4, 0, n))
        self.counts = np.zeros((0, n), dtype=np.int32)
        self.deps_left = [0] * n
        self.dependents: list[list[int]] = [[] for _ in range(n)]
        #: per op, the stream whose queue its end frees (kernels, copies, collectives), else None
        self.ends_on: list[str | None] = [o.stream if o.kind in ("kernel", "memcpy", "collective") else None
                                          for o in ops]
        #: per op, the stream its last dependency's end may start it on (every kind but host work and
        #: host_wait), else None
        self.starts_on: list[str | None] = [None if o.kind in ("host", "host_wait") else o.stream for o in ops]
        for i, op in enumerate(ops):
            deps = set(op.deps)
            self.deps_left[i] = len(deps)
            for d in deps:
                self.dependents[d].append(i)

    def allocate(self, ranks: int) -> None:
        self.times = np.full((4, ranks, len(self.ops)), math.nan)
        self.counts = np.tile(np.asarray(self.deps_left, dtype=np.int32), (ranks, 1))
        self.left = ranks


class _Rank:
    """What the engine tracks for one rank while its program runs, and the times its records take.

    Each op has two records at most: on the CPU thread, its launch (a ``host`` op: its host work),
    from ``launch`` to ``issue``; a kernel, copy or collective on its stream from ``start`` to
    ``end``, a ``host_wait`` on the CPU thread from when the thread began to wait to when it went on.
    """

    __slots__ = (
        "cpu_time",
        "cursor",
        "dependents",
        "deps_left",
        "done",
        "end",
        "ends_on",
        "factor",
        "issue",
        "launch",
        "launch_scale",
        "ops",
        "rank",
        "start",
        "starts_on",
        "streams",
        "wait_since",
        "waiting",
    )

    def __init__(self, rank: int, ops: list[Op], shape: _Shape, k: int, launch_scale: float) -> None:
        """Rank ``rank``, the ``k``-th of its shape's (see :meth:`_Shape.allocate`)."""
        self.rank, self.ops, self.launch_scale = rank, ops, launch_scale
        # memoryviews into the shape's blocks: read and written one element at a time, as fast as
        # lists or arrays
        self.launch, self.issue, self.start, self.end = (_view(shape.times[j, k]) for j in range(4))
        self.deps_left = _view(shape.counts[k])
        self.done = bytearray(len(ops))
        self.dependents = shape.dependents
        self.ends_on, self.starts_on = shape.ends_on, shape.starts_on
        self.streams: dict[str, _Stream] = {}
        self.cursor = 0
        self.cpu_time = 0.0
        self.waiting = -1  # index of the host_wait the CPU thread is blocked on
        self.wait_since = 0.0
        #: per op, the factor on its kernel's time (``variability``: a slow GPU, jitter), else None
        self.factor: list[float] | None = None


def _view(a: np.ndarray) -> Any:
    """A memoryview of ``a``'s elements (Python floats or ints one at a time)."""
    return memoryview(a)  # type: ignore[arg-type]


#: what a rank and its shape hold once their times and counts are given back
_NO_TIMES = _view(np.zeros(0))
_NO_COUNTS = _view(np.zeros(0, dtype=np.int32))
_EMPTY_TIMES = np.zeros((4, 0, 0))
_EMPTY_COUNTS = np.zeros((0, 0), dtype=np.int32)


class _Call:
    """A SimPy event that calls ``engine._finish(rank, op)`` when processed: scheduled directly on
    the environment's queue as a ``Timeout`` would be, without a closure or an event of SimPy's."""

    __slots__ = ("callbacks", "i", "r")
    _ok = True

    def __init__(self, callbacks: list[Any], r: _Rank, i: int) -> None:
        self.callbacks, self.r, self.i = callbacks, r, i


class _Ends:
    """A SimPy event for a provisional memory-bound kernel's end (``engine._end(rank, op, token)``),
    scheduled as :class:`_Call` is."""

    __slots__ = ("callbacks", "i", "r", "token")
    _ok = True

    def __init__(self, callbacks: list[Any], r: _Rank, i: int, token: int) -> None:
        self.callbacks, self.r, self.i, self.token = callbacks, r, i, token


class _Wakes:
    """A SimPy event that wakes a stream whose next op is issued later (``engine._wake(rank, stream)``),
    scheduled as :class:`_Call` is."""

    __slots__ = ("callbacks", "r", "stream")
    _ok = True

    def __init__(self, callbacks: list[Any], r: _Rank, stream: _Stream) -> None:
        self.callbacks, self.r, self.stream = callbacks, r, stream
