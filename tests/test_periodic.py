"""The periodic shortcut: a pipeline's steady state repeated, the same iteration as every micro-batch.

Each case is simulated both ways; with the shortcut the iteration time, every rank's breakdown,
every record (name and times) and the link statistics match the plain simulation of all
micro-batches, on 1F1B and interleaved schedules, folded and every rank, with the data-parallel
reductions overlapping the cool-down, a slow NIC, an oversubscribed core and a slow rank. Where
the schedule does not repeat (a rank that slows down from one micro-batch to the next), the check
finds it and every micro-batch is simulated; without the check that case would be extrapolated
wrongly. A hypothesis property checks :func:`periodic.extend` on made-up periodic streams.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu import load_job, simulate
from simgpu.comm.planner import Planner
from simgpu.config.checks import gpus_per_node
from simgpu.engine import EngineOptions, periodic, shortcuts
from simgpu.graph import PipelineShape, Workload
from simgpu.kernels.registry import make_predictor
from simgpu.platform.topology import Topology
from simgpu.report.summary import rank_breakdown, summarize
from simgpu.result import LINK_STAT_COLUMNS, RECORD_COLUMNS, SimResult
from simgpu.sim import build

GPT3 = ROOT / "workloads" / "gpt3_175b_1024x_a100.yaml"
#: GPT-3's layer shapes cut to fit the suite: TP8 PP2 DP4 on 8 nodes, 32 micro-batches of 2
PP2 = ["model.layers=4", "nodes=8", "parallelism.tp=8", "parallelism.pp=2", "parallelism.dp=4",
       "training.global_batch=256"]
#: TP4 PP4 DP2 on 4 nodes, 48 micro-batches
PP4 = ["model.layers=8", "model.hidden=4096", "model.heads=32", "nodes=4", "parallelism.tp=4", "parallelism.pp=4",
       "parallelism.dp=2", "training.global_batch=192"]
#: PP2 interleaved over 2 model chunks a stage, 40 micro-batches
INTERLEAVED = ["model.layers=8", "nodes=8", "parallelism.tp=8", "parallelism.pp=2", "parallelism.dp=4",
               "training.global_batch=320", "parallelism.pp_schedule=interleaved", "parallelism.virtual_stages=2"]


def assert_same(plain: SimResult, short: SimResult) -> None:
    assert short.iteration_time_s == pytest.approx(plain.iteration_time_s, rel=1e-9)
    a, b = rank_breakdown(plain), rank_breakdown(short)
    assert list(a.index) == list(b.index)
    np.testing.assert_allclose(b.to_numpy(), a.to_numpy(), rtol=1e-9, atol=1e-9)
    ra, rb = plain.records, short.records
    assert len(ra) == len(rb)
    for col in ("rank", "stream", "name", "category", "kind", "nbytes"):
        assert (ra[col].to_numpy() == rb[col].to_numpy()).all(), col
    np.testing.assert_allclose(rb[["start_s", "end_s"]].to_numpy(), ra[["start_s", "end_s"]].to_numpy(),
                               rtol=0, atol=1e-9 * plain.iteration_time_s)
    la, lb = plain.link_stats.set_index("link"), short.link_stats.set_index("link")
    assert sorted(la.index) == sorted(lb.index)
    np.testing.assert_allclose(lb.loc[la.index, ["nbytes", "busy_s"]].to_numpy(),
                               la[["nbytes", "busy_s"]].to_numpy(), rtol=1e-9, atol=1e-6)
    sa, sb = summarize(plain), summarize(short)
    assert sb["breakdown_ms"] == pytest.approx(sa["breakdown_ms"], rel=1e-6)
    assert sb["categories_ms"] == pytest.approx(sa["categories_ms"], rel=1e-6)
    assert sb["memory_gib"] == sa["memory_gib"] and sb["throughput"] == sa["throughput"]


def both(overrides: list[str], fold: bool = True) -> tuple[SimResult, SimResult]:
    job = load_job(GPT3, overrides)
    return simulate(job, fold=fold, periodic=False), simulate(job, fold=fold)


@pytest.mark.parametrize("overrides, fold, counts", [
    (PP2, True, (6, 7)),
    (PP4, True, (8, 9)),
    (INTERLEAVED, True, (4, 8)),                                            # least and 2 periods inserted
    (PP2, False, (6, 7)),                                                   # every rank
    (PP2 + ["parallelism.zero=0", "comm.algorithm=ring"], True, (6, 7)),   # DDP all-reduce in the cool-down
    (PP2 + ["platform.network.nic_gbps=25"], True, (6, 7)),                 # reductions contend with P2P
    (PP2 + ["platform.network.oversubscription=4", "platform.network.nodes_per_leaf=2"], True, (6, 7)),
], ids=["1f1b-pp2", "1f1b-pp4", "interleaved", "every-rank", "ddp-ring", "slow-nic", "oversubscribed-core"])
def test_periodic_equals_every_micro_batch(overrides, fold, counts):
    plain, short = both(overrides, fold)
    note = short.meta["periodic"]
    assert note.startswith(f"periodic: {counts[0]} and {counts[1]} micro-batches simulated"), note
    assert plain.meta["periodic"] == "turned off"
    assert short.events < plain.events
    assert_same(plain, short)
    assert summarize(short)["periodic"] == note


#: ZeRO-1 with Megatron's overlap_param_gather: two iterations back to back (steady_state auto), the
#: parameter all-gathers of the first under the second's forward
OVERLAP_PARAM_GATHER = ["parallelism.zero=1", "parallelism.overlap_param_gather=true", "training.framework=megatron"]


@pytest.mark.parametrize("extra", [["training.steady_state=always"], OVERLAP_PARAM_GATHER],
                         ids=["steady-always", "overlap-param-gather"])
def test_periodic_equals_every_micro_batch_over_several_iterations(extra):
    """Programs of two iterations: a block inserted in each, copied in each; the steady window is the
    plain run's (iteration time, every rank's breakdown, every record and the link statistics)."""
    plain, short = both(PP2 + extra)
    assert len(plain.meta["iteration_ends_s"]) == 2
    note = short.meta["periodic"]
    assert note.startswith("periodic: 6 and 7 micro-batches simulated") and "each of its 2 iterations" in note, note
    np.testing.assert_allclose(short.meta["iteration_ends_s"], plain.meta["iteration_ends_s"], rtol=1e-9)
    assert short.meta["first_iteration_s"] == pytest.approx(plain.meta["first_iteration_s"], rel=1e-9)
    assert short.meta["steady_state"] == plain.meta["steady_state"]
    assert short.events < plain.events
    assert_same(plain, short)


def test_a_rank_that_slows_down_over_several_iterations_is_not_repeated():
    """Two iterations back to back and a rank that slows down from one kernel to the next: refused,
    every micro-batch simulated."""
    job = load_job(GPT3, PP2 + ["training.steady_state=always"])

    def perturb(w: Workload) -> None:
        _slow_rank(2e-6)(w, growing=True)

    plain = _run(job, perturb, EngineOptions(periodic=False)).result
    out = _run(job, perturb, EngineOptions())
    assert out.periodic.startswith("not used: ") and "all 32 micro-batches simulated" in out.periodic
    assert out.workload.iterations == 2
    assert out.result.iteration_time_s == plain.iteration_time_s
    assert out.result.meta["iteration_ends_s"] == plain.meta["iteration_ends_s"]
    assert_same(plain, out.result)


@pytest.mark.parametrize("extra, fold", [
    ([], 4), (["platform.network.topology=fat_tree"], 4),
    (["parallelism.tp=2", "parallelism.dp=16", "training.global_batch=1024"], 1),
], ids=["rail-optimised", "fat-tree", "tp2"])
def test_oversubscribed_core_folds_inside_nodes_or_not_at_all_and_still_repeats(extra, fold):
    """An oversubscribed core: ranks inside nodes fold (on the rail-optimised fabric and on a plain fat
    tree), or at tp 2, where no shift inside nodes holds, nothing does; either way the schedule repeats."""
    _, short = both(PP2 + ["platform.network.oversubscription=4", "platform.network.nodes_per_leaf=2", *extra])
    assert short.meta["fold"] == fold and "oversubscribed" in short.meta["fold_note"]
    assert short.meta["fold_note"].startswith("only ranks inside nodes folded") == (fold > 1)
    assert short.meta["periodic"].startswith("periodic")


def _run(job, perturb, options: EngineOptions) -> shortcuts.Outcome:
    """``shortcuts.run`` on ``job`` with each program changed by ``perturb(workload)``."""
    topo = Topology(job.platform, job.workload.nodes, gpus_per_node(job))

    def building(fold: bool, inside: bool, micro, nodes: bool = True) -> Workload:
        w = build(job, fold=fold, topo=topo if inside else None, micro_batches=micro, whole_nodes=nodes)
        perturb(w)
        return w

    predictor = make_predictor("analytical", job.platform)
    planner = Planner(topo, job.platform.collectives, "ring")
    return shortcuts.run(topo, building, lambda w: predictor.predict(w.kernels), planner, options)


def _slow_rank(step_s: float):
    """Rank 0's kernels each wait before they start: ``step_s`` each, or, with ``growing``, ``step_s``
    times the kernel's place in the program (a GPU that gets slower and slower)."""
    def perturb(w: Workload, growing: bool = False) -> None:
        kernels = [op for op in w.programs[0].ops if op.kind == "kernel"]
        for i, op in enumerate(kernels):
            op.delay_s = step_s * (i if growing else 1)
    return perturb


