"""An even all-to-all's aggregates found from its route parts (:class:`RouteParts`), for
:mod:`simgpu.comm.network`: the first slowest link of every pair's route, found once per pair of
part rows; the groups of pairs alike; and each group's links and edge counts, tallied per (group,
part row, node) rather than per pair and link, so that 16 million pairs cost a few passes over
arrays of a few numbers each, never a row of links per pair."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..platform import route_parts as _route_parts
from ..platform.route_parts import RouteParts, first_positions, key_members

#: the most counters a tally counts in at once (beyond: numbered in two digits, or sorted)
_DENSE_BINS = 1 << 26
#: (flow, link) pairs of aggregates: each pair's flow, its link among the links in use, the links in
#: use and the edges crossing (see :func:`simgpu.comm.fair._incidence`)
Incidence = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def part_anchors(parts: RouteParts, live: np.ndarray, capacity: np.ndarray) -> np.ndarray | None:
    """The first slowest link of the routes of the pairs ``live`` of ``parts``, found once per
    pair of parts: its place in the route is the same for all pairs of those parts, as every
    node's links have the capacities of node 0's. None where they do not, where the fabric
    reaches into a node's block, or where a part crosses a link twice (then the routes are read
    pair by pair)."""
    lpn, nodes = parts.lpn, parts.nodes
    node_cap = capacity[:nodes * lpn].reshape(nodes, lpn)
    pre, fab, post = parts.pre, parts.fab, parts.post
    if not np.all(node_cap == node_cap[0]) or np.any(fab[fab >= 0] < nodes * lpn):
        return None
    if any(_repeats_a_link_in(rows) for rows in (pre, fab, post)):
        return None
    nF = len(fab)
    if len(live) < len(parts):
        na, nb = parts.na[live], parts.nb[live]
        wide = np.int64 if len(pre) * nF >= 2**31 else np.int32
        cvals, _, cinv = key_members(parts.tpart[live].astype(wide) * nF + parts.fpart[live], members=False)
    else:
        na, nb = parts.na, parts.nb
        cvals, cinv = parts.shapes()
    ct, cf = np.divmod(cvals, nF)
    cap0 = node_cap[0]

    def caps_of(rows: np.ndarray, cap: np.ndarray) -> np.ndarray:
        return np.where(rows >= 0, cap[np.maximum(rows, 0)], np.inf)

    wp, wf = pre.shape[1], fab.shape[1]
    row_cap = np.concatenate((caps_of(pre, cap0)[ct], caps_of(fab, capacity)[cf], caps_of(post, cap0)[ct]), axis=1)
    at = np.argmin(row_cap, axis=1)  # the first of the slowest (padding is never slowest)
    rows = np.concatenate((pre[ct], fab[cf], post[ct]), axis=1)
    link = np.int64 if len(capacity) >= 2**31 else np.int32
    anchor = rows[np.arange(len(at)), at].astype(link)[cinv]
    for part, shift in ((at < wp, na), (at >= wp + wf, nb)):
        if part.all():
            anchor += shift.astype(link, copy=False) * lpn
        elif part.any():
            anchor += np.where(part[cinv], shift.astype(link, copy=False) * lpn, 0).astype(link, copy=False)
    return anchor


#: per pair, what a tally of (group, row of a part, node) keeps: those keys and the pairs with each
_Tally = tuple[np.ndarray, np.ndarray]


def _countable(bound: int, n: int) -> bool:
    """Whether ``n`` keys below ``bound`` are counted in an array of ``bound`` for less than they
    are sorted."""
    return bound <= _DENSE_BINS and bound <= 8 * n + (1 << 16)


def _tally(key: np.ndarray, bound: int) -> _Tally:
    """The distinct values of ``key`` (non-negative, below ``bound``) in increasing order, and how
    often each occurs: counted in place where the range is small, else sorted."""
    if _countable(bound, len(key)):
        counts = np.bincount(key, minlength=bound)
        values = np.flatnonzero(counts)
        return values, counts[values]
    values, counts = np.unique(key, return_counts=True)
    return values, counts


def _tally2(hi: np.ndarray, lo: np.ndarray, lo_bound: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct pairs ``(hi, lo)`` (non-negative, ``lo`` below ``lo_bound``) in increasing order
    and how often each occurs. Where their range is too wide to count in place, ``lo`` is split in
    two digits and the pairs are numbered in two steps, each over a range that is."""
    H = int(hi.max()) + 1 if len(hi) else 1
    if H * lo_bound <= _DENSE_BINS or not len(hi):
        values, count = _tally(_joined(hi, H, lo, lo_bound), H * lo_bound)
        a, b = np.divmod(values, lo_bound)
        return a, b, count
    lookup = _route_parts._LOOKUP_KEYS
    if lookup >= H:  # the high values numbered first, if that narrows the range enough
        his, _, at = key_members(hi, members=False)
        if len(his) * lo_bound <= _DENSE_BINS:
            values, count = _tally(_joined(at, len(his), lo, lo_bound), len(his) * lo_bound)
            a, b = np.divmod(values, lo_bound)
            return his[a], b, count
    B = int(np.ceil(np.sqrt(lo_bound)))
    tops = (lo_bound + B - 1) // B
    top = lo // B
    digit = lo - top * B
    first, _, at = key_members(_joined(hi, H, top, tops), members=False)
    del top
    values, count = _tally(_joined(at, len(first), digit, B), len(first) * B)
    at, digit = np.divmod(values, B)
    a, top = np.divmod(first[at], tops)
    return a, top * B + digit, count


