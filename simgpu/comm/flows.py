"""The flow network's bookkeeping: transfers started together (:class:`_Batch`), the flows that
carry them (:class:`_Flow`, one transfer or an aggregate of several), the aggregates started
together (:class:`_Block`), what fires when they end (:class:`_Join`, :func:`soon`), and a
single route's flow (:func:`_single`)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np
import simpy
from simpy.events import NORMAL

from .parts import PartGroups
from .transfers import TransferTable

#: the fewest transfers started together that are grouped into aggregates (fewer cost less one by one)
AGGREGATE_FROM = 64
_ONES = tuple(np.array([k]) for k in range(AGGREGATE_FROM))
for _a in _ONES:
    _a.flags.writeable = False


class _Soon:
    """An event on SimPy's queue that calls ``fn(arg)`` when processed: scheduled directly, as a
    ``Timeout`` or a succeeded event would be, without an event of SimPy's or a closure (the engine's
    loop calls ``fn`` itself; SimPy's ``step`` calls it through ``callbacks``)."""

    __slots__ = ("arg", "callbacks", "fn")
    _ok = True

    def __init__(self, fn: Any, arg: Any) -> None:
        self.fn, self.arg, self.callbacks = fn, arg, _FIRE


def _fire(event: _Soon) -> None:
    event.fn(event.arg)


_FIRE = [_fire]


def soon(env: simpy.Environment, t: float, fn: Any, arg: Any) -> None:
    """Call ``fn(arg)`` at simulated time ``t`` (now if ``t`` has passed), at the place in SimPy's
    queue that ``env.timeout(max(t - now, 0))`` would take."""
    now = env._now
    delay = t - now
    queue: list[Any] = env._queue  # (time, priority, id, event)
    heapq.heappush(queue, (now + (delay if delay > 0 else 0.0), NORMAL, next(env._eid), _Soon(fn, arg)))


class _Join:
    """Fires ``event`` once ``left`` member transfers have ended (or, without an event, schedules
    ``fn(arg)`` now, where ``event.succeed()`` would schedule the event)."""

    __slots__ = ("arg", "env", "event", "fn", "left")

    def __init__(self, event: simpy.Event | None, left: int, env: simpy.Environment | None = None,
                 fn: Any = None, arg: Any = None) -> None:
        self.event, self.left, self.env, self.fn, self.arg = event, left, env, fn, arg

    def fire(self) -> None:
        if self.event is not None:
            self.event.succeed()
            return
        env = self.env
        assert env is not None
        queue: list[Any] = env._queue
        heapq.heappush(queue, (env._now, NORMAL, next(env._eid), _Soon(self.fn, self.arg)))


class _Batch:
    """Transfers started together: each one's links, and what fires when each ends (``shared``: one
    join for all of them, else ``targets``, an event or None each); ``owner`` names whose they are
    (:mod:`simgpu.comm.owners`)."""

    __slots__ = ("links", "owner", "shared", "table", "targets")

    def __init__(self, links: Sequence[Sequence[int]], targets: Sequence[Any] = (), shared: _Join | None = None,
                 table: TransferTable | None = None, owner: str = "") -> None:
        self.links, self.targets, self.shared, self.table, self.owner = links, targets, shared, table, owner

    @classmethod
    def of(cls, items: Sequence[tuple[Sequence[int], float, float]] | TransferTable, targets: Sequence[Any] = (),
           shared: _Join | None = None, owner: str = "") -> _Batch:
        """The batch of ``items``: a list of ``(links, ...)`` or a :class:`TransferTable`, whose routes
        are read from its arrays (a member's own tuple is made only if it has to run alone)."""
        if isinstance(items, TransferTable):
            return cls(_TableRoutes(items), targets, shared, items, owner)
        return cls([links for links, *_ in items], targets, shared, owner=owner)

    def lens(self) -> np.ndarray:
        """The number of links of each transfer's route."""
        if self.table is not None:
            return self.table.lens
        return np.fromiter(map(len, self.links), dtype=np.int64, count=len(self.links))

    def flat(self, live: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """The links of the transfers ``live`` (their route lengths ``lens``), route after route."""
        if self.table is None:
            return np.fromiter(chain.from_iterable(self.links[i] for i in live.tolist()), dtype=np.int64,
                               count=int(lens.sum()))
        t = self.table
        if len(live) == len(t):
            return t.flat
        keep = np.zeros(len(t), dtype=bool)
        keep[live] = True
        return t.flat[np.repeat(keep, t.lens)]

    def ended(self, idx: np.ndarray, count: int | None = None) -> None:
        """The transfers at ``idx`` have ended (``count``: how many, where one join waits for all
        and ``idx`` need not be made)."""
        if self.shared is not None:
            self.shared.left -= len(idx) if count is None else count
            if self.shared.left == 0:
                self.shared.fire()
            return
        for i in idx.tolist():
            if self.targets[i] is not None:
                self.targets[i].succeed()

    def flow_ended(self, f: _Flow) -> None:
        """The members of ``f`` have ended."""
        if self.shared is not None:
            self.shared.left -= f.count
            if self.shared.left == 0:
                self.shared.fire()
        else:
            self.ended(f.idx)


class _TableRoutes(Sequence[tuple[int, ...]]):
    """The routes of a :class:`TransferTable`, each made as a tuple when asked for."""

    __slots__ = ("table",)

    def __init__(self, table: TransferTable) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i: int) -> tuple[int, ...]:  # type: ignore[override]
        return self.table.links(i)