def test_a_slow_rank_still_repeats():
    job = load_job(GPT3, PP2)
    perturb = _slow_rank(20e-6)
    plain = _run(job, perturb, EngineOptions(periodic=False)).result
    out = _run(job, perturb, EngineOptions())
    assert out.periodic.startswith("periodic: 6 and 7"), out.periodic
    assert_same(plain, out.result)
    assert plain.iteration_time_s > _run(job, lambda w: None, EngineOptions(periodic=False)).result.iteration_time_s


def test_a_rank_that_slows_down_is_not_repeated():
    """Rank 0's kernels wait longer and longer: no period repeats, the check finds it and every
    micro-batch is simulated. Extending the short runs regardless gives a shorter iteration."""
    job = load_job(GPT3, PP2)

    def perturb(w: Workload) -> None:
        _slow_rank(2e-6)(w, growing=True)

    plain = _run(job, perturb, EngineOptions(periodic=False)).result
    out = _run(job, perturb, EngineOptions())
    assert out.periodic.startswith("not used: ") and "all 32 micro-batches simulated" in out.periodic
    assert out.result.iteration_time_s == plain.iteration_time_s
    assert_same(plain, out.result)
    # what the runs would give without the check: the last period's delays stand for all later ones
    short = _run(load_job(GPT3, PP2[:-1] + ["training.global_batch=48"]), perturb, EngineOptions(periodic=False))
    long = _run(load_job(GPT3, PP2[:-1] + ["training.global_batch=56"]), perturb, EngineOptions(periodic=False))
    d = long.result.iteration_time_s - short.result.iteration_time_s
    assert short.result.iteration_time_s + 26 * d < 0.99 * plain.iteration_time_s


