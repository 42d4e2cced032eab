"""Platform faults (docs/faults.md): degraded and failed links, NICs, NVLink ports and switches.

A NIC down on a multi-NIC node leaves NCCL's rings on the NICs that remain, so an all-reduce across
two nodes runs at about (k-1)/k of its bandwidth with one of k NICs down; a NIC at half its rate
slows it and never speeds it; degrading any link never makes a collective faster; a factor of 1
changes nothing though every faulted path of the code runs; a group with no path left is refused
with the entry's key.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simgpu.collective_run import simulate_collective
from simgpu.config.loader import load_job, load_platform
from simgpu.config.platform import PlatformSpec
from simgpu.errors import ConfigError
from simgpu.platform.topology import Topology
from simgpu.sim import model_notes

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def with_faults(p: PlatformSpec, faults: list[dict[str, Any]]) -> PlatformSpec:
    return PlatformSpec.model_validate({**p.model_dump(), "faults": faults})


def nic_down(node: int, index: int) -> dict[str, Any]:
    return {"nic": {"node": node, "index": index}, "down": True}


@pytest.fixture(scope="module")
def h100() -> PlatformSpec:
    return load_platform("dgx_h100")[0]


def names(topo: Topology, route: tuple[int, ...]) -> list[str]:
    return [topo.links[i].name for i in route]


@pytest.mark.parametrize("faults", [[nic_down(0, 1), nic_down(1, 1)], [nic_down(0, 1)]], ids=["both", "one"])
def test_a_dead_rail_leaves_k_minus_1_over_k_of_the_ring(h100, faults):
    """DGX H100, 8 NICs a node: a ring all-reduce of 8 GiB over 2 nodes with NIC 1 down (on both
    nodes, or on one: the channels keep off rail 1 everywhere) runs at about 7/8 of its bus bandwidth."""
    base = simulate_collective(h100, "all_reduce", 8 * GIB, nodes=2, algorithm="ring")
    hurt = simulate_collective(with_faults(h100, faults), "all_reduce", 8 * GIB, nodes=2, algorithm="ring")
    assert base / hurt == pytest.approx(7 / 8, rel=0.04)


def test_the_rings_replan_over_the_nics_left(h100):
    from simgpu.comm.algorithms.rings import ring_orders

    topo = Topology(with_faults(h100, [nic_down(0, 1)]), 2)
    orders = ring_orders(tuple(range(16)), topo, h100.collectives)
    assert len(orders) == 7  # NCCL's search finds one channel fewer on the node that lost a NIC
    heads = sorted(topo.nic_of(order[0]) for order in orders)
    assert heads == [0, 2, 3, 4, 5, 6, 7]
    assert topo.nic_of(1) == 0 and topo.nic_of(9) == 1  # node 0's GPU 1 sends through NIC 0 (its PCIe switch's)
    dead = topo.faults.dead
    for a in range(8):
        for b in range(8, 16):
            assert not dead.intersection(topo.route(a, b)) and not dead.intersection(topo.route(b, a))


def test_a_half_rate_nic_slows_an_all_reduce_and_never_speeds_it(h100):
    half = with_faults(h100, [{"nic": {"node": 1, "index": 5}, "factor": 0.5}])
    for algorithm in ("auto", "ring"):
        base = simulate_collective(h100, "all_reduce", GIB, nodes=2, algorithm=algorithm)
        slow = simulate_collective(half, "all_reduce", GIB, nodes=2, algorithm=algorithm)
        assert slow > 1.2 * base
    topo = Topology(half, 2)
    assert topo.capacity[topo.link_id("n1.nic5->leaf5.0")] == pytest.approx(0.5 * topo.port_bw)


def test_an_nvlink_port_down_falls_back_to_pcie(h100):
    topo = Topology(with_faults(h100, [{"nvlink": {"node": 0, "gpu": 3}, "down": True}]), 1)
    assert names(topo, topo.route(3, 5)) == ["n0.gpu3->n0.pcisw1", "n0.pcisw1->n0.cpu", "n0.cpu->n0.pcisw2",
                                             "n0.pcisw2->n0.gpu5"]
    assert topo.hardware(topo.route(0, 1)) == "nvlink"


def test_a_mesh_pair_down_goes_through_a_gpu_wired_to_both():
    p = load_platform("dgx1_v100")[0]
    topo = Topology(with_faults(p, [{"nvlink": {"node": 0, "gpus": [0, 1]}, "down": True}]), 1)
    route = names(topo, topo.route(0, 1))
    assert len(route) == 2 and all(topo.links[i].kind == "nvlink" for i in topo.route(0, 1)), route


def test_a_factor_of_one_changes_nothing(h100):
    """Every faulted path runs (routes pair by pair, no fold), and the times are the same."""
    same = with_faults(h100, [{"link": "n0.nic3->leaf3.0", "factor": 1.0}])
    assert Topology(same, 2).faults
    for op in ("all_reduce", "all_to_all", "all_gather"):
        assert simulate_collective(same, op, 64 << 20, nodes=2) == simulate_collective(h100, op, 64 << 20, nodes=2)


def test_no_faults_builds_the_same_links_and_routes(h100):
    a, b = Topology(h100, 2), Topology(with_faults(h100, []), 2)
    assert not b.faults and a.links == b.links
    assert all(a.route(s, d) == b.route(s, d) for s in range(16) for d in range(16))


def test_a_group_cut_off_is_refused_with_the_entry(h100):
    single = PlatformSpec.model_validate({**h100.model_dump(), "network": {**h100.network.model_dump(),
                                                                          "nics_per_node": 1}})
    with pytest.raises(ConfigError) as e:
        Topology(with_faults(single, [{"link": "n0.gpu0->n0.nvsw", "factor": 0.5}, nic_down(1, 0)]), 2)
    assert e.value.key == "faults.1" and "node 1 is cut off" in e.value.message
    with pytest.raises(ConfigError) as e:
        Topology(with_faults(h100, [nic_down(2, 0)]), 2)
    assert e.value.key == "faults.0" and "expected a node 0..1" in e.value.message


def test_the_example_platform_and_the_summary_note():
    p = load_platform("dgx_h100_nic_down")[0]
    assert p.faults and Topology(p, 2).faults.dead
    job = load_job(ROOT / "workloads" / "gpt_2x_dgx_h100.yaml")
    job = dataclasses.replace(job, platform=p)
    notes = [n for n in model_notes(job) if n.startswith("faults: ")]
    assert notes == ["faults: nic 1 of node 0 down; nic 1 of node 1 down (docs/faults.md)"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]),
       pick=st.integers(0, 10**6), factor=st.floats(0.05, 1.0), size=st.sampled_from([1 << 20, 64 << 20, 512 << 20]))
def test_degrading_any_link_never_speeds_a_collective(h100, op, pick, factor, size):
    topo = Topology(h100, 2)
    link = topo.links[pick % len(topo.links)].name
    base = simulate_collective(h100, op, size, nodes=2)
    hurt = simulate_collective(with_faults(h100, [{"link": link, "factor": factor}]), op, size, nodes=2)
    assert hurt >= base * (1 - 1e-9), (link, factor)
