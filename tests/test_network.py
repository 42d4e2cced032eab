"""Bandwidth sharing on links: max-min fairness, exact completion times, monotonicity."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu.comm import aggregates
from simgpu.comm.fair import _max_min, isolated_rates
from simgpu.comm.network import FlowNetwork
from simgpu.comm.transfers import TransferTable
from simgpu.report.summary import union_measure


class F:
    def __init__(self, links: list[int], cap: float = float("inf")) -> None:
        self.links = np.asarray(links, dtype=np.int64)
        self.cap = cap


def finish_times(cap: list[float], transfers: list[tuple[list[int], float, float]]) -> list[float]:
    env = simpy.Environment()
    net = FlowNetwork(env, np.array(cap))
    out = [0.0] * len(transfers)

    def go(i: int, links: list[int], nbytes: float, start: float):
        yield env.timeout(start)
        yield net.transfer(links, nbytes)
        out[i] = env.now

    for i, (links, nbytes, start) in enumerate(transfers):
        env.process(go(i, links, nbytes, start))
    env.run()
    return out


def test_one_transfer_takes_bytes_over_bottleneck():
    assert finish_times([10.0, 5.0], [([0, 1], 100.0, 0.0)]) == [pytest.approx(20.0)]


def test_two_transfers_share_then_one_speeds_up():
    # both on link 0 (cap 10): 5 each; the 50-byte one ends at t=10, the other then runs at 10
    t = finish_times([10.0], [([0], 50.0, 0.0), ([0], 150.0, 0.0)])
    assert t == [pytest.approx(10.0), pytest.approx(20.0)]


def test_max_min_gives_unused_share_to_others():
    # flow a: links 0,1; flow b: link 1; flow c: link 0 (cap 10 each) -> all 5
    rates, _, _ = _max_min([F([0, 1]), F([1]), F([0])], np.array([10.0, 10.0]))
    assert rates == pytest.approx([5, 5, 5])
    # link 1 has cap 2: a gets 1, b gets 1, c takes the rest of link 0 (9)
    rates, _, _ = _max_min([F([0, 1]), F([1]), F([0])], np.array([10.0, 2.0]))
    assert rates == pytest.approx([1, 1, 9])


def test_coflow_multiplicity_counts_each_edge():
    rates, ids, load = _max_min([F([0, 0, 1])], np.array([10.0, 10.0]))
    assert rates == pytest.approx([5.0])
    assert dict(zip(ids.tolist(), load.tolist())) == pytest.approx({0: 10.0, 1: 5.0})


def test_a_capped_flow_leaves_its_share_to_the_others():
    # a is held at 2 by its own cap (a protocol window), so c takes 8 of link 0 and b 8 of link 1
    rates, _, _ = _max_min([F([0, 1], cap=2.0), F([1]), F([0])], np.array([10.0, 10.0]))
    assert rates == pytest.approx([2, 8, 8])
    # a cap above the fair share changes nothing
    rates, _, _ = _max_min([F([0, 1], cap=50.0), F([1]), F([0])], np.array([10.0, 10.0]))
    assert rates == pytest.approx([5, 5, 5])
    # alone, a capped transfer takes bytes over its cap
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([10.0]))
    ev = net.transfer([0], 100.0, max_rate=4.0)
    env.run()
    assert ev.processed and env.now == pytest.approx(25.0)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=4),
                          st.one_of(st.just(float("inf")), st.floats(0.5, 50.0))), min_size=1, max_size=10),
       st.lists(st.floats(1.0, 40.0), min_size=4, max_size=4))
def test_capped_max_min_is_feasible_and_fair(flows, cap):
    """With per-flow caps: no flow above its cap, no link above its capacity, and every flow is
    either at its cap or crosses a saturated link on which no flow gets more than it (max-min)."""
    fs = [F(links, c) for links, c in flows]
    capacity = np.array(cap)
    rates, ids, load = _max_min(fs, capacity)
    per_link = {int(i): float(x) for i, x in zip(ids, load)}
    for lid, x in per_link.items():
        assert x <= capacity[lid] * (1 + 1e-6)
    for f, r in zip(fs, rates):
        assert r <= f.cap * (1 + 1e-9)
        if r >= f.cap * (1 - 1e-6):
            continue
        bottlenecks = [lid for lid in set(f.links.tolist()) if per_link[lid] >= capacity[lid] * (1 - 1e-6)]
        assert bottlenecks, (f.links, r)
        assert any(all(r2 <= r * (1 + 1e-6) for g, r2 in zip(fs, rates) if lid in g.links.tolist())
                   for lid in bottlenecks)


def test_latency_delays_the_start():
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([1.0]))
    ev = net.transfer([0], 2.0, latency=3.0)
    env.run()
    assert ev.triggered and env.now == pytest.approx(5.0)


def test_link_bytes_and_busy_time_are_accounted():
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([10.0, 10.0]), record=True)
    net.transfer([0, 1], 100.0)
    env.run()
    net.finish()
    assert net.link_bytes == pytest.approx([100.0, 100.0])
    assert net.link_busy_s == pytest.approx([10.0, 10.0])
    assert sorted(net.intervals) == [(0, 0.0, pytest.approx(10.0)), (1, 0.0, pytest.approx(10.0))]


transfers = st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=3),
                               st.floats(1.0, 1e3), st.floats(0.0, 10.0)), min_size=1, max_size=8)


def test_each_owner_keeps_its_own_stretch_on_a_shared_link():
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([10.0, 10.0]), owners=True)
    net.transfer([0], 20.0, owner="a")              # alone on link 0 at 10/s until b joins at 1 s
    net.transfer([0, 1], 5.0, latency=1.0, owner="b")  # 5/s each from 1 s: b ends at 2 s, a at 2.5 s
    env.run()
    net.finish()
    assert net.owners is not None and net.intervals == []  # link intervals only where asked for
    assert sorted(net.owners.intervals) == [(0, "a", 0.0, pytest.approx(2.5)), (0, "b", 1.0, pytest.approx(2.0)),
                                            (1, "b", 1.0, pytest.approx(2.0))]
    only = FlowNetwork(simpy.Environment(), np.array([10.0, 10.0]), owners=[1])
    assert FlowNetwork(simpy.Environment(), np.array([1.0]), owners=[]).owners is None
    only.transfer([0, 1], 10.0, owner="c")
    only.env.run()
    only.finish()
    assert only.owners is not None and only.owners.intervals == [(1, "c", 0.0, pytest.approx(1.0))]


@settings(max_examples=40, deadline=None)
@given(items=transfers)
def test_owner_stretches_cover_each_links_busy_time(items):
    # single flows, routes started together and aggregates (split where their members part)
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([10.0, 20.0, 5.0, 40.0]), record=True, owners=True, aggregate_from=2)
    together = [(links, b, float("inf")) for k, (links, b, _) in enumerate(items) if k % 2 == 0]
    for k, (links, b, lat) in enumerate(items):
        if k % 2:
            net.transfer(links, b, lat, owner=f"o{k % 3}")
    net.transfer_all(together, owner="all")
    env.run()
    net.finish()
    assert net.owners is not None
    for lid in range(4):
        mine = [(s, e) for link, _, s, e in net.owners.intervals if link == lid]
        plain = [(s, e) for link, s, e in net.intervals if link == lid]
        assert union_measure([s for s, _ in mine], [e for _, e in mine]) == pytest.approx(
            net.link_busy_s[lid], rel=1e-9, abs=1e-12)
        assert union_measure([s for s, _ in plain], [e for _, e in plain]) == pytest.approx(
            net.link_busy_s[lid], rel=1e-9, abs=1e-12)


@settings(max_examples=60)
@given(st.lists(st.tuples(st.floats(1.0, 1e3), st.floats(0.0, 10.0)), min_size=1, max_size=8),
       st.floats(1.0, 100.0))
def test_faster_shared_link_never_delays_a_transfer(trs, cap):
    """Property: on one shared link, doubling its capacity finishes every transfer no later."""
    flows = [([0], nbytes, start) for nbytes, start in trs]
    for slow, fast in zip(finish_times([cap], flows), finish_times([2 * cap], flows)):
        assert fast <= slow * (1 + 1e-9)


@settings(max_examples=60)
@given(transfers, st.lists(st.floats(1.0, 100.0), min_size=4, max_size=4))
def test_work_conservation_bounds(trs, cap):
    """Property: no transfer beats its bottleneck alone; a link never carries more than it can."""
    done = finish_times(cap, trs)
    for (links, nbytes, start), end in zip(trs, done):
        assert end - start >= nbytes / min(cap[i] for i in links) * (1 - 1e-9)
    for lid in range(4):
        load = sum(nbytes * links.count(lid) for links, nbytes, _ in trs)
        first = min((s for links, _, s in trs if lid in links), default=0.0)
        last = max((e for (links, _, _), e in zip(trs, done) if lid in links), default=0.0)
        if load:
            assert load <= cap[lid] * (last - first) * (1 + 1e-6)


def test_transfer_all_equals_one_by_one():
    """Starting a collective's transfers together gives the same times as starting them one by one."""
    items = [([0, 1], 100.0, float("inf")), ([1], 50.0, 3.0), ([0], 30.0, float("inf")), ([], 10.0, 1.0),
             ([1, 1], 0.0, float("inf"))]

    def run(together: bool) -> list[float]:
        env = simpy.Environment()
        net = FlowNetwork(env, np.array([10.0, 20.0]))
        events = (net.transfer_all(items) if together
                  else [net.transfer(links, b, max_rate=c) for links, b, c in items])
        ends = [0.0] * len(events)
        for k, ev in enumerate(events):
            ev.callbacks.append(lambda _e, k=k: ends.__setitem__(k, env.now))
        env.run()
        assert all(ev.processed for ev in events)
        return ends

    assert run(True) == pytest.approx(run(False))


