"""Aggregate flows: transfers started together carried as one flow where that is exact.

Transfers started together (:meth:`~simgpu.comm.network.FlowNetwork.transfer_all`, at least
:data:`~simgpu.comm.flows.AGGREGATE_FROM` of them) that move the same bytes under the same cap and
have the same first slowest link on their route (the NIC port of a rail, for the pairs of an
all-to-all) are carried as one *aggregate* flow: one entry in the max-min computation, one finish
time, whose load on each link is the sum of its members'. That is exact whenever every member
would get the aggregate's rate on its own, and the network checks it at every recomputation
(:func:`~simgpu.comm.fair._fair`): the max-min fair allocation is the one in which every flow is at
its cap or crosses a saturated link on which no flow gets more (its bottleneck), and an aggregate
whose bottleneck is a link all its members cross gives each member such a bottleneck. An
aggregate without one (its members would part: one of them crosses a contended link the others do
not) is split into its members, each with the bytes the aggregate had left, and the rates are
computed again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .flows import AGGREGATE_FROM, _Batch, _Flow, _single
from .parts import PartGroups, part_anchors
from .transfers import TransferTable

#: the most (group, link) counters the aggregates' links are counted in at once (beyond: sorted)
_DENSE_BINS = 1 << 26


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
