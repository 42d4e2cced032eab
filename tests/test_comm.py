"""Collectives: algorithms, the tuner, protocols, groups, contention, the nccl-tests view, calibration."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from conftest import run_programs

from simgpu.collective_run import simulate_collective
from simgpu.comm.__main__ import main as comm_main
from simgpu.comm.__main__ import parse_sizes
from simgpu.comm.algorithms.rings import ring_orders
from simgpu.comm.calibrate import main as calibrate_main
from simgpu.comm.calibrate import parse_nccl_tests
from simgpu.comm.plan import CollectiveRequest
from simgpu.comm.planner import Planner
from simgpu.config.loader import load_platform
from simgpu.errors import ConfigError
from simgpu.graph import CollectiveCall, Op, Program
from simgpu.platform.topology import Topology

GB = 1 << 30


def plan_for(platform, nodes, op, nbytes, group=None, **kw):
    topo = Topology(platform, nodes)
    req = CollectiveRequest(op, tuple(group or range(topo.world)), nbytes)
    return Planner(topo, platform.collectives, **kw).plan(req)


def test_sizes_parse_like_nccl_tests():
    assert parse_sizes("8B:16GB")[:3] == [8, 16, 32] and parse_sizes("8B:16GB")[-1] == 16 * GB
    assert len(parse_sizes("8B:16GB")) == 32
    assert parse_sizes("1MB,64MB") == [1 << 20, 64 << 20]
    assert parse_sizes("4096") == [4096]
    with pytest.raises(ConfigError):
        parse_sizes("lots")


def test_nccl_tests_view_prints_columns_and_writes_csv(tmp_path, capsys):
    out = tmp_path / "ar.csv"
    assert comm_main(["--platform", "dgx_h100", "--nodes", "2", "--op", "all_reduce", "--sizes", "8B:1MB",
                      "--csv", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["size(B)", "time(us)", "algbw(GB/s)", "busbw(GB/s)"]
    assert len(lines) == 2 + 18
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["size(B)", "time(us)", "algbw(GB/s)", "busbw(GB/s)"] and len(rows) == 19


def test_nccl_tests_view_notes_host_staging(capsys):
    assert comm_main(["--platform", "rtx2080ti_2gpu", "--op", "all_gather", "--sizes", "1MB"]) == 0
    lines = capsys.readouterr().out.splitlines()
    notes = [line for line in lines if line.startswith("# note:")]
    assert len(notes) == 2 and "host memory" in notes[0] and "simgpu.comm.calibrate" in notes[1]
    assert lines[len(notes) + 1].split()[0] == "size(B)"
    for op, args in (("broadcast", ["--platform", "rtx2080ti_2gpu"]), ("all_gather", ["--platform", "dgx_h100"]),
                     ("all_gather", ["--platform", "pcie_4gpu"])):
        assert comm_main([*args, "--op", op, "--sizes", "1MB"]) == 0
        assert "# note:" not in capsys.readouterr().out, (op, args)


def test_nccl_tests_view_rejects_bad_input(capsys):
    assert comm_main(["--platform", "dgx_h100", "--gpus-per-node", "9"]) == 2
    assert "--gpus-per-node" in capsys.readouterr().err
    assert comm_main(["--platform", "nope"]) == 2
    capsys.readouterr()
    assert comm_main(["--platform", "dgx_h100", "--gpus-per-node", "1", "--sizes", "1MB"]) == 2
    assert "at least 2 GPUs" in capsys.readouterr().err


def test_small_messages_latency_bound_large_bandwidth_bound(dgx_h100):
    t = {s: simulate_collective(dgx_h100, "all_reduce", s, nodes=2) for s in (8, 4096, GB, 2 * GB)}
    assert t[4096] == pytest.approx(t[8], rel=0.05)
    assert t[2 * GB] == pytest.approx(2 * t[GB], rel=0.05)


def test_tuner_picks_by_size_and_topology(dgx_h100, dgx_a100):
    small = plan_for(dgx_h100, 2, "all_reduce", 8)
    big = plan_for(dgx_h100, 2, "all_reduce", 4 * GB)
    assert small.protocol == "ll" and big.protocol == "simple"
    assert small.algorithm == "tree"
    assert plan_for(dgx_h100, 1, "all_reduce", GB).algorithm == "nvls"  # in-switch reduction on H100
    assert plan_for(dgx_a100, 1, "all_reduce", GB).algorithm == "ring"  # no NVLS on A100
    assert plan_for(dgx_a100, 1, "all_to_all", GB).algorithm == "direct"


def test_forced_algorithm_and_protocol(dgx_h100):
    p = plan_for(dgx_h100, 2, "all_reduce", 8, algorithm="ring", protocol="simple")
    assert (p.algorithm, p.protocol) == ("ring", "simple")
    # an algorithm that cannot serve the op or topology falls back to one that can
    assert plan_for(dgx_h100, 2, "all_gather", GB, algorithm="tree").algorithm == "ring"
    with pytest.raises(ValueError, match="unknown collective algorithm"):
        plan_for(dgx_h100, 1, "all_reduce", 8, algorithm="magic")


def test_every_collective_over_arbitrary_groups(dgx_a100):
    """A TP group inside a node, a DP group across nodes and a PP pair, all in one iteration."""
    progs = [Program(r) for r in range(16)]
    tp = tuple(range(8, 16))
    for r in tp:
        for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce"):
            progs[r].add(Op(op, "collective", op, stream="comm", coll=CollectiveCall(f"tp.{op}", op, tp, 64 << 20),
                            nbytes=64 << 20))
    for r in (0, 8):
        progs[r].add(Op("dp", "collective", "all_reduce", stream="comm",
                        coll=CollectiveCall("dp", "all_reduce", (0, 8), 64 << 20), nbytes=64 << 20))
    for r in (1, 9):
        progs[r].add(Op("pp", "collective", "send_recv", stream="comm",
                        coll=CollectiveCall("pp", "send_recv", (1, 9), 32 << 20), nbytes=32 << 20))
    res = run_programs(dgx_a100, 2, progs, [])
    comm = res.records[res.records["stream"] == "comm"]
    assert len(comm) == 8 * 6 + 2 + 2
    assert (comm["end_s"] > comm["start_s"]).all()


def test_uneven_all_to_all(dgx_a100):
    """all-to-all-v: the rank with most to send sets the pace."""
    group = (0, 1, 2, 3)

    def run(rows):
        progs = [Program(r, [Op("a2a", "collective", "all_to_all", stream="comm",
                                coll=CollectiveCall("a2a", "all_to_all", group, sum(rows[r]), send_bytes=rows[r]),
                                nbytes=sum(rows[r]))]) for r in group]
        return run_programs(dgx_a100, 1, progs, [], gpus_per_node=4).iteration_time_s

    even = run([tuple(0 if i == j else 64 << 20 for j in group) for i in group])
    skew = run([tuple(0 if i == j else (256 << 20 if i == 0 else 64 << 20) for j in group) for i in group])
    assert skew > 2.5 * even


def test_rail_optimised_beats_single_nic_node(dgx_a100):
    one_nic, _ = load_platform("dgx_a100", [("network.nics_per_node", 1)])
    rail = simulate_collective(dgx_a100, "all_reduce", 4 * GB, nodes=2)
    single = simulate_collective(one_nic, "all_reduce", 4 * GB, nodes=2)
    assert single > 4 * rail


def test_oversubscribed_core_costs_its_ratio(dgx_h100):
    """All-to-all across pods: with a 4:1 oversubscribed spine the cross-pod traffic takes ~4x."""
    def a2a(oversub):
        p, _ = load_platform("dgx_h100", [("network.nodes_per_leaf", 1), ("network.oversubscription", oversub)])
        return simulate_collective(p, "all_to_all", 4 * GB, nodes=4)

    ratio = a2a(4.0) / a2a(1.0)
    assert 3.0 < ratio <= 4.05


def test_mesh_rings_use_every_wire_once(dgx_a100):
    v100, _ = load_platform("dgx1_v100")
    topo = Topology(v100, 1)
    rings = ring_orders(tuple(range(8)), topo, v100.collectives)
    assert len(rings) == 6  # six NVLink links per GPU, one ring per link
    used: dict[tuple[int, int], int] = {}
    for ring in rings:
        for a, b in zip(ring, ring[1:] + ring[:1]):
            used[(a, b)] = used.get((a, b), 0) + 1
    assert all(n <= topo.nvlink_count(a, b) for (a, b), n in used.items())


def test_multi_node_channels_spread_over_nics(dgx_a100):
    topo = Topology(dgx_a100, 2)
    rings = ring_orders(tuple(range(16)), topo, dgx_a100.collectives)
    entries = {topo.nic_of(r[0]) for r in rings}
    assert len(rings) == 8 and entries == set(range(8))


def test_parse_nccl_tests_and_calibrate(tmp_path, capsys):
    """Calibration reads nccl-tests rows, improves the fit, and writes a loadable platform."""
    p, _ = load_platform("dgx_a100", [("node.nvlink.efficiency", 0.6)])  # the "real" machine is slower
    sizes = [1 << k for k in range(20, 31, 2)]
    rows = ["#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw"]
    for s in sizes:
        t = simulate_collective(p, "all_reduce", s) * 1e6
        rows.append(f"{s:>12d} {s // 4:>12d}     float     sum      -1 {t:8.1f} {s / t / 1e3:6.2f} {0:6.2f}      0")
    log = tmp_path / "ar.log"
    log.write_text("\n".join(rows) + "\n")
    got_sizes, got_times = parse_nccl_tests(log.read_text())
    assert list(got_sizes) == sizes and (got_times > 0).all()
    out = tmp_path / "cal.yaml"
    assert calibrate_main([str(log), "--platform", "dgx_a100", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "node.nvlink.efficiency" in printed
    cal, _ = load_platform(str(out))
    assert cal.node.nvlink is not None and cal.node.nvlink.efficiency == pytest.approx(0.6, rel=0.1)
    # --set describes the user's machine: applied before the fit and kept in the written file
    out2 = tmp_path / "cal2.yaml"
    assert calibrate_main([str(log), "--platform", "dgx_a100", "--set", "collectives.channels=4",
                           "--out", str(out2)]) == 0
    assert load_platform(str(out2))[0].collectives.channels == 4
    assert calibrate_main([str(log), "--platform", "dgx_a100", "--set", "network.nic_gbs=1"]) == 2
    assert calibrate_main([str(tmp_path / "missing.log"), "--platform", "dgx_a100"]) == 2
    capsys.readouterr()
    assert calibrate_main([str(log), "--platform", "dgx_a100", "--nodes", "2", "--gpus-per-node", "9"]) == 2
    assert "--gpus-per-node" in capsys.readouterr().err


def test_link_kinds_on_routes(dgx_a100):
    topo = Topology(dgx_a100, 2)
    assert topo.hardware(topo.route(0, 1)) == "nvlink"
    assert topo.hardware(topo.route(0, 8)) == "net"
    pcie, _ = load_platform("pcie_4gpu")
    assert Topology(pcie, 1).hardware(Topology(pcie, 1).route(0, 3)) == "pcie"


def test_protocol_and_algorithm_in_workload(tmp_path):
    from conftest import ROOT

    from simgpu import load_job, simulate
    path = Path(ROOT / "workloads" / "gpt2_small_pcie_4gpu.yaml")
    a = simulate(load_job(path, ["model.layers=2", "comm.algorithm=ring", "comm.protocol=ll"])).iteration_time_s
    b = simulate(load_job(path, ["model.layers=2", "comm.algorithm=ring", "comm.protocol=simple"])).iteration_time_s
    assert a != b


def test_enabled_protocols_restrict_the_tuner(dgx_h100, tmp_path):
    """Where the network plugin forces NCCL_PROTO=simple (EFA on p4de), small messages take Simple."""
    assert plan_for(dgx_h100, 2, "all_reduce", 8).protocol == "ll"
    simple_only, _ = load_platform("dgx_h100", [("collectives.enabled_protocols", ["simple"])])
    assert plan_for(simple_only, 2, "all_reduce", 8).protocol == "simple"
    p4de, _ = load_platform("aws_p4de")
    assert {plan_for(p4de, 2, "all_reduce", s).protocol for s in (8, 1 << 20, GB)} == {"simple"}
    with pytest.raises(ConfigError, match="enabled_protocols"):
        load_platform("dgx_h100", [("collectives.enabled_protocols", ["ll256"])])


def test_a_protocol_given_in_part_keeps_its_other_costs():
    """``--set collectives.protocols.simple.step_net_us=20`` changes that one cost; the other keys of
    Simple and the other protocols keep their defaults."""
    p, _ = load_platform("dgx_h100", [("collectives.protocols.simple.step_net_us", 20.0)])
    d, _ = load_platform("dgx_h100")
    assert p.collectives.protocols["simple"].step_net_us == 20.0
    simple = p.collectives.protocols["simple"]
    assert simple.model_copy(update={"step_net_us": 10.0}) == d.collectives.protocols["simple"]
    assert set(p.collectives.protocols) == {"ll", "ll128", "simple"}
    with pytest.raises(ConfigError, match=r"collectives\.protocols\.simple\.step_net_us"):
        load_platform("dgx_h100", [("collectives.protocols.simple.step_net_us", -1.0)])


def test_window_holds_mid_size_messages_on_slow_fabrics(dgx_h100):
    """Eight chunk-sized slots per channel come back a round trip after they left: on a fabric
    with 20 us of latency a 16 MB all-reduce over two nodes moves below the NICs' bandwidth,
    a 4 GB one (whole chunks) at it; on the low-latency fabric neither is held back."""
    slow, _ = load_platform("dgx_h100", [("network.latency_us", 20.0)])

    def capped(platform, nbytes: int) -> bool:
        plan = plan_for(platform, 2, "all_reduce", nbytes, algorithm="ring", protocol="simple")
        topo = Topology(platform, 2)
        nic = topo.edge(0, 8).capacity
        return min(t.max_rate for t in plan.transfers) < nic

    assert capped(slow, 16 << 20) and not capped(slow, 4 * GB)
    assert not capped(dgx_h100, 4 * GB)
    # the cap is what the engine runs at: the window-held mid-size all-reduce is slower per byte
    t16 = simulate_collective(slow, "all_reduce", 16 << 20, nodes=2, algorithm="ring")
    t4g = simulate_collective(slow, "all_reduce", 4 * GB, nodes=2, algorithm="ring")
    assert t16 / (16 << 20) > 1.5 * t4g / (4 * GB)


def test_tree_chunks_shrink_with_the_message():
    """NCCL halves the tree's chunk until a channel's share is several chunks per level."""
    from simgpu.comm.algorithms.trees import _tree_chunk
    from simgpu.config.platform import _default_protocols

    simple = _default_protocols()["simple"]
    assert _tree_chunk(1 << 30, 8, simple) == 512 << 10          # plenty of chunks: the whole slot
    assert _tree_chunk(8 << 20, 8, simple) == 128 << 10          # 8 MB over 8 levels: 64 chunks of 128 KiB
    assert _tree_chunk(2 << 20, 8, simple) == 64 << 10
    assert _tree_chunk(16 << 10, 8, simple) == 16 << 10          # never more than the share
    ll = _default_protocols()["ll"]
    assert _tree_chunk(8 << 20, 8, ll) == ll.chunk_kib * 1024     # LL keeps its own slot size


def test_tree_bandwidth_follows_nccls_derating_by_size():
    """Trees reach NCCL's treeCorrectionFactor of their bandwidth: Simple half of it from 128 KiB
    (64 B x 2^11) to 1 MiB, 0.6 at 2 MiB, all of it beyond 256 MiB; the figure of a size is that of
    the power of two at or below it."""
    from simgpu.comm.algorithms.trees import _tree_efficiency
    from simgpu.config.platform import _default_protocols

    simple, ll = _default_protocols()["simple"], _default_protocols()["ll"]
    assert [_tree_efficiency(simple, s) for s in (64, 128 << 10, 1 << 20, 2 << 20, 3 << 20, 256 << 20, GB)] == \
        [0.9, 0.5, 0.5, 0.6, 0.6, 0.9, 1.0]
    assert _tree_efficiency(simple, 8) == 1.0                      # below the table
    assert _tree_efficiency(ll, 512 << 10) == 0.4
    # the plan's tree transfers carry the derated bytes: at 1 MiB twice what they carry underated
    flat, _ = load_platform("dgx_a100", [("collectives.protocols.simple.tree_efficiency", [])])

    def tree_bytes(platform) -> float:
        plan = plan_for(platform, 2, "all_reduce", 1 << 20, algorithm="tree", protocol="simple")
        return sum(t.nbytes for t in plan.transfers)

    derated, _ = load_platform("dgx_a100")
    assert tree_bytes(derated) == pytest.approx(2 * tree_bytes(flat))
    # a platform whose trees fall further short (calibrated): the derating squared, 1 stays 1
    deeper, _ = load_platform("dgx_a100", [("collectives.tree_efficiency_power", 2.0)])
    assert tree_bytes(deeper) == pytest.approx(4 * tree_bytes(flat))
    assert _tree_efficiency(simple, GB, 2.0) == 1.0


def test_calibration_knobs_follow_the_collective():
    """A fit moves the bounding link's fraction and latency and the collective's fixed cost; NCCL's
    channel bound for point-to-point traffic; the trees' shortfall for all-reduce across nodes."""
    from simgpu.comm.calibrate import knobs

    p, _ = load_platform("dgx_h100")
    def keys(nodes: int, op: str) -> list[str]:
        return [k.key for k in knobs(p, nodes, op)]

    assert keys(1, "all_reduce") == ["node.nvlink.efficiency", "node.nvlink.latency_us", "collectives.launch_us"]
    assert keys(1, "send_recv")[-1] == "collectives.channel_gbytes_per_s"
    assert keys(2, "all_reduce") == ["network.efficiency", "network.latency_us", "collectives.launch_us",
                                     "collectives.tree_efficiency_power"]