def _reference(cap: list[float], transfers: list[tuple[list[int], float, float, float]]
               ) -> tuple[list[float], np.ndarray, np.ndarray]:
    """Finish times, bytes and busy seconds per link with every active flow's max-min rate
    recomputed over the whole network at every start and end: the definition the incremental
    network (components only, lazy progress) must reproduce."""
    class G:
        def __init__(self, i: int, links: list[int], nbytes: float, cap_: float) -> None:
            self.i, self.links, self.remaining, self.cap = i, np.asarray(links, dtype=np.int64), nbytes, cap_

    capacity = np.asarray(cap, dtype=float)
    pending = sorted(((s, i) for i, (_, _, s, _) in enumerate(transfers)), reverse=True)
    active: list[G] = []
    out = [0.0] * len(transfers)
    link_bytes, busy = np.zeros(len(cap)), np.zeros(len(cap))
    now = 0.0
    while pending or active:
        rates = _max_min(active, capacity)[0] if active else np.zeros(0)
        t_end = min((g.remaining / r for g, r in zip(active, rates, strict=True)), default=float("inf"))
        t_start = pending[-1][0] - now if pending else float("inf")
        dt = min(t_end, t_start)
        for g, r in zip(active, rates, strict=True):
            g.remaining -= r * dt
            np.add.at(link_bytes, g.links, r * dt)
        used = {int(lid) for g in active for lid in g.links}
        for lid in used:
            busy[lid] += dt
        now += dt
        still = []
        for g, r in zip(active, rates, strict=True):
            if g.remaining <= r * 1e-12:
                out[g.i] = now
            else:
                still.append(g)
        active = still
        while pending and pending[-1][0] <= now + 1e-15:
            _, i = pending.pop()
            links, nbytes, _, c = transfers[i]
            if nbytes > 0 and links:
                active.append(G(i, links, nbytes, c))
            else:
                out[i] = now
    return out, link_bytes, busy


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 5), min_size=1, max_size=4),
                          st.floats(0.5, 50.0), st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.5, 4.0]),
                          st.sampled_from([float("inf"), float("inf"), 3.0, 7.0])),
                min_size=1, max_size=10),
       st.lists(st.floats(1.0, 10.0), min_size=6, max_size=6))
