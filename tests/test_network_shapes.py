"""Network shapes beyond the fat tree: a dragonfly (groups of switches, local and global links, the
taper between groups) and multi-rail nodes with several NICs per GPU. Routes (hop counts, which
links a flow crosses), contention on a shared global link, analytic bounds, a property over ranks,
and the one-line refusals of a bad network section."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu.collective_run import simulate_collective
from simgpu.config.loader import load_platform
from simgpu.errors import ConfigError
from simgpu.platform.topology import Topology

GB = 1 << 30
PERLMUTTER, _ = load_platform("perlmutter_gpu")


def small_dragonfly(**dragonfly: object):
    """Perlmutter's node on a toy dragonfly: 2 nodes a switch, 2 switches a group, one global link
    between two groups (unless ``dragonfly`` says otherwise)."""
    keys = {"nodes_per_switch": 2, "switches_per_group": 2, "global_links_per_group_pair": 1, "routing": "minimal",
            **dragonfly}
    p, _ = load_platform("perlmutter_gpu", [(f"network.dragonfly.{k}", v) for k, v in keys.items()])
    return p


def kinds(topo: Topology, src: int, dst: int) -> Counter[str]:
    return Counter(topo.links[i].kind for i in topo.route(src, dst))


def test_dragonfly_routes_are_minimal():
    """Same switch: no switch-to-switch hop; same group: one local hop; other group: one global link
    and at most one local hop on either side (a three-hop dragonfly)."""
    p = small_dragonfly()
    topo = Topology(p, 8, 1)  # nodes 0-1 on sw0.0, 2-3 on sw0.1, 4-5 on sw1.0, 6-7 on sw1.1
    assert kinds(topo, 0, 1)["local"] == 0 and kinds(topo, 0, 1)["global"] == 0
    assert kinds(topo, 0, 2)["local"] == 1 and kinds(topo, 0, 2)["global"] == 0
    # group 0's global link to group 1 sits on sw0.1, its far end on sw1.0
    names = [topo.links[i].name for i in topo.route(0, 6) if topo.links[i].kind in ("local", "global")]
    assert names == ["sw0.0->sw0.1", "sw0.1->sw1.0/g0", "sw1.0->sw1.1"]
    assert [topo.links[i].name for i in topo.route(2, 4) if topo.links[i].kind == "global"] == ["sw0.1->sw1.0/g0"]
    assert kinds(topo, 2, 4)["local"] == 0  # both ends sit on the global link's switches
    for a in range(8):
        for b in range(8):
            if topo.node_of(a) != topo.node_of(b):
                k = kinds(topo, a, b)
                assert k["global"] == (topo.switch_at(a)[0] != topo.switch_at(b)[0])
                assert k["local"] + k["global"] <= 3 and k["nic"] == 2 and k["spine"] == 0


def test_one_global_link_is_shared_by_the_flows_between_two_groups():
    p = small_dragonfly()
    topo = Topology(p, 8, 1)
    globals_used = {i for a in range(4) for b in range(4, 8) for i in topo.route(a, b)
                    if topo.links[i].kind == "global"}
    assert len(globals_used) == 1
    # with four global links between the groups, the flows spread over them by their end nodes
    wide = Topology(small_dragonfly(global_links_per_group_pair=4), 8, 1)
    spread = Counter(i for a in range(4) for b in range(4, 8) for i in wide.route(a, b)
                     if wide.links[i].kind == "global")
    assert len(spread) == 4 and set(spread.values()) == {4}


def test_dragonfly_links_carry_the_datasheet_rates():
    net = PERLMUTTER.network
    link = 200 / 8 * 1e9 * net.efficiency
    minimal, _ = load_platform("perlmutter_gpu", [("network.dragonfly.routing", "minimal")])
    topo = Topology(minimal, 256)  # two groups of 128 nodes
    by_kind = Counter(lk.kind for lk in topo.links if lk.kind in ("local", "global"))
    assert by_kind["local"] == 2 * 32 * 31 and by_kind["global"] == 2 * 15
    rate = {lk.kind: lk.capacity for lk in topo.links}
    assert rate["global"] == pytest.approx(link) and rate["local"] == pytest.approx(link)
    assert rate["nic"] == pytest.approx(topo.nic_bw)
    # adaptive routing: a switch's 31 local links and a group pair's 15 global links each one pool
    pooled = Topology(PERLMUTTER, 256)
    rate = {lk.name: lk.capacity for lk in pooled.links}
    assert rate["g0->g1"] == pytest.approx(15 * link) and rate["sw1.7->local"] == pytest.approx(31 * link)
    assert pooled.core_may_limit and not Topology(PERLMUTTER, 4).core_may_limit


def test_adaptive_routes_cross_the_pools():
    p = small_dragonfly(routing="adaptive", global_links_per_group_pair=4)
    topo = Topology(p, 8, 1)
    names = [topo.links[i].name for i in topo.route(0, 6) if topo.links[i].kind in ("local", "global")]
    assert names == ["sw0.0->local", "g0->g1", "local->sw1.1"]
    assert [topo.links[i].name for i in topo.route(0, 2) if topo.links[i].kind == "local"] == [
        "sw0.0->local", "local->sw0.1"]
    assert not {topo.links[i].kind for i in topo.route(0, 1)} & {"local", "global"}
    shared = {i for a in range(4) for b in range(4, 8) for i in topo.route(a, b) if topo.links[i].kind == "global"}
    assert [topo.links[i].name for i in shared] == ["g0->g1"]


def test_all_reduce_across_groups_is_bounded_by_the_global_links_taper():
    """One GPU a node, one node a switch, two switches a group: a ring over four nodes crosses the
    single global link once each way, so with a 4:1 taper (a global link a quarter of a NIC) the
    all-reduce takes its bytes over the global link's rate, about four times the untapered time."""
    size = GB

    def t(global_gbps: float) -> float:
        p = small_dragonfly(nodes_per_switch=1, global_link_gbps=global_gbps)
        return simulate_collective(p, "all_reduce", size, nodes=4, gpus_per_node=1, algorithm="ring")

    net = PERLMUTTER.network
    global_bw = 50 / 8 * 1e9 * net.efficiency
    bound = 2 * 3 / 4 * size / global_bw
    tapered, flat = t(50), t(200)
    assert bound <= tapered <= 1.05 * bound
    assert 3.5 < tapered / flat <= 4.05