class _Flow:
    """A transfer on the network, or an aggregate of several started together.

    ``links`` are the distinct links it crosses and ``w`` how many edges (of all its members) cross
    each; its ``count`` members are the transfers ``idx`` of ``batch`` (found when first asked
    for, where ``group`` says which group of a :class:`PartGroups` it is); ``common`` (aggregates
    only) the links every member crosses; ``block`` (aggregates only) the aggregates it started
    with; ``active`` whether it is on the network."""

    __slots__ = ("_idx", "active", "batch", "block", "cap", "common", "count", "finish", "group", "imp", "last",
                 "links", "rate", "remaining", "route", "serial", "w")

    def __init__(self, links: np.ndarray, w: np.ndarray, nbytes: float, batch: _Batch, idx: np.ndarray | None,
                 cap: float = float("inf"), common: np.ndarray | None = None, serial: int = 0,
                 group: tuple[PartGroups, int] | None = None, route: _Route | None = None) -> None:
        self.links, self.w, self.remaining, self.rate, self.cap = links, w, nbytes, 0.0, cap
        #: a single route's facts (:meth:`FlowNetwork._route`), where it came from a list of transfers
        self.route = route
        self.batch, self._idx, self.common, self.group = batch, idx, common, group
        self.count = len(idx) if idx is not None else int(group[0].size[group[1]]) if group is not None else 0
        self.serial, self.last, self.finish = serial, 0.0, float("inf")
        self.block: _Block | None = None
        self.active = False
        #: the implied links it crosses and its edges on each (:meth:`FlowNetwork._implied_of`), once known
        self.imp: list[tuple[int, float]] | None = None if route is None else route[5]

    @property
    def idx(self) -> np.ndarray:
        """Its members: positions in its batch, in increasing order."""
        if self._idx is None:
            assert self.group is not None
            self._idx = self.group[0].members(self.group[1])
        return self._idx

    def settle(self, now: float) -> None:
        """Bring ``remaining`` up to ``now`` at the current rate."""
        if now > self.last:
            self.remaining -= self.rate * (now - self.last)
            self.last = now


class _Block:
    """The aggregates started together, indexed on the network as one: under each link any of them
    crosses (``links``), so that starting, ending or reaching them costs one entry per link, not one
    per aggregate and link. Reaching the block reaches all its active aggregates (a superset of the
    component is exact: the rates of flows that share no link do not depend on each other)."""

    __slots__ = ("links", "live", "members", "serial")

    def __init__(self, members: list[_Flow], links: np.ndarray, serial: int) -> None:
        self.members, self.links, self.serial, self.live = members, links, serial, len(members)
        for f in members:
            f.block = self


#: one route's distinct links and edges crossing each (as arrays; as lists, the implied links left out),
#: its rate alone on the network (its slowest link's share), and its implied links with their edges
_Route = tuple[np.ndarray, np.ndarray, list[int], list[float], float, list[tuple[int, float]]]


def _one(k: int) -> np.ndarray:
    """``np.array([k])``, shared (read only) for the first few ``k``."""
    return _ONES[k] if k < len(_ONES) else np.array([k])


def _single(batch: _Batch, i: int, nbytes: float, cap: float) -> _Flow:
    links = batch.links[i]
    if len(set(links)) == len(links):  # a route: each link once
        ids, w = np.array(links, dtype=np.int64), np.ones(len(links))
    else:  # a coflow: a link once per edge crossing it
        ids, mult = np.unique(np.asarray(links, dtype=np.int64), return_counts=True)
        w = mult.astype(float)
    return _Flow(ids, w, float(nbytes), batch, np.array([i]), float(cap))



def _live(table: TransferTable, routed: bool = False) -> np.ndarray:
    """The transfers of ``table`` that move bytes over at least one link (``routed``: that cross
    one), the same array each time where that is all of them."""
    moving = table.lens > 0 if routed else _moving(table)
    if not moving.all():
        return np.flatnonzero(moving)
    held = table.memo.get("all live")
    if not isinstance(held, np.ndarray) or len(held) != len(table):
        held = table.memo["all live"] = np.arange(len(table))
    return held


def _moving(table: TransferTable) -> np.ndarray:
    """Whether each transfer of ``table`` has bytes to move over at least one link."""
    if table.kinds is not None and table.kind_nbytes is not None:
        return (np.asarray(table.kind_nbytes) > 0)[table.kinds] & (table.lens > 0)
    return (np.asarray(table.nbytes) > 0) & (table.lens > 0)
