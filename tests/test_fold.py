"""Folding identical data-parallel replicas: the same iteration as simulating every rank.

Each case is simulated both ways; folded, the iteration time is within 0.5% (in practice equal) and
every rank's breakdown and every record (copied onto the replicas) match the full simulation. The
cases include contention (data-parallel reductions overlapping pipeline traffic on the same NICs)
and the situations where the fold must turn itself off: an oversubscribed core, a plan that is not
the same from every replica (a double binary tree), replicas that do not fill whole nodes, a DLRM.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simgpu import load_job, simulate
from simgpu.config.checks import gpus_per_node
from simgpu.config.loader import load_platform
from simgpu.engine import core
from simgpu.engine.fold import FoldMap
from simgpu.graph import Replicas
from simgpu.platform.topology import Topology
from simgpu.report.summary import rank_breakdown, summarize

GPT3 = ROOT / "workloads" / "gpt3_175b_1024x_a100.yaml"
GPT = ROOT / "workloads" / "gpt_2x_dgx_h100.yaml"
#: GPT-3's layer shapes, cut to fit the suite: 8 nodes of 8 A100s unless a case says otherwise
SMALL_GPT3 = ["model.layers=8", "training.global_batch=32", "nodes=8", "parallelism.tp=8",
              "parallelism.pp=2", "parallelism.dp=4"]


def both(path, overrides):
    job = load_job(path, overrides)
    return simulate(job, fold=False), simulate(job)


def assert_same(full, folded, factor):
    assert folded.meta["fold"] == factor, folded.meta["fold_note"]
    assert full.meta["fold"] == 1
    assert folded.iteration_time_s == pytest.approx(full.iteration_time_s, rel=5e-3)
    a, b = rank_breakdown(full), rank_breakdown(folded)
    assert list(a.index) == list(b.index) == list(range(full.meta["gpus"]))
    np.testing.assert_allclose(b.to_numpy(), a.to_numpy(), rtol=1e-6, atol=1e-9)
    ea, eb = full.records, folded.expanded()
    assert len(ea) == len(eb)
    assert (ea["name"].to_numpy() == eb["name"].to_numpy()).all()
    np.testing.assert_allclose(eb[["start_s", "end_s"]].to_numpy(), ea[["start_s", "end_s"]].to_numpy(),
                               rtol=1e-6, atol=1e-9)
    sa, sb = summarize(full), summarize(folded)
    assert sb["breakdown_ms"] == pytest.approx(sa["breakdown_ms"], rel=1e-5)
    assert sb["categories_ms"] == pytest.approx(sa["categories_ms"], rel=1e-5)


@pytest.mark.parametrize("extra, factor", [
    ([], 16),                                                       # TP8 PP2 DP4, ZeRO-1, 1F1B: 4 x 4
    (["parallelism.zero=0", "comm.algorithm=ring"], 16),            # DDP all-reduce on rings
    (["parallelism.pp_schedule=interleaved", "parallelism.virtual_stages=2"], 16),
    (["parallelism.tp=4", "parallelism.dp=8"], 8),                  # two replicas in a node: 4 x 2
    (["parallelism.zero=3"], 16),                                   # FSDP gathers every block
], ids=["zero1", "ddp-ring", "interleaved", "tp4", "zero3"])
def test_folded_gpt_equals_full(extra, factor):
    full, folded = both(GPT3, SMALL_GPT3 + extra)
    assert_same(full, folded, factor)


def test_folded_moe_equals_full():
    """Mixtral-style experts: the all-to-alls stay inside an expert group of whole nodes."""
    full, folded = both(ROOT / "workloads" / "mixtral_8x7b_64x_h100.yaml",
                        ["model.layers=4", "nodes=4", "parallelism.pp=2", "training.global_batch=64"])
    assert_same(full, folded, 2)
    assert (full.records["category"] == "all_to_all").any()


MIXTRAL_SMALL = ["model.layers=4", "nodes=4", "parallelism.pp=2", "training.global_batch=16"]


@pytest.mark.parametrize("extra, factor", [
    (["parallelism.tp=4", "parallelism.sp=true", "parallelism.ep=4"], 4),  # two members a node: 2 x 2
    (["parallelism.tp=8", "parallelism.ep=2"], 8),                         # one member a node: 2 x 4
], ids=["tp4-ep4", "tp8-ep2"])
def test_folded_moe_whose_expert_group_spans_every_replica_equals_full(extra, factor):
    """Expert parallelism over every data-parallel rank of a stage (ep == dp, as Qwen3-235B's EP32):
    each shift of replicas maps the expert group onto itself, so whole nodes fold and the even
    all-to-all's transfers are kept once per orbit. Every rank's records are the full run's, to the bit."""
    full, folded = both(ROOT / "workloads" / "mixtral_8x7b_64x_h100.yaml", MIXTRAL_SMALL + extra)
    assert_same(full, folded, factor)
    assert (full.records["category"] == "all_to_all").any()
    assert folded.iteration_time_s == full.iteration_time_s
    ea, eb = full.records, folded.expanded()
    assert (eb[["start_s", "end_s"]].to_numpy() == ea[["start_s", "end_s"]].to_numpy()).all()


def test_folded_data_parallel_64_gpus_equals_full():
    full, folded = both(GPT, ["nodes=8", "parallelism.dp=64", "comm.algorithm=ring", "model.layers=4"])
    assert_same(full, folded, 8)


def test_folded_128_gpus_with_contention_equals_full():
    """16 nodes; the data-parallel reduce-scatters of the last micro-batch overlap the pipeline's
    sends on the same NICs, and a slower NIC makes them contend harder."""
    full, folded = both(GPT3, ["model.layers=8", "training.global_batch=32", "nodes=16", "parallelism.tp=8",
                               "parallelism.pp=4", "parallelism.dp=4", "platform.network.nic_gbps=25"])
    assert_same(full, folded, 16)
    assert (full.records["kind"] == "collective").any()


def test_replicas_placed_differently_on_leaves_stay_within_their_latency_budget():
    """Leaves of 6 nodes cut the second 4-node stage: a pipeline hop crosses the spine in some
    replicas and not in others. Only the spine's latency differs; the fold bounds it and stays on."""
    full, folded = both(GPT3, SMALL_GPT3 + ["platform.network.nodes_per_leaf=6"])
    assert folded.meta["fold"] == 16 and "leaf switches" in folded.meta["fold_note"]
    assert folded.iteration_time_s == pytest.approx(full.iteration_time_s, rel=5e-3)
    np.testing.assert_allclose(rank_breakdown(folded).to_numpy(), rank_breakdown(full).to_numpy(),
                               rtol=5e-3, atol=5e-3 * full.iteration_time_s)


#: tp 2 on a DGX A100: no shift of GPUs inside a node maps it onto itself, so only whole nodes may fold
TP2 = ["parallelism.tp=2", "parallelism.dp=16"]


@pytest.mark.parametrize("extra, reason", [
    (["platform.network.nodes_per_leaf=6", "platform.network.spine_latency_us=100", *TP2], "planned differently"),
    (["platform.network.oversubscription=4", "platform.network.nodes_per_leaf=2", *TP2], "oversubscribed"),
    (["parallelism.zero=0", "comm.algorithm=tree", *TP2], "not the same seen from every replica"),
], ids=["slow-spine-other-protocol", "oversubscribed-core", "tree"])
def test_fold_turns_itself_off(extra, reason):
    full, folded = both(GPT3, SMALL_GPT3 + extra)
    assert folded.meta["fold"] == 1 and reason in folded.meta["fold_note"]
    assert folded.iteration_time_s == full.iteration_time_s
    assert summarize(folded)["fold"]["note"] == folded.meta["fold_note"]


@pytest.mark.parametrize("extra, reason", [
    (["platform.network.nodes_per_leaf=6", "platform.network.spine_latency_us=100"], "planned differently"),
    (["parallelism.zero=0", "comm.algorithm=tree"], "not the same seen from every replica"),
], ids=["slow-spine-other-protocol", "tree"])
def test_where_whole_nodes_do_not_fold_ranks_inside_them_still_do(extra, reason):
    """The run finds the fold of whole nodes inexact (a replica planned differently on the leaves, a
    double binary tree across replicas, which no shift of replicas maps onto itself); the shift of GPUs
    inside nodes maps each of those onto the image collective, so the programs are built again folded
    inside nodes only, and every rank's records are the full run's."""
    full, folded = both(GPT3, SMALL_GPT3 + extra)
    assert_same(full, folded, 4)
    note = folded.meta["fold_note"]
    assert note.startswith("only ranks inside nodes folded, not whole nodes: ") and reason in note
    assert folded.iteration_time_s == full.iteration_time_s


@pytest.mark.parametrize("extra, factor", [
    (["platform.network.oversubscription=4", "platform.network.nodes_per_leaf=2"], 4),
    (["platform.network.oversubscription=8", "platform.network.nodes_per_leaf=2", "platform.network.nic_gbps=100",
      "parallelism.zero=0", "comm.algorithm=ring"], 4),
    (["platform.network.oversubscription=4", "platform.network.nodes_per_leaf=1", "parallelism.tp=4",
      "parallelism.dp=8"], 2),
    (["platform.network.oversubscription=4", "platform.network.nodes_per_leaf=3",
      "parallelism.pp_schedule=interleaved", "parallelism.virtual_stages=2"], 4),
    (["platform.network.oversubscription=4", "platform.network.nodes_per_leaf=2",
      "platform.network.topology=fat_tree"], 4),
    (["platform.network.oversubscription=8", "platform.network.nodes_per_leaf=3", "platform.network.nic_gbps=100",
      "platform.network.topology=fat_tree", "parallelism.zero=0", "comm.algorithm=ring"], 4),
], ids=["zero1", "ddp-ring-slow-nic", "tp4", "interleaved-leaves-of-3", "fat-tree", "fat-tree-ddp-ring"])
def test_oversubscribed_core_folds_ranks_inside_nodes(extra, factor):
    """On an oversubscribed core whole nodes do not fold (the spine is shared by the replicas, whose
    leaves need not line up), but ranks inside nodes do: on a rail-optimised fat tree the shift of GPUs
    inside every node moves each rail's leaf and its spine links onto the image rail's; on a plain one
    it leaves each leaf's spine links in place, and the representative's flows stand there for all
    their images. The spine links are kept, and every rank's records are the full run's. The spine
    limits these jobs: the same job without the oversubscription is faster."""
    full, folded = both(GPT3, SMALL_GPT3 + extra)
    assert_same(full, folded, factor)
    assert folded.meta["fold_note"].startswith(
        "only ranks inside nodes folded, not whole nodes: the network core may limit")
    assert folded.iteration_time_s == full.iteration_time_s
    # the representative links (the spine's among them) carry what they carry in the full run
    a, b = full.link_stats.set_index("link"), folded.link_stats.set_index("link")
    spine = [x for x in b.index if "spine" in x]
    assert spine and (b.loc[spine, "nbytes"] > 0).all()
    np.testing.assert_allclose(b[["nbytes", "busy_s"]].to_numpy(), a.loc[b.index, ["nbytes", "busy_s"]].to_numpy(),
                               rtol=1e-9, atol=1e-12)
    core = [x for x in extra if "oversubscription" in x]
    unlimited = simulate(load_job(GPT3, SMALL_GPT3 + [x for x in extra if x not in core]))
    assert unlimited.iteration_time_s < full.iteration_time_s


@pytest.mark.parametrize("routing", ["minimal", "adaptive"])
def test_a_dragonflys_ranks_inside_nodes_fold(routing):
    """Perlmutter's dragonfly (every NIC of a node on one switch): a shift of GPUs inside the nodes
    leaves every switch and every local and global link in place, and the representative's flows
    stand on them for all their images. 64 nodes over two groups: the data-parallel reductions cross
    the global links; every rank's records and every link the folded run keeps are the full run's."""
    full, folded = both(GPT, ["platform=perlmutter_gpu", "nodes=64", "parallelism.tp=4", "parallelism.dp=64",
                              "model.layers=4", "training.batch_per_gpu=2",
                              "platform.network.dragonfly.switches_per_group=8",
                              f"platform.network.dragonfly.routing={routing}"])
    assert_same(full, folded, 4)
    assert folded.meta["fold_note"].startswith("only ranks inside nodes folded, not whole nodes")
    assert folded.iteration_time_s == full.iteration_time_s
    a, b = full.link_stats.set_index("link"), folded.link_stats.set_index("link")
    fabric = [x for x in b.index if not x.startswith("n") and ".nic" not in x]  # between switches
    groups = [re.fullmatch(r"(?:sw|g)(\d+)[.\d]*->(?:sw|g)(\d+)[.\d]*(?:/g\d+)?", x) for x in fabric]
    assert any(m is not None and m.group(1) != m.group(2) for m in groups)  # a global link between the groups
    assert (b.loc[fabric, "nbytes"] > 0).all()
    np.testing.assert_allclose(b[["nbytes", "busy_s"]].to_numpy(), a.loc[b.index, ["nbytes", "busy_s"]].to_numpy(),
                               rtol=1e-9, atol=1e-12)


def test_fold_gives_up_when_latency_differences_add_up(monkeypatch):
    """The same placement with a 10 us spine: 0.36 ms of latency differences in all (a ring's network
    hop pays the spine one way), about 0.05% of the iteration; with a budget of 0.02% the fold gives
    up and every rank is simulated."""
    extra = SMALL_GPT3 + ["platform.network.nodes_per_leaf=6", "platform.network.spine_latency_us=10"]
    job = load_job(GPT3, extra)
    within = simulate(job)
    assert within.meta["fold"] == 16 and "by at most 360.0 us in all" in within.meta["fold_note"]
    share = 360e-6 / within.iteration_time_s
    assert f"({share:.3%} of the iteration)" in within.meta["fold_note"] and 0.0002 < share < 0.005
    monkeypatch.setattr(core, "SLACK_FRACTION", 0.0002)
    over = simulate(job)  # whole nodes give up; ranks inside nodes, whose images share the leaves, fold
    assert over.meta["fold"] == 4 and "more than 0.02%" in over.meta["fold_note"]
    assert over.meta["fold_note"].startswith("only ranks inside nodes folded")
    assert over.iteration_time_s == simulate(job, fold=False).iteration_time_s
    assert within.iteration_time_s == pytest.approx(over.iteration_time_s, rel=5e-3)


def test_replicas_that_straddle_nodes_are_not_folded():
    """6 data-parallel ranks per stage on 4-GPU nodes: no shift of whole nodes maps the job onto itself."""
    folded = simulate(load_job(GPT, ["platform=pcie_4gpu", "nodes=3", "parallelism.dp=6", "parallelism.pp=2",
                                     "model.layers=4", "training.batch_per_gpu=1"]))
    assert folded.meta["fold"] == 1 and "whole nodes" in folded.meta["fold_note"]


def test_dlrm_is_not_folded():
    r = simulate(load_job(ROOT / "workloads" / "dlrm_2x_dgx_a100.yaml"))
    assert r.meta["fold"] == 1 and r.replicas is None


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp=st.sampled_from([2, 4, 8]), pp=st.sampled_from([1, 2]), dp=st.sampled_from([2, 4, 8]),
       mb=st.sampled_from([1, 2]), zero=st.sampled_from([0, 1]), core=st.sampled_from([1, 4]),
       per_leaf=st.sampled_from([1, 2, 3]), fabric=st.sampled_from(["rail_optimized", "fat_tree"]))
