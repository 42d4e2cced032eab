"""An all-to-all's aggregates found from its route parts and kinds (:func:`_part_flows`) are those
found route by route from the same transfers' rows: the same members, links, edge counts, common
links, bytes and caps, on every shape of network, with the tallies counted in place or sorted; the
isolated time from the aggregates equals that of the per-transfer rates; and the numbering helpers
equal numpy's sorts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu.comm import parts as parts_module
from simgpu.comm.aggregates import _flows_of, _part_flows
from simgpu.comm.algorithms.p2p import direct
from simgpu.comm.fair import isolated_rates, isolated_time
from simgpu.comm.flows import _Batch
from simgpu.comm.parts import _tally2
from simgpu.comm.plan import CollectiveRequest
from simgpu.comm.transfers import Transfer, TransferTable
from simgpu.config.loader import load_platform
from simgpu.platform import route_parts
from simgpu.platform.route_parts import first_positions
from simgpu.platform.topology import Topology

CASES = [
    ("dgx_a100", [], 6, None),  # rail-optimised leaves, PXN across rails
    ("dgx_h100", [("network.nodes_per_leaf", 2), ("network.oversubscription", 2.0)], 6, None),  # 2:1 spine
    ("dgx_h100", [("network.topology", "fat_tree"), ("network.nodes_per_leaf", 2)], 5, None),  # fat tree
    ("dgx_h100", [("network.nics_per_node", 16), ("network.nic_gbps", 200), ("network.nics_per_gpu", 2)], 3, None),
    ("perlmutter_gpu", [("network.dragonfly.nodes_per_switch", 2), ("network.dragonfly.switches_per_group", 2),
                        ("network.dragonfly.global_links_per_group_pair", 2),
                        ("network.dragonfly.routing", "minimal")], 9, None),
    ("perlmutter_gpu", [("network.dragonfly.nodes_per_switch", 1), ("network.dragonfly.switches_per_group", 3),
                        ("network.dragonfly.routing", "adaptive")], 7, None),
    ("pcie_4gpu", [], 3, None),  # one NIC a node: destination rows share links
    ("dgx1_v100", [], 2, None),  # NVLink mesh
    ("dgx_a100", [], 4, 3),  # fewer GPUs a node than the node has
]


def plan_table(case: tuple, nbytes: int, proto: str = "simple") -> tuple[Topology, TransferTable]:
    platform, keys, nodes, gpn = case
    spec, _ = load_platform(platform, keys)
    topo = Topology(spec, nodes, gpn)
    req = CollectiveRequest("all_to_all", tuple(range(topo.world)), nbytes)
    protos = spec.collectives.protocols
    plan = direct(req, topo, spec.collectives, protos[proto if proto in protos else next(iter(protos))])
    assert isinstance(plan.transfers, TransferTable) and plan.transfers.kinds is not None
    return topo, plan.transfers


def as_rows(t: TransferTable) -> TransferTable:
    """The same transfers with their routes as rows and bytes and caps per transfer."""
    return TransferTable(np.asarray(t.flat, dtype=np.int64), t.starts, np.array(t.nbytes), np.array(t.max_rate))


def groups(flows: list) -> dict:
    return {tuple(f.idx.tolist()): (dict(zip(f.links.tolist(), f.w.tolist(), strict=True)),
                                    None if f.common is None else sorted(f.common.tolist()), f.remaining, f.cap)
            for f in flows}


def both(topo: Topology, t: TransferTable, live: np.ndarray, ones: bool = False) -> tuple[list, list]:
    kb = np.ones(len(t.kind_nbytes)) if ones else t.kind_nbytes
    parts = _part_flows(_Batch.of(t), live, t.kinds[live], kb, t.kind_max_rate, topo.capacity)
    assert parts is not None
    rows = as_rows(t)
    nbytes = np.ones(len(t)) if ones else rows.nbytes
    plain = _flows_of(_Batch.of(rows), live, nbytes[live], rows.max_rate[live], topo.capacity, aggregate_from=2)
    return parts, plain


@pytest.mark.parametrize("sorted_", [False, True])  # True: every tally and numbering sorted, none counted
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}x{c[3] or 'all'}-{len(c[1])}")
def test_part_groups_equal_groups_from_rows(case, sorted_, monkeypatch):
    if sorted_:
        monkeypatch.setattr(parts_module, "_DENSE_BINS", 0)
        monkeypatch.setattr(route_parts, "_LOOKUP_KEYS", 0)
    for nbytes in (1 << 16, 1 << 26):
        topo, t = plan_table(case, nbytes)
        parts, plain = both(topo, t, np.arange(len(t)))
        assert groups(parts) == groups(plain)
        assert [f.idx.tolist() for f in parts] == [f.idx.tolist() for f in plain]  # the same order
        assert any(f.common is not None for f in parts)  # aggregated, not one flow a pair


@settings(max_examples=25, deadline=None)
@given(case=st.sampled_from(CASES), seed=st.integers(0, 2**16), keep=st.floats(0.2, 1.0), ones=st.booleans())
def test_part_groups_of_some_pairs_equal_those_from_rows(case, seed, keep, ones):
    topo, t = plan_table(case, 1 << 20)
    live = np.flatnonzero(np.random.default_rng(seed).random(len(t)) < keep)
    if len(live) < 2:
        return
    parts, plain = both(topo, t, live, ones)
    assert groups(parts) == groups(plain)


@pytest.mark.parametrize("case", CASES[:5] + CASES[6:7], ids=lambda c: f"{c[0]}-{c[2]}")
@pytest.mark.parametrize("nbytes", [1 << 10, 1 << 22])
def test_isolated_time_from_aggregates_equals_per_transfer_rates(case, nbytes):
    topo, t = plan_table(case, nbytes)
    rows = as_rows(t)
    want = float(np.max(rows.nbytes / isolated_rates(rows, topo.capacity)))
    assert isolated_time(t, topo.capacity) == want


def test_a_table_of_kinds_reads_as_its_transfers():
    topo, t = plan_table(CASES[0], 1 << 20)
    assert len(t) == topo.world * (topo.world - 1)
    np.testing.assert_array_equal(t.nbytes, t.kind_nbytes[t.kinds])
    rng = np.random.default_rng(2)
    for i in rng.integers(0, len(t), 50).tolist():
        a, b = divmod(i, topo.world - 1)
        b += b >= a  # member a's pairs skip a itself
        assert t[i] == Transfer(topo.route(a, b), float(t.kind_nbytes[t.kinds[i]]), float(t.kind_max_rate[t.kinds[i]]))
    assert np.array_equal(t.flat[t.starts[5]:t.starts[6]], np.array(t.links(5)))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), k=st.integers(1, 300), n=st.integers(1, 30000))
def test_first_positions_equal_uniques(seed, k, n):
    raw = np.random.default_rng(seed).integers(0, k, n)
    values, want, inverse = np.unique(raw, return_index=True, return_inverse=True)
    np.testing.assert_array_equal(first_positions(inverse.reshape(-1), len(values)), want)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), hi=st.integers(1, 500), lo=st.integers(1, 5000), n=st.integers(1, 5000),
       dense=st.sampled_from([0, 1 << 10, 1 << 26]))
def test_tally2_equals_unique_counts(seed, hi, lo, n, dense):
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, hi, n), rng.integers(0, lo, n)
    old = parts_module._DENSE_BINS
    parts_module._DENSE_BINS = dense
    try:
        x, y, count = _tally2(a, b, lo)
    finally:
        parts_module._DENSE_BINS = old
    keys, want = np.unique(a.astype(np.int64) * lo + b, return_counts=True)
    np.testing.assert_array_equal(x * lo + y, keys)
    np.testing.assert_array_equal(count, want)


def _of_both_ways(topo: Topology, t: TransferTable, live: np.ndarray, monkeypatch) -> tuple:
    """PartGroups.of counted source node by source node (one node a chunk and many), and over the
    whole key at once."""
    anchor = parts_module.part_anchors(t.parts, live, topo.capacity)
    assert anchor is not None
    key = anchor * (int(t.kinds.max()) + 1) + t.kinds[live]
    out = []
    for bins in (1, 1 << 30, None):
        with monkeypatch.context() as m:
            if bins is None:
                m.setattr(parts_module, "_node_tallies", lambda *a: None)
            else:
                m.setattr(parts_module, "_CHUNK_BINS", bins)
            out.append(parts_module.PartGroups.of(t.parts, live, key, len(topo.capacity)))
    return tuple(out)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}x{c[3] or 'all'}-{len(c[1])}")
def test_part_groups_counted_node_by_node_equal_those_counted_at_once(case, monkeypatch):
    topo, t = plan_table(case, 1 << 16)
    rng = np.random.default_rng(3)
    seen: list = []
    real = parts_module._node_tallies

    def counted(*a):
        seen.append(real(*a))
        return seen[-1]

    for live in (np.arange(len(t)), np.flatnonzero(rng.random(len(t)) < 0.5)):
        seen.clear()
        monkeypatch.setattr(parts_module, "_node_tallies", counted)
        *by_node, whole = _of_both_ways(topo, t, live, monkeypatch)
        monkeypatch.setattr(parts_module, "_node_tallies", real)
        assert len(seen) == 2 and all(s is not None for s in seen)  # the node-by-node count was taken
        for got in by_node:
            for name in ("gid", "size", "heads"):
                np.testing.assert_array_equal(getattr(got, name), getattr(whole, name))
            assert got.made == whole.made
            assert len(got.links) == len(whole.links)
            for a, b in zip(got.links, whole.links, strict=True):
                for x, y in zip(a, b, strict=True):  # links in the same order, the same counts
                    assert x.dtype == y.dtype
                    np.testing.assert_array_equal(x, y)


def test_part_groups_of_members_out_of_node_order_equal_those_from_rows(monkeypatch):
    """Members not in GPU order: the pairs do not come node by node, so the groups are counted
    over the whole key; they still equal the groups found route by route."""
    spec, _ = load_platform("dgx_a100")
    topo = Topology(spec, 4)
    order = tuple(np.random.default_rng(5).permutation(topo.world).tolist())
    req = CollectiveRequest("all_to_all", order, 1 << 16)
    plan = direct(req, topo, spec.collectives, spec.collectives.protocols["simple"])
    t = plan.transfers
    assert isinstance(t, TransferTable)
    seen = []
    real = parts_module._node_tallies
    monkeypatch.setattr(parts_module, "_node_tallies", lambda *a: seen.append(real(*a)) or seen[-1])
    parts, plain = both(topo, t, np.arange(len(t)))
    assert seen == [None]  # counted over the whole key
    assert groups(parts) == groups(plain)
    assert [f.idx.tolist() for f in parts] == [f.idx.tolist() for f in plain]