def test_a_pipeline_that_has_not_settled_is_not_repeated(monkeypatch):
    """PP4 from 6 micro-batches: stage 0's gradients still arrive a little later each period (the
    pipeline settles by 8), so the shortcut refuses 6 and 7 and simulates every micro-batch."""
    plain = simulate(load_job(GPT3, PP4), periodic=False)
    monkeypatch.setattr(periodic, "counts", lambda shape: [(6, 7)])
    short = simulate(load_job(GPT3, PP4))
    assert short.meta["periodic"].startswith("not used: the steady state has not settled by 6"), short.meta["periodic"]
    assert_same(plain, short)


def test_interleaved_falls_back_to_the_next_pair_with_the_run_it_has(monkeypatch):
    """Interleaved PP2 over 40 micro-batches tries (4, 8), then (8, 10). With the first pair refused,
    the 8-micro-batch run is used again as the second pair's shorter run (three runs in all), and
    the result is still every micro-batch's."""
    job = load_job(GPT3, INTERLEAVED)
    plain = simulate(job, periodic=False)
    extend, made = periodic.extend, []

    def refuse_least(short, long, m, shape, iterations=1, inserted=1):
        return "refused here" if m == shape.least else extend(short, long, m, shape, iterations, inserted)

    run = shortcuts._Runs.run

    def counting(self, choose):
        out = run(self, choose)
        made.append(out.workload.pipeline.simulated)
        return out

    monkeypatch.setattr(periodic, "extend", refuse_least)
    monkeypatch.setattr(shortcuts._Runs, "run", counting)
    short = simulate(job)
    assert short.meta["periodic"].startswith("periodic: 8 and 10 micro-batches simulated"), short.meta["periodic"]
    assert made == [4, 8, 10]
    assert_same(plain, short)