def test_incremental_rates_equal_global_recomputation(trs, cap):
    """Property: recomputing only the component a start or an end touches, and settling progress
    lazily, gives the finish times, bytes and busy time per link of a global recomputation."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.array(cap))
    out = [0.0] * len(trs)

    def go(i: int, links: list[int], nbytes: float, start: float, c: float):
        yield env.timeout(start)
        yield net.transfer(links, nbytes, max_rate=c)
        out[i] = env.now

    for i, (links, nbytes, start, c) in enumerate(trs):
        env.process(go(i, links, nbytes, start, c))
    env.run()
    net.finish()
    want, link_bytes, busy = _reference(cap, trs)
    assert out == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert net.link_bytes == pytest.approx(link_bytes, rel=1e-9, abs=1e-9)
    assert net.link_busy_s == pytest.approx(busy, rel=1e-9, abs=1e-9)


def _run_all(cap: list[float], batches: list[tuple[float, list[tuple[list[int], float, float]]]], aggregate: bool
             ) -> tuple[list[float], FlowNetwork]:
    """Finish time of every transfer of ``batches`` (each started together, by transfer_all, at its time)."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.array(cap), aggregate_from=2 if aggregate else 0)
    out: list[list[float]] = [[0.0] * len(items) for _, items in batches]

    def go(b: int, start: float, items: list[tuple[list[int], float, float]]):
        yield env.timeout(start)
        for k, ev in enumerate(net.transfer_all(items)):
            ev.callbacks.append(lambda _e, k=k: out[b].__setitem__(k, env.now))

    for b, (start, items) in enumerate(batches):
        env.process(go(b, start, items))
    env.run()
    net.finish()
    return [t for ts in out for t in ts], net


