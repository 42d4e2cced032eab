"""Links as shared resources on the SimPy clock: transfers share bandwidth max-min fairly.

A transfer moves ``nbytes`` over a set of links. Concurrent transfers crossing a link share its
capacity; the rates of all active transfers are the max-min fair allocation (progressive filling),
recomputed whenever a transfer starts or ends. This is the limit of chunk-by-chunk turn taking as
chunks shrink, at the cost of one event per start and end instead of one per chunk and hop.

A transfer may be a *coflow*: several edges that progress at one common rate (the edges of a ring,
which in steady state all move at the pace of the slowest). Its ``links`` list the links of all
edges, a link appearing once per edge that crosses it; each of its edges moves ``nbytes``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import numpy as np
import simpy

_EPS_S = 1e-12  # flows within this many seconds of completion are complete


class _Flow:
    __slots__ = ("cap", "done", "finish", "last", "links", "rate", "remaining", "serial", "uniq")

    def __init__(self, links: np.ndarray, nbytes: float, done: simpy.Event, cap: float = float("inf"),
                 serial: int = 0) -> None:
        # a link appears once per edge of the flow that crosses it
        self.links, self.remaining, self.rate, self.done, self.cap = links, nbytes, 0.0, done, cap
        self.serial, self.last, self.finish = serial, 0.0, float("inf")
        self.uniq: list[int] = np.unique(links).tolist()

    def settle(self, now: float) -> None:
        """Bring ``remaining`` up to ``now`` at the current rate."""
        if now > self.last:
            self.remaining -= self.rate * (now - self.last)
            self.last = now


class FlowNetwork:
    """Max-min fair bandwidth sharing over links with capacities in bytes/s.

    Max-min fair rates on flows that share no link, directly or through other flows, do not depend
    on each other, so a start or an end recomputes the rates of its connected component only (the
    flows reachable from its links through shared links); the other flows keep their rates and are
    not touched. Each flow's progress is brought up to date only when its rate changes, and the
    next completion comes from a heap of finish times."""

    def __init__(self, env: simpy.Environment, capacity: np.ndarray, link_kinds: Sequence[str] | None = None,
                 record: bool = False) -> None:
        if np.any(capacity <= 0):
            raise ValueError("link capacities must be positive")
        self.env = env
        self.capacity = np.asarray(capacity, dtype=float)
        self.link_bytes = np.zeros(len(capacity))
        self.link_busy_s = np.zeros(len(capacity))
        self.transfers = 0
        self.reschedules = 0
        self._serial = 0
        self._on_link: dict[int, dict[int, _Flow]] = {}   # link -> active flows crossing it, by serial
        self._link_rate: dict[int, float] = {}            # link -> total rate on it (links in use only)
        self._link_last: dict[int, float] = {}            # link -> when its bytes were last settled
        self._heap: list[tuple[float, int, _Flow]] = []   # (finish time, serial, flow); stale entries skipped
        self._wake_at = float("inf")
        self._gen = 0
        self._record = record
        self._busy_since: dict[int, float] = {}
        self.intervals: list[tuple[int, float, float]] = []

    @property
    def flows(self) -> list[_Flow]:
        """The active flows, in the order they started."""
        seen: dict[int, _Flow] = {}
        for on in self._on_link.values():
            seen.update(on)
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
        flow = self._flow(links, nbytes, done, max_rate)
        if latency > 0:
            self.env.timeout(latency).callbacks.append(lambda _e: self._start([flow]))
        else:
            self._start([flow])
        return done

    def transfer_all(self, items: Sequence[tuple[Sequence[int], float, float]]) -> list[simpy.Event]:
        """Start several ``(links, nbytes, max_rate)`` transfers at once, with one reallocation of
        the rates (``max_rate``: bytes/s the transfer never exceeds, ``inf`` for none).

        The same as calling :meth:`transfer` for each, but a collective of thousands of pairs (an
        all-to-all over many GPUs) costs one max-min computation instead of one per pair.
        """
        events: list[simpy.Event] = []
        flows: list[_Flow] = []
        for links, nbytes, cap in items:
            done = self.env.event()
            self.transfers += 1
            events.append(done)
            if nbytes <= 0 or len(links) == 0:
                done.succeed()
                continue
            flows.append(self._flow(links, nbytes, done, cap))
        if flows:
            self._start(flows)
        return events

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

    def _flow(self, links: Sequence[int], nbytes: float, done: simpy.Event, cap: float) -> _Flow:
        self._serial += 1
        return _Flow(np.asarray(links, dtype=np.int64), float(nbytes), done, float(cap), self._serial)

    def _start(self, flows: list[_Flow]) -> None:
        now = self.env.now
        seeds: set[int] = set()
        for f in flows:
            f.last = now
            for lid in f.uniq:
                self._on_link.setdefault(lid, {})[f.serial] = f
            seeds.update(f.uniq)
        self._reschedule(seeds)

    def _component(self, seeds: set[int]) -> list[_Flow]:
        """The active flows connected to the links ``seeds`` through shared links, by serial."""
        comp: dict[int, _Flow] = {}
        seen = set(seeds)
        stack = list(seeds)
        while stack:
            on = self._on_link.get(stack.pop())
            if not on:
                continue
            for k, f in on.items():
                if k in comp:
                    continue
                comp[k] = f
                for lid in f.uniq:
                    if lid not in seen:
                        seen.add(lid)
                        stack.append(lid)
        return [comp[k] for k in sorted(comp)]

    def _settle_link(self, lid: int, now: float) -> None:
        last = self._link_last.get(lid, now)
        rate = self._link_rate.get(lid, 0.0)
        if now > last and rate > 0:
            self.link_bytes[lid] += rate * (now - last)
            self.link_busy_s[lid] += now - last
        self._link_last[lid] = now

    def _reschedule(self, seeds: set[int]) -> None:
        """New max-min rates for the component of the links ``seeds`` (whose flows changed)."""
        self.reschedules += 1
        now = self.env.now
        flows = self._component(seeds)
        touched = set(seeds)
        for f in flows:
            touched.update(f.uniq)
        for lid in touched:
            self._settle_link(lid, now)
        if flows:
            rates, ids, load = _max_min(flows, self.capacity)
            heap = self._heap
            for f, r in zip(flows, rates.tolist(), strict=True):
                if r == f.rate:
                    continue  # its finish time and heap entry stand
                f.settle(now)
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

    def _arm(self) -> None:
        """Keep one timeout pending, at the earliest finish time."""
        heap = self._heap
        while heap and (heap[0][2].finish != heap[0][0] or heap[0][1] not in self._on_link.get(heap[0][2].uniq[0], {})):
            heapq.heappop(heap)
        if not heap:
            self._wake_at = float("inf")
            return
        t = heap[0][0]
        if t < self._wake_at:
            self._wake_at = t
            self._gen += 1
            gen = self._gen
            self.env.timeout(max(t - self.env.now, 0.0)).callbacks.append(lambda _e: self._wake(gen))

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
            if f.finish != t or serial in ended or serial not in self._on_link.get(f.uniq[0], {}):
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
        for f in finished:
            for lid in f.uniq:
                on = self._on_link[lid]
                del on[f.serial]
                if not on:
                    del self._on_link[lid]
            seeds.update(f.uniq)
        self._reschedule(seeds)
        for f in sorted(finished, key=lambda f: f.serial):
            f.done.succeed()


def _succeed(event: simpy.Event) -> None:
    event.succeed()


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
    capped = bool(np.isfinite(caps).any())
    counts = np.fromiter((len(f.links) for f in flows), dtype=np.int64, count=n)
    raw_flow = np.repeat(np.arange(n), counts)
    raw_link = np.concatenate([f.links for f in flows])
    ids, link_idx = np.unique(raw_link, return_inverse=True)
    # one pair per (flow, link), weighted by how many of the flow's edges cross the link
    pairs, mult = np.unique(raw_flow * len(ids) + link_idx, return_counts=True)
    pair_flow, pair_link = np.divmod(pairs, len(ids))
    pair_mult = mult.astype(float)
    cap_left = capacity[ids].astype(float).copy()
    tol = capacity[ids] * 1e-9
    rates = np.zeros(n)
    active = np.ones(n, dtype=bool)
    while True:
        act_pairs = active[pair_flow]
        load = np.bincount(pair_link[act_pairs], weights=pair_mult[act_pairs], minlength=len(ids))
        used = load > 0
        if not used.any():
            break
        inc = float(np.min(cap_left[used] / load[used]))
        if capped:
            inc = min(inc, float(np.min(caps[active] - rates[active])))
        rates[active] += inc
        cap_left -= inc * load
        saturated = used & (cap_left <= tol)
        frozen = np.unique(pair_flow[saturated[pair_link] & act_pairs])
        active[frozen] = False
        if capped:
            active &= rates < caps * (1 - 1e-9)
        if not active.any():
            break
    link_rate = np.bincount(pair_link, weights=pair_mult * rates[pair_flow], minlength=len(ids))
    return rates, ids, link_rate
