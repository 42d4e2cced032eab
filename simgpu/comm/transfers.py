"""Transfers as data: a coflow of edges over links (:class:`Transfer`), and many single-route
transfers as arrays (:class:`TransferTable`), what collective plans hand to the flow network."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple, overload

import numpy as np

from ..platform.route_parts import RouteParts


class Transfer(NamedTuple):
    """Edges moving ``nbytes`` each at one common rate; ``links`` lists every edge's route links.
    ``max_rate`` (bytes/s per edge) bounds that rate whatever the links could give: a protocol
    whose buffer slots are all in flight waits for their credits to come back. (A named tuple: an
    all-to-all has one per pair, a million over 1,024 GPUs, and a tuple is the cheapest to make.)"""

    links: tuple[int, ...]
    nbytes: float
    max_rate: float = float("inf")


class TransferTable(Sequence[Transfer]):
    """Many single-route transfers as arrays: transfer i crosses ``flat[starts[i]:starts[i + 1]]``
    and moves ``nbytes[i]`` under ``max_rate[i]``. The routes may be given as :class:`RouteParts`
    instead (``parts``: four numbers a transfer), ``flat`` and ``starts`` then made only when asked
    for. It reads as a sequence of :class:`Transfer`, each made when asked for; the network takes
    the arrays as they are (an all-to-all over 1,024 GPUs is a million of them). Where ``kinds``
    is given (a number per transfer), ``nbytes`` and ``max_rate`` are given per kind
    (:attr:`kind_nbytes`, :attr:`kind_max_rate`) and made per transfer only when asked for.
    ``memo`` holds
    what the network derives from the routes alone, to share between tables over the same routes
    (the plans of one all-to-all, protocol by protocol); the arrays are never changed once made."""

    __slots__ = ("_flat", "_lens", "_max_rate", "_nbytes", "_starts", "kind_max_rate", "kind_nbytes", "kinds", "memo",
                 "parts")

    def __init__(self, flat: np.ndarray | None, starts: np.ndarray | None, nbytes: np.ndarray, max_rate: np.ndarray,
                 memo: dict[str, object] | None = None, parts: RouteParts | None = None,
                 kinds: np.ndarray | None = None) -> None:
        if (flat is None or starts is None) and parts is None:
            raise ValueError("a transfer table needs its routes: flat and starts, or parts")
        m = len(parts) if parts is not None else len(starts) - 1  # type: ignore[arg-type]
        if m != (len(nbytes) if kinds is None else len(kinds)) or len(nbytes) != len(max_rate):
            raise ValueError("a transfer table needs one start per transfer and one more, and bytes and a cap "
                             "per transfer (per kind, with kinds)")
        self._flat, self._starts, self.parts = flat, starts, parts
        self._lens: np.ndarray | None = None
        self.kinds = kinds
        #: per kind, where kinds are given
        self.kind_nbytes: np.ndarray | None = nbytes if kinds is not None else None
        self.kind_max_rate: np.ndarray | None = max_rate if kinds is not None else None
        self._nbytes: np.ndarray | None = None if kinds is not None else nbytes
        self._max_rate: np.ndarray | None = None if kinds is not None else max_rate
        self.memo: dict[str, object] = {} if memo is None else memo

    def __len__(self) -> int:
        return len(self.kinds) if self.kinds is not None else len(self.nbytes)

    @property
    def nbytes(self) -> np.ndarray:
        """The bytes of each transfer."""
        if self._nbytes is None:
            assert self.kinds is not None and self.kind_nbytes is not None
            self._nbytes = self.kind_nbytes[self.kinds]
        return self._nbytes

    @property
    def max_rate(self) -> np.ndarray:
        """The cap of each transfer."""
        if self._max_rate is None:
            assert self.kinds is not None and self.kind_max_rate is not None
            self._max_rate = self.kind_max_rate[self.kinds]
        return self._max_rate

    @overload
    def __getitem__(self, i: int) -> Transfer: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[Transfer]: ...

    def __getitem__(self, i: int | slice) -> Transfer | Sequence[Transfer]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return Transfer(self.links(i), float(self.nbytes[i]), float(self.max_rate[i]))

    def __iter__(self) -> Iterator[Transfer]:
        return (self[i] for i in range(len(self)))

    def capped_to(self, seconds: float) -> TransferTable:
        """The same transfers over the same routes, each taking at least ``seconds`` to move its bytes
        (its cap lowered to its bytes over ``seconds``)."""
        if self.kinds is not None:
            assert self.kind_nbytes is not None and self.kind_max_rate is not None
            nbytes, cap = self.kind_nbytes, self.kind_max_rate
        else:
            nbytes, cap = self.nbytes, self.max_rate
        return TransferTable(self._flat, self._starts, nbytes, np.minimum(cap, nbytes / seconds), parts=self.parts,
                             kinds=self.kinds)

    def links(self, i: int) -> tuple[int, ...]:
        """The route of transfer ``i``."""
        if self._flat is None and self.parts is not None:
            return self.parts.route(i)
        return tuple(self.flat[self.starts[i]:self.starts[i + 1]].tolist())

    @property
    def flat(self) -> np.ndarray:
        """Every transfer's links, route after route."""
        if self._flat is None:
            assert self.parts is not None
            rows = self.parts.rows()
            self._flat = rows[rows >= 0]
        return self._flat

    @property
    def starts(self) -> np.ndarray:
        """Where each transfer's links begin in :attr:`flat`, and one more for the end."""
        if self._starts is None:
            self._starts = np.concatenate(([0], np.cumsum(self.lens)))
        return self._starts

    @property
    def lens(self) -> np.ndarray:
        """The number of links of each transfer's route."""
        if self._lens is None:
            self._lens = self.parts.lens() if self.parts is not None else np.diff(self.starts)
        return self._lens