def test_dragonfly_in_one_switch_matches_the_fat_tree():
    """Nodes on one switch cross no local or global link: the same time as on a non-blocking fat tree."""
    fat, _ = load_platform("perlmutter_gpu", [("network.topology", "fat_tree"), ("network.dragonfly", None)])
    for op in ("all_reduce", "all_to_all"):
        assert simulate_collective(PERLMUTTER, op, 256 << 20, nodes=4) == pytest.approx(
            simulate_collective(fat, op, 256 << 20, nodes=4), rel=1e-9)


def multi_rail(nics_per_gpu: int, stripe: bool = False, *extra: tuple[str, object]):
    """DGX H100 with ``nics_per_gpu`` 200 Gb/s NICs a GPU (two of them stay within the GPU's PCIe link)."""
    p, _ = load_platform("dgx_h100", [("network.nics_per_node", 8 * nics_per_gpu), ("network.nic_gbps", 200),
                                      ("network.nics_per_gpu", nics_per_gpu),
                                      ("network.stripe_messages", stripe), *extra])
    return p


def test_multi_rail_ports_and_leaves():
    """Two NICs a GPU: each GPU's port carries both NICs' rate, one port per GPU on its rails' leaf."""
    one, two = Topology(multi_rail(1), 2), Topology(multi_rail(2), 2)
    assert two.ports == 8 and two.rails == 2 and two.nic_bw == one.nic_bw
    nic = [lk.capacity for lk in two.links if lk.kind == "nic"]
    assert len(nic) == 2 * 2 * 8 and nic == pytest.approx([2 * one.nic_bw] * len(nic))
    assert [lk.name for lk in one.links] == [lk.name for lk in two.links]


def test_multi_rail_doubles_a_nic_bound_collective():
    """All-gather and all-reduce over four nodes of one GPU are held by the GPU's NIC (NVLink plays
    no part): two NICs a GPU move them in half the time."""
    size = 4 * GB
    for op in ("all_gather", "all_reduce"):
        single = simulate_collective(multi_rail(1), op, size, nodes=4, gpus_per_node=1, algorithm="ring")
        double = simulate_collective(multi_rail(2), op, size, nodes=4, gpus_per_node=1, algorithm="ring")
        assert single / double == pytest.approx(2.0, rel=0.03)


