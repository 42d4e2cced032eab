"""NCCL's channel counts (simgpu/comm/channels.py) on hand-checked cases, their bounds, and their use."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu.comm.channels import MAXCHANNELS, communicator, compute_capability, for_size, hardware, search
from simgpu.config.loader import load_platform

H100, _ = load_platform("dgx_h100")
A100, _ = load_platform("dgx_a100")
PCIE, _ = load_platform("pcie_4gpu")
CLUSTER, _ = load_platform("h100_ndr_cluster")


def test_what_nccls_topology_sees():
    """NCCL's own bandwidths: 18 NVLinks of 20.6 GB/s on H100, 12 of 20 on A100, a PCIe link at
    lanes x rate / 80 (48 GB/s Gen5 x16, 24 Gen4), a NIC at its line rate."""
    h = hardware(H100, 8)
    assert (h.cc, h.nvlink, h.pcie, h.nics, h.nic_bw) == (90, pytest.approx(370.8), 48.0, 8, 50.0)
    a = hardware(A100, 8)
    assert (a.cc, a.nvlink, a.pcie, a.nic_bw) == (80, pytest.approx(240.0), 24.0, 25.0)
    assert hardware(H100, 1).nics == 1          # one GPU of a node reaches its own NIC
    assert compute_capability(PCIE) == 80 and hardware(PCIE, 4).nvlink == 0.0


def test_h100_nvswitch_node_with_eight_nics():
    """Across nodes the search starts at 48 GB/s (the GPU's Gen5 path to its NIC); each NIC carries
    one channel, eight in all, and 8 x 48 >= the NVLink sum 370.8 ends the search. Hopper keeps a
    graph under 50 GB/s with more than four channels as it is; the communicator doubles it to 16 (the
    extra Hopper doubling needs fewer than 16). Inside one node: 60 GB/s fits six channels (360), no
    lower speed does better, so the graph is duplicated to 12 x 30 and the communicator has 24."""
    two = communicator(H100, 16, 2)
    assert (two.search.channels, two.search.bw_inter, two.rings, two.collective) == (8, 48.0, 8, 16)
    assert (two.nvls, two.collnet_direct, two.p2p) == (16, 8, 16)
    one = communicator(H100, 8, 1)
    assert (one.search.channels, one.search.bw_intra, one.rings, one.collective) == (12, 30.0, 6, 24)


def test_a100_node():
    """A100 inside a node: 40 GB/s fits six channels, 6 x 40 = the NVLink sum 240 (a perfect
    graph), duplicated to 12 x 20; communicator 24. Across nodes the Gen4 link (24 GB/s) bounds a
    channel below the 200 Gb/s NIC: eight at 24, not duplicated (under 25 GB/s); communicator 16."""
    one = communicator(A100, 8, 1)
    assert (one.search.channels, one.search.bw_intra, one.collective) == (12, 20.0, 24)
    two = communicator(A100, 16, 2)
    assert (two.search.channels, two.search.bw_inter, two.collective) == (8, 24.0, 16)


def test_pcie_only_node():
    """Four GPUs on PCIe Gen4 (24 GB/s): 20 GB/s fits one channel, 12 fits two (24, the link's
    whole rate: done); under 25 GB/s nothing is duplicated; communicator 4."""
    g = search(hardware(PCIE, 4), 1)
    assert (g.channels, g.bw_intra) == (2, 12.0)
    assert communicator(PCIE, 4, 1).collective == 4


def test_one_gpu_per_node():
    """One H100 a node: its one NIC path carries one channel at 48 GB/s, short of the NVLink sum, and
    no lower speed carries more; duplicated to two at 24 (one channel is not 'more than four');
    communicator 4, p2p 4. NCCL 2.29 gives a network peer 4 channels on two nodes (50 GB/s at 14 a
    channel), 2 on ten (4 x ceil(10 / 8) > 4 p2p channels)."""
    two = communicator(CLUSTER, 2, 2)
    assert (two.search.channels, two.search.bw_inter, two.rings, two.collective, two.p2p) == (2, 24.0, 1, 4, 4)
    assert two.net_peer == 4
    assert communicator(CLUSTER, 10, 10).net_peer == 2


def test_platform_keys_override_as_nccls_variables():
    """collectives.max_channels caps the communicator (NCCL_MAX_NCHANNELS), min_channels raises it
    (NCCL_MIN_NCHANNELS), net_peer_channels sets a network peer's (NCCL_NCHANNELS_PER_NET_PEER)."""
    capped, _ = load_platform("dgx_h100", [("collectives.max_channels", 4)])
    raised, _ = load_platform("dgx_h100", [("collectives.min_channels", 32)])
    pinned, _ = load_platform("dgx_h100", [("collectives.net_peer_channels", 8)])
    assert communicator(capped, 16, 2).collective == 4
    assert communicator(raised, 16, 2).collective == 32
    assert communicator(pinned, 16, 2).net_peer == 8


def test_channels_by_size():
    """A collective runs on fewer channels while a thread would have under its threshold of bytes
    (64 with Simple, 512 threads): 64 KiB takes two of DGX H100's 16, 1 MiB all of them; NVLS always
    its own 16."""
    comm = communicator(H100, 16, 2)
    assert for_size(comm, "ring", "simple", 64 << 10, 16, 2) == 2
    assert for_size(comm, "ring", "simple", 1 << 20, 16, 2) == 16
    assert for_size(comm, "tree", "simple", 1 << 10, 16, 2) == 1
    assert for_size(comm, "nvls_tree", "simple", 1 << 10, 16, 2) == 16
    sizes = [1 << k for k in range(10, 31)]
    counts = [for_size(comm, "ring", "ll128", s, 16, 2) for s in sizes]
    assert counts == sorted(counts) and counts[-1] == comm.collective


def test_the_tuner_uses_the_searched_graph():
    """NCCL's model's bus bandwidth is the graph's channels x their bandwidth: a 2-node ring on DGX
    H100 gets 8 x 48 GB/s, its algorithm bandwidth 384 x 16/30; its choice names the channels."""
    from simgpu.comm.tuning import estimates
    from simgpu.platform.topology import Topology

    topo = Topology(H100, 2)
    est = {(c.algorithm, c.protocol): c for c in estimates(H100, topo, "all_reduce", 1 << 30, 16, 2, ["simple"])}
    assert est["ring", "simple"].bandwidth_gbps == pytest.approx(8 * 48 * 16 / 30)
    assert est["ring", "simple"].channels == 16


NAMES = ["dgx_h100", "dgx_a100", "dgx_b200", "dgx1_v100", "pcie_4gpu", "aws_p5", "aws_p4de", "perlmutter_gpu",
         "rtx2080ti_2gpu", "h100_ndr_cluster00"]
PLATFORMS = {n: load_platform(n)[0] for n in NAMES}


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(NAMES), gpn_log=st.integers(0, 3), nodes=st.integers(1, 64),
       cap=st.one_of(st.none(), st.integers(1, MAXCHANNELS)))
def test_channels_never_exceed_the_maximum(name, gpn_log, nodes, cap):
    """Whatever the platform and shape, the searched graph stays within the search's 16 channels,
    the communicator within MAXCHANNELS (or the platform's max_channels), NVLS within 16, every count
    at least one where it applies, and a collective by size never above its communicator's."""
    plat = PLATFORMS[name]
    gpn = min(1 << gpn_log, plat.node.gpus)
    if cap is not None:
        plat = plat.model_copy(update={"collectives": plat.collectives.model_copy(update={"max_channels": cap})})
    comm = communicator(plat, gpn * nodes, nodes)
    assert 1 <= comm.rings <= comm.search.channels <= MAXCHANNELS // 2
    assert 1 <= comm.collective <= (cap or MAXCHANNELS)
    assert comm.collective <= comm.p2p <= MAXCHANNELS and comm.nvls <= 16
    assert 1 <= comm.collnet_chain <= MAXCHANNELS and 1 <= comm.collnet_direct <= 8
    if nodes > 1:
        assert 1 <= comm.net_peer <= comm.p2p
    for size in (1 << 10, 1 << 20, 1 << 30):
        assert 1 <= for_size(comm, "ring", "simple", size, gpn * nodes, nodes) <= comm.collective