def test_tree_pipeline_fills_level_by_level():
    """A tree's first chunk crosses each level at that level's own pace: making NVLink (the chain
    inside each node) ten times faster shortens the fill by the chain's part only."""
    base, _ = load_platform("dgx_a100", [("collectives.protocols.simple.tree_efficiency", [])])
    fast, _ = load_platform("dgx_a100", [("collectives.protocols.simple.tree_efficiency", []),
                                         ("node.nvlink.gbytes_per_s", 3000.0)])

    def latency(platform) -> float:
        return plan_for(platform, 2, "all_reduce", 64 << 20, algorithm="tree", protocol="simple").latency_s

    topo = Topology(base, 2)
    chunk = 128 << 10                       # 8 MiB per channel (8 of them) over 8 levels
    nvl = topo.edge(0, 1).capacity
    chain_fill = 2 * 7 * chunk / nvl        # up and down the chain of 8 GPUs, a tenth of it when fast
    assert latency(base) - latency(fast) == pytest.approx(chain_fill * (1 - 1 / 10), rel=1e-6)


@pytest.mark.parametrize("op,link_steps", [("all_reduce", lambda n: 2 * (n - 1)), ("all_gather", lambda n: n - 1),
                                           ("reduce_scatter", lambda n: n - 1)])
def test_ring_loop_copies_one_chunk_locally(op, link_steps):
    """Each ring loop has one step that copies a chunk in the rank's own memory: over the
    collective, one step's bytes read and written at the memory's bandwidth, on top of the link
    steps, so the busbw of two ranks trails that of eight (as vTrain's A100 sweeps measure)."""
    base, _ = load_platform("dgx_a100")
    fast, _ = load_platform("dgx_a100", [("gpu.hbm_gbytes_per_s", 1e9)])
    nbytes = 1 << 30
    def latency(platform, n: int) -> float:
        return plan_for(platform, 1, op, nbytes, group=range(n), algorithm="ring", protocol="simple").latency_s

    for n in (2, 4, 8):
        step = (2 * (n - 1) if op == "all_reduce" else n - 1) / n * nbytes / link_steps(n)
        assert latency(base, n) - latency(fast, n) == pytest.approx(2 * step / 2039e9, rel=1e-5)
    # one process driving all the GPUs (nccl-tests -g N) passes direct pointers: no copy
    one, _ = load_platform("dgx_a100", [("collectives.single_process", True)])
    one_fast, _ = load_platform("dgx_a100", [("collectives.single_process", True), ("gpu.hbm_gbytes_per_s", 1e9)])
    assert latency(one, 8) == latency(one_fast, 8)
    # broadcast's chain overlaps the copy: the rank that copies does nothing else
    assert (plan_for(base, 1, "broadcast", nbytes, algorithm="ring", protocol="simple").latency_s
            == pytest.approx(plan_for(fast, 1, "broadcast", nbytes, algorithm="ring", protocol="simple").latency_s))