def test_fold_is_exact_wherever_it_is_used(tp, pp, dp, mb, zero, core, per_leaf, fabric):
    nodes = tp * pp * dp // 8
    if nodes < 1:
        return
    extra = ["model.layers=4", f"nodes={nodes}", f"parallelism.tp={tp}", f"parallelism.pp={pp}",
             f"parallelism.dp={dp}", f"parallelism.zero={zero}", "training.micro_batch=1",
             f"training.global_batch={dp * mb * max(pp, 2)}"]
    if core > 1:  # an oversubscribed core: ranks inside nodes fold, whatever the leaves
        extra += [f"platform.network.oversubscription={core}", f"platform.network.nodes_per_leaf={per_leaf}",
                  f"platform.network.topology={fabric}"]
    full, folded = both(GPT3, extra)
    if folded.meta["fold"] > 1:
        assert_same(full, folded, folded.meta["fold"])
    else:
        assert folded.iteration_time_s == full.iteration_time_s


def test_fold_map_is_a_shift_of_whole_nodes():
    p, _ = load_platform("dgx_a100")
    topo = Topology(p, 8)
    fm = FoldMap(topo, Replicas(world=64, levels=((32, 8),)))
    names = [lk.name for lk in topo.links]
    for lid, nxt in enumerate(fm.next[0]):
        if nxt < 0:
            assert topo.links[lid].kind == "spine"
            continue
        a, b = names[lid], names[nxt]
        na, nb = (int(re.search(r"(?:^|>)n(\d+)\.", x).group(1)) for x in (a, b))  # type: ignore[union-attr]
        assert nb == (na // 4) * 4 + (na % 4 + 1) % 4  # a stage block of 4 nodes, one replica per node

        def shape(x: str) -> str:  # the link without its node and leaf numbers
            return re.sub(r"(leaf\d+)\.\d+", r"\1", re.sub(r"(^|>)n\d+\.", r"\1n.", x))
        assert shape(a) == shape(b)
        assert topo.links[lid].capacity == topo.links[nxt].capacity
    assert sorted(fm.next[0][fm.next[0] >= 0]) == list(range(topo.nodes * topo.links_per_node))
    reps = {int(x) for x in fm.to_rep if x >= 0}
    assert {int(re.search(r"(?:^|>)n(\d+)\.", names[x]).group(1)) for x in reps} == {0, 4}  # type: ignore[union-attr]


def test_replicas_maps():
    r = Replicas(world=24, levels=((12, 4),))
    assert r.factor == 3 and r.representatives() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert [r.shift(x) for x in (0, 5, 11, 13)] == [4, 9, 3, 17]
    assert [r.rep(x) for x in (0, 5, 11, 23)] == [0, 1, 3, 15]
    with pytest.raises(ValueError):
        Replicas(world=24, levels=((12, 5),))
    assert gpus_per_node(load_job(GPT3)) == 8


@pytest.mark.parametrize("tp, calls_made, factor", [
    (8, [(True, True, True), (True, True, False)], 4),   # whole nodes break; inside nodes hold
    (2, [(True, True, True), (False, False, True)], 1),  # no shift inside nodes at tp 2: every rank
], ids=["tp8", "tp2"])
def test_the_engine_owns_the_fold_fallback(tp, calls_made, factor):
    """``simgpu.engine.shortcuts.run`` decides the fold, runs it and rebuilds where the run finds it
    inexact: the tree case is built folded, breaks across replicas, and is built again folded inside
    nodes only where that may hold, else with every rank."""
    from simgpu.comm.planner import Planner
    from simgpu.engine import EngineOptions, shortcuts
    from simgpu.kernels.registry import make_predictor
    from simgpu.sim import build

    job = load_job(GPT3, SMALL_GPT3 + ["parallelism.zero=0", "comm.algorithm=tree", f"parallelism.tp={tp}",
                                       f"parallelism.dp={32 // tp}"])
    topo = Topology(job.platform, job.workload.nodes, gpus_per_node(job))
    calls: list[tuple[bool, bool, bool]] = []

    def building(fold: bool, inside: bool, micro=None, nodes=True):
        calls.append((fold, inside, nodes))
        return build(job, fold=fold, topo=topo if inside else None, micro_batches=micro, whole_nodes=nodes)

    predictor = make_predictor("analytical", job.platform)
    planner = Planner(topo, job.platform.collectives, "tree")
    out = shortcuts.run(topo, building, lambda w: predictor.predict(w.kernels), planner, EngineOptions())
    assert calls == calls_made
    assert (1 if out.workload.replicas is None else out.workload.replicas.factor) == factor
    assert "not the same seen from every replica" in out.note
    plain = shortcuts.run(topo, building, lambda w: predictor.predict(w.kernels), planner, EngineOptions(),
                          fold=False)
    assert plain.note == "turned off" and calls[-1] == (False, True, True)
    assert plain.result.iteration_time_s == out.result.iteration_time_s
    linked = shortcuts.run(topo, building, lambda w: predictor.predict(w.kernels), planner,
                           EngineOptions(record_links=True))
    assert linked.note == "link intervals are recorded for every link"