def _assert_same(cap, batches) -> FlowNetwork:
    got, agg = _run_all(cap, batches, True)
    want, plain = _run_all(cap, batches, False)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert agg.link_busy_s == pytest.approx(plain.link_busy_s, rel=1e-9, abs=1e-12)
    assert agg.link_bytes == pytest.approx(plain.link_bytes, rel=1e-9, abs=1e-9)
    return agg


def test_pairs_alike_ride_as_one_aggregate():
    # four senders' pairs through one shared port (link 4, the slowest): one aggregate, no split
    items = [([s, 4, 5 + d], 10.0, float("inf")) for s in range(4) for d in range(2)]
    net = _assert_same([20.0] * 4 + [8.0] + [20.0, 20.0], [(0.0, items)])
    assert (net.aggregates, net.splits) == (1, 0)


def test_an_aggregate_whose_members_would_part_is_split():
    # the same pairs, but one destination port (link 6, not the slowest) is contended by later
    # transfers: the members crossing it slow down, the others speed up, so the aggregate must
    # split, and the times still match
    items = [([s, 4, 5 + d], 10.0, float("inf")) for s in range(4) for d in range(2)]
    other = [([6], 40.0, float("inf"))] * 10
    net = _assert_same([20.0] * 4 + [8.0] + [20.0, 9.0], [(0.0, items), (0.5, other)])
    assert net.splits >= 1


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.0, 0.7, 2.0]),
                          st.lists(st.tuples(st.lists(st.integers(0, 6), min_size=1, max_size=4),
                                             st.sampled_from([5.0, 5.0, 12.0]),
                                             st.sampled_from([float("inf"), float("inf"), 2.0])),
                                   min_size=1, max_size=9)),
                min_size=1, max_size=3),
       st.lists(st.sampled_from([1.0, 2.0, 2.0, 5.0, 9.0]), min_size=7, max_size=7))
def test_aggregates_equal_one_flow_per_transfer(batches, cap):
    """Property: carrying transfers alike as aggregates (split where their members would part)
    gives every transfer's finish time and every link's bytes and busy time of one flow each,
    contended or not."""
    _assert_same(cap, batches)