def test_ring_latency_adds_up_hop_by_hop():
    """A chunk pays each hop's cost in turn: over 2 nodes a 16-rank ring crosses the network on 2
    of its 16 hops, so 10 us more network latency (one way per step: the proxy posts each step as
    it lands) costs the all-reduce's 30 steps 30/16 x 2 x 10 us, not 30 network steps' worth."""
    base, _ = load_platform("dgx_a100")
    slow, _ = load_platform("dgx_a100", [("network.latency_us", base.network.latency_us + 10.0)])

    def latency(platform) -> float:
        return plan_for(platform, 2, "all_reduce", 64 << 20, algorithm="ring", protocol="simple").latency_s

    assert latency(slow) - latency(base) == pytest.approx(30 / 16 * 2 * 10e-6, rel=1e-6)


def test_point_to_point_channels_grow_with_the_transfer():
    """NCCL cuts a send into pieces of at most 32 steps on as few channels as the communicator's
    share per peer allows (32 channels over the ranks), doubling them up to four times that share."""
    from simgpu.comm.algorithms.p2p import p2p_channels

    nvl = 512 << 10
    assert [p2p_channels(mb << 20, 8, nvl, False) for mb in (32, 64, 128, 256, 1024)] == [4, 4, 8, 16, 16]
    assert [p2p_channels(mb << 20, 4, nvl, False) for mb in (32, 128, 256, 512)] == [8, 8, 16, 32]
    assert p2p_channels(64 << 20, 2, nvl, False) == 16       # PyTorch's pair communicator
    assert p2p_channels(100 << 10, 8, nvl, False) == 2       # small: 64 KiB pieces fill two channels
    assert p2p_channels(64 << 20, 2, 128 << 10, True) == 32  # across nodes a piece is one step


