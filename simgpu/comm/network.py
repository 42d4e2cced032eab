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

from collections.abc import Sequence
from typing import Any

import numpy as np
import simpy

_EPS_S = 1e-12  # flows within this many seconds of completion are complete


class _Flow:
    __slots__ = ("cap", "done", "links", "rate", "remaining")

    def __init__(self, links: np.ndarray, nbytes: float, done: simpy.Event, cap: float = float("inf")) -> None:
        # a link appears once per edge of the flow that crosses it
        self.links, self.remaining, self.rate, self.done, self.cap = links, nbytes, 0.0, done, cap


class FlowNetwork:
    """Max-min fair bandwidth sharing over links with capacities in bytes/s."""

    def __init__(self, env: simpy.Environment, capacity: np.ndarray, link_kinds: Sequence[str] | None = None,
                 record: bool = False) -> None:
        if np.any(capacity <= 0):
            raise ValueError("link capacities must be positive")
        self.env = env
        self.capacity = np.asarray(capacity, dtype=float)
        self.flows: list[_Flow] = []
        self.link_bytes = np.zeros(len(capacity))
        self.link_busy_s = np.zeros(len(capacity))
        self.transfers = 0
        self.reschedules = 0
        self._last = 0.0
        self._gen = 0
        self._load_ids = np.zeros(0, dtype=np.int64)   # links with traffic, and their total rate
        self._load_rate = np.zeros(0)
        self._record = record
        self._busy_since: dict[int, float] = {}
        self.intervals: list[tuple[int, float, float]] = []

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
        flow = _Flow(np.asarray(links, dtype=np.int64), float(nbytes), done, float(max_rate))
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
            flows.append(_Flow(np.asarray(links, dtype=np.int64), float(nbytes), done, float(cap)))
        if flows:
            self._start(flows)
        return events

    def finish(self) -> None:
        """Close the busy intervals still open (call once the simulation has ended)."""
        now = self.env.now
        for lid, since in sorted(self._busy_since.items()):
            self.intervals.append((lid, since, now))
        self._busy_since.clear()

    # -- internals ------------------------------------------------------------------------------

    def _start(self, flows: list[_Flow]) -> None:
        self._advance()
        self.flows.extend(flows)
        self._reschedule()

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self._last
        if dt > 0 and self.flows:
            for f in self.flows:
                f.remaining -= f.rate * dt
            self.link_bytes[self._load_ids] += self._load_rate * dt
            self.link_busy_s[self._load_ids] += dt
        self._last = now

    def _reschedule(self) -> None:
        self._gen += 1
        self.reschedules += 1
        flows = self.flows
        if not flows:
            self._set_load(np.zeros(0, dtype=np.int64), np.zeros(0))
            return
        rates, ids, load = _max_min(flows, self.capacity)
        for f, r in zip(flows, rates, strict=True):
            f.rate = float(r)
        self._set_load(ids, load)
        t_next = min(f.remaining / f.rate for f in flows)
        gen = self._gen
        self.env.timeout(max(t_next, 0.0)).callbacks.append(lambda _e: self._wake(gen))

    def _wake(self, gen: int) -> None:
        if gen != self._gen:
            return
        self._advance()
        still: list[_Flow] = []
        finished: list[_Flow] = []
        for f in self.flows:
            (finished if f.remaining <= f.rate * _EPS_S else still).append(f)
        self.flows = still
        self._reschedule()
        for f in finished:
            f.done.succeed()

    def _set_load(self, ids: np.ndarray, load: np.ndarray) -> None:
        if self._record:
            now = self.env.now
            new = set(ids.tolist())
            for lid in [lid for lid in self._busy_since if lid not in new]:
                self.intervals.append((lid, self._busy_since.pop(lid), now))
            for lid in new:
                self._busy_since.setdefault(lid, now)
        self._load_ids, self._load_rate = ids, load


def _succeed(event: simpy.Event) -> None:
    event.succeed()


def _max_min(flows: Sequence[Any], capacity: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Max-min fair rates (bytes/s per edge) by progressive filling.

    ``flows`` have ``links`` (a link once per edge that crosses it) and ``cap`` (a rate they never
    exceed). Returns the rate of each flow, the ids of the links in use, and the total rate on each.
    """
    n = len(flows)
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
