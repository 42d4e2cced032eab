"""Many routes at once: :meth:`Topology.route_table` lists the same links as :meth:`Topology.route`
pair by pair, on every shape of network, and its shape numbers group routes that differ only in
their end nodes."""

from __future__ import annotations

import numpy as np
import pytest

from simgpu.config.loader import load_platform
from simgpu.platform import route_parts
from simgpu.platform.topology import Topology

CASES = [
    ("dgx_a100", [], 6, None),  # fat tree, one leaf, PXN across rails
    ("dgx_h100", [("network.nodes_per_leaf", 2), ("network.oversubscription", 2.0)], 6, None),  # spine
    ("dgx_h100", [("network.topology", "rail_optimized"), ("network.nodes_per_leaf", 2)], 5, None),
    ("dgx_h100", [("network.nics_per_node", 16), ("network.nic_gbps", 200), ("network.nics_per_gpu", 2)], 3, None),
    ("perlmutter_gpu", [("network.dragonfly.nodes_per_switch", 2), ("network.dragonfly.switches_per_group", 2),
                        ("network.dragonfly.global_links_per_group_pair", 2),
                        ("network.dragonfly.routing", "minimal")], 11, None),
    ("perlmutter_gpu", [("network.dragonfly.nodes_per_switch", 1), ("network.dragonfly.switches_per_group", 3),
                        ("network.dragonfly.routing", "adaptive")], 7, None),
    ("pcie_4gpu", [], 3, None),
    ("dgx1_v100", [], 2, None),  # NVLink mesh, routes through an intermediate GPU
    ("dgx_a100", [], 4, 3),  # fewer GPUs a node than the node has
]


@pytest.mark.parametrize(("platform", "keys", "nodes", "gpn"), CASES)
def test_route_table_lists_each_pairs_route(platform, keys, nodes, gpn):
    spec, _ = load_platform(platform, keys)
    topo = Topology(spec, nodes, gpn)
    rng = np.random.default_rng(7)
    src = rng.integers(0, topo.world, 3000)
    dst = rng.integers(0, topo.world, 3000)
    src, dst = src[src != dst], dst[src != dst]
    table, shape = topo.route_table(src, dst)
    assert table.shape[0] == len(src)
    for row, a, b in zip(table, src.tolist(), dst.tolist(), strict=True):
        assert tuple(row[row >= 0].tolist()) == topo.route(a, b)
    # pairs of one shape cross the same kinds of link in the same order
    for s in np.unique(shape).tolist():
        rows = table[shape == s]
        kinds = {tuple(topo.links[i].kind for i in r[r >= 0].tolist()) for r in rows}
        assert len(kinds) == 1


def test_route_table_rejects_a_pair_of_one_gpu():
    topo = Topology(load_platform("dgx_a100")[0], 2)
    with pytest.raises(ValueError, match="distinct GPUs"):
        topo.route_table(np.array([3]), np.array([3]))


@pytest.mark.parametrize("lookup", [1 << 24, 0])  # 0: every range sorted
def test_key_members_numbers_keys_as_unique_does(lookup, monkeypatch):
    monkeypatch.setattr(route_parts, "_LOOKUP_KEYS", lookup)
    key = np.random.default_rng(3).integers(0, 50, 2000) * 7
    values, member, inverse = route_parts.key_members(key)
    want, want_inverse = np.unique(key, return_inverse=True)
    assert values.tolist() == want.tolist() and inverse.tolist() == want_inverse.reshape(-1).tolist()
    assert key[member].tolist() == values.tolist()
    sparse = np.concatenate((np.zeros(4001, dtype=np.int64), [5]))  # 5 only at 4001: a 16th-position sample misses it
    values, member, _ = route_parts.key_members(sparse)
    assert sparse[member].tolist() == values.tolist() == [0, 5]


@pytest.mark.parametrize(("platform", "keys", "nodes", "gpn"), CASES)
def test_route_parts_read_pair_by_pair_and_shape_by_shape(platform, keys, nodes, gpn):
    spec, _ = load_platform(platform, keys)
    topo = Topology(spec, nodes, gpn)
    rng = np.random.default_rng(11)
    src, dst = rng.integers(0, topo.world, 2000), rng.integers(0, topo.world, 2000)
    src, dst = src[src != dst], dst[src != dst]
    parts = topo.route_parts(src, dst)
    rows = parts.rows()
    np.testing.assert_array_equal(parts.lens(), (rows >= 0).sum(axis=1))
    for p in rng.integers(0, len(src), 100).tolist():
        assert parts.route(p) == topo.route(int(src[p]), int(dst[p]))
    # one route a shape stands for all of them: the same kinds, capacities and latencies in order
    shapes, first, of_shape = np.unique(parts.shape, return_index=True, return_inverse=True)
    kept, kept_of = parts.shapes()  # the kept numbering is unique's, and the same each time it is asked
    assert kept.tolist() == shapes.tolist() and kept_of.tolist() == of_shape.reshape(-1).tolist()
    assert parts.shapes()[1] is kept_of
    for shape, row, p in zip(shapes.tolist(), parts.shape_rows(shapes), first.tolist(), strict=True):
        def classes(route):
            return [(topo.links[i].kind, topo.links[i].capacity, topo.links[i].latency) for i in route]
        assert classes(row[row >= 0].tolist()) == classes(topo.route(int(src[p]), int(dst[p]))), shape