def test_sendrecv_on_a_world_communicator_is_channel_bound(dgx_h100):
    """nccl-tests' sendrecv on 8 H100s: 64 MB and 128 MB take about as long (the channels double),
    and a pair communicator (as PyTorch makes for send/recv) moves 64 MB faster than the world one."""
    def t(nbytes: int, comm: int) -> float:
        req = CollectiveRequest("send_recv", (0, 1), nbytes, comm_size=comm)
        return Planner(Topology(dgx_h100, 1), dgx_h100.collectives).plan(req).isolated_time(Topology(dgx_h100, 1))

    assert t(128 << 20, 8) == pytest.approx(t(64 << 20, 8), rel=0.05)
    assert t(64 << 20, 2) < 0.5 * t(64 << 20, 8)
    # without a per-channel bound the links alone set the pace
    free, _ = load_platform("dgx_h100", [("collectives.channel_gbytes_per_s", None)])
    req = CollectiveRequest("send_recv", (0, 1), 64 << 20, comm_size=8)
    topo = Topology(free, 1)
    assert Planner(topo, free.collectives).plan(req).isolated_time(topo) < 0.3 * t(64 << 20, 8)


def test_comm_cli_takes_nccl_tests_names_and_explains(capsys):
    """``--op alltoall`` / ``sendrecv`` / ``all_reduce_perf`` are nccl-tests' names; ``--explain`` prints
    the communicator's channels, NCCL's model's estimates, its pick and the plan simulated, per size."""
    assert comm_main(["--platform", "h100_ndr_cluster", "--nodes", "2", "--gpus-per-node", "1", "--op", "sendrecv",
                      "--sizes", "1MB"]) == 0
    assert "# send_recv on h100_ndr_cluster" in capsys.readouterr().out
    assert comm_main(["--platform", "dgx_h100", "--op", "alltoall", "--sizes", "1MB"]) == 0
    assert "# all_to_all" in capsys.readouterr().out
    assert comm_main(["--platform", "dgx_h100", "--nodes", "16", "--gpus-per-node", "2", "--op", "all_reduce_perf",
                      "--sizes", "64KB,1GB", "--explain"]) == 0
    out = capsys.readouterr().out
    assert out.count("NCCL picks") == 2 and "tree/ll on" in out and out.count("#   simulated") == 2
    assert out.count("#   channels    search 4 x 24/24 GB/s (2 before duplication), collectives 8") == 2
    assert comm_main(["--platform", "dgx_h100", "--op", "allreduce"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "expected --op one of" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("platform, nodes", [("dgx_h100", 1), ("dgx_a100", 1), ("dgx_a100", 2)])
def test_slow_all_reduces_take_the_factor_past_their_size(platform, nodes):
    """``collectives.slow_all_reduce``: an all-reduce of ``slow_all_reduce_bytes`` or more moves its
    bytes that many times as slowly alone (its latency as before), on the same links with the same
    bytes; a smaller one and other ops are as before."""
    base, _ = load_platform(platform)
    slow, _ = load_platform(platform, [("collectives.slow_all_reduce_bytes", 64 << 20),
                                       ("collectives.slow_all_reduce", 2.5)])
    topo = Topology(base, nodes)
    for op, nbytes in (("all_reduce", 64 << 20), ("all_reduce", 256 << 20), ("all_reduce", 32 << 20),
                       ("all_gather", 256 << 20)):
        req = CollectiveRequest(op, tuple(range(topo.world)), nbytes)
        a = Planner(topo, base.collectives).plan(req)
        b = Planner(topo, slow.collectives).plan(req)
        assert (a.algorithm, a.protocol, a.latency_s) == (b.algorithm, b.protocol, b.latency_s)
        assert [(t.links, t.nbytes) for t in a.transfers] == [(t.links, t.nbytes) for t in b.transfers]
        moving = a.isolated_time(topo) - a.latency_s
        factor = 2.5 if op == "all_reduce" and nbytes >= 64 << 20 else 1.0
        assert b.isolated_time(topo) - b.latency_s == pytest.approx(factor * moving, rel=1e-9)
        # and so in the simulation
        ta = simulate_collective(base, op, nbytes, nodes=nodes)
        tb = simulate_collective(slow, op, nbytes, nodes=nodes)
        assert tb - ta == pytest.approx((factor - 1) * moving, rel=1e-6, abs=1e-12)


def test_a_transfer_tables_caps_lowered_to_a_time():
    """``TransferTable.capped_to``: every transfer takes at least the time given (its cap lowered to
    its bytes over it, a lower cap kept), over the same routes; per kind where the table has kinds."""
    import numpy as np

    from simgpu.comm.transfers import TransferTable

    flat, starts = np.array([0, 1, 1, 2]), np.array([0, 2, 3, 4])
    t = TransferTable(flat, starts, np.array([10.0, 40.0, 4.0]), np.array([np.inf, 5.0, 1.0])).capped_to(2.0)
    assert t.max_rate.tolist() == [5.0, 5.0, 1.0] and t.nbytes.tolist() == [10.0, 40.0, 4.0]
    assert [t.links(i) for i in range(3)] == [(0, 1), (1,), (2,)]
    k = TransferTable(flat, starts, np.array([10.0, 40.0]), np.array([np.inf, 5.0]), kinds=np.array([0, 1, 1]))
    k = k.capped_to(4.0)
    assert k.kind_max_rate.tolist() == [2.5, 5.0] and k.max_rate.tolist() == [2.5, 5.0, 5.0]
