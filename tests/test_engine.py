"""The engine: stream order, dependencies, launch overhead, collectives' rendezvous, analytic checks."""

from __future__ import annotations

import pytest
from conftest import ROOT, run_programs
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu import load_job, simulate
from simgpu.errors import SimulationError
from simgpu.graph import CollectiveCall, Op, Program
from simgpu.platform.topology import Topology
from simgpu.report.summary import rank_breakdown


def kernel(name: str, k: int, deps: tuple[int, ...] = (), stream: str = "compute") -> Op:
    return Op(name, "kernel", "elementwise", stream=stream, kernel=k, deps=deps)


def allreduce(key: str, group: tuple[int, ...], nbytes: int, deps: tuple[int, ...] = ()) -> Op:
    return Op(key, "collective", "all_reduce", stream="comm", coll=CollectiveCall(key, "all_reduce", group, nbytes),
              nbytes=nbytes, deps=deps)


def test_one_gpu_in_sequence_is_sum_of_ops_plus_launches(dgx_a100):
    """Analytic check (a): kernels back to back on one stream; launches are shorter than kernels,
    so the iteration is the first launch plus the sum of the kernels."""
    durs = [10e-6, 20e-6, 30e-6, 40e-6]
    prog = Program(0, [kernel(f"k{i}", i) for i in range(4)])
    res = run_programs(dgx_a100, 1, [prog], durs, gpus_per_node=1, launch_s=5e-6)
    assert res.iteration_time_s == pytest.approx(5e-6 + sum(durs), rel=1e-12)


def test_launch_bound_when_kernels_are_short(dgx_a100):
    """Kernels shorter than the launch overhead: the CPU thread is the bottleneck."""
    n, launch = 50, 5e-6
    prog = Program(0, [kernel(f"k{i}", 0) for i in range(n)])
    res = run_programs(dgx_a100, 1, [prog], [1e-6], gpus_per_node=1, launch_s=launch)
    assert res.iteration_time_s == pytest.approx(n * launch + 1e-6, rel=1e-9)


def test_streams_overlap_and_deps_wait(dgx_a100):
    p = Program(0)
    a = p.add(kernel("a", 0))                       # compute 0..10
    p.add(kernel("b", 1, stream="copy"))             # copy 0..20, independent
    p.add(kernel("c", 0, deps=(a,), stream="copy"))  # after b (stream order) and a
    p.add(kernel("d", 0))                            # compute after a: 10..20
    res = run_programs(dgx_a100, 1, [p], [10e-6, 20e-6], gpus_per_node=1)
    r = res.records[res.records["stream"] != "cpu"].set_index("name")
    assert r.loc["c", "start_s"] == pytest.approx(20e-6)
    assert r.loc["d", "start_s"] == pytest.approx(10e-6)
    assert res.iteration_time_s == pytest.approx(30e-6)


def test_ring_all_reduce_matches_formula(dgx_a100):
    """Analytic check (b): ring all-reduce of S bytes over n GPUs on identical links of bandwidth B
    takes 2(n-1)/n * S / B plus the per-step latency."""
    n, S = 8, 1 << 30
    res = run_programs(dgx_a100, 1, [Program(r, [allreduce("ar", tuple(range(n)), S)]) for r in range(n)], [],
                       algorithm="ring")
    nv = dgx_a100.node.nvlink
    B = nv.gbytes_per_s * 1e9 * nv.efficiency
    c = dgx_a100.collectives
    simple = c.protocols["simple"]
    latency = (c.launch_us + simple.base_us) * 1e-6 + 2 * (n - 1) * (simple.step_nvlink_us + nv.latency_us) * 1e-6
    expected = 2 * (n - 1) / n * S / B + latency
    assert res.iteration_time_s == pytest.approx(expected, rel=0.02)


def test_two_node_all_reduce_bounded_by_nics(dgx_a100):
    """Emergent: the same all-reduce over 2 nodes runs at the NICs' pace, over 1 node at NVLink's."""
    S = 4 << 30
    one = run_programs(dgx_a100, 1, [Program(r, [allreduce("ar", tuple(range(8)), S)]) for r in range(8)], [],
                       algorithm="ring")
    two = run_programs(dgx_a100, 2, [Program(r, [allreduce("ar", tuple(range(16)), S)]) for r in range(16)], [],
                       algorithm="ring")
    nic = dgx_a100.network
    nic_bw = nic.nic_gbps / 8 * 1e9 * nic.efficiency * nic.nics_per_node  # per node, per direction
    busbw_two = 2 * 15 / 16 * S / two.iteration_time_s
    assert busbw_two == pytest.approx(nic_bw, rel=0.05)
    assert one.iteration_time_s < two.iteration_time_s
    util = two.link_stats.nbytes / (two.link_stats.capacity_gbytes_per_s * 1e9 * two.iteration_time_s)
    assert two.link_stats.loc[util.idxmax(), "link_kind"] == "nic"
    assert util.max() > 0.9


def test_collective_waits_for_all_members(dgx_a100):
    progs = [Program(r) for r in range(2)]
    progs[0].add(allreduce("ar", (0, 1), 1 << 20))
    k = progs[1].add(kernel("late", 0))
    progs[1].add(allreduce("ar", (0, 1), 1 << 20, deps=(k,)))
    res = run_programs(dgx_a100, 1, progs, [100e-6], gpus_per_node=2)
    ar = res.records[(res.records["name"] == "ar") & (res.records["stream"] == "comm")].set_index("rank")
    assert ar.loc[0, "start_s"] == pytest.approx(0.0)
    assert ar.loc[1, "start_s"] == pytest.approx(100e-6)
    assert ar.loc[0, "end_s"] == pytest.approx(ar.loc[1, "end_s"])
    assert ar.loc[0, "end_s"] > 100e-6