@pytest.mark.parametrize("overrides, options, why", [
    (PP2 + ["training.global_batch=64"], EngineOptions(), "8 micro-batches are too few"),
    (PP2 + ["parallelism.pp_schedule=gpipe"], EngineOptions(), "no pipeline schedule that repeats"),
    (PP2, EngineOptions(periodic=False), "turned off"),
    (PP2, EngineOptions(record_links=True), "link intervals are recorded"),
], ids=["too-few", "gpipe", "off", "links"])
def test_periodic_turns_itself_off(overrides, options, why):
    out = _run(load_job(GPT3, overrides), lambda w: None, options)
    assert why in out.periodic
    assert out.workload.pipeline is None or out.workload.pipeline.simulated == out.workload.pipeline.micro_batches


def test_short_programs_keep_the_jobs_memory_and_samples():
    job = load_job(GPT3, PP4)
    full = build(job)
    short = build(job, micro_batches=lambda shape: shape.least)
    assert full.pipeline == PipelineShape(micro_batches=48, period=1, least=4, simulated=48)
    assert short.pipeline == PipelineShape(micro_batches=48, period=1, least=4, simulated=4)
    assert short.memory == full.memory and short.samples == full.samples and short.model_flops == full.model_flops
    assert sum(len(p.ops) for p in short.programs) < sum(len(p.ops) for p in full.programs) / 6
    with pytest.raises(ValueError, match="plus a multiple"):
        build(load_job(GPT3, INTERLEAVED), micro_batches=lambda shape: shape.least + 1)


def test_counts_stay_within_the_budget():
    assert periodic.counts(PipelineShape(96, 1, 16)) == [(20, 21)]
    assert periodic.counts(PipelineShape(200, 1, 16)) == [(20, 21), (24, 25)]
    assert periodic.counts(PipelineShape(128, 8, 16)) == [(16, 32), (24, 32)]
    assert periodic.counts(PipelineShape(40, 2, 4)) == [(4, 8), (8, 10)]
    assert periodic.counts(PipelineShape(40, 1, 16)) == []
    assert periodic.counts(PipelineShape(64, 8, 16)) == []
    for shape in (PipelineShape(96, 1, 16), PipelineShape(1000, 4, 8), PipelineShape(37, 1, 2),
                  PipelineShape(128, 8, 16), PipelineShape(50, 3, 6)):
        tried = periodic.counts(shape)
        assert sum(set(c for pair in tried for c in pair)) <= shape.micro_batches
        first = tried[0] if shape.period > 1 else None
        assert first is None or first == (shape.least, shape.least + 2 * shape.period)
        rest = tried[1:] if first else tried
        assert sum(2 * m + shape.period for m, _ in rest) <= periodic.BUDGET * shape.micro_batches
        assert all((m - shape.least) % shape.period == 0 and m > shape.least and m2 == m + shape.period
                   for m, m2 in rest)


# ---- periodic.extend on made-up streams


def _stream(rank: int, names: list[str], starts: list[float], length: float) -> list[tuple]:
    return [(rank, "compute", n, "gemm", "fwd", "kernel", s, s + length, 0, "analytical")
            for n, s in zip(names, starts, strict=True)]


def _result(rows: list[tuple]) -> SimResult:
    rec = pd.DataFrame(rows, columns=list(RECORD_COLUMNS)).sort_values(
        ["rank", "stream", "start_s", "end_s"], kind="stable").reset_index(drop=True)
    links = pd.DataFrame({"link": ["nic0"], "link_kind": ["nic"], "capacity_gbytes_per_s": [25.0],
                          "nbytes": [float(len(rec))], "busy_s": [float(len(rec)) * 1e-3]},
                         columns=list(LINK_STAT_COLUMNS))
    return SimResult(rec, links, float(rec["end_s"].max()), len(rec), {})


@settings(max_examples=40, deadline=None)
@given(head=st.integers(0, 4), block=st.integers(1, 4), tail=st.integers(0, 4), ranks=st.integers(1, 3),
       extra=st.integers(1, 5), period=st.floats(1.0, 10.0), iterations=st.integers(1, 3),
       broken=st.sampled_from([None, 0, 1, 2]), inserted=st.integers(1, 2))
