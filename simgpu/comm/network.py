"""Links as shared resources on the SimPy clock: transfers share bandwidth max-min fairly.

A transfer moves ``nbytes`` over a set of links. Concurrent transfers crossing a link share its
capacity; the rates of all active transfers are the max-min fair allocation (progressive filling),
recomputed whenever a transfer starts or ends. This is the limit of chunk-by-chunk turn taking as
chunks shrink, at the cost of one event per start and end instead of one per chunk and hop.

A transfer may be a *coflow*: several edges that progress at one common rate (the edges of a ring,
which in steady state all move at the pace of the slowest). Its ``links`` list the links of all
edges, a link appearing once per edge that crosses it; each of its edges moves ``nbytes``.

Transfers started together (:meth:`FlowNetwork.transfer_all`, at least :data:`AGGREGATE_FROM` of
them) that move the same bytes under the same cap and have the same first slowest link on their
route (the NIC port of a rail, for the pairs of an all-to-all) are carried as one *aggregate* flow:
one entry in the max-min computation, one finish time, whose load on each link is the sum of its
members'. That is exact whenever every member would get the aggregate's rate on its own, and the
network checks it at every recomputation: the max-min fair allocation is the one in which every
flow is at its cap or crosses a saturated link on which no flow gets more (its bottleneck), and an
aggregate whose bottleneck is a link all its members cross gives each member such a bottleneck. An
aggregate without one (its members would part: one of them crosses a contended link the others do
not) is split into its members, each with the bytes the aggregate had left, and the rates are
computed again.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np
import simpy
from simpy.events import NORMAL

from .parts import Incidence, PartGroups, part_anchors
from .plan import TransferTable

_EPS_S = 1e-12  # flows within this many seconds of completion are complete
#: relative slack of the aggregate check: a link this close to its capacity is saturated, a rate
#: this close to a link's highest is the highest (the progressive filling's own tolerance is 1e-9)
_CHECK_TOL = 1e-8
#: the fewest transfers started together that are grouped into aggregates (fewer cost less one by one)
AGGREGATE_FROM = 64
_ONES = tuple(np.array([k]) for k in range(AGGREGATE_FROM))
for _a in _ONES:
    _a.flags.writeable = False
#: the most (group, link) counters the aggregates' links are counted in at once (beyond: sorted)
_DENSE_BINS = 1 << 26


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
    join for all of them, else ``targets``, an event or None each)."""

    __slots__ = ("links", "shared", "table", "targets")

    def __init__(self, links: Sequence[Sequence[int]], targets: Sequence[Any] = (), shared: _Join | None = None,
                 table: TransferTable | None = None) -> None:
        self.links, self.targets, self.shared, self.table = links, targets, shared, table

    @classmethod
    def of(cls, items: Sequence[tuple[Sequence[int], float, float]] | TransferTable, targets: Sequence[Any] = (),
           shared: _Join | None = None) -> _Batch:
        """The batch of ``items``: a list of ``(links, ...)`` or a :class:`TransferTable`, whose routes
        are read from its arrays (a member's own tuple is made only if it has to run alone)."""
        if isinstance(items, TransferTable):
            return cls(_TableRoutes(items), targets, shared, items)
        return cls([links for links, *_ in items], targets, shared)

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


