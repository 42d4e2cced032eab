"""Who keeps a link busy: per link and owner, the stretches during which the link carries at least
one transfer of that owner.

Every transfer started on a :class:`~simgpu.comm.network.FlowNetwork` may name its owner (the
engine gives a collective's key, a copy's op name). :class:`LinkOwners` counts, per recorded link
and owner, the flows of that owner on the link: a stretch opens when the first one starts and
closes when the last one ends. Flows of several owners on one link at once each keep their own
stretch, so one owner's stretches on a link never overlap each other, two owners' may, and the
union of a link's stretches is its busy time (the network's ``link_busy_s``): a flow on the
network always has a positive rate. The bytes are not split between owners; a stretch says who
was on the link, not how much of it each had.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from .flows import _Flow


class LinkOwners:
    """The owner stretches of the links ``links`` of a network of ``n`` links (None: every link)."""

    def __init__(self, n: int, links: Sequence[int] | None = None) -> None:
        self._mask: np.ndarray | None = None
        if links is not None and len(set(links)) < n:
            self._mask = np.zeros(n, dtype=bool)
            self._mask[np.asarray(list(links), dtype=np.int64)] = True
        #: (link, owner) -> [flows of the owner on the link, since when]
        self._open: dict[tuple[int, str], list[float]] = {}
        #: flow -> its owner and its recorded links (while it is on the network)
        self._held: dict[int, tuple[str, list[int]]] = {}
        #: (link, owner, start, end) of each closed stretch, in the order they closed
        self.intervals: list[tuple[int, str, float, float]] = []

    def add(self, flows: Iterable[_Flow], now: float) -> None:
        """``flows`` have started on the network at ``now``."""
        mask, opened, held = self._mask, self._open, self._held
        for f in flows:
            ids = f.links if mask is None else f.links[mask[f.links]]
            links = ids.tolist()
            owner = f.batch.owner
            held[id(f)] = (owner, links)
            for lid in links:
                got = opened.get((lid, owner))
                if got is None:
                    opened[(lid, owner)] = [1.0, now]
                else:
                    got[0] += 1.0

    def remove(self, flows: Iterable[_Flow], now: float) -> None:
        """``flows`` have left the network at ``now`` (ended, or an aggregate split into its members)."""
        opened, out = self._open, self.intervals
        for f in flows:
            owner, links = self._held.pop(id(f))
            for lid in links:
                key = (lid, owner)
                got = opened[key]
                got[0] -= 1.0
                if got[0] == 0.0:
                    del opened[key]
                    if now > got[1]:
                        out.append((lid, owner, got[1], now))

    def finish(self, now: float) -> None:
        """Close the stretches still open at ``now`` (the end of the simulation), in link and owner order."""
        for (lid, owner), (_, since) in sorted(self._open.items()):
            if now > since:
                self.intervals.append((lid, owner, since, now))
        self._open.clear()
        self._held.clear()
