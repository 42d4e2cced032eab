"""Collectives at cluster scale: cross-node point-to-point on NCCL's channels per network peer,
all-to-all costs that grow with the peers, and times that never fall as ranks are added."""

from __future__ import annotations

import pytest
from conftest import run_programs
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu.collective_run import simulate_collective
from simgpu.comm.algorithms.p2p import net_peer_channels
from simgpu.config.loader import load_platform
from simgpu.graph import CollectiveCall, Op, Program
from simgpu.platform.topology import Topology

CLUSTER, _ = load_platform("h100_ndr_cluster")


def test_net_peer_channels_follow_nccls_rule():
    """NCCL 2.29 gives a network peer the channels its 400 Gb/s NIC needs at 14 GB/s each (four),
    halved while the peers, eight to a round, need more than the p2p channels: four on two nodes of
    one GPU, two on ten. Up to 2.28 a peer has two, halved while the peers' channels exceed four
    times the p2p channels: two on two nodes, one on ten (src/graph/paths.cc)."""
    assert net_peer_channels(2, Topology(CLUSTER, 2, 1)) == 4
    assert net_peer_channels(10, Topology(CLUSTER, 10, 1)) == 2
    assert net_peer_channels(40, Topology(CLUSTER, 10, 4)) == 2
    old, _ = load_platform("h100_ndr_cluster", [("collectives.nccl_version", "2.28.7")])
    assert net_peer_channels(2, Topology(old, 2, 1)) == 2
    assert net_peer_channels(10, Topology(old, 10, 1)) == 1
    assert net_peer_channels(16, Topology(old, 2, 8)) == 2
    pinned, _ = load_platform("h100_ndr_cluster", [("collectives.net_peer_channels", 1)])
    assert net_peer_channels(2, Topology(pinned, 2, 1)) == 1   # NCCL_NCHANNELS_PER_NET_PEER


def test_cross_node_send_recv_is_held_by_its_channels_and_its_nic_share():
    """Two channels (ten nodes) move twice the network channel's bound; four (two nodes) reach the
    share of a NIC one pair's connection gets, below the NIC's own rate."""
    size = 1 << 30
    spec, net = CLUSTER.collectives, CLUSTER.network
    nic = net.nic_gbps / 8 * net.efficiency
    ten = size / simulate_collective(CLUSTER, "send_recv", size, nodes=10, gpus_per_node=1) / 1e9
    two = size / simulate_collective(CLUSTER, "send_recv", size, nodes=2, gpus_per_node=1) / 1e9
    assert ten == pytest.approx(2 * spec.net_channel_gbytes_per_s, rel=0.01)
    assert two == pytest.approx(spec.net_peer_share * nic, rel=0.01)
    faster, _ = load_platform("h100_ndr_cluster", [("collectives.net_channel_gbytes_per_s", 100.0)])
    assert size / simulate_collective(faster, "send_recv", size, nodes=10, gpus_per_node=1) / 1e9 > 1.5 * ten


def test_small_all_to_all_grows_with_the_peers():
    """A grouped point-to-point operation serves its peers one after another: a small all-to-all's
    time grows by the per-peer cost for every peer across the network."""
    per_peer = CLUSTER.collectives.p2p_net_peer_us * 1e-6
    t = {n: simulate_collective(CLUSTER, "all_to_all", 64 * n, nodes=n, gpus_per_node=1) for n in (4, 16, 64)}
    assert t[16] - t[4] == pytest.approx(12 * per_peer, rel=0.05)
    assert t[64] - t[16] == pytest.approx(48 * per_peer, rel=0.05)


@settings(max_examples=12, deadline=None)
@given(op=st.sampled_from(["all_gather", "all_to_all"]), gpn=st.sampled_from([1, 2, 4]),
       nodes=st.integers(1, 6), more=st.integers(1, 4), log_per_rank=st.integers(10, 26))
def test_time_never_falls_as_ranks_are_added(op, gpn, nodes, more, log_per_rank):
    """At a fixed message per rank (all-gather: each rank's contribution; all-to-all: each rank's
    buffer), adding nodes never makes the collective faster."""
    per_rank = 1 << log_per_rank

    def time(n: int) -> float:
        if n * gpn < 2:
            return 0.0
        size = per_rank * n * gpn if op == "all_gather" else per_rank
        return simulate_collective(CLUSTER, op, size, nodes=n, gpus_per_node=gpn)

    assert time(nodes + more) >= time(nodes) * (1 - 1e-9)


