"""Many pairs' routes at once as arrays (:class:`RouteParts`: a source node part, a fabric part and a
destination node part per pair), and the numbering of integer keys they are found with
(:func:`key_members`, :func:`first_positions`)."""

from __future__ import annotations

import numpy as np

#: the widest range of keys :func:`key_members` numbers by lookup (beyond: by sorting)
_LOOKUP_KEYS = 1 << 24


def key_members(key: np.ndarray, members: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct values of the non-negative ints ``key`` in increasing order, one position holding
    each (a member, not necessarily the first; empty unless ``members``), and each position's index
    among the values (32-bit where the values are fewer than 2**31)."""
    if len(key) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    bound = int(key.max()) + 1
    if bound > _LOOKUP_KEYS:
        values, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        return values, first, inverse.reshape(-1)
    present = np.zeros(bound, dtype=bool)
    present[key] = True
    values = np.flatnonzero(present)
    number: np.ndarray = np.cumsum(present, dtype=np.int32 if len(values) < 2**31 else np.int64)
    number -= 1
    inverse = number[key]
    member = np.full(len(values) if members else 0, -1, dtype=np.int64)
    if members:  # from every 16th position first; the whole array only where that misses a value
        stride = 16 if len(key) >= 16 * len(values) else 1
        member[inverse[::stride]] = np.arange(0, len(key), stride)
        if stride > 1 and int(member.min()) < 0:
            member[inverse] = np.arange(len(key))
    return values, member, inverse


def first_positions(inverse: np.ndarray, k: int) -> np.ndarray:
    """The first position of each of the values ``0..k-1`` in ``inverse`` (each present): the least
    position of each value taken over chunks that double, stopping once every value is seen, so
    values that all show up early cost a few short reads."""
    n = len(inverse)
    first = np.full(k, n, dtype=np.int64)
    lo, step = 0, 1024
    while lo < n:
        hi = min(n, lo + step)
        np.minimum.at(first, inverse[lo:hi], np.arange(lo, hi))
        if int(first.max(initial=0)) < n:  # every value seen: later positions are larger
            break
        lo, step = hi, step * 2
    return first


def _divmod(x: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.divmod(x, d)`` for non-negative ints ``x``, in their own width: a shift and a mask where
    ``d`` is a power of two."""
    if d & (d - 1) == 0:
        return x >> (d.bit_length() - 1), x & (d - 1)
    q = x // d
    return q, x - q * d


class RouteParts:
    """The routes of many pairs in three parts, each part a row of a small table: the source node's
    links (``pre``, as offsets in a node's block of ``lpn`` link ids, shifted by ``na * lpn``), the
    fabric between the switches (``fab``, link ids) and the destination node's links (``post``,
    offsets shifted by ``nb * lpn``); rows padded with -1. Pair p's route is
    ``pre[tpart[p]] + na[p] * lpn``, then ``fab[fpart[p]]``, then ``post[tpart[p]] + nb[p] * lpn``
    (each without its padding). Per pair this is four numbers, not a row of links."""

    __slots__ = ("_lens", "_shapes", "fab", "fpart", "lpn", "na", "nb", "nodes", "post", "pre", "tpart")

    def __init__(self, pre: np.ndarray, fab: np.ndarray, post: np.ndarray, tpart: np.ndarray, fpart: np.ndarray,
                 na: np.ndarray, nb: np.ndarray, lpn: int, nodes: int) -> None:
        self.pre, self.fab, self.post, self.tpart, self.fpart = pre, fab, post, tpart, fpart
        self.na, self.nb, self.lpn, self.nodes = na, nb, lpn, nodes
        self._lens: np.ndarray | None = None
        self._shapes: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.tpart)

    @property
    def shape(self) -> np.ndarray:
        """A number per pair shared by the pairs whose routes are the same up to their end nodes."""
        return self.tpart.astype(np.int64) * len(self.fab) + self.fpart

    def shapes(self) -> tuple[np.ndarray, np.ndarray]:
        """The distinct :attr:`shape` numbers in increasing order and each pair's index among them
        (kept: the parts do not change)."""
        if self._shapes is None:
            nF = len(self.fab)
            key: np.ndarray = self.tpart.astype(np.int64 if len(self.pre) * nF >= 2**31 else np.int32)
            key *= nF
            key += self.fpart
            values, _, inverse = key_members(key, members=False)
            self._shapes = (values, inverse)
        return self._shapes

    def lens(self) -> np.ndarray:
        """The number of links of each pair's route."""
        if self._lens is None:
            per_t = (self.pre >= 0).sum(axis=1) + (self.post >= 0).sum(axis=1)
            per_f = (self.fab >= 0).sum(axis=1)
            if self._shapes is not None:  # the shapes numbered already: one read per pair
                t, f = np.divmod(self._shapes[0], len(self.fab))
                self._lens = (per_t[t] + per_f[f])[self._shapes[1]]
            else:
                self._lens = per_t[self.tpart] + per_f[self.fpart]
        return self._lens

    def rows(self, pairs: np.ndarray | None = None) -> np.ndarray:
        """The routes of ``pairs`` (all by default) as rows of link ids padded with -1 between and
        after the parts (``rows[rows >= 0]`` lists them route after route)."""
        tp, fp, na, nb = self.tpart, self.fpart, self.na, self.nb
        if pairs is not None:
            tp, fp, na, nb = tp[pairs], fp[pairs], na[pairs], nb[pairs]
        lpn = self.lpn
        kind = np.int32 if self.nodes * lpn + len(self.fab) * self.fab.shape[1] < 2**31 else np.int64
        wp, wf = self.pre.shape[1], self.fab.shape[1]
        table = np.empty((len(tp), wp + wf + self.post.shape[1]), dtype=kind)
        head, tail = table[:, :wp], table[:, wp + wf:]
        head[:] = self.pre[tp]
        np.add(head, (na.astype(np.int64) * lpn).astype(kind)[:, None], out=head, where=head >= 0)
        table[:, wp:wp + wf] = self.fab[fp]
        tail[:] = self.post[tp]
        np.add(tail, (nb.astype(np.int64) * lpn).astype(kind)[:, None], out=tail, where=tail >= 0)
        return table

    def shape_rows(self, shapes: np.ndarray) -> np.ndarray:
        """One route of each of ``shapes`` (numbers of :attr:`shape`) as :meth:`rows` gives them:
        from node 0 to node 1 (to node 0 where there is one node); a shape's other routes are
        these links at the same places of other nodes' blocks."""
        t, f = np.divmod(np.asarray(shapes, dtype=np.int64), len(self.fab))
        parts = RouteParts(self.pre, self.fab, self.post, t, f, np.zeros_like(t),
                           np.full_like(t, min(1, self.nodes - 1)), self.lpn, self.nodes)
        return parts.rows()

    def route(self, p: int) -> tuple[int, ...]:
        """Pair ``p``'s route."""
        t, f = int(self.tpart[p]), int(self.fpart[p])
        a, b = int(self.na[p]) * self.lpn, int(self.nb[p]) * self.lpn
        pre, fab, post = self.pre[t], self.fab[f], self.post[t]
        return tuple((pre[pre >= 0] + a).tolist() + fab[fab >= 0].tolist() + (post[post >= 0] + b).tolist())