def _as_table(items: list[tuple[list[int], float, float]], memo: dict[str, object]) -> TransferTable:
    lens = [len(links) for links, _, _ in items]
    return TransferTable(np.array([x for links, _, _ in items for x in links], dtype=np.int64),
                         np.concatenate(([0], np.cumsum(lens))).astype(np.int64),
                         np.array([b for _, b, _ in items]), np.array([c for _, _, c in items]), memo)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 6), min_size=1, max_size=4),
                          st.sampled_from([5.0, 5.0, 12.0]),
                          st.sampled_from([float("inf"), float("inf"), 2.0])), min_size=2, max_size=12),
       st.sampled_from([0.0, 0.3, 3.0]),
       st.lists(st.sampled_from([1.0, 2.0, 2.0, 5.0, 9.0]), min_size=7, max_size=7))
def test_a_transfer_table_runs_as_its_transfers(items, again, cap):
    """Property: transfers given as a :class:`TransferTable` (started twice, the second time
    reusing what the first derived from the routes) end when the same transfers given one tuple
    each do, to the bit, aggregated or not, routes crossing a link twice or not."""
    for aggregate, dense in ((True, 1 << 26), (True, 0), (False, 1 << 26)):  # dense 0: links counted by sorting
        want, plain = _run_all(cap, [(0.0, items), (again, items)], aggregate)
        memo: dict[str, object] = {}
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(aggregates, "_DENSE_BINS", dense)
            got, table = _run_all(cap, [(0.0, _as_table(items, memo)), (again, _as_table(items, memo))], aggregate)
        assert got == want
        assert list(table.link_bytes) == list(plain.link_bytes)
        assert list(table.link_busy_s) == list(plain.link_busy_s)
    assert [tuple(t) for t in _as_table(items, {})] == [(tuple(links), b, c) for links, b, c in items]


def test_isolated_rates_of_a_table_equal_those_of_its_transfers():
    items = [([s, 4, 5 + d], 10.0, float("inf") if s else 3.0) for s in range(4) for d in range(2)]
    cap = np.array([20.0] * 4 + [8.0] + [20.0, 9.0])
    want = isolated_rates([(links, c) for links, _, c in items], cap)
    assert list(isolated_rates(_as_table(items, {}), cap)) == list(want)


# -- implied links: a leaf's uplink covered by its NIC ports ----------------------------------------

#: a two-leaf fabric: leaf A's ports up (0-2) and its uplink (3); leaf B's downlink (7) and ports down
#: (4-6); a link inside leaf A (8)
_PORTS_UP, _UP, _PORTS_DOWN, _DOWN, _LOCAL = (0, 1, 2), 3, (4, 5, 6), 7, 8
_IMPLIED = {_UP: frozenset(_PORTS_UP), _DOWN: frozenset(_PORTS_DOWN)}


def _edge(a: int, b: int | None) -> list[int]:
    """Port ``a`` of leaf A to port ``b`` of leaf B across the spine, or to the link inside leaf A."""
    return [_PORTS_UP[a], _LOCAL] if b is None else [_PORTS_UP[a], _UP, _DOWN, _PORTS_DOWN[b]]