def test_tuner_follows_nccls_model_by_node_count():
    """Across nodes the planner runs the algorithm NCCL's tuning model picks for the node count, so
    its choice changes only where that model's does. On the graph NCCL's search finds for DGX H100
    (eight channels at 48 GB/s) the model runs a 1 GiB all-reduce as the NVLS tree on two nodes
    (where it counts the node's bandwidth), the ring on 4-16 and the NVLS tree again from 32, where
    the ring's latency, growing with the nodes, outweighs its bandwidth."""
    from simgpu.comm.collective import request
    from simgpu.comm.planner import ALGORITHM_OF, Planner
    from simgpu.comm.tuning import choose

    plat, _ = load_platform("dgx_h100")
    picks = {}
    for nodes in (2, 4, 8, 16, 32):
        topo = Topology(plat, nodes, 2)
        for size in (1 << 16, 1 << 24, 1 << 30):
            req = request("all_reduce", size, topo)
            want = choose(plat, topo, "all_reduce", size, topo.world, nodes, plat.collectives.usable_protocols())
            assert want is not None
            assert Planner(topo, plat.collectives).plan(req).algorithm == ALGORITHM_OF[want.algorithm]
        full = Topology(plat, nodes, 8)
        pick = choose(plat, full, "all_reduce", 1 << 30, full.world, nodes, plat.collectives.usable_protocols())
        assert pick is not None
        picks[nodes] = pick.algorithm
    assert picks == {2: "nvls_tree", 4: "ring", 8: "ring", 16: "ring", 32: "nvls_tree"}


def test_nccl_version_chooses_the_rule_set():
    """Releases before NVLS (2.17) follow the older tables, which have no NVLS tree."""
    from simgpu.comm.tuning import estimates, rule_set

    assert rule_set("2.8.4") == "2.8" and rule_set("2.16") == "2.8" and rule_set("2.21.5") == "2.20"
    old, _ = load_platform("dgx_h100", [("collectives.nccl_version", "2.12")])
    topo = Topology(old, 4, 8)
    algos = {c.algorithm for c in estimates(old, topo, "all_reduce", 1 << 26, 32, 4, ["ll", "ll128", "simple"])}
    assert algos == {"ring", "tree"}
    new = {c.algorithm for c in estimates(CLUSTER, topo, "all_reduce", 1 << 26, 32, 4, ["simple"])}
    assert "nvls_tree" in new


def test_gpus_per_node_over_the_full_range():
    """Every GPUs-per-node count of a node works across nodes, each GPU on its own NIC."""
    for gpn in range(1, 9):
        t = simulate_collective(CLUSTER, "all_gather", 1 << 26, nodes=2, gpus_per_node=gpn)
        assert 0 < t < 1.0


def test_pipeline_sends_share_the_nic_with_data_parallel_traffic():
    """Micro-batch sends between two pipeline stages on different nodes run at one pair's NIC share
    alone; a data-parallel all-reduce on the same NIC takes its fair share of the link, so the
    sends slow down, and together they never move more than the NIC does."""
    mb, n_mb = 256 << 20, 4

    def run(with_dp: bool) -> tuple[float, float]:
        progs = [Program(r) for r in range(2)]
        for k in range(n_mb):
            call = CollectiveCall(f"pp{k}", "send_recv", (0, 1), mb, comm_size=2)
            for r in (0, 1):
                progs[r].add(Op(f"pp{k}", "collective", "send_recv", stream="pp", coll=call, nbytes=mb))
        if with_dp:
            call = CollectiveCall("dp", "all_reduce", (0, 1), 1 << 30)
            for r in (0, 1):
                progs[r].add(Op("dp", "collective", "all_reduce", stream="comm", coll=call, nbytes=1 << 30))
        res = run_programs(CLUSTER, 2, progs, [], gpus_per_node=1)
        pp = res.records[res.records["stream"] == "pp"]
        return float(pp["end_s"].max()), res.iteration_time_s

    nic = CLUSTER.network.nic_gbps / 8 * CLUSTER.network.efficiency * 1e9
    alone, _ = run(False)
    assert alone == pytest.approx(n_mb * mb / (CLUSTER.collectives.net_peer_share * nic), rel=0.02)
    shared, total = run(True)
    assert shared > 1.15 * alone
    assert total >= (n_mb * mb + (1 << 30)) / nic  # an all-reduce of two ranks sends the message once