def _flows_of(batch: _Batch, live: np.ndarray, nbytes: np.ndarray, caps: np.ndarray, capacity: np.ndarray,
              aggregate_from: int = AGGREGATE_FROM) -> list[_Flow]:
    """Flows for the transfers ``live`` of ``batch`` (none empty; their bytes and caps) started
    together: where there are at least ``aggregate_from`` (0: never), those with the same bytes, cap
    and first slowest link form one aggregate (see the module docstring)."""
    n = len(live)
    if n < max(2, aggregate_from) or aggregate_from <= 0:
        return [_single(batch, i, b, c) for i, b, c in zip(live.tolist(), nbytes.tolist(), caps.tolist(), strict=True)]
    memo = batch.table.memo if batch.table is not None else None
    uniform = memo is not None and nbytes.min() == nbytes.max() and caps.min() == caps.max()
    held: Any = memo.get("anchors") if memo is not None else None
    if held is not None and np.array_equal(held[0], live) and np.array_equal(held[1], capacity):
        lens, flat, owner, anchor = held[2]  # the same routes on the same links
    else:
        lens = batch.lens()[live]
        flat = batch.flat(live, lens)
        starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
        owner = np.repeat(np.arange(n), lens)
        cap_at = capacity[flat]
        low = np.minimum.reduceat(cap_at, starts)
        hits = np.flatnonzero(cap_at == low[owner])
        anchor = flat[hits[np.searchsorted(hits, starts)]]
        if memo is not None:
            memo["anchors"] = (live, capacity.copy(), (lens, flat, owner, anchor))
    # all bytes alike and all caps alike (an even all-to-all): the groups are those of the first
    # slowest links alone, the same for every protocol's plan
    held = memo.get("uniform") if memo is not None and uniform else None
    if held is not None and held[0] is anchor:
        order, gid = held[1], held[2]
    else:
        order = np.lexsort((caps, nbytes, anchor))
        a, b, c = anchor[order], nbytes[order], caps[order]
        first = np.concatenate(([True], (a[1:] != a[:-1]) | (b[1:] != b[:-1]) | (c[1:] != c[:-1])))
        gid = np.empty(n, dtype=np.int64)
        gid[order] = np.cumsum(first) - 1
        if memo is not None and uniform:
            memo["uniform"] = (anchor, order, gid)
    held = memo.get("groups") if memo is not None else None
    if held is not None and np.array_equal(held[0], live) and np.array_equal(held[1], gid):
        members = held[2]  # the same members in the same groups: the same links
    else:
        members = _group_members(live, order, gid, flat, lens, owner, len(capacity))
        if memo is not None:
            memo["groups"] = (live, gid, members)
    out: list[_Flow] = []
    for m, ids, links, w, common in members:
        i0 = int(m[0])
        if len(m) == 1:
            out.append(_single(batch, int(live[i0]), float(nbytes[i0]), float(caps[i0])))
        else:
            out.append(_Flow(links, w, float(nbytes[i0]), batch, ids, float(caps[i0]), common))
    return out


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` hold the same numbers (at once where they are one array)."""
    return a is b or np.array_equal(a, b)


def _by_kind(table: TransferTable | None, live: np.ndarray, aggregate_from: int) -> np.ndarray | None:
    """The kinds of the transfers ``live`` of ``table``, where its bytes and caps are given per kind
    and its routes as parts, and there are enough to aggregate; else None."""
    if table is None or table.kinds is None or table.parts is None:
        return None
    if aggregate_from <= 0 or len(live) < max(2, aggregate_from):
        return None
    return table.kinds if len(live) == len(table) else table.kinds[live]


def _part_flows(batch: _Batch, live: np.ndarray, kinds: np.ndarray, kb: np.ndarray, kc: np.ndarray,
                capacity: np.ndarray) -> list[_Flow] | None:
    """:func:`_flows_of` for the transfers ``live`` of a table whose routes are :class:`RouteParts`,
    of ``kinds`` (one each) that move ``kb`` bytes under the cap ``kc`` (per kind): its groups found
    from the parts and the kinds, with per pair only a few numbers read; None where the parts do
    not allow it (see :func:`_part_anchors`)."""
    table = batch.table
    assert table is not None and table.parts is not None
    K = len(kb)
    # kinds of the same bytes and cap are one class: groups are (first slowest link, class)
    by = np.lexsort((kc, kb))
    new = np.concatenate(([True], (kb[by][1:] != kb[by][:-1]) | (kc[by][1:] != kc[by][:-1])))
    kclass = np.empty(K, dtype=np.int64)
    kclass[by] = np.cumsum(new) - 1
    memo = table.memo
    held: Any = memo.get("part anchors")
    if held is not None and _same(held[0], live) and np.array_equal(held[1], capacity):
        anchor = held[2]  # the same routes on the same links
    else:
        memo.pop("part anchors", None)
        memo.pop("part groups", None)
        anchor = part_anchors(table.parts, live, capacity)
        memo["part anchors"] = (live, capacity.copy(), anchor)
    if anchor is None:
        return None
    held = memo.get("part groups")
    if held is not None and held[0] is anchor and np.array_equal(held[1], kclass) and _same(held[2], kinds):
        grouping = held[3]
    else:
        memo.pop("part groups", None)
        classes = int(kclass.max()) + 1
        grouping = PartGroups.of(table.parts, live, anchor * classes + kclass[kinds] if classes > 1 else anchor,
                                  len(capacity))
        memo["part groups"] = (anchor, kclass, kinds, grouping)
    out: list[_Flow] = []
    heads = grouping.heads
    head_kind = kinds[heads]
    hb, hc = kb[head_kind].tolist(), kc[head_kind].tolist()
    for g in np.argsort(heads, kind="stable").tolist():  # in the order the transfers came (see .made)
        if grouping.size[g] == 1:
            out.append(_single(batch, int(live[heads[g]]), hb[g], hc[g]))
        else:
            links, w, common = grouping.links[g]
            out.append(_Flow(links, w, hb[g], batch, None, hc[g], common, group=(grouping, g)))
    return out


_Members = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _group_members(live: np.ndarray, order: np.ndarray, gid: np.ndarray, flat: np.ndarray, lens: np.ndarray,
                   owner: np.ndarray, L: int) -> list[_Members]:
    """Per group ``gid`` of the transfers ``live`` (``order``: sorted by group), in the order the
    transfers came: its members (positions in ``live``, sorted, and their transfers), its links, the
    edges crossing each and the links every member crosses."""
    first = np.concatenate(([True], gid[order][1:] != gid[order][:-1]))
    groups = np.split(order, np.flatnonzero(first)[1:])  # members of each group, group by group
    size = np.bincount(gid)
    kl, mult, ccount, bounds = _group_links(flat, lens, owner, gid, len(size), L)
    out = []
    heads = np.fromiter((m.min() for m in groups), dtype=np.int64, count=len(groups))
    for g in np.argsort(heads, kind="stable").tolist():  # in the order the transfers came
        m = np.sort(groups[g])
        lo, hi = bounds[g], bounds[g + 1]
        links = kl[lo:hi]
        out.append((m, live[m], links, mult[lo:hi].astype(float), links[ccount[lo:hi] == size[g]]))
    return out


def _group_links(flat: np.ndarray, lens: np.ndarray, owner: np.ndarray, gid: np.ndarray, groups: int, L: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per (group, link), in order of group then link, for the routes ``flat`` (lengths ``lens``, of
    the transfers ``owner``) in groups ``gid`` (of ``groups``) over ``L`` links: the link, the
    edges crossing it, and the members crossing it (each member once); and where each group's
    rows begin (one more for the end)."""
    if groups * L <= _DENSE_BINS:  # few enough (group, link) pairs to count in place of sorting
        counts = np.bincount(gid[owner] * L + flat, minlength=groups * L)
        keys = np.flatnonzero(counts)
        mult = counts[keys]
    else:
        keys, mult = np.unique(gid[owner] * L + flat, return_counts=True)
    if _repeats_a_link(flat, lens):
        crossing = np.sort(owner * L + flat)
        crossing = crossing[np.concatenate(([True], crossing[1:] != crossing[:-1]))]
        _, ccount = np.unique(gid[crossing // L] * L + crossing % L, return_counts=True)
    else:  # every route crosses each of its links once: members crossing a link are its edges
        ccount = mult
    kg, kl = np.divmod(keys, L)
    return kl, mult, ccount, np.searchsorted(kg, np.arange(groups + 1))


def _repeats_a_link(flat: np.ndarray, lens: np.ndarray) -> bool:
    """Whether any of the routes ``flat`` (route after route, lengths ``lens``) crosses a link twice."""
    width = int(lens.max())
    table = np.full((len(lens), width), -1, dtype=np.int64)
    table[np.arange(width) < lens[:, None]] = flat
    table.sort(axis=1)
    return bool(np.any((table[:, 1:] == table[:, :-1]) & (table[:, 1:] >= 0)))


class FlowNetwork:
    """Max-min fair bandwidth sharing over links with capacities in bytes/s.

    Max-min fair rates on flows that share no link, directly or through other flows, do not depend
    on each other, so a start or an end recomputes the rates of its connected component only (the
    flows reachable from its links through shared links); the other flows keep their rates and are
    not touched. Each flow's progress is brought up to date only when its rate changes, and the
    next completion comes from a heap of finish times.

    ``implied`` names links whose capacity can never limit a flow, each with the links that *cover*
    it: every flow crossing the link crosses its cover at least as many times, and the cover's
    capacities sum to no more than the link's (a fat tree's leaf uplink and the leaf's NIC ports, on
    a core that is not oversubscribed). The link's constraint is then implied by its cover's, and the
    max-min fair allocation is the same without it; so it joins no component (the data-parallel
    rings of every replica meet on the leaf uplinks, and would make one component of them all), and
    its bytes and busy time are counted from the rates of the flows crossing it, kept as a running
    sum. Each flow is checked against the premise when it first crosses such a link."""

    def __init__(self, env: simpy.Environment, capacity: np.ndarray, link_kinds: Sequence[str] | None = None,
                 record: bool = False, aggregate_from: int = AGGREGATE_FROM,
                 implied: dict[int, frozenset[int]] | None = None) -> None:
        if np.any(capacity <= 0):
            raise ValueError("link capacities must be positive")
        self.env = env
        self.capacity = np.asarray(capacity, dtype=float)
        self._implied = dict(implied or {})
        #: implied link -> how many flows with a rate cross it
        self._implied_flows: dict[int, int] = dict.fromkeys(self._implied, 0)
        #: per link: the implied link whose cover it is in, else -1 (covers are disjoint)
        self._cover_of = np.full(len(self.capacity), -1, dtype=np.int64)
        self._is_implied = np.zeros(len(self.capacity), dtype=bool)
        self._is_implied[list(self._implied)] = True
        for lid, cover in self._implied.items():
            c = np.fromiter(cover, dtype=np.int64, count=len(cover))
            if self._is_implied[c].any() or (self._cover_of[c] >= 0).any():
                raise ValueError(f"implied link {lid}: the covers of implied links must be disjoint and "
                                 "hold no implied link")
            self._cover_of[c] = lid
        self._owner = {int(c): lid for lid, cover in self._implied.items() for c in cover}
        self._imp_memo: dict[tuple[float, ...], list[tuple[int, float]]] = {}  # a few links, weights -> theirs
        # bytes and busy seconds per link, as Python floats (added to one link at a time)
        self._bytes = [0.0] * len(capacity)
        self._busy = [0.0] * len(capacity)
        self.transfers = 0
        self.reschedules = 0
        #: aggregates split because their members would part, and aggregates started
        self.splits = 0
        self.aggregates = 0
        self._aggregate_from = aggregate_from
        self._serial = 0
        #: link -> the active flows crossing it (blocks of aggregates: once), by serial
        self._on_link: dict[int, dict[int, _Flow | _Block]] = {}
        self._link_rate: dict[int, float] = {}            # link -> total rate on it (links in use only)
        self._link_last: dict[int, float] = {}            # link -> when its bytes were last settled
        self._heap: list[tuple[float, int, _Flow]] = []   # (finish time, serial, flow); stale entries skipped
        self._wake_at = float("inf")
        self._gen = 0
        self._record = record
        self._busy_since: dict[int, float] = {}
        self.intervals: list[tuple[int, float, float]] = []
        #: link tuple -> its route's facts (:meth:`_route`): the same routes come again and again
        self._routes: dict[tuple[int, ...], _Route] = {}

    @property
    def link_bytes(self) -> np.ndarray:
        """Bytes each link has carried, up to its last settling (all of them after :meth:`finish`)."""
        return np.array(self._bytes)

    @property
    def link_busy_s(self) -> np.ndarray:
        """Seconds each link has carried traffic, as :attr:`link_bytes`."""
        return np.array(self._busy)

    @property
    def flows(self) -> list[_Flow]:
        """The active flows, in the order they started."""
        seen: dict[int, _Flow] = {}
        for on in self._on_link.values():
            for k, item in on.items():
                if isinstance(item, _Block):
                    seen.update((f.serial, f) for f in item.members if f.active)
                else:
                    seen[k] = item
        return [seen[k] for k in sorted(seen)]

    # -- public ---------------------------------------------------------------------------------

    def transfer(self, links: Sequence[int], nbytes: float, latency: float = 0.0,
                 max_rate: float = float("inf")) -> simpy.Event:
        """An event that fires when ``nbytes`` have crossed ``links`` after ``latency`` seconds, at
        no more than ``max_rate`` bytes/s."""
        done = self.env.event()
        self.transfers += 1
        if nbytes <= 0 or len(links) == 0:
            if latency > 0:
                self.env.timeout(latency).callbacks.append(lambda _e: _succeed(done))
            else:
                done.succeed()
            return done
        flow = _single(_Batch([links], [done]), 0, nbytes, max_rate)
        self._serial += 1
        flow.serial = self._serial
        if latency > 0:
            self.env.timeout(latency).callbacks.append(lambda _e: self._start([flow]))
        else:
            self._start([flow])
        return done

    def transfer_all(self, items: Sequence[tuple[Sequence[int], float, float]] | TransferTable
                     ) -> list[simpy.Event]:
        """Start several ``(links, nbytes, max_rate)`` transfers at once, with one reallocation of
        the rates (``max_rate``: bytes/s the transfer never exceeds, ``inf`` for none).

        The same as calling :meth:`transfer` for each, but a collective of thousands of pairs (an
        all-to-all over many GPUs) costs one max-min computation instead of one per pair, and its
        pairs alike are carried as aggregates (see the module docstring).
        """
        events = [self.env.event() for _ in range(len(items))]
        self._start_items(_Batch.of(items, events), items)
        return events

    def transfer_group(self, items: Sequence[tuple[Sequence[int], float, float]] | TransferTable
                       ) -> simpy.Event:
        """Like :meth:`transfer_all`, but one event that fires when the last of them has ended."""
        done = self.env.event()
        self._group(items, _Join(done, 0))
        return done

    def transfer_group_then(self, items: Sequence[tuple[Sequence[int], float, float]] | TransferTable,
                            fn: Any, arg: Any) -> None:
        """Like :meth:`transfer_group`, but ``fn(arg)`` is called where the event's callback would
        be, at the same place in SimPy's queue, without the event."""
        self._group(items, _Join(None, 0, self.env, fn, arg))

    def _group(self, items: Sequence[tuple[Sequence[int], float, float]] | TransferTable, join: _Join) -> None:
        if not isinstance(items, TransferTable) and (len(items) < max(2, self._aggregate_from)
                                                     or self._aggregate_from <= 0):
            # a few transfers (the edges of a ring, a pipeline's send): flows one by one, each
            # from its route's facts worked out once (what _start_items and _flows_of do for them)
            moving = [k for k, (links, b, _) in enumerate(items) if b > 0 and len(links) > 0]
            self.transfers += len(items)
            join.left = len(moving)
            if not moving:
                join.fire()
                return
            batch = _Batch([t[0] for t in items], (), join)
            flows = []
            for k in moving:
                links, b, c = items[k]
                route = self._route(links)
                flows.append(_Flow(route[0], route[1], float(b), batch, _one(k), float(c), route=route))
            self._start(flows)
            return
        if isinstance(items, TransferTable):
            join.left = int(np.count_nonzero(_moving(items)))
        else:
            join.left = sum(1 for links, b, _ in items if b > 0 and len(links) > 0)
        if join.left == 0:
            self.transfers += len(items)
            join.fire()
            return
        self._start_items(_Batch.of(items, shared=join), items)

    def _route(self, links: Sequence[int]) -> _Route:
        """The route ``links``'s distinct links and the edges crossing each (as :func:`_single` finds
        them), as lists too, and its rate alone on the network (as :meth:`_start_alone` finds it)."""
        key = links if type(links) is tuple else tuple(links)
        got = self._routes.get(key)
        if got is None:
            if len(set(key)) == len(key):  # a route: each link once
                ids, w = np.array(key, dtype=np.int64), np.ones(len(key))
            else:  # a coflow: a link once per edge crossing it
                ids, mult = np.unique(np.asarray(key, dtype=np.int64), return_counts=True)
                w = mult.astype(float)
            own, own_w, imp = ids.tolist(), w.tolist(), []
            if self._implied:
                imp = self._implied_of_links(ids, w)
                if imp:
                    gone = {lid for lid, _ in imp}
                    own_w = [x for lid, x in zip(own, own_w, strict=True) if lid not in gone]
                    own = [lid for lid in own if lid not in gone]
            rate = min(float(self.capacity[lid]) / x for lid, x in zip(own, own_w, strict=True))
            got = self._routes[key] = (ids, w, own, own_w, rate, imp)
        return got

    def _implied_of_links(self, links: np.ndarray, w: np.ndarray) -> list[tuple[int, float]]:
        """The implied links among ``links`` (a flow's distinct links, ``w`` edges on each) with the
        edges on each, checked against the premise: the flow crosses each one's cover as often."""
        if len(links) <= 32:  # a route or a ring's coflow: cheaper one link at a time, and seen again
            key = (*links.tolist(), *w.tolist())
            got = self._imp_memo.get(key)
            if got is None:
                got = self._imp_memo[key] = self._implied_of_few(links.tolist(), w.tolist())
            return got
        imp = self._is_implied[links]
        if not imp.any():
            return []
        owner = self._cover_of[links]
        covered = owner >= 0
        ids, x = links[imp], w[imp]
        order = np.argsort(ids)
        sids = ids[order]
        k = np.minimum(np.searchsorted(sids, owner[covered]), len(sids) - 1)
        mine = sids[k] == owner[covered]
        held = np.bincount(k[mine], weights=w[covered][mine], minlength=len(sids))
        short = held < x[order]
        if short.any():
            j = int(np.flatnonzero(short)[0])
            raise ValueError(f"link {int(sids[j])} is given as implied, but a flow crosses it {x[order][j]:g} times "
                             "and the links that cover it fewer")
        return list(zip(ids.tolist(), x.tolist(), strict=True))

    def _implied_of_few(self, links: list[int], w: list[float]) -> list[tuple[int, float]]:
        """:meth:`_implied_of_links` of a few links, as lists."""
        implied = self._implied
        if not any(lid in implied for lid in links):
            return []
        owner = self._owner
        held: dict[int, float] = {}
        for lid, x in zip(links, w, strict=True):
            o = owner.get(lid)
            if o is not None:
                held[o] = held.get(o, 0.0) + x
        out = []
        for lid, x in zip(links, w, strict=True):
            if lid in implied:
                if held.get(lid, 0.0) < x:
                    raise ValueError(f"link {lid} is given as implied, but a flow crosses it {x:g} times and "
                                     "the links that cover it fewer")
                out.append((lid, x))
        return out

    def _implied_of(self, f: _Flow) -> list[tuple[int, float]]:
        """The implied links ``f`` crosses, with its edges on each (found once)."""
        imp = f.imp
        if imp is None:
            imp = f.imp = self._implied_of_links(f.links, f.w) if self._implied else []
        return imp

    def _own(self, f: _Flow) -> list[int]:
        """The distinct links of ``f`` it is indexed under: all of them but the implied ones."""
        if f.route is not None:
            return f.route[2]
        if not self._implied:
            return f.links.tolist()
        implied = self._implied
        return [lid for lid in f.links.tolist() if lid not in implied]

    def _bump(self, f: _Flow, old: float, new: float, now: float) -> None:
        """The rate of ``f`` goes from ``old`` to ``new`` (0: it leaves): the implied links it
        crosses, settled up to ``now``, carry the difference."""
        count = self._implied_flows
        link_rate, link_last = self._link_rate, self._link_last
        for lid, x in self._implied_of(f):
            rate = link_rate.get(lid, 0.0)
            last = link_last.get(lid, now)
            if now > last and rate > 0:  # _settle_link, inline
                self._bytes[lid] += rate * (now - last)
                self._busy[lid] += now - last
            n = count[lid]
            if old == 0:
                n += 1
            if new == 0:
                n -= 1
            count[lid] = n
            if n == 0:  # the last flow has left: exactly idle, whatever the running sum's rounding
                link_rate.pop(lid, None)
                link_last.pop(lid, None)
                if self._record and lid in self._busy_since:
                    self.intervals.append((lid, self._busy_since.pop(lid), now))
                continue
            link_rate[lid] = rate + x * (new - old)
            link_last[lid] = now
            if self._record and lid not in self._busy_since:
                self._busy_since[lid] = now

    def finish(self) -> None:
        """Close the busy intervals still open and bring link counters up to date (call once the
        simulation has ended)."""
        now = self.env.now
        for lid in list(self._link_rate):
            self._settle_link(lid, now)
        for lid, since in sorted(self._busy_since.items()):
            self.intervals.append((lid, since, now))
        self._busy_since.clear()

    # -- internals ------------------------------------------------------------------------------

    def _start_items(self, batch: _Batch, items: Sequence[tuple[Sequence[int], float, float]] | TransferTable
                     ) -> None:
        m = len(items)
        self.transfers += m
        if isinstance(items, TransferTable):
            live = _live(items)
            if len(live) < m and batch.shared is None:  # a join counts the moving ones only
                ended = np.ones(m, dtype=bool)
                ended[live] = False
                batch.ended(np.flatnonzero(ended))
            kinds = _by_kind(items, live, self._aggregate_from)
            if kinds is not None and len(live):
                assert items.kind_nbytes is not None and items.kind_max_rate is not None
                flows = _part_flows(batch, live, kinds, np.asarray(items.kind_nbytes, dtype=float),
                                    np.asarray(items.kind_max_rate, dtype=float), self.capacity)
                if flows is not None:
                    self._start_flows(flows)
                    return
            if not len(live):
                return
            nbytes, caps = np.asarray(items.nbytes, dtype=float), np.asarray(items.max_rate, dtype=float)
            self._start_flows(_flows_of(batch, live, nbytes[live], caps[live], self.capacity, self._aggregate_from))
            return
        else:
            nbytes = np.fromiter((b for _, b, _ in items), dtype=float, count=m)
            caps = np.fromiter((c for _, _, c in items), dtype=float, count=m)
        empty = (nbytes <= 0) | (batch.lens() == 0)
        if empty.any() and batch.shared is None:  # a join counts the moving ones only
            batch.ended(np.flatnonzero(empty))
        live = np.flatnonzero(~empty)
        if not len(live):
            return
        self._start_flows(_flows_of(batch, live, nbytes[live], caps[live], self.capacity, self._aggregate_from))

    def _start_flows(self, flows: list[_Flow]) -> None:
        """Start ``flows`` made together: their aggregates indexed as one block."""
        aggs = [f for f in flows if f.common is not None]
        if aggs:
            self.aggregates += len(aggs)
            self._serial += 1
            links = _incidence(aggs, len(self.capacity))[2]  # the links any of them crosses
            if self._implied:
                links = np.array([lid for lid in links.tolist() if lid not in self._implied], dtype=np.int64)
            _Block(aggs, links, self._serial)
        self._start(flows)

    def _start(self, flows: list[_Flow]) -> None:
        now = self.env.now
        if len(flows) == 1 and flows[0].common is None and self._alone(flows[0]):
            self._start_alone(flows[0], now)
            return
        seeds: set[int] = set()
        blocks: dict[int, _Block] = {}
        for f in flows:
            if not f.serial:
                self._serial += 1
                f.serial = self._serial
            f.last, f.active = now, True
            if f.block is not None:
                blocks[f.block.serial] = f.block
                continue
            uniq = self._own(f)
            for lid in uniq:
                self._on_link.setdefault(lid, {})[f.serial] = f
            seeds.update(uniq)
        for b in blocks.values():
            uniq = b.links.tolist()
            for lid in uniq:
                self._on_link.setdefault(lid, {})[b.serial] = b
            seeds.update(uniq)
        self._reschedule(seeds)

    def _alone(self, f: _Flow) -> bool:
        """Whether no active flow crosses any link of ``f`` (a flow not on the network yet)."""
        on = self._on_link
        return not any(on.get(lid) for lid in self._own(f))

    def _start_alone(self, f: _Flow, now: float) -> None:
        """Start ``f``, which shares no link with an active flow: :meth:`_reschedule` of its links,
        whose component is ``f`` alone (its rate is its slowest link's share or its cap, as
        :func:`_fair` computes it), without finding the component."""
        self.reschedules += 1
        if not f.serial:
            self._serial += 1
            f.serial = self._serial
        f.last, f.active = now, True
        route = f.route
        if route is None:
            rate = min(float(np.min(self.capacity[f.links] / f.w)), f.cap)
            if self._implied:
                own = self._own(f)
                keep = np.isin(f.links, own)
                links, loads = own, (f.w[keep] * rate).tolist()
            else:
                links, loads = f.links.tolist(), (f.w * rate).tolist()
        else:
            links = route[2]
            rate = min(route[4], f.cap)
            loads = [w * rate for w in route[3]]
        on = self._on_link
        serial = f.serial
        for lid in links:
            on[lid] = {serial: f}
        if rate != f.rate:
            if self._implied:
                self._bump(f, f.rate, rate, now)
            f.rate = rate
            f.finish = now + max(f.remaining / rate, 0.0)
            heapq.heappush(self._heap, (f.finish, serial, f))
        link_rate, link_last = self._link_rate, self._link_last
        for lid, load in zip(links, loads, strict=True):
            if load > 0:  # its links carried nothing before: no bytes to settle
                link_rate[lid] = load
                link_last[lid] = now
            else:
                link_rate.pop(lid, None)
                link_last.pop(lid, None)
            if self._record:
                if load > 0:
                    self._busy_since.setdefault(lid, now)
                elif lid in self._busy_since:
                    self.intervals.append((lid, self._busy_since.pop(lid), now))
        self._arm()

    def _retire(self, block: _Block) -> None:
        """One of ``block``'s aggregates has left the network; the block leaves with its last."""
        block.live -= 1
        if block.live == 0:
            for lid in block.links.tolist():
                on = self._on_link[lid]
                del on[block.serial]
                if not on:
                    del self._on_link[lid]

    def _component(self, seeds: set[int]) -> tuple[list[_Flow], set[int]]:
        """The active flows connected to the links ``seeds`` through shared links, by serial, and
        the links reached (every link they cross, and the seeds)."""
        comp: dict[int, _Flow] = {}
        reached: set[int] = set()
        seen = set(seeds)
        stack = list(seeds)
        while stack:
            on = self._on_link.get(stack.pop())
            if not on:
                continue
            for k, item in on.items():
                if k in reached:
                    continue
                reached.add(k)
                if isinstance(item, _Block):
                    comp.update((f.serial, f) for f in item.members if f.active)
                else:
                    comp[k] = item
                for lid in item.links.tolist():
                    if lid not in seen:
                        seen.add(lid)
                        stack.append(lid)
        if self._implied:  # reached but not indexed: their counters are the flows' (_bump)
            seen = {lid for lid in seen if lid not in self._implied}
        return [comp[k] for k in sorted(comp)], seen

    def _settle_link(self, lid: int, now: float) -> None:
        last = self._link_last.get(lid, now)
        rate = self._link_rate.get(lid, 0.0)
        if now > last and rate > 0:
            self._bytes[lid] += rate * (now - last)
            self._busy[lid] += now - last
        self._link_last[lid] = now

    def _split(self, flows: list[_Flow], broken: list[int], now: float) -> list[_Flow]:
        """``flows`` with the aggregates at ``broken`` replaced by their members (each with the
        bytes the aggregate had left), by serial."""
        gone = set(broken)
        out = [f for k, f in enumerate(flows) if k not in gone]
        for k in broken:
            agg = flows[k]
            agg.settle(now)
            self.splits += 1
            agg.active = False
            if self._implied and agg.rate > 0:
                self._bump(agg, agg.rate, 0.0, now)
            if agg.block is not None:
                self._retire(agg.block)
            else:
                for lid in self._own(agg):
                    del self._on_link[lid][agg.serial]
            for i in agg.idx.tolist():
                f = _single(agg.batch, i, agg.remaining, agg.cap)
                self._serial += 1
                f.serial, f.last, f.active = self._serial, now, True
                for lid in self._own(f):
                    self._on_link.setdefault(lid, {})[f.serial] = f
                out.append(f)
        out.sort(key=lambda f: f.serial)
        return out

    def _reschedule(self, seeds: set[int]) -> None:
        """New max-min rates for the component of the links ``seeds`` (whose flows changed)."""
        self.reschedules += 1
        now = self.env.now
        on = self._on_link
        link_rate, link_last = self._link_rate, self._link_last
        link_bytes, link_busy = self._bytes, self._busy
        if not any(on.get(lid) for lid in seeds):  # no flow left on them (a lone flow ended): all idle
            for lid in seeds:  # settled (as _settle_link does) and idled
                rate = link_rate.pop(lid, 0.0)
                last = link_last.pop(lid, now)
                if now > last and rate > 0:
                    link_bytes[lid] += rate * (now - last)
                    link_busy[lid] += now - last
                if self._record and lid in self._busy_since:
                    self.intervals.append((lid, self._busy_since.pop(lid), now))
            self._arm()
            return
        flows, touched = self._component(seeds)
        for lid in touched:  # _settle_link, inline
            last = link_last.get(lid, now)
            rate = link_rate.get(lid, 0.0)
            if now > last and rate > 0:
                link_bytes[lid] += rate * (now - last)
                link_busy[lid] += now - last
            link_last[lid] = now
        if flows:
            while True:
                rates, ids, load, broken = _fair(flows, self.capacity)
                if not broken:
                    break
                flows = self._split(flows, broken, now)
            heap = self._heap
            bump = self._bump if self._implied else None
            for f, r in zip(flows, rates.tolist(), strict=True):
                if r == f.rate:
                    continue  # its finish time and heap entry stand
                f.settle(now)
                if bump is not None:
                    bump(f, f.rate, r, now)
                f.rate = r
                f.finish = now + max(f.remaining / r, 0.0)
                heapq.heappush(heap, (f.finish, f.serial, f))
            new_load = dict(zip(ids.tolist(), load.tolist(), strict=True))
        else:
            new_load = {}
        for lid in touched:
            rate = new_load.get(lid, 0.0)
            if rate > 0:
                self._link_rate[lid] = rate
            else:
                self._link_rate.pop(lid, None)
                self._link_last.pop(lid, None)
            if self._record:
                if rate > 0:
                    self._busy_since.setdefault(lid, now)
                elif lid in self._busy_since:
                    self.intervals.append((lid, self._busy_since.pop(lid), now))
        self._arm()

    def _live(self, t: float, serial: int, f: _Flow) -> bool:
        return f.finish == t and f.active

    def _arm(self) -> None:
        """Keep one timeout pending, at the earliest finish time."""
        heap = self._heap
        while heap and not self._live(*heap[0]):
            heapq.heappop(heap)
        if not heap:
            self._wake_at = float("inf")
            return
        t = heap[0][0]
        if t < self._wake_at:
            self._wake_at = t
            self._gen += 1
            soon(self.env, t, self._wake, self._gen)  # where env.timeout(max(t - now, 0)) would go

    def _wake(self, gen: int) -> None:
        if gen != self._gen:
            return
        self._wake_at = float("inf")
        now = self.env.now
        finished: list[_Flow] = []
        ended: set[int] = set()
        heap = self._heap
        while heap:
            t, serial, f = heap[0]
            if serial in ended or not self._live(t, serial, f):
                heapq.heappop(heap)
                continue
            f.settle(now)
            if f.remaining > f.rate * _EPS_S:
                break
            heapq.heappop(heap)
            finished.append(f)
            ended.add(serial)
        if not finished:
            self._arm()
            return
        seeds: set[int] = set()
        blocks: dict[int, _Block] = {}
        for f in finished:
            f.active = False
            if self._implied:
                self._bump(f, f.rate, 0.0, now)
            if f.block is not None:
                if f.block.serial not in blocks:
                    blocks[f.block.serial] = f.block
                    seeds.update(f.block.links.tolist())
                self._retire(f.block)
                continue
            uniq = self._own(f)
            for lid in uniq:
                on = self._on_link[lid]
                del on[f.serial]
                if not on:
                    del self._on_link[lid]
            seeds.update(uniq)
        self._reschedule(seeds)
        for f in sorted(finished, key=lambda f: f.serial):
            f.batch.flow_ended(f)


def _succeed(event: simpy.Event) -> None:
    event.succeed()


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


def isolated_time(table: TransferTable, capacity: np.ndarray) -> float:
    """The longest time any transfer of ``table`` takes at its isolated rate
    (:func:`isolated_rates`; 0 where none crosses a link): for a table of kinds, from its
    aggregates' rates and the largest bytes of each, with no array per transfer."""
    live = _live(table, routed=True)
    kinds = _by_kind(table, live, AGGREGATE_FROM)
    if kinds is None or not len(live):
        return float(np.max(table.nbytes / isolated_rates(table, capacity), initial=0.0))
    assert table.kind_nbytes is not None and table.kind_max_rate is not None
    kb, kc = np.asarray(table.kind_nbytes, dtype=float), np.asarray(table.kind_max_rate, dtype=float)
    batch = _Batch.of(table)
    flows = _part_flows(batch, live, kinds, np.ones(len(kb)), kc, np.asarray(capacity, dtype=float))
    if flows is None:
        return float(np.max(table.nbytes / isolated_rates(table, capacity), initial=0.0))
    flows, rates = _fair_split(batch, flows, capacity)
    worst = 0.0
    one_size = bool(kb.min() == kb.max())  # then every aggregate's largest member bytes are that size
    for f, r in zip(flows, rates.tolist(), strict=True):
        if f.group is not None and f._idx is None:
            most = float(kb[0]) if one_size else float(kb[f.group[0].kinds_of(f.group[1], kinds, len(kb))].max())
        else:
            most = float(kb[table.kinds[f.idx]].max())  # type: ignore[index]
        worst = max(worst, most / r)
    return worst


def isolated_rates(items: Sequence[tuple[Sequence[int], float]] | TransferTable, capacity: np.ndarray
                   ) -> np.ndarray:
    """The max-min fair rate of each ``(links, max_rate)`` transfer (or each of a table's) started
    together on an otherwise idle network (inf for one that crosses no link), computed as the
    network does (aggregates, checked and split)."""
    m = len(items)
    batch = _Batch.of(items)  # type: ignore[arg-type]
    if isinstance(items, TransferTable):
        caps = np.asarray(items.max_rate, dtype=float)
    else:
        caps = np.fromiter((c for _, c in items), dtype=float, count=m)
    live = np.flatnonzero(batch.lens() > 0)
    out = np.full(m, float("inf"))
    flows = _flows_of(batch, live, np.ones(len(live)), caps[live], np.asarray(capacity, dtype=float))
    flows, rates = _fair_split(batch, flows, capacity)
    # aggregates of a table's groups by their group numbers (no members made), then the others
    by_group: dict[int, tuple[PartGroups, np.ndarray]] = {}
    for f, r in zip(flows, rates.tolist(), strict=True):
        if f.group is not None and f._idx is None:
            grouping, g = f.group
            if id(grouping) not in by_group:
                by_group[id(grouping)] = (grouping, np.full(len(grouping.size), np.nan))
            by_group[id(grouping)][1][g] = r
    for grouping, rate in by_group.values():
        at = rate[grouping.gid]
        held = ~np.isnan(at)
        out[grouping.live[held]] = at[held]
    for f, r in zip(flows, rates.tolist(), strict=True):
        if f.group is None or f._idx is not None:
            out[f.idx] = r
    return out


def _fair_split(batch: _Batch, flows: list[_Flow], capacity: np.ndarray) -> tuple[list[_Flow], np.ndarray]:
    """The max-min fair rates of ``flows`` on an idle network, the aggregates that fail the check
    split into their members until none does: the flows and their rates."""
    while True:
        rates, _, _, broken = _fair(flows, capacity)
        if not broken:
            return flows, rates
        gone = set(broken)
        flows = [f for k, f in enumerate(flows) if k not in gone] + [
            _single(batch, i, 1.0, flows[k].cap) for k in broken for i in flows[k].idx.tolist()]


def _fair(flows: Sequence[_Flow], capacity: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """Max-min fair rates of ``flows`` (distinct links, weights), the links in use and the total rate
    on each, and the positions of the aggregates that do not give every member a bottleneck."""
    n = len(flows)
    caps = np.fromiter((f.cap for f in flows), dtype=float, count=n)
    if n == 1 and flows[0].common is None:
        f = flows[0]
        rate = min(float(np.min(capacity[f.links] / f.w)), f.cap)
        return np.array([rate]), f.links, f.w * rate, []
    if all(f.common is None and f.group is None for f in flows):
        pairs = sum(len(f.links) for f in flows)
        if pairs <= _SMALL_FILL:
            return (*_fill_small(flows, capacity), [])
    pair_flow, pair_link, ids, pair_w = _incidence(flows, len(capacity))
    rates, link_rate = _fill(pair_flow, pair_link, pair_w, caps, capacity[ids])
    aggs = np.array([k for k, f in enumerate(flows) if f.common is not None], dtype=np.int64)
    if not len(aggs):
        return rates, ids, link_rate, []
    cap_l = capacity[ids]
    saturated = link_rate >= cap_l * (1 - _CHECK_TOL)
    top = np.zeros(len(ids))
    np.maximum.at(top, pair_link, rates[pair_flow])
    # an aggregate below its cap needs a saturated common link on which no flow gets more
    aggs = aggs[rates[aggs] < caps[aggs] * (1 - _CHECK_TOL)]
    if not len(aggs):
        return rates, ids, link_rate, []
    commons = [flows[k].common for k in aggs.tolist()]
    owner = np.repeat(np.arange(len(aggs)), [len(c) for c in commons])
    c = np.searchsorted(ids, np.concatenate(commons))
    ok = saturated[c] & (rates[aggs][owner] >= top[c] * (1 - _CHECK_TOL))
    held = np.bincount(owner[ok], minlength=len(aggs))
    return rates, ids, link_rate, aggs[held == 0].tolist()


#: the most (flow, link) pairs of a component without aggregates whose rates are filled in plain Python
#: (:func:`_fill_small`); beyond, numpy's per-call cost is the smaller
_SMALL_FILL = 256


def _fill_small(flows: Sequence[_Flow], capacity: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_incidence` and :func:`_fill` for a few flows, in plain Python, with the same
    operations in the same order (the same floats): each flow's rate, the links in use (sorted) and
    the total rate on each."""
    raw: list[int] = []
    pf: list[int] = []
    pw: list[float] = []
    for k, f in enumerate(flows):
        lids = f.links.tolist() if f.route is None else f.route[2]
        raw += lids
        pf += [k] * len(lids)
        pw += f.w.tolist() if f.route is None else f.route[3]
    ids = sorted(set(raw))
    pos = {lid: j for j, lid in enumerate(ids)}
    pl = [pos[lid] for lid in raw]
    n, nl = len(flows), len(ids)
    caps = [f.cap for f in flows]
    capped = any(math.isfinite(c) for c in caps)
    cap_l = capacity[ids].tolist()
    cap_left = list(cap_l)
    tol = [c * 1e-9 for c in cap_l]
    rates = [0.0] * n
    active = [True] * n
    shrink = 1 - 1e-9
    a_f, a_l, a_w = pf, pl, pw  # the pairs of unfrozen flows, in order
    while True:
        load = [0.0] * nl
        for lk, w in zip(a_l, a_w, strict=True):  # np.bincount: summed in pair order
            load[lk] += w
        inc = math.inf
        for lk in range(nl):
            if load[lk] > 0:
                x = cap_left[lk] / load[lk]
                if x < inc:
                    inc = x
        if inc == math.inf:  # no link in use
            break
        if capped:
            inc = min(inc, min(caps[k] - rates[k] for k in range(n) if active[k]))
        for k in range(n):
            if active[k]:
                rates[k] += inc
        for lk in range(nl):
            cap_left[lk] -= inc * load[lk]
        for fk, lk in zip(a_f, a_l, strict=True):
            if load[lk] > 0 and cap_left[lk] <= tol[lk]:
                active[fk] = False
        if capped:
            for k in range(n):
                if active[k] and not rates[k] < caps[k] * shrink:
                    active[k] = False
        if not any(active):
            break
        if not all(active[fk] for fk in a_f):
            keep = [j for j, fk in enumerate(a_f) if active[fk]]
            a_f, a_l, a_w = [a_f[j] for j in keep], [a_l[j] for j in keep], [a_w[j] for j in keep]
    link_rate = [0.0] * nl
    for fk, lk, w in zip(pf, pl, pw, strict=True):
        link_rate[lk] += w * rates[fk]
    return np.array(rates), np.array(ids, dtype=np.int64), np.array(link_rate)


def _incidence(flows: Sequence[_Flow], L: int) -> Incidence:
    """The (flow, link) pairs of ``flows``: each pair's flow (a position in ``flows``), its link
    (a position in the links in use), the links in use (ids below ``L``) and the edges crossing.
    Kept with the groups of a table when ``flows`` are exactly its aggregates in the order they
    were made (every protocol's isolated rates, then the run, compute over the same pairs)."""
    grouping = flows[0].group[0] if flows[0].group is not None else None
    made = grouping is not None and len(flows) == len(grouping.made) and all(
        f.group is not None and f.group[0] is grouping for f in flows) and [
        f.group[1] for f in flows if f.group is not None] == grouping.made
    if made and grouping is not None and grouping.incidence is not None and grouping.incidence[0] == L:
        return grouping.incidence[1]
    n = len(flows)
    counts = np.fromiter((len(f.links) for f in flows), dtype=np.int64, count=n)
    pair_flow = np.repeat(np.arange(n, dtype=np.intp), counts)  # native-width indices: no conversion to read them
    ids, pair_link = _numbered(np.concatenate([f.links for f in flows]), L)
    out = (pair_flow, pair_link, ids, np.concatenate([f.w for f in flows]))
    if made and grouping is not None:
        grouping.incidence = (L, out)
    return out


def _numbered(raw: np.ndarray, L: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(raw, return_inverse=True)`` for link ids below ``L``, by lookup where ``raw`` is
    long enough for a table of ``L`` to cost less than a sort."""
    if len(raw) * 8 < L:
        ids, inverse = np.unique(raw, return_inverse=True)
        return ids, inverse.reshape(-1)
    present = np.zeros(L, dtype=bool)
    present[raw] = True
    ids = np.flatnonzero(present)
    pos = np.empty(L, dtype=np.intp)
    pos[ids] = np.arange(len(ids))
    return ids, pos[raw]



def _fill(pair_flow: np.ndarray, pair_link: np.ndarray, pair_w: np.ndarray, caps: np.ndarray,
          capacity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Progressive filling over (flow, link, edges crossing) pairs: every unfrozen flow's rate rises
    together until a link it crosses saturates or it reaches its cap. Returns the rate of each flow
    and the total rate on each link (``capacity``: of the links the pairs index)."""
    n = len(caps)
    capped = bool(np.isfinite(caps).any())
    cap_left = capacity.astype(float).copy()
    tol = capacity * 1e-9
    rates = np.zeros(n)
    active = np.ones(n, dtype=bool)
    nl = len(capacity)
    # the pairs of unfrozen flows, in order (indices of the native width: gathers and bincount take
    # them without a conversion)
    pair_flow, pair_link = pair_flow.astype(np.intp, copy=False), pair_link.astype(np.intp, copy=False)
    pf, pl, pw = pair_flow, pair_link, pair_w
    while True:
        load = np.bincount(pl, weights=pw, minlength=nl)
        used = load > 0
        if not used.any():
            break
        inc = float(np.min(cap_left[used] / load[used]))
        if capped:
            inc = min(inc, float(np.min(caps[active] - rates[active])))
        rates[active] += inc
        cap_left -= inc * load
        saturated = used & (cap_left <= tol)
        active[pf[saturated[pl]]] = False
        if capped:
            active &= rates < caps * (1 - 1e-9)
        if not active.any():
            break
        keep = active[pf]
        if not keep.all():
            pf, pl, pw = pf[keep], pl[keep], pw[keep]
    link_rate = np.bincount(pair_link, weights=pair_w * rates[pair_flow], minlength=nl)
    return rates, link_rate


def _max_min(flows: Sequence[Any], capacity: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Max-min fair rates (bytes/s per edge) by progressive filling.

    ``flows`` have ``links`` (a link once per edge that crosses it) and ``cap`` (a rate they never
    exceed). Returns the rate of each flow, the ids of the links in use, and the total rate on each.
    """
    n = len(flows)
    if n == 1:  # alone: its bottleneck link, shared by its own edges crossing it, or its cap
        f = flows[0]
        ids, mult = np.unique(f.links, return_counts=True)
        rate = min(float(np.min(capacity[ids] / mult)), f.cap)
        return np.array([rate]), ids, mult * rate
    caps = np.fromiter((f.cap for f in flows), dtype=float, count=n)
    counts = np.fromiter((len(f.links) for f in flows), dtype=np.int64, count=n)
    raw_flow = np.repeat(np.arange(n), counts)
    raw_link = np.concatenate([f.links for f in flows])
    ids, link_idx = np.unique(raw_link, return_inverse=True)
    # one pair per (flow, link), weighted by how many of the flow's edges cross the link
    pairs, mult = np.unique(raw_flow * len(ids) + link_idx, return_counts=True)
    pair_flow, pair_link = np.divmod(pairs, len(ids))
    rates, link_rate = _fill(pair_flow, pair_link, mult.astype(float), caps, capacity[ids])
    return rates, ids, link_rate
