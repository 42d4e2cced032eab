"""Links as shared resources on the SimPy clock: transfers share bandwidth max-min fairly.

A transfer moves ``nbytes`` over a set of links. Concurrent transfers crossing a link share its
capacity; the rates of all active transfers are the max-min fair allocation (progressive filling),
recomputed whenever a transfer starts or ends. This is the limit of chunk-by-chunk turn taking as
chunks shrink, at the cost of one event per start and end instead of one per chunk and hop.

A transfer may be a *coflow*: several edges that progress at one common rate (the edges of a ring,
which in steady state all move at the pace of the slowest). Its ``links`` list the links of all
edges, a link appearing once per edge that crosses it; each of its edges moves ``nbytes``.

Transfers started together (:meth:`FlowNetwork.transfer_all`) that move the same bytes under the
same cap over the same first slowest link are carried as one *aggregate* flow, checked at every
recomputation and split where its members would part (:mod:`simgpu.comm.aggregates`). The flows
and their batches are in :mod:`simgpu.comm.flows`, the max-min fair rates in :mod:`simgpu.comm.fair`.

A transfer may name its owner (``owner``); with ``owners`` given, the network keeps per link and
owner the stretches during which the link carries that owner's transfers (:mod:`simgpu.comm.owners`).

This file stays above 500 lines: it is one class, :class:`FlowNetwork`, whose methods all keep the
same per-link indexes (the flows on each link, its rate, its bytes and busy time) in step.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import numpy as np
import simpy

from .aggregates import _by_kind, _flows_of, _part_flows
from .fair import _fair, _incidence
from .flows import AGGREGATE_FROM, _Batch, _Block, _Flow, _Join, _live, _moving, _one, _Route, _single, soon
from .owners import LinkOwners
from .transfers import TransferTable

_EPS_S = 1e-12  # flows within this many seconds of completion are complete


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
                 implied: dict[int, frozenset[int]] | None = None, owners: bool | Sequence[int] = False) -> None:
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
        #: who keeps which link busy: every link's owners (``owners`` True), those of the links ``owners``
        #: names, or None (none recorded: False or no link)
        self.owners = (LinkOwners(len(self.capacity), None if owners is True else owners)
                       if owners is True or (owners is not False and len(owners)) else None)
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
                 max_rate: float = float("inf"), owner: str = "") -> simpy.Event:
        """An event that fires when ``nbytes`` have crossed ``links`` after ``latency`` seconds, at
        no more than ``max_rate`` bytes/s (``owner``: whose transfer it is)."""
        done = self.env.event()
        self.transfers += 1
        if nbytes <= 0 or len(links) == 0:
            if latency > 0:
                self.env.timeout(latency).callbacks.append(lambda _e: _succeed(done))
            else:
                done.succeed()
            return done
        flow = _single(_Batch([links], [done], owner=owner), 0, nbytes, max_rate)
        self._serial += 1
        flow.serial = self._serial
        if latency > 0:
            self.env.timeout(latency).callbacks.append(lambda _e: self._start([flow]))
        else:
            self._start([flow])
        return done

    def transfer_all(self, items: Sequence[tuple[Sequence[int], float, float]] | TransferTable,
                     owner: str = "") -> list[simpy.Event]:
        """Start several ``(links, nbytes, max_rate)`` transfers at once, with one reallocation of
        the rates (``max_rate``: bytes/s the transfer never exceeds, ``inf`` for none).

        The same as calling :meth:`transfer` for each, but a collective of thousands of pairs (an
        all-to-all over many GPUs) costs one max-min computation instead of one per pair, and its
        pairs alike are carried as aggregates (see :mod:`simgpu.comm.aggregates`).
        """
        events = [self.env.event() for _ in range(len(items))]
        self._start_items(_Batch.of(items, events, owner=owner), items)
        return events

    def transfer_group(self, items: Sequence[tuple[Sequence[int], float, float]] | TransferTable,
                       owner: str = "") -> simpy.Event:
        """Like :meth:`transfer_all`, but one event that fires when the last of them has ended."""
        done = self.env.event()
        self._group(items, _Join(done, 0), owner)
        return done

    def transfer_group_then(self, items: Sequence[tuple[Sequence[int], float, float]] | TransferTable,
                            fn: Any, arg: Any, owner: str = "") -> None:
        """Like :meth:`transfer_group`, but ``fn(arg)`` is called where the event's callback would
        be, at the same place in SimPy's queue, without the event."""
        self._group(items, _Join(None, 0, self.env, fn, arg), owner)

    def _group(self, items: Sequence[tuple[Sequence[int], float, float]] | TransferTable, join: _Join,
               owner: str) -> None:
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
            batch = _Batch([t[0] for t in items], (), join, owner=owner)
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
        self._start_items(_Batch.of(items, shared=join, owner=owner), items)

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
        if self.owners is not None:
            self.owners.finish(now)

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
        if self.owners is not None:
            self.owners.add(flows, now)
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
        n = len(out)
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
        if self.owners is not None:  # the members on, then the aggregates off: their links stay held
            self.owners.add(out[n:], now)
            self.owners.remove([flows[k] for k in broken], now)
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
        if self.owners is not None:
            self.owners.remove(finished, now)
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