def test_pat_is_weighed_at_one_gpu_per_node_from_nccl_2_23():
    """NCCL weighs PAT for all-gather and reduce-scatter from 2.23, with Simple only and one GPU per
    node (ncclPatEnable: nNodes == nRanks); its model picks it for mid sizes on 16 nodes, where its
    log2 n steps beat the ring's n - 1, and the ring for large messages (a quarter less bandwidth)."""
    from simgpu.comm.tuning import choose, estimates, rule_set

    assert rule_set("2.23.4") == "2.23" and rule_set("2.22.3") == "2.20"
    protos = ["ll", "ll128", "simple"]
    one = Topology(CLUSTER, 16, 1)
    for op in ("all_gather", "reduce_scatter"):
        algos = {(c.algorithm, c.protocol) for c in estimates(CLUSTER, one, op, 1 << 22, 16, 16, protos)}
        assert ("pat", "simple") in algos and ("pat", "ll") not in algos
    two = Topology(CLUSTER, 8, 2)
    assert "pat" not in {c.algorithm for c in estimates(CLUSTER, two, "all_gather", 1 << 22, 16, 8, protos)}
    older, _ = load_platform("h100_ndr_cluster", [("collectives.nccl_version", "2.22")])
    assert "pat" not in {c.algorithm for c in estimates(older, one, "all_gather", 1 << 22, 16, 16, protos)}
    assert choose(CLUSTER, one, "all_gather", 1 << 22, 16, 16, protos).algorithm == "pat"
    assert choose(CLUSTER, one, "all_gather", 1 << 30, 16, 16, protos).algorithm == "ring"


def test_pat_runs_in_log_steps_at_a_rings_bandwidth():
    """The planner runs PAT where NCCL's model picks it; it is faster than the ring where latency
    counts, moves a large message at the NIC's rate as the ring does, and cannot run at two GPUs
    per node or with LL."""
    from simgpu.comm.collective import request
    from simgpu.comm.planner import Planner

    topo = Topology(CLUSTER, 16, 1)
    assert Planner(topo, CLUSTER.collectives).plan(request("all_gather", 1 << 22, topo)).algorithm == "pat"
    def t(op: str, size: int, algorithm: str) -> float:
        return simulate_collective(CLUSTER, op, size, nodes=16, gpus_per_node=1, algorithm=algorithm)

    for op in ("all_gather", "reduce_scatter"):
        assert t(op, 1 << 22, "pat") < 0.9 * t(op, 1 << 22, "ring")
        assert t(op, 1 << 30, "pat") == pytest.approx(t(op, 1 << 30, "ring"), rel=0.05)
    two = Topology(CLUSTER, 8, 2)
    plans = Planner(two, CLUSTER.collectives, algorithm="pat").candidates(request("all_gather", 1 << 22, two))
    assert all(p.algorithm != "pat" for p in plans)  # falls back: PAT needs one GPU per node
    ll = Planner(topo, CLUSTER.collectives, algorithm="pat", protocol="ll").plan(request("all_gather", 1 << 22, topo))
    assert ll.algorithm != "pat" or ll.latency_s == float("inf")


def test_collnet_is_weighed_where_the_switches_reduce():
    """With in-network reduction (SHARP) NCCL's model weighs CollNet for all-reduce across nodes
    (Direct on NVSwitch nodes, Chain anywhere, Simple only); without it, never. --explain shows it."""
    from simgpu.comm.tuning import choose, estimates

    protos = ["ll", "ll128", "simple"]
    sharp, _ = load_platform("dgx_h100", [("network.in_network_reduction", True)])
    plain, _ = load_platform("dgx_h100")
    topo = Topology(sharp, 8, 8)
    algos = {(c.algorithm, c.protocol) for c in estimates(sharp, topo, "all_reduce", 1 << 30, 64, 8, protos)}
    assert {("collnet_direct", "simple"), ("collnet_chain", "simple")} <= algos
    assert not any(a.startswith("collnet") and p != "simple" for a, p in algos)
    assert not any(c.algorithm.startswith("collnet")
                   for c in estimates(plain, Topology(plain, 8, 8), "all_reduce", 1 << 30, 64, 8, protos))
    gather = estimates(sharp, topo, "all_gather", 1 << 30, 64, 8, protos)
    assert gather and not any(c.algorithm.startswith("collnet") for c in gather)
    assert choose(sharp, topo, "all_reduce", 1 << 30, 64, 8, protos).algorithm == "collnet_direct"
    from simgpu.comm.__main__ import explain

    lines = explain(sharp, topo, "all_reduce", 1 << 30, "auto")
    assert "CollNet chain 16 / direct 8" in lines[1]
    assert "collnet_direct/simple" in lines[2] and "simulated   collnet/simple" in lines[4]


