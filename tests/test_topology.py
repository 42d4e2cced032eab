"""Topology: links built from the platform and routes between GPUs."""

from __future__ import annotations

import pytest

from simgpu.platform.topology import Topology


def names(topo: Topology, route: tuple[int, ...]) -> list[str]:
    return [topo.links[i].name for i in route]


def test_same_node_nvswitch_route(dgx_a100):
    t = Topology(dgx_a100, 2)
    assert names(t, t.route(1, 5)) == ["n0.gpu1->n0.nvsw", "n0.nvsw->n0.gpu5"]
    assert t.route(3, 3) == ()


def test_cross_node_route_goes_pcie_nic_network_nic_pcie(dgx_a100):
    t = Topology(dgx_a100, 2)
    r = names(t, t.route(2, 10))  # GPU 2 of node 0 to GPU 2 of node 1: same rail
    assert r == ["n0.gpu2->n0.pcisw1", "n0.pcisw1->n0.nic2", "n0.nic2->leaf2.0",
                 "leaf2.0->n1.nic2", "n1.nic2->n1.pcisw1", "n1.pcisw1->n1.gpu2"]
    kinds = [t.links[i].kind for i in t.route(2, 10)]
    assert kinds == ["pcie", "pcie", "nic", "nic", "pcie", "pcie"]


def test_cross_rail_uses_nvlink_then_the_destination_rail(dgx_a100):
    t = Topology(dgx_a100, 2)
    r = names(t, t.route(0, 13))  # rail 0 to rail 5: PXN over NVLink to GPU 5, then rail 5
    assert r[:2] == ["n0.gpu0->n0.nvsw", "n0.nvsw->n0.gpu5"]
    assert "n0.nic5->leaf5.0" in r and not any("spine" in x for x in r)


def test_pcie_only_node_routes_through_switches_and_cpu(pcie_4gpu):
    t = Topology(pcie_4gpu, 1)
    assert names(t, t.route(0, 1)) == ["n0.gpu0->n0.pcisw0", "n0.pcisw0->n0.gpu1"]
    assert names(t, t.route(1, 2)) == ["n0.gpu1->n0.pcisw0", "n0.pcisw0->n0.cpu", "n0.cpu->n0.pcisw1",
                                       "n0.pcisw1->n0.gpu2"]


def test_single_nic_node_shares_its_nic(pcie_4gpu):
    t = Topology(pcie_4gpu, 2)
    nics = {t.nic_of(g) for g in range(4)}
    assert nics == {0}
    r = names(t, t.route(3, 7))
    assert "n0.nic0->leaf0" in r and "leaf0->n1.nic0" in r


def test_spine_crossed_between_pods_and_oversubscription(dgx_h100):
    spec = dgx_h100.model_copy(update={"network": dgx_h100.network.model_copy(
        update={"nodes_per_leaf": 2, "oversubscription": 2.0})})
    t = Topology(spec, 4)
    r = names(t, t.route(0, 16))  # node 0 to node 2: different pods
    assert "leaf0.0->spine" in r and "spine->leaf0.1" in r
    up = t.links[t.link_id("leaf0.0->spine")]
    assert up.capacity == pytest.approx(2 * t.nic_bw / 2.0)
    assert not any("spine" in x for x in names(t, t.route(0, 8)))  # same pod


@pytest.mark.parametrize("topology", ["rail_optimized", "fat_tree"])
def test_leaf_uplinks_are_implied_by_their_ports_unless_oversubscribed(dgx_h100, topology):
    def spec(over: float):
        return dgx_h100.model_copy(update={"network": dgx_h100.network.model_copy(
            update={"nodes_per_leaf": 2, "oversubscription": over, "topology": topology})})
    t = Topology(spec(1.0), 5)  # the last leaf half full: its uplink is more than its ports
    implied = t.implied_links()
    assert sorted(implied) == sorted(t.spine_links())
    for lid, cover in implied.items():
        name = t.links[lid].name
        leaf = name.split("->")[0] if name.endswith("->spine") else name.split("->")[1]
        want = {i for i, lk in enumerate(t.links) if lk.kind == "nic" and
                (lk.name.endswith(f"->{leaf}") if name.endswith("->spine") else lk.name.startswith(f"{leaf}->"))}
        assert cover == want and want
        assert t.capacity[lid] >= sum(t.capacity[c] for c in cover) * (1 - 1e-12)
        # every route up (down) the link leaves (enters) through one of its cover
        for a in range(0, t.world, 3):
            for b in range(1, t.world, 5):
                route = t.route(a, b)
                if lid in route:
                    assert len(cover & set(route)) == 1
    assert Topology(spec(2.0), 4).implied_links() == {}
    # at 2:1 a leaf with half its nodes has as much uplink as ports
    over = Topology(spec(2.0), 5)
    last = {over.leaf_of(4, k) for k in range(over.ports)}
    assert set(over.implied_links()) == {over.link_id(x) for leaf in last
                                         for x in (f"{leaf}->spine", f"spine->{leaf}")}
    assert Topology(spec(1.0), 1).implied_links() == {}  # one node: no spine


def test_capacities_come_from_datasheet_times_efficiency(dgx_h100):
    t = Topology(dgx_h100, 2)
    nv = t.links[t.link_id("n0.gpu0->n0.nvsw")]
    assert nv.capacity == pytest.approx(450e9 * 0.80)
    nic = t.links[t.link_id("n0.nic0->leaf0.0")]
    assert nic.capacity == pytest.approx(400 / 8 * 1e9 * 0.92)


def test_fewer_gpus_per_node(dgx_a100):
    t = Topology(dgx_a100, 2, gpus_per_node=4)
    assert t.world == 8 and t.node_of(5) == 1 and t.local_of(5) == 1
    with pytest.raises(ValueError):
        t.route(0, 8)
    with pytest.raises(ValueError):
        Topology(dgx_a100, 1, gpus_per_node=9)


def test_host_route(dgx_a100):
    t = Topology(dgx_a100, 1)
    assert names(t, t.host_route(3)) == ["n0.cpu->n0.pcisw1", "n0.pcisw1->n0.gpu3"]