def _run_fabric(cap: list[float], batches: list[tuple[float, str, list[tuple[list[int], float, float]]]],
                implied: bool) -> tuple[list[float], FlowNetwork]:
    """Each batch's transfers' finish times (``how``: one by one, all together, or one group)."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.array(cap), record=True, aggregate_from=2, implied=_IMPLIED if implied else None)
    out: list[list[float]] = [[0.0] * len(items) for _, _, items in batches]

    def go(b: int, start: float, how: str, items: list[tuple[list[int], float, float]]):
        yield env.timeout(start)
        if how == "group":
            yield net.transfer_group(items)
            out[b] = [env.now] * len(items)
            return
        events = net.transfer_all(items) if how == "all" else [net.transfer(*item[:2], max_rate=item[2])
                                                                 for item in items]
        for k, ev in enumerate(events):
            ev.callbacks.append(lambda _e, k=k: out[b].__setitem__(k, env.now))

    for b, (start, how, items) in enumerate(batches):
        env.process(go(b, start, how, items))
    env.run()
    net.finish()
    return [t for ts in out for t in ts], net


_edges = st.tuples(st.integers(0, 2), st.one_of(st.none(), st.integers(0, 2)))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.0, 0.4, 1.5]), st.sampled_from(["one", "all", "group"]),
                          st.lists(st.tuples(st.lists(_edges, min_size=1, max_size=3),
                                             st.sampled_from([5.0, 5.0, 12.0]),
                                             st.sampled_from([float("inf"), float("inf"), 2.0])),
                                   min_size=1, max_size=6)),
                min_size=1, max_size=3),
       st.lists(st.sampled_from([1.0, 2.0, 2.0, 5.0]), min_size=7, max_size=7), st.sampled_from([1.0, 1.5]))
def test_implied_links_change_no_rate_nor_counter(batches, caps, spare):
    """Property: leaving a leaf's uplink and downlink out of the rate computation (their capacity at
    least their ports', ``spare`` times) gives every transfer's finish time and every link's bytes,
    busy time and busy intervals of the full computation: routes, coflows crossing the spine twice,
    capped flows and aggregates alike."""
    cap = caps[:3] + [0.0] + caps[3:6] + [0.0, caps[6]]
    cap[_UP] = sum(cap[p] for p in _PORTS_UP) * spare
    cap[_DOWN] = sum(cap[p] for p in _PORTS_DOWN) * spare
    items = [(start, how, [([x for a, b in edges for x in _edge(a, b)], nbytes, rate) for edges, nbytes, rate in its])
             for start, how, its in batches]
    want, full = _run_fabric(cap, items, False)
    got, pruned = _run_fabric(cap, items, True)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert pruned.link_bytes == pytest.approx(full.link_bytes, rel=1e-9, abs=1e-9)
    assert pruned.link_busy_s == pytest.approx(full.link_busy_s, rel=1e-9, abs=1e-12)
    a, b = np.array(sorted(pruned.intervals)).reshape(-1, 3), np.array(sorted(full.intervals)).reshape(-1, 3)
    assert a.shape == b.shape and (a[:, 0] == b[:, 0]).all()
    np.testing.assert_allclose(a[:, 1:], b[:, 1:], rtol=1e-9, atol=1e-12)


def test_implied_links_join_no_component():
    # two flows from different ports of leaf A up the spine to different ports of leaf B meet only on
    # the uplink and downlink: each is alone on the network, and each gets its port's rate
    cap = [4.0, 4.0, 4.0, 12.0, 4.0, 4.0, 4.0, 12.0, 4.0]
    t, net = _run_fabric(cap, [(0.0, "one", [(_edge(0, 0), 8.0, float("inf")), (_edge(1, 1), 4.0, float("inf"))])],
                         True)
    assert t == pytest.approx([2.0, 1.0])
    assert net.link_bytes[_UP] == pytest.approx(12.0) and net.link_busy_s[_UP] == pytest.approx(2.0)
    assert [(a, b) for lid, a, b in net.intervals if lid == _UP] == [(0.0, pytest.approx(2.0))]


def test_a_flow_that_misses_an_implied_links_cover_is_refused():
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([4.0, 4.0, 4.0, 12.0, 4.0, 4.0, 4.0, 12.0, 4.0]), implied=_IMPLIED)
    with pytest.raises(ValueError, match="link 3 is given as implied"):
        net.transfer([_LOCAL, _UP], 1.0)


def test_implied_links_need_disjoint_covers_of_plain_links():
    cap = np.array([4.0, 4.0, 4.0, 12.0, 4.0, 4.0, 4.0, 12.0, 4.0])
    with pytest.raises(ValueError, match="disjoint"):
        FlowNetwork(simpy.Environment(), cap, implied={3: frozenset({0, 1}), 7: frozenset({1, 2})})
    with pytest.raises(ValueError, match="disjoint"):
        FlowNetwork(simpy.Environment(), cap, implied={3: frozenset({0, 7}), 7: frozenset({4})})