def _joined(hi: np.ndarray, H: int, lo: np.ndarray, lo_bound: int) -> np.ndarray:
    """``hi * lo_bound + lo`` (``hi`` below ``H``), in 32-bit numbers where the product fits."""
    kind = np.int32 if H * lo_bound < 2**31 else np.int64
    out: np.ndarray = hi.astype(kind) * lo_bound
    out += lo
    return out


class PartGroups:
    """The aggregates of an even all-to-all whose routes are :class:`RouteParts`, found from the
    parts: the first slowest link of a route is found once per pair of parts (its place in the
    route is the same for all pairs of those parts, as every node's links have the capacities of
    node 0's), and a group's links and edge counts are counted per (group, row of a part, node)
    rather than per pair and link. ``gid`` numbers each pair's group (as the sorted first slowest
    links), ``size`` and ``heads`` (first member) are per group, ``links`` holds each group's
    links, edges crossing each and the links every member crosses."""

    __slots__ = ("_kinds", "gid", "heads", "incidence", "links", "live", "made", "order", "size")

    def __init__(self, live: np.ndarray, gid: np.ndarray, size: np.ndarray, heads: np.ndarray,
                 links: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        self.live, self.gid, self.size, self.heads, self.links = live, gid, size, heads, links
        self.order: np.ndarray | None = None
        self._kinds: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        #: the groups made aggregates (of two or more), in the order they are made; and the
        #: (flow, link) pairs of those aggregates (see :func:`_incidence`), on how many links
        self.made = [g for g in np.argsort(heads, kind="stable").tolist() if size[g] > 1]
        self.incidence: tuple[int, Incidence] | None = None

    def kinds_of(self, g: int, kinds: np.ndarray, K: int) -> np.ndarray:
        """The kinds among group ``g``'s members (``kinds``: one per pair, ``K`` of them)."""
        if self._kinds is None or self._kinds[0] is not kinds:
            gs, ks, _ = _tally2(self.gid, kinds, K)
            self._kinds = (kinds, ks, np.searchsorted(gs, np.arange(len(self.size) + 1)))
        _, ks, bounds = self._kinds
        return ks[bounds[g]:bounds[g + 1]]

    def members(self, g: int) -> np.ndarray:
        """Group ``g``'s transfers, in increasing order."""
        if self.order is None:  # all groups' members at once, the first time any is asked for
            key = self.gid.astype(np.uint16) if len(self.size) <= 1 << 16 else self.gid
            self.order = np.argsort(key, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(self.size)))
        return self.live[self.order[bounds[g]:bounds[g + 1]]]

    @classmethod
    def of(cls, parts: RouteParts, live: np.ndarray, key: np.ndarray, L: int) -> PartGroups:
        """The groups of the pairs ``live`` of ``parts`` (none crossing a link twice) by ``key``
        (first slowest link and class, a number per pair), over ``L`` links."""
        _, _, gid = key_members(key, members=False)
        G = int(gid.max()) + 1
        heads = first_positions(gid, G)
        tp, fp, na, nb = (parts.tpart[live], parts.fpart[live], parts.na[live], parts.nb[live]) \
            if len(live) < len(parts) else (parts.tpart, parts.fpart, parts.na, parts.nb)
        lpn, nodes = parts.lpn, parts.nodes
        # each group's links: counted per (group, row, node) for the node parts, per (group, row)
        # for the fabric, then each row's links shifted to its node
        pre, post = parts.pre, parts.post
        by_node = _node_tallies(gid, tp, fp, na, nb, pre, post, len(parts.fab), nodes)
        if by_node is not None:  # every group within one source node: counted node by node
            tallies, size = by_node
            entries = [_expand(*tallies[0], pre, heads, lpn, na), _expand(*tallies[1], parts.fab, heads, lpn, None),
                       _expand(*tallies[2], post, heads, lpn, nb)]
        else:
            size = np.bincount(gid, minlength=G)
            entries = [_entries(_rows_of(pre, tp), pre, na, gid, heads, G, nodes, lpn),
                       _entries(fp, parts.fab, None, gid, heads, G, nodes, lpn),
                       _entries(_rows_of(post, tp), post, nb, gid, heads, G, nodes, lpn)]
        # the destination nodes' rows, where no two share a link and none shares one with a source
        # node's row, give each (group, link) once (the rows are counted per group, row and node):
        # only the others' entries need adding up
        offsets = [set(row[row >= 0].tolist()) for row in np.unique(post, axis=0)]
        alone = sum(map(len, offsets)) == len(set().union(*offsets)) and not set().union(*offsets) & set(
            pre[pre >= 0].tolist())
        merged = _merge(entries[:2] if alone else entries, G, L)
        rest = entries[2] if alone else (np.zeros(0, dtype=np.int64),) * 2 + (np.zeros(0),)
        mb = np.searchsorted(merged[0], np.arange(G + 1))
        rb = np.searchsorted(rest[0], np.arange(G + 1))
        links = []
        for g in range(G):
            ids = np.concatenate((merged[1][mb[g]:mb[g + 1]], rest[1][rb[g]:rb[g + 1]]))
            w = np.concatenate((merged[2][mb[g]:mb[g + 1]], rest[2][rb[g]:rb[g + 1]]))
            links.append((ids, w, ids[w == size[g]]))  # no route crosses a link twice: members are edges
        return cls(live, gid, size, heads, links)