def test_collnet_moves_the_message_once_each_way_per_nic():
    """A ring carries 2(n-1)/n of the message over each node's NIC, in-network reduction once each
    way: on eight nodes of one GPU (NIC-bound) the ring takes 1.75x as long; without in-network
    reduction CollNet cannot run."""
    sharp, _ = load_platform("dgx_h100", [("network.in_network_reduction", True)])

    def t(platform, algorithm: str) -> float:
        return simulate_collective(platform, "all_reduce", 1 << 30, nodes=8, gpus_per_node=1, algorithm=algorithm)

    assert t(sharp, "ring") / t(sharp, "collnet") == pytest.approx(1.75, rel=0.03)
    plain, _ = load_platform("dgx_h100")
    assert t(plain, "collnet") == pytest.approx(t(plain, "ring"), rel=1e-9)  # falls back to the ring


def _sharp(name: str, *extra: tuple[str, object]):
    return load_platform(name, [("network.in_network_reduction", True), *extra])[0]


def test_collnet_aggregates_at_each_switch_level():
    """Above the leaves each leaf sends its reduced stream up once and takes the result down once:
    eight nodes of one GPU spread over four leaves (two levels) pay one more level's aggregation and
    the spine's latency (a round trip with Simple) over the same nodes under one leaf; a 4:1
    oversubscribed spine halves the tree's rate (two nodes a leaf: half a port up), while 2:1, which
    would slow a ring, costs the tree nothing (one stream a leaf)."""
    def t(size: int, *extra: tuple[str, object]) -> float:
        return simulate_collective(_sharp("dgx_h100", *extra), "all_reduce", size, nodes=8, gpus_per_node=1,
                                   algorithm="collnet")

    plat = _sharp("dgx_h100")
    one_level, two_levels = t(8 << 10), t(8 << 10, ("network.nodes_per_leaf", 2))
    step = plat.network.sharp.level_us + 2 * plat.network.spine_latency_us
    assert two_levels - one_level == pytest.approx(step * 1e-6, rel=0.02)
    big = t(1 << 30)
    spread = ("network.nodes_per_leaf", 2)
    assert t(1 << 30, spread, ("network.oversubscription", 2.0)) == pytest.approx(big, rel=0.01)
    assert t(1 << 30, spread, ("network.oversubscription", 4.0)) == pytest.approx(2 * big, rel=0.03)


def test_collnet_time_grows_with_the_levels_of_a_dragonfly():
    """On Perlmutter's dragonfly a small CollNet all-reduce takes longer from one switch (one level)
    to one group (two) to two groups (three); each group aggregates before its stream crosses the
    global links, once, so a 1 GiB all-reduce over two groups stays within 5% of one group's (a star
    of every switch onto one root would be held by the global links)."""
    plat = _sharp("perlmutter_gpu")

    def t(nodes: int, size: int) -> float:
        return simulate_collective(plat, "all_reduce", size, nodes=nodes, gpus_per_node=1, algorithm="collnet")

    small = [t(n, 8 << 10) for n in (2, 64, 256)]
    assert small == sorted(small) and small[0] < small[1] < small[2]
    assert t(256, 1 << 30) == pytest.approx(t(64, 1 << 30), rel=0.05)


def test_collnet_channels_share_a_switch_that_runs_one_tree():
    """Quantum (HDR) runs one streaming-aggregation tree at a time per switch: on a fat tree, where
    a node's eight NICs share one leaf, the eight channels share its rate and a NIC-bound 1 GiB
    all-reduce slows by about that much; one tree per port (Quantum-2) lets each run at its own."""
    def t(trees: str) -> float:
        plat = _sharp("dgx_h100", ("network.topology", "fat_tree"), ("network.sharp.trees", trees))
        return simulate_collective(plat, "all_reduce", 1 << 30, nodes=4, gpus_per_node=8, algorithm="collnet")

    assert t("per_switch") / t("per_port") > 3.5
