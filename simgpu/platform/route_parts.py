"""Many pairs' routes at once as arrays (:class:`RouteParts`: a source node part, a fabric part and a
destination node part per pair), and the numbering of integer keys they are found with
(:func:`key_members`, :func:`first_positions`)."""

from __future__ import annotations

from typing import Any

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


def _pad(parts: list[np.ndarray]) -> np.ndarray:
    out = np.full((len(parts), max(1, max(map(len, parts), default=0))), -1, dtype=np.int64)
    for i, part in enumerate(parts):
        out[i, :len(part)] = part
    return out


def _faulted_parts(topo: Any, src: np.ndarray, dst: np.ndarray, na: np.ndarray, nb: np.ndarray) -> RouteParts:
    """Every distinct pair's route whole, as its fabric part (no node parts): with faults a node's
    links need not sit alike, nor its routes be another node's shifted."""
    key = src.astype(np.int64) * topo.world + dst
    keys, first, fpart = key_members(key)
    fabs = [np.array(topo.route(int(src[p]), int(dst[p])), dtype=np.int64) for p in first.tolist()]
    empty = np.full((1, 1), -1, dtype=np.int64)
    small = np.int32 if max(topo.nodes, len(keys)) < 2**31 else np.int64
    return RouteParts(empty, _pad(fabs), empty, np.zeros(len(src), dtype=small), fpart.astype(small, copy=False),
                      na.astype(small, copy=False), nb.astype(small, copy=False), topo.links_per_node, topo.nodes)


def route_parts_of(topo: Any, src: np.ndarray, dst: np.ndarray) -> RouteParts:
    """:meth:`Topology.route_parts <simgpu.platform.topology.Topology.route_parts>` (``topo`` the
    topology): the node parts from one representative pair each, the fabric once per pair of
    switches; on a topology with faults every distinct pair's own route as its fabric part."""
    idx = np.int32 if topo.world < 2**31 else np.int64
    src, dst = np.asarray(src).astype(idx, copy=False), np.asarray(dst).astype(idx, copy=False)
    w, gpn, lpn = topo.world, topo.gpus_per_node, topo.links_per_node
    if len(src) and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= w or np.any(src == dst)):
        raise ValueError(f"route_table needs distinct GPUs of this {w}-GPU topology")
    # per pair: its nodes and local indices, computed in the pairs' own width (a shift and a mask
    # where the GPUs a node are a power of two), and its NICs read through a table per local GPU
    na, ga = _divmod(src, gpn)
    nb, gb = _divmod(dst, gpn)
    if topo.faults:
        return _faulted_parts(topo, src, dst, na, nb)
    inter = na != nb
    # the node parts, by (local GPUs, whether the pair leaves the node): the key says both
    tkey: np.ndarray = ga * gpn
    tkey += gb
    np.add(tkey, gpn * gpn, out=tkey, where=inter)  # in place: big temporaries cost their pages
    tkeys, _, tpair = key_members(tkey, members=False)
    del tkey
    pres, posts = [], []
    for k in tkeys.tolist():
        leaves, g_a, g_b = k >= gpn * gpn, k % (gpn * gpn) // gpn, k % gpn
        r = np.array(topo._route(g_a, (gpn if leaves else 0) + g_b), dtype=np.int64)
        pres.append(r[r < lpn])
        posts.append(r[(r >= lpn) & (r < 2 * lpn)] - lpn)
    # the fabric, by what it depends on: the two switches (and on a dragonfly the end nodes)
    nv = topo.platform.node.nvlink
    nic_of = np.array(topo._nic_of[:gpn], dtype=idx)
    own = bool(np.array_equal(nic_of, np.arange(gpn)))  # GPU g on NIC g: no table to read
    kb = gb if own else nic_of[gb.astype(np.intp)]
    # PXN (NVSwitch nodes): a pair leaves through the destination rail's NIC
    ka = kb if nv is not None and nv.kind == "nvswitch" else ga if own else nic_of[ga.astype(np.intp)]
    del ga, gb
    net = topo.platform.network
    fkey: np.ndarray
    if net.topology == "dragonfly":
        assert net.dragonfly is not None
        d = net.dragonfly
        ports = topo.nodes // d.nodes_per_switch + 1
        na64, nb64 = na.astype(np.int64), nb.astype(np.int64)
        fkey = ((na64 // d.nodes_per_switch) * ports + nb64 // d.nodes_per_switch) \
            * d.global_links_per_group_pair + (na64 + nb64) % d.global_links_per_group_pair
        del na64, nb64
    else:
        rail = net.topology == "rail_optimized"
        pods = topo.nodes // net.nodes_per_leaf + 1
        span = pods * topo.ports
        wide = np.int64 if span * span + 1 >= 2**31 else idx
        la: np.ndarray = (na // net.nodes_per_leaf).astype(wide, copy=False)
        la *= topo.ports
        if rail:
            la += ka
        la *= span
        lb: np.ndarray = (nb // net.nodes_per_leaf).astype(wide, copy=False)
        lb *= topo.ports
        if rail:
            lb += kb
        la += lb
        fkey = la
        del la, lb
    fkey += 1
    fkey *= inter
    del inter
    fkeys, ffirst, fpair = key_members(fkey)
    fabs = []
    for k, p in zip(fkeys.tolist(), ffirst.tolist(), strict=True):
        if k == 0:
            fabs.append(np.zeros(0, dtype=np.int64))
            continue
        a, b, x, y = int(na[p]), int(nb[p]), int(ka[p]), int(kb[p])
        fabs.append(np.array([topo._ids[h] for h in topo._fabric(a, topo.leaf_of(a, x), b, topo.leaf_of(b, y))],
                             dtype=np.int64))

    small = np.int32 if max(topo.nodes, len(tkeys), len(fkeys)) < 2**31 else np.int64  # per pair
    tpart, fpart, na, nb = (x.astype(small, copy=False) for x in (tpair, fpair, na, nb))
    return RouteParts(_pad(pres), _pad(fabs), _pad(posts), tpart, fpart, na, nb, lpn, topo.nodes)