def _merge(entries: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], G: int, L: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group, link, pairs crossing) entries with each (group, link) once, its counts added up, in
    order of group then link (``G`` groups over ``L`` links)."""
    key = np.concatenate([e[0] * L + e[1] for e in entries])
    weights = np.concatenate([e[2] for e in entries])
    if _countable(G * L, len(key)):
        total = np.bincount(key, weights=weights, minlength=G * L)
        keys = np.flatnonzero(total)
        mult = total[keys]
    else:
        keys, at = np.unique(key, return_inverse=True)
        mult = np.bincount(at.reshape(-1), weights=weights)
    kg, kl = np.divmod(keys, L)
    return kg, kl, mult


def _rows_of(rows: np.ndarray, tp: np.ndarray) -> np.ndarray:
    """Per pair, the number of its row of a node part (``rows[tp]``) among the distinct rows."""
    _, number = np.unique(rows, axis=0, return_inverse=True)
    return number.reshape(-1)[tp]


def _entries(r: np.ndarray, rows: np.ndarray, shift: np.ndarray | None, gid: np.ndarray, heads: np.ndarray,
             G: int, nodes: int, lpn: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group, link, pairs crossing) for one part of the routes: pair p crosses ``rows[r[p]]``
    shifted by ``shift[p] * lpn`` (None: not shifted), in group ``gid[p]``. Counted per (group,
    row), where every pair of a group shifts by the same node, else per (group, row, node)."""
    R = int(r.max()) + 1 if len(r) else 1
    s: np.ndarray | None
    if shift is None or np.array_equal(shift, shift[heads][gid]):
        g, row, count = _tally2(gid, r, R)
        s = None
    else:
        gr, s, count = _tally2(_joined(gid, G, r, R), shift, nodes)
        g, row = np.divmod(gr, R)
    return _expand(g, row, s, count, rows, heads, lpn, shift)