def test_one_send_recv_pair_reaches_as_many_nics_as_it_has_channels():
    """A send/recv pair's connection reaches its share of one NIC per channel. NCCL gives a network
    peer at least one channel per NIC of its GPU, so on ten nodes a second NIC a GPU doubles the
    pair's rate; held to one channel (NCCL_NCHANNELS_PER_NET_PEER=1) the second NIC adds nothing
    unless the network layer stripes messages over both."""
    size = GB
    fast = ("collectives.net_channel_gbytes_per_s", 100.0)  # no channel bound below the NICs'
    one = ("collectives.net_peer_channels", 1)

    def rate(platform, nodes: int) -> float:
        return size / simulate_collective(platform, "send_recv", size, nodes=nodes, gpus_per_node=1) / 1e9

    share = multi_rail(1).collectives.net_peer_share * Topology(multi_rail(1), 2).nic_bw / 1e9
    assert rate(multi_rail(1, False, fast), 10) == pytest.approx(share, rel=0.01)
    assert rate(multi_rail(2, False, fast), 10) == pytest.approx(2 * share, rel=0.01)
    assert rate(multi_rail(2, False, fast), 2) == pytest.approx(2 * share, rel=0.01)
    assert rate(multi_rail(2, False, fast, one), 10) == pytest.approx(share, rel=0.01)
    assert rate(multi_rail(2, True, fast, one), 10) == pytest.approx(2 * share, rel=0.01)


@settings(max_examples=16, deadline=None)
@given(op=st.sampled_from(["all_gather", "all_to_all", "all_reduce"]), gpn=st.sampled_from([1, 2, 4]),
       nodes=st.integers(1, 9), more=st.integers(1, 6), log_per_rank=st.integers(12, 26),
       routing=st.sampled_from(["minimal", "adaptive"]))
def test_dragonfly_time_never_falls_as_ranks_are_added(op, gpn, nodes, more, log_per_rank, routing):
    """On a dragonfly of two-node switches and two-switch groups, with a 2:1 taper of the global
    link, adding nodes (into more switches and groups) at a fixed message per rank never makes a
    collective faster."""
    p = small_dragonfly(global_link_gbps=100, routing=routing)
    per_rank = 1 << log_per_rank

    def time(n: int) -> float:
        if n * gpn < 2:
            return 0.0
        size = per_rank * n * gpn if op == "all_gather" else per_rank
        return simulate_collective(p, op, size, nodes=n, gpus_per_node=gpn)

    assert time(nodes + more) >= time(nodes) * (1 - 1e-9)


@pytest.mark.parametrize("changes, key, words", [
    ([("network.dragonfly", None)], "network", "expected a dragonfly section"),
    ([("network.topology", "fat_tree")], "network", "expected topology dragonfly"),
    ([("network.topology", "torus")], "network.topology", "expected rail_optimized, fat_tree or dragonfly"),
    ([("network.dragonfly.global_links_per_group_pair", 0)], "network.dragonfly.global_links_per_group_pair",
     "greater than 0"),
    ([("network.dragonfly.groups", 4)], "network.dragonfly.groups", "unknown key"),
    ([("network.nics_per_gpu", 2)], "network.nics_per_node", "expected node.gpus x nics_per_gpu = 8"),
], ids=["no-section", "section-without-dragonfly", "unknown-topology", "no-global-links", "unknown-key",
        "rails-mismatch"])
def test_bad_network_shapes_are_refused_naming_the_key(changes, key, words):
    with pytest.raises(ConfigError) as err:
        load_platform("perlmutter_gpu", changes)
    message = str(err.value)
    assert key in message and words in message and "\n" not in message


def test_trees_take_nccls_double_binary_tree_shape():
    """NCCL's tree over 14 nodes (src/graph/trees.cc's illustration): subtrees on consecutive nodes,
    root 0 above 8; the second tree mirrors the first on an even count and shifts it by one on an
    odd count, so no node is inner in both."""
    from simgpu.comm.algorithms.trees import _binary_tree

    parent = dict(_binary_tree(list(range(14))))
    assert parent == {1: 2, 3: 2, 5: 6, 7: 6, 9: 10, 11: 10, 13: 12, 2: 4, 6: 4, 10: 12, 4: 8, 12: 8, 8: 0}
    second = dict(_binary_tree(list(range(12)), second=True))
    assert second[11 - 8] == 11 and second[0] == 1  # mirrored: 3 below the root 11, 0 a leaf under 1
    for n in (5, 12, 13):
        for tree in (_binary_tree(list(range(n))), _binary_tree(list(range(n)), second=True)):
            assert len(tree) == n - 1 and len({c for c, _ in tree}) == n - 1
        inner = [{p for _, p in _binary_tree(list(range(n)), second=s)} for s in (False, True)]
        assert len(inner[0] & inner[1]) <= 1