def test_extend_repeats_made_up_periods(head, block, tail, ranks, extra, period, iterations, broken, inserted):
    """Per rank and iteration: ``head`` records, the block once (``m`` micro-batches) or ``1 +
    inserted`` times (``m + inserted``), then ``tail`` records; extended by ``extra`` periods, the
    result is the stream with the block ``extra + 1`` times in each iteration, and the iterations
    end as much later. With ``broken``, the longer run's second block in that iteration is one
    record late: refused (with two inserted, the first of them differs from the second)."""
    inserted = min(inserted, extra)
    step = period / block

    def stream(rank: int, blocks: int, late: int | None = None) -> tuple[list[tuple], list[float]]:
        names: list[str] = []
        starts: list[float] = []
        ends: list[float] = []
        t = 0.0
        for it in range(iterations):
            names += [f"h{i}" for i in range(head)] + [f"b{i}" for i in range(block)] * blocks + \
                [f"t{i}" for i in range(tail)]
            mine = [t + i * 0.5 for i in range(head)]
            t0 = t + head * 0.5
            mine += [t0 + i * step for i in range(block * blocks)]
            t1 = t0 + blocks * period
            mine += [t1 + i * 0.25 for i in range(tail)]
            if late == it:
                mine[head + block] += 0.1 * step
            starts += mine
            t = t1 + tail * 0.25
            ends.append(max(mine) + 0.1 * step)
        return _stream(rank, names, starts, 0.1 * step), ends

    def result(blocks: int, late: int | None = None) -> SimResult:
        rows, ends = [], []
        for k in range(ranks):
            r, e = stream(k, blocks, late if k == ranks - 1 else None)
            rows += r
            ends = e if not ends else [max(x, y) for x, y in zip(ends, e, strict=True)]
        res = _result(rows)
        if iterations > 1:
            res.meta["iteration_ends_s"] = ends
        return res

    late = broken if broken is not None and broken < iterations else None
    short, long = result(1), result(1 + inserted, late)
    shape = PipelineShape(micro_batches=4 + extra, period=1, least=1)
    out = periodic.extend(short, long, 4, shape, iterations, inserted)
    if late is not None:
        assert isinstance(out, str)
        return
    assert isinstance(out, SimResult), out
    want = result(extra + 1)
    assert out.iteration_time_s == pytest.approx(want.iteration_time_s, rel=1e-12)
    pd.testing.assert_frame_equal(out.records, want.records, check_exact=False, rtol=1e-12)
    assert float(out.link_stats["nbytes"].iloc[0]) == len(want.records)
    if iterations > 1:
        np.testing.assert_allclose(out.meta["iteration_ends_s"], want.meta["iteration_ends_s"], rtol=1e-12)


def test_extend_refuses_runs_that_differ_by_more_than_a_block():
    def run(blocks: int, shift: float) -> SimResult:
        names = ["a"] + ["b"] * blocks + ["c"]
        starts = [0.0] + [1.0 + i for i in range(blocks)] + [1.0 + blocks + shift]
        return _result(_stream(0, names, starts, 0.5))

    assert isinstance(periodic.extend(run(2, 0.0), run(3, 0.0), 2, PipelineShape(6, 1, 1)), SimResult)
    why = periodic.extend(run(2, 0.0), run(3, 0.3), 2, PipelineShape(6, 1, 1))
    assert isinstance(why, str) and "has not settled" in why
    short = _result(_stream(0, ["a", "b", "c", "d"], [0, 1, 2, 3], 0.5))
    long = _result(_stream(0, ["a", "b", "b", "c", "d"], [0, 1.2, 2, 3.2, 4], 0.5))
    why = periodic.extend(short, long, 2, PipelineShape(6, 1, 1))
    assert isinstance(why, str) and "more than one inserted block" in why


def test_run_command_turns_it_off(tmp_path):
    import json

    from simgpu.run import main

    path = ROOT / "workloads" / "gpt2_small_pcie_4gpu.yaml"
    for flags, want in (([], "no pipeline schedule"), (["--no-periodic"], "turned off")):
        out = tmp_path / str(len(flags))
        assert main([str(path), "--out", str(out), "--set", "model.layers=1", "--quiet", "--no-trace",
                     "--records", "none", *flags]) == 0
        assert want in json.loads((out / "summary.json").read_text())["periodic"]
