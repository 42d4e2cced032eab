"""Max-min fair rates by progressive filling: the flows of a component (:func:`_fair`, with the
aggregates' check), and the rates of transfers alone on an idle network (:func:`isolated_rates`,
:func:`isolated_time`), what the planner compares algorithms and protocols by."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .aggregates import _by_kind, _flows_of, _part_flows
from .flows import AGGREGATE_FROM, _Batch, _Flow, _live, _single
from .parts import Incidence, PartGroups
from .transfers import TransferTable

#: relative slack of the aggregate check: a link this close to its capacity is saturated, a rate
#: this close to a link's highest is the highest (the progressive filling's own tolerance is 1e-9)
_CHECK_TOL = 1e-8


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