def test_missing_member_is_a_deadlock_error(dgx_a100):
    progs = [Program(0, [allreduce("ar", (0, 1), 1024)]), Program(1, [kernel("k", 0)])]
    with pytest.raises(SimulationError, match="never reached it: \\[1\\]"):
        run_programs(dgx_a100, 1, progs, [1e-6], gpus_per_node=2)


def test_mismatched_collective_is_an_error(dgx_a100):
    progs = [Program(0, [allreduce("ar", (0, 1), 1024)]), Program(1, [allreduce("ar", (0, 1), 2048)])]
    with pytest.raises(SimulationError, match="another member"):
        run_programs(dgx_a100, 1, progs, [], gpus_per_node=2)


def test_concurrent_collectives_share_links(dgx_a100):
    """Two all-reduces over the same NICs at once take about twice as long as one."""
    S = 1 << 30
    group = tuple(range(16))
    one = run_programs(dgx_a100, 2, [Program(r, [allreduce("a", group, S)]) for r in range(16)], [],
                       algorithm="ring")
    two = run_programs(dgx_a100, 2, [Program(r, [allreduce("a", group, S), ]) for r in range(16)], [],
                       algorithm="ring")
    progs = []
    for r in range(16):
        p = Program(r)
        p.add(allreduce("a", group, S))
        p.add(Op("b", "collective", "all_reduce", stream="copy", coll=CollectiveCall("b", "all_reduce", group, S),
                 nbytes=S))
        progs.append(p)
    both = run_programs(dgx_a100, 2, progs, [], algorithm="ring")
    assert one.iteration_time_s == pytest.approx(two.iteration_time_s)
    assert both.iteration_time_s == pytest.approx(2 * one.iteration_time_s, rel=0.1)


def test_overlap_slowdown_stretches_kernels_under_communication(dgx_a100):
    progs = []
    for r in range(2):
        p = Program(r)
        p.add(allreduce("ar", (0, 1), 256 << 20))
        p.add(kernel("k", 0))
        progs.append(p)
    base = run_programs(dgx_a100, 1, progs, [100e-6], gpus_per_node=2)
    slow = run_programs(dgx_a100, 1, progs, [100e-6], gpus_per_node=2, overlap=0.5)
    k0 = base.records[base.records["name"] == "k"].iloc[0]
    k1 = slow.records[slow.records["name"] == "k"].iloc[0]
    assert (k1["end_s"] - k1["start_s"]) == pytest.approx(1.5 * (k0["end_s"] - k0["start_s"]))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["compute", "copy"])), min_size=1, max_size=12))
def test_no_two_intervals_overlap_on_a_stream(dgx_a100, ops):
    """Property: a stream runs one op at a time, in issue order."""
    p = Program(0)
    for i, (k, stream) in enumerate(ops):
        deps = (i - 1,) if i and i % 3 == 0 else ()
        p.add(kernel(f"k{i}", k, deps=deps, stream=stream))
    res = run_programs(dgx_a100, 1, [p], [3e-6, 5e-6, 7e-6], gpus_per_node=1, launch_s=1e-6)
    for _, g in res.records[res.records["stream"] != "cpu"].groupby("stream"):
        g = g.sort_values("start_s")
        assert (g["start_s"].values[1:] >= g["end_s"].values[:-1] - 1e-15).all()


@pytest.mark.parametrize("path, extra", [
    # GPT-3's shapes cut short, every rank, four pods of two nodes per rail: data-parallel rings and
    # pipeline sends across the spine; then on double binary trees, and with the switches reducing
    ("gpt3_175b_1024x_a100.yaml", ["parallelism.pp=2", "parallelism.dp=4"]),
    ("gpt3_175b_1024x_a100.yaml", ["parallelism.pp=2", "parallelism.dp=4", "comm.algorithm=tree"]),
    ("gpt3_175b_1024x_a100.yaml", ["parallelism.pp=2", "parallelism.dp=4", "platform.network.topology=fat_tree",
                                   "platform.network.in_network_reduction=true"]),
    # a DLRM's all-to-alls over 8 nodes: pairs carried as aggregates across the spine
    ("dlrm_dcnv2_8x_dgx_a100.yaml", []),
])
def test_every_rank_with_the_leaf_uplinks_implied_is_the_full_computation(monkeypatch, path, extra):
    """The leaf uplinks of a core that is not oversubscribed, left out of the rate computation
    (their capacity implied by the leaf's ports'), change no time, no breakdown and no link counter."""
    size = ["model.layers=4", "training.global_batch=16", "nodes=8", "parallelism.tp=8"] if "gpt3" in path else []
    job = load_job(ROOT / "workloads" / path, [*size, *extra, "platform.network.nodes_per_leaf=2"])
    pruned = simulate(job, fold=False)
    assert pruned.meta["fold"] == 1
    implied = Topology.implied_links
    calls = []
    monkeypatch.setattr(Topology, "implied_links", lambda self: calls.append(implied(self)) or {})
    full = simulate(job, fold=False)
    assert calls and calls[0], "the uplinks are implied on this fabric"
    assert pruned.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-9)
    a, b = rank_breakdown(full), rank_breakdown(pruned)
    assert (a.index == b.index).all()
    assert b.to_numpy() == pytest.approx(a.to_numpy(), rel=1e-9, abs=1e-12)
    la, lb = full.link_stats.set_index("link"), pruned.link_stats.set_index("link")
    assert list(la.index) == list(lb.index)
    assert any(la.index.str.contains("spine"))
    assert lb["nbytes"].to_numpy() == pytest.approx(la["nbytes"].to_numpy(), rel=1e-9)
    assert lb["busy_s"].to_numpy() == pytest.approx(la["busy_s"].to_numpy(), rel=1e-9, abs=1e-12)