def _expand(g: np.ndarray, row: np.ndarray, s: np.ndarray | None, count: np.ndarray, rows: np.ndarray,
            heads: np.ndarray, lpn: int, shift: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group, link, pairs crossing) from a tally of (group ``g``, row number ``row``, node ``s``):
    the row's links (among the distinct ``rows``; ``rows`` themselves where ``shift`` is None)
    shifted to the node (None: each group's node, ``shift`` of its first member)."""
    table = rows
    if shift is not None:
        _, first = np.unique(rows, axis=0, return_index=True)
        table = rows[first]
    empty = np.asarray(~(table >= 0).any(axis=1))
    if empty.any() and empty[row].any():  # rows of no links give nothing: dropped, so the rest may be whole
        keep = ~empty[row]
        g, row, count = g[keep], row[keep], count[keep]
        s = s[keep] if s is not None else None
    links = table[row]
    if shift is not None and s is None:
        s = shift[heads][g]
    valid = links >= 0
    if shift is not None:  # the padding's values are never read
        assert s is not None
        links += (s.astype(np.int64) * lpn)[:, None]
    if valid.all():  # no padding: every entry's row is whole
        width = links.shape[1]
        return np.repeat(g, width), links.reshape(-1), np.repeat(count.astype(float), width)
    width = valid.sum(axis=1)
    return np.repeat(g, width), links[valid], np.repeat(count.astype(float), width)


def _numbering(key: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """The values of ``key`` (below ``bound``) in increasing order, and a table from a value to its
    number among them."""
    values = np.flatnonzero(np.bincount(key, minlength=bound))
    number = np.zeros(bound, dtype=np.intp)
    number[values] = np.arange(len(values))
    return values, number


#: the most counters a node-by-node tally counts in at once (a few MiB, held in the caches)
_CHUNK_BINS = 1 << 18


def _node_tallies(gid: np.ndarray, tp: np.ndarray, fp: np.ndarray, na: np.ndarray, nb: np.ndarray,
                  pre: np.ndarray, post: np.ndarray, F: int, nodes: int
                  ) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]], np.ndarray] | None:
    """The tallies of :func:`_entries` for the source parts, the fabric and the destination parts
    (group, row number, node or None, pairs), and each group's size, where the pairs come source
    node by source node (``na`` sorted) and no group spans two source nodes: then each node's pairs
    hold all of its groups, and a few nodes' pairs are counted at a time in an array small enough
    to stay in the caches, whatever the range of the whole key. None where that does not hold."""
    n = len(gid)
    if n == 0 or not bool(np.all(na[1:] >= na[:-1])):
        return None
    starts = np.searchsorted(na, np.arange(nodes + 1, dtype=na.dtype))  # na's own width: not converted
    used = np.flatnonzero(starts[1:] > starts[:-1])
    lo = starts[used]
    gmin, gmax = np.minimum.reduceat(gid, lo), np.maximum.reduceat(gid, lo)
    if np.any(gmin[1:] <= gmax[:-1]):  # a group in two nodes, or groups of nodes interleaved
        return None
    _, pre_num = np.unique(pre, axis=0, return_inverse=True)
    _, post_num = np.unique(post, axis=0, return_inverse=True)
    pre_num, post_num = pre_num.reshape(-1).astype(np.intp), post_num.reshape(-1).astype(np.intp)
    Rp, Rq = int(pre_num.max()) + 1, int(post_num.max()) + 1
    per_group = max(Rp, F, Rq * nodes)
    out: list[list[tuple[np.ndarray, np.ndarray, int, int]]] = [[], [], []]
    i, U = 0, len(used)
    while i < U:  # a run of nodes whose groups' counters fit the chunk (at least one node)
        j = i + 1
        while j < U and (int(gmax[j]) - int(gmin[i]) + 1) * per_group <= _CHUNK_BINS:
            j += 1
        a, b = int(starts[used[i]]), int(starts[used[j - 1] + 1])
        g0, span = int(gmin[i]), int(gmax[j - 1]) - int(gmin[i]) + 1
        local = gid[a:b].astype(np.intp) - g0
        t = tp[a:b]
        counts = np.bincount(local * Rp + pre_num[t], minlength=span * Rp)
        at = np.flatnonzero(counts)
        out[0].append((at, counts[at], g0, Rp))
        # the fabric rows and the destination (group, row) pairs in use are numbered first (in
        # order), so that the counters span those, not every row
        f = fp[a:b]
        rows, number = _numbering(f, F)
        counts = np.bincount(local * len(rows) + number[f], minlength=span * len(rows))
        at = np.flatnonzero(counts)
        c, r = np.divmod(at, len(rows))
        out[1].append((c * F + rows[r], counts[at], g0, F))
        gr = local * Rq + post_num[t]
        pairs, number = _numbering(gr, span * Rq)
        counts = np.bincount(number[gr] * nodes + nb[a:b], minlength=len(pairs) * nodes)
        at = np.flatnonzero(counts)
        c, node = np.divmod(at, nodes)
        out[2].append((pairs[c] * nodes + node, counts[at], g0, Rq * nodes))
        i = j
    tallies: list[tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]] = []
    for k, width in enumerate((Rp, F, Rq * nodes)):
        at = np.concatenate([x[0] + x[2] * width for x in out[k]])
        count = np.concatenate([x[1] for x in out[k]])
        g, rest = np.divmod(at, width)
        if k == 2:
            row, node = np.divmod(rest, nodes)
            tallies.append((g, row, node, count))
        else:
            tallies.append((g, rest, None, count))
    g, _, _, count = tallies[0]
    size = np.bincount(g, weights=count, minlength=int(gmax[-1]) + 1).astype(np.int64)
    return tallies, size


def _repeats_a_link_in(rows: np.ndarray) -> bool:
    """Whether any of the padded ``rows`` holds a link twice."""
    srt = np.sort(rows, axis=1)
    return bool(np.any((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)))
