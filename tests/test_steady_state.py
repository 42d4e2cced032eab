"""The steady iteration: programs of two iterations back to back, the distributed optimizer's
parameter all-gathers overlapped with the next forward (overlap_param_gather), and the window that
reports the second iteration with the first one's tail."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_report import make_result, rec

from simgpu import load_job, simulate
from simgpu.engine.steady import TAIL_FRACTION, steady_window
from simgpu.errors import ConfigError
from simgpu.report import summarize
from simgpu.report.gantt import build_timeline_figure
from simgpu.report.summary import exposed_by_kind
from simgpu.result import SimResult
from simgpu.sim import build

GPT = "workloads/gpt_2x_dgx_h100.yaml"
#: A ZeRO-1 job whose first bucket (a small vocabulary's embedding) is small and whose forward is long:
#: every later bucket's all-gather fits under the forward of the layers before it.
ZERO1 = ["model.layers=6", "model.vocab=1024", "training.batch_per_gpu=8", "parallelism.zero=1",
         "training.framework=megatron"]


def run(*extra: str) -> tuple[SimResult, dict]:
    r = simulate(load_job(GPT, [*ZERO1, *extra]))
    return r, summarize(r)


def test_overlaps_off_build_one_iteration():
    job = load_job(GPT, ZERO1)
    assert build(job).iterations == 1
    r, s = run()
    assert "iteration_ends_s" not in r.meta
    assert s["steady_state"].startswith("one isolated iteration: nothing crosses")


def test_never_is_todays_isolated_iteration():
    """steady_state: never with overlap_param_gather builds what the job without it builds."""
    _, off = run()
    _, never = run("parallelism.overlap_param_gather=true", "training.steady_state=never")
    assert never["iteration_time_ms"] == off["iteration_time_ms"]
    assert never["breakdown_ms"] == off["breakdown_ms"]


def test_steady_iteration_is_the_isolated_one_when_nothing_crosses():
    """With nothing in flight at the boundary, two iterations give the isolated one's time back."""
    _, one = run()
    r, two = run("training.steady_state=always")
    assert len(r.meta["iteration_ends_s"]) == 2
    assert two["iteration_time_ms"] == pytest.approx(one["iteration_time_ms"], rel=0.005)
    assert two["steady_state"].startswith("steady: the last of 2 iterations")


def test_overlap_param_gather_hides_all_but_the_first_bucket():
    """Under overlap_param_gather the forward waits for each bucket before the layers that use it:
    only the first bucket it needs (the embedding's) is exposed; without it, every all-gather is."""
    r, s = run("parallelism.overlap_param_gather=true")
    rec = r.records
    ag = rec[rec["name"].str.startswith("params.bucket") & (rec["rank"] == 0)]
    prev = ag[ag["start_s"] < r.iteration_time_s / 2]  # the previous iteration's, from the boundary (0) on
    assert len(prev) > 3
    first = prev.sort_values("start_s").iloc[0]
    first_s = float(first["end_s"] - first["start_s"])
    total_s = float((ag["end_s"] - ag["start_s"]).sum()) / 2  # two iterations' all-gathers
    exposed = s["exposed_communication_by_kind_ms"].get("all_gather", 0.0) / 1e3
    assert total_s > 5 * first_s  # the case the test is about: the first bucket is small
    assert exposed <= first_s * 1.02 + 2e-6
    _, never = run("parallelism.overlap_param_gather=true", "training.steady_state=never")
    assert never["exposed_communication_by_kind_ms"]["all_gather"] / 1e3 >= 0.9 * total_s
    assert s["iteration_time_ms"] < never["iteration_time_ms"] - 0.5 * (total_s - first_s) * 1e3


def test_overlap_param_gather_first_bucket_is_exposed_in_the_steady_state_too():
    """Megatron dispatches the first bucket's all-gather after the optimizer step (distributed
    optimizer: the next iteration's zero_grad, or megatron-core's first forward pre-hook, which
    finish_param_sync dispatches lazily), so nothing of the previous iteration is left to hide it:
    in the steady window every all-gather of the previous iteration starts after its last kernel
    (the step), the first one is exposed in full and the later ones not at all."""
    r, s = run("parallelism.overlap_param_gather=true")
    rec = r.records[(r.records["rank"] == 0) & (r.records["stream"] != "cpu")]
    prev_step = rec[(rec["name"] == "optimizer.step") & (rec["end_s"] <= 1e-12)]
    assert len(prev_step) == 1
    ag = rec[rec["name"].str.startswith("params.bucket") & (rec["start_s"] < r.iteration_time_s / 2)]
    assert (ag["start_s"] >= float(prev_step["end_s"].iloc[0]) - 1e-12).all()
    first = ag.sort_values("start_s").iloc[0]
    first_s = float(first["end_s"] - first["start_s"])
    exposed = s["exposed_communication_by_kind_ms"]["all_gather"] / 1e3
    assert first_s * 0.98 - 2e-6 <= exposed <= first_s * 1.02 + 2e-6


def test_overlap_param_gather_forward_waits_per_bucket():
    """Each of the second iteration's first forwards of a unit depends on its bucket's all-gather of
    the iteration before, and nothing in the first iteration does."""
    w = build(load_job(GPT, [*ZERO1, "parallelism.overlap_param_gather=true"]))
    assert w.iterations == 2
    ops = w.programs[0].ops
    gathers = {i for i, o in enumerate(ops) if o.name.startswith("params.bucket") and o.iteration == 0}
    waiting = [o for o in ops if set(o.deps) & gathers]
    assert waiting and all(o.iteration == 1 and o.phase == "fwd" for o in waiting)
    assert set().union(*(set(o.deps) & gathers for o in waiting)) == gathers
    keys = [o.coll.key for o in ops if o.coll is not None]
    assert len(keys) == len(set(keys))


#: an interleaved pipeline under Megatron's host syncs between steps (pp.sync), 4 micro-batches
INTERLEAVED = ["model.layers=4", "parallelism.pp=2", "parallelism.dp=8", "parallelism.pp_schedule=interleaved",
               "parallelism.virtual_stages=2", "training.grad_accumulation=4"]


@pytest.mark.parametrize("extra", [[], ["training.grad_accumulation=4"], INTERLEAVED],
                         ids=["dp", "dp-4-micro-batches", "interleaved-pp2"])
def test_check_finds_the_second_iteration_already_steady(extra):
    """steady_state: check runs three iterations in full and reports the third: its length is the
    second's (what auto reports), and the summary gives both."""
    r, s = run("parallelism.overlap_param_gather=true", "training.steady_state=check", *extra)
    ends = r.meta["iteration_ends_s"]
    assert len(ends) == 3
    second, third = ends[1] - ends[0], ends[2] - ends[1]
    assert r.iteration_time_s == third
    assert abs(third - second) <= 1e-9 * third
    _, auto = run("parallelism.overlap_param_gather=true", *extra)
    assert s["iteration_time_ms"] == pytest.approx(auto["iteration_time_ms"], rel=1e-9)
    assert s["steady_state"].startswith("steady: the last of 3 iterations")
    assert f"iterations 2 to 3: {second * 1e3:.6f}, {third * 1e3:.6f} ms" in s["steady_state"]
    # the tail the cold first iteration leaves (its step and the all-gathers after it, under the second
    # iteration's head) is the second's (under the third's), one window later
    tails = r.meta["steady_tails"]
    assert [t["iteration"] for t in tails] == [1, 2]
    assert tails[0]["offset_s"] <= 1e-9 * ends[-1]
    assert "each iteration's ops against the previous one's" in s["steady_state"]


def test_tail_repeats_finds_the_op_that_moved(monkeypatch):
    """tail_repeats gives the largest difference, and where it is, between consecutive tails shifted by
    the window; an op moved by hand in the third iteration is found, by its rank and name."""
    from simgpu.engine.shortcuts import Engine
    from simgpu.engine.steady import tail_repeats

    job = load_job(GPT, [*ZERO1, "parallelism.overlap_param_gather=true", "training.steady_state=check"])
    w = build(job)
    assert w.iterations == 3
    seen = {}
    real = Engine.run

    def keep(self):
        out = real(self)
        seen["w"], seen["times"] = self.workload, {k: tuple(a.copy() for a in v) for k, v in self.op_times.items()}
        return out

    monkeypatch.setattr(Engine, "run", keep)
    r = simulate(job)
    ends = r.meta["iteration_ends_s"]
    times = seen["times"]
    clean = tail_repeats(seen["w"], times, ends)
    assert [t.iteration for t in clean] == [1, 2]
    assert clean[0].offset_s <= 1e-9 * ends[-1]
    prog = seen["w"].programs[0]
    last = max(i for i, o in enumerate(prog.ops) if o.iteration == 2 and o.name.startswith("params.bucket"))
    times[prog.rank][1][last] += 1e-3  # its start, a millisecond later
    moved = tail_repeats(seen["w"], times, ends)
    assert moved[0] == clean[0]
    assert moved[1].offset_s >= 1e-3 - abs(clean[1].offset_s)
    assert (moved[1].rank, moved[1].op) == (prog.rank, prog.ops[last].name)


def test_overlap_grad_reduce_is_dp_overlap():
    a = load_job(GPT, ["parallelism.overlap_grad_reduce=false"]).workload.parallelism
    assert a.dp_overlap is False
    with pytest.raises(ConfigError, match="expected"):
        load_job(GPT, ["parallelism.overlap_grad_reduce=false", "parallelism.dp_overlap=true"])


def _two_iterations() -> SimResult:
    rows = [rec(0, "compute", 0, 8), rec(0, "comm", 8, 11, category="all_gather", name="ag"),
            rec(0, "compute", 10, 18), rec(0, "comm", 18, 21, category="all_gather", name="ag")]
    r = make_result(rows, 21.0, with_links=True)
    r.meta["iteration_ends_s"] = [0.008, 0.018]
    return r


def test_steady_window_cuts_the_last_iteration():
    r = steady_window(_two_iterations())
    assert r.iteration_time_s == pytest.approx(0.010)
    # kept: what ends within TAIL_FRACTION of an iteration before the window (the first compute, to -8 ms)
    assert TAIL_FRACTION * 10 < 8
    assert r.records["start_s"].min() == pytest.approx(-0.008)
    # the first iteration's all-gather (8-11 ms) overlaps the second's compute (10-18): 2 ms exposed
    assert exposed_by_kind(r)["all_gather"] == pytest.approx(0.002)
    base = _two_iterations()
    assert r.link_stats["nbytes"].tolist() == pytest.approx((base.link_stats["nbytes"] / 2).tolist())
    fig = build_timeline_figure(r)
    assert fig.axes[0].get_xlim()[0] < 0
    assert steady_window(make_result([rec(0, "compute", 0, 1)], 1.0)).iteration_time_s == pytest.approx(1e-3)


def test_exposed_by_kind_counts_each_kind_outside_compute():
    rows = [rec(0, "compute", 0, 4), rec(0, "comm", 2, 6, category="all_reduce"),
            rec(0, "comm", 5, 7, category="all_gather")]
    got = exposed_by_kind(make_result(rows, 7.0))
    assert got["all_reduce"] == pytest.approx(0.002)
    assert got["all_gather"] == pytest.approx(0.002)
    assert isinstance(got, pd.Series)


PP = ["model.layers=4", "parallelism.pp=2", "parallelism.dp=8", "parallelism.pp_schedule=interleaved",
      "parallelism.virtual_stages=2", "training.grad_accumulation=4", "training.framework=megatron"]


def test_overlap_p2p_comm_waits_on_the_gpu_not_the_host():
    """overlap_p2p_comm: no host wait per step; each receive is waited for by a kernel; and
    the iteration is no longer than with Megatron's batched P2P and host syncs."""
    base = build(load_job(GPT, PP))
    w = build(load_job(GPT, [*PP, "parallelism.overlap_p2p_comm=true"]))
    for prog in w.programs:
        ops = prog.ops
        assert not any(o.name == "pp.sync" for o in ops)
        recvs = {i for i, o in enumerate(ops) if o.name.startswith("pp.recv")}
        waited = {d for o in ops if o.kind == "kernel" for d in o.deps}
        assert recvs and recvs <= waited
    assert any(o.name == "pp.sync" for o in base.programs[0].ops)
    fast = simulate(load_job(GPT, [*PP, "parallelism.overlap_p2p_comm=true"])).iteration_time_s
    slow = simulate(load_job(GPT, PP)).iteration_time_s
    assert fast <= slow
    with pytest.raises(ConfigError, match="expected pp_schedule: interleaved"):
        load_job(GPT, ["parallelism.pp=2", "parallelism.dp=8", "parallelism.overlap_p2p_comm=true"])


def test_the_steady_window_does_not_depend_on_the_first_iterations_earlier_micro_batches():
    """The fact a cheaper steady state would rest on (docs/steady-state.md, "The cost of the steady state"): with
    8 micro-batches, every rank's first iteration cut to its last micro-batch (from its first
    kernel on; the earlier ones reduce nothing) gives the same steady window as the two full
    iterations, here to 1e-9, from fewer ops."""
    from dataclasses import replace

    import numpy as np

    from simgpu.comm.planner import Planner
    from simgpu.config.checks import gpus_per_node
    from simgpu.engine import Engine, EngineOptions
    from simgpu.graph import Program
    from simgpu.kernels.overlap import memory_bound
    from simgpu.kernels.registry import make_predictor
    from simgpu.platform.topology import Topology
    from simgpu.report.summary import rank_breakdown
    from simgpu.sim import DEFAULT_KERNEL_MODEL

    job = load_job(GPT, [*ZERO1, "parallelism.overlap_param_gather=true", "training.grad_accumulation=8"])
    p = job.platform
    topo = Topology(p, job.workload.nodes, gpus_per_node(job))
    w = build(job, fold=True, topo=topo)
    w.memory_bound = memory_bound(w.kernels, p.gpu)
    progs = []
    for prog in w.programs:
        ops = prog.ops
        c = max(i for i, o in enumerate(ops) if o.iteration == 0 and o.phase == "data") + 1
        starts = [i for i, o in enumerate(ops[:c]) if o.phase == "data" and (i == 0 or ops[i - 1].phase != "data")]
        assert len(starts) == 8  # the micro-batches of the first iteration
        progs.append(Program(prog.rank, [replace(o, deps=tuple(d - c for d in o.deps if d >= c)) for o in ops[c:]]))
    cut = replace(w, programs=progs)
    durations, models = make_predictor(DEFAULT_KERNEL_MODEL, p).predict(w.kernels)
    g = p.gpu
    opts = EngineOptions(launch_s=p.host.launch_us * 1e-6, cpu_threads_per_node=p.host.cpu_threads,
                         overlap_slowdown=g.overlap_slowdown, sms=g.sms,
                         overlap_slowdown_by_op=tuple(sorted(g.overlap_slowdown_by_op.items())),
                         overlap_slowdown_memory=tuple(sorted(g.overlap_slowdown_memory.items())))
    planner = Planner(topo, p.collectives)
    full, short = (steady_window(Engine(topo, x, np.asarray(durations), models, planner, opts).run())
                   for x in (w, cut))
    assert sum(len(q.ops) for q in cut.programs) < 0.6 * sum(len(q.ops) for q in w.programs)
    assert short.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-9)
    a, b = rank_breakdown(full), rank_breakdown(short)
    np.testing.assert_allclose(b.to_numpy(), a.to_numpy(), rtol=0, atol=1e-9 * full.iteration_time_s)


# -- the shortened first iteration (simgpu.engine.steady_cut, steady_check) against both iterations in full --

OPG = [*ZERO1, "parallelism.overlap_param_gather=true"]


def _both(path: str, overrides: list[str]) -> tuple[SimResult, SimResult]:
    job = load_job(path, overrides)
    return simulate(job), simulate(job, steady_cut=False)


def _same(cut: SimResult, full: SimResult) -> None:
    """The same iteration time and per-rank breakdown to 1e-9, the same bytes per link, each link's busy
    time in the window to 1e-9 of the iteration."""
    import numpy as np

    from simgpu.report.summary import rank_breakdown

    t = full.iteration_time_s
    assert cut.iteration_time_s == pytest.approx(t, rel=1e-9, abs=0)
    np.testing.assert_allclose(rank_breakdown(cut).to_numpy(), rank_breakdown(full).to_numpy(), rtol=0, atol=1e-9 * t)
    a = cut.link_stats.set_index("link")["nbytes"]
    b = full.link_stats.set_index("link")["nbytes"]
    assert sorted(a.index) == sorted(b.index)
    np.testing.assert_allclose(a.loc[b.index].to_numpy(), b.to_numpy(), rtol=1e-12, atol=0)
    busy_a = cut.link_stats.set_index("link")["busy_s"]
    busy_b = full.link_stats.set_index("link")["busy_s"]
    np.testing.assert_allclose(busy_a.loc[busy_b.index].to_numpy(), busy_b.to_numpy(), rtol=0, atol=1e-9 * t)


@pytest.mark.parametrize("ga,job", [(1, OPG), (4, OPG), (8, OPG), (8, OPG[3:])], ids=["1", "4", "8", "8-workload"])
def test_the_shortened_first_iteration_gives_the_full_runs_steady_iteration(ga, job):
    """ZeRO-1 with overlap_param_gather: with one micro-batch there is nothing to drop; with 4 and 8 the
    cut is used and agrees with both iterations simulated in full. Also on the workload's own model at
    8, where the second iteration's input copies would meet the first's reduce-scatters in the cut
    run if they moved their bytes there (the full run's run long before any kept op)."""
    cut, full = _both(GPT, [*job, f"training.grad_accumulation={ga}"])
    _same(cut, full)
    note = summarize(cut)["steady_state"]
    if ga == 1:
        assert cut.meta["steady_cut"].startswith("not used: rank 0's first iteration has 1 micro-batch")
        assert note == summarize(full)["steady_state"]
    else:
        assert cut.meta["steady_cut"].startswith("used (") and "shortened first iteration used" in note
        assert cut.events < 0.75 * full.events
    assert full.meta["steady_cut"] == "not used: turned off"
    assert "shortened" not in summarize(full)["steady_state"]


def test_the_full_runs_link_statistics_are_its_second_iterations():
    """Link bytes are what the second iteration's ops move (each iteration moves the same here, so they
    are half the run's), busy times what lies within the window."""
    job = load_job(GPT, [*OPG, "training.grad_accumulation=2"])
    r = simulate(job, steady_cut=False)
    from simgpu.sim import build as build_programs

    assert build_programs(job).iterations == 2
    assert (r.link_stats["nbytes"] > 0).all()
    assert (r.link_stats["busy_s"] <= r.iteration_time_s * (1 + 1e-12)).all()


def test_the_shortened_first_iteration_on_an_interleaved_pipeline():
    """An interleaved pipeline under overlap_param_gather: Megatron's host syncs between pipeline steps
    keep the cut from being tried (the CPU's position in the full run would be unknown), and the
    steady iteration is the full run's."""
    pp = [*PP, "parallelism.zero=1", "parallelism.overlap_param_gather=true"]
    cut, full = _both(GPT, pp)
    _same(cut, full)
    assert cut.meta["steady_cut"].startswith("not used: rank 0 waits on the host ('pp.sync')")


PCIE = "workloads/gpt2_small_pcie_4gpu.yaml"


def test_the_shortened_first_iteration_refuses_where_the_copies_share_links():
    """On a PCIe box with tensor parallelism the forward's all-reduces between the GPUs cross the link
    into each GPU that its input copies take. The second iteration's copies, issued by the CPU far
    ahead, run in the full run among the dropped micro-batches' all-reduces: the check cannot rule
    out that they meet there, refuses, and both iterations are simulated in full."""
    over = ["parallelism.zero=1", "training.framework=megatron", "parallelism.overlap_param_gather=true",
            "training.grad_accumulation=4", "parallelism.tp=2", "parallelism.dp=2"]
    cut, full = _both(PCIE, over)
    want = "not used: rank 0's copy 'batch.h2d', run with no bytes, shares a link with a dropped collective"
    assert cut.meta["steady_cut"].startswith(want), cut.meta["steady_cut"]
    _same(cut, full)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.integers(1, 3), ga=st.integers(2, 5), batch=st.sampled_from([2, 4, 8]),
       tp=st.sampled_from([1, 2]), cp=st.sampled_from([1, 2]), nic=st.sampled_from([100, 400]))
def test_the_shortened_first_iteration_is_the_full_run_on_small_jobs(layers, ga, batch, tp, cp, nic):
    """Whichever way the check decides, the steady iteration is the full run's."""
    over = ["model.vocab=1024", "parallelism.zero=1", "training.framework=megatron",
            "parallelism.overlap_param_gather=true", f"model.layers={layers}", f"training.grad_accumulation={ga}",
            f"training.batch_per_gpu={batch}", f"parallelism.tp={tp}", f"parallelism.cp={cp}",
            f"parallelism.dp={16 // tp // cp}", f"platform.network.nic_gbps={nic}"]
    cut, full = _both(GPT, over)
    _same(cut, full)


@pytest.mark.parametrize("cp_comm", ["ring", "all_gather"])
def test_context_parallel_jobs_are_not_cut(cp_comm, monkeypatch):
    """Context parallelism's communication is not cut: on this job (found by the property above) the
    check passes a cut whose window is 3.4e-4 off the full run's; it is refused up front, at no cost."""
    from simgpu.engine import steady_cut

    over = [*OPG, "model.layers=1", "training.grad_accumulation=5", "parallelism.cp=2", "parallelism.dp=8",
            "platform.network.nic_gbps=100", f"parallelism.cp_comm={cp_comm}"]
    cut, full = _both(GPT, over)
    assert cut.meta["steady_cut"].startswith("not used: rank 0 runs context parallelism's communication")
    _same(cut, full)
    if cp_comm == "ring":  # the cut, were it allowed, runs (it was 3.4e-4 off the full run under the kernel
        # models of version 3; those of version 4 happen to leave this job's cut exact, so the refusal
        # rests on the mechanism (a memory-bound kernel's slowdown decided by one instant's order), not
        # on this job's figure)
        monkeypatch.setattr(steady_cut, "CP_STREAMS", frozenset())
        forced = simulate(load_job(GPT, over))
        assert forced.meta["steady_cut"].startswith("used (")


def test_run_command_turns_the_shortened_first_iteration_off(tmp_path):
    """`--no-steady-cut` simulates both iterations in full; the steady_state line says which way."""
    import json

    from simgpu.run import main

    over = [x for o in [*OPG, "training.grad_accumulation=4"] for x in ("--set", o)]
    lines = {}
    for flags in ([], ["--no-steady-cut"]):
        out = tmp_path / str(len(flags))
        assert main([GPT, "--out", str(out), *over, "--quiet", "--no-trace", "--records", "none", *flags]) == 0
        lines[len(flags)] = json.loads((out / "summary.json").read_text())
    assert "shortened first iteration used" in lines[0]["steady_state"]
    assert "shortened" not in lines[1]["steady_state"]
    assert lines[0]["iteration_time_ms"] == lines[1]["iteration_time_ms"]


def _own_copies(workload, slow_rank=None):
    """``workload`` with every program's ops its own objects and no template (each rank read on its own);
    ``slow_rank``'s ops after its first take twice the launch time."""
    from dataclasses import replace as dc_replace

    from simgpu.graph import Program

    progs = []
    for p in workload.programs:
        ops = [dc_replace(o) for o in p.ops]
        if p.rank == slow_rank:
            ops = [ops[0]] + [dc_replace(o, cpu_s=50 * (o.cpu_s or 5e-6)) for o in ops[1:]]
        progs.append(Program(p.rank, ops))
    return dc_replace(workload, programs=progs)


@pytest.mark.parametrize("over", [[*OPG, "training.grad_accumulation=4"],
                                  [*OPG, "training.grad_accumulation=4", "parallelism.tp=2", "parallelism.dp=8"]],
                         ids=["dp16", "tp2"])
def test_shorten_and_check_read_once_per_template_as_rank_by_rank(over):
    """``shorten`` and ``check`` work out what a template's ranks share once; the cut programs, the copies
    taken off, and the check's verdict are those of every rank read on its own (programs with no template),
    and a rank whose own ops take another host time than its template's is read as its own."""
    from dataclasses import replace as dc_replace

    import numpy as np

    from simgpu.comm.planner import Planner
    from simgpu.config.checks import gpus_per_node
    from simgpu.engine import Engine, EngineOptions, steady_check, steady_cut
    from simgpu.kernels.registry import make_predictor
    from simgpu.platform.topology import Topology
    from simgpu.sim import DEFAULT_KERNEL_MODEL

    job = load_job(GPT, over)
    p = job.platform
    topo = Topology(p, job.workload.nodes, gpus_per_node(job))
    full = build(job)
    assert any(prog.template is not None and prog.ops is not prog.template for prog in full.programs)
    durations, models = make_predictor(DEFAULT_KERNEL_MODEL, p).predict(full.kernels)
    options = EngineOptions(launch_s=p.host.launch_us * 1e-6, cpu_threads_per_node=p.host.cpu_threads,
                            overlap_slowdown=p.gpu.overlap_slowdown, sms=p.gpu.sms, op_times=True)
    verdicts = []
    for slow in (None, full.programs[1].rank):
        shared = full
        if slow is not None:  # the slow rank keeps its template, its ops their own host time
            shared = dc_replace(full, programs=[
                q if q.rank != slow else dc_replace(q, ops=_own_copies(full, slow).programs[i].ops)
                for i, q in enumerate(full.programs)])
        own = _own_copies(full, slow)
        a, b = steady_cut.shorten(shared), steady_cut.shorten(own)
        assert not isinstance(a, str) and not isinstance(b, str)
        assert a.dropped == b.dropped and a.off == b.off
        for pa, pb in zip(a.workload.programs, b.workload.programs, strict=True):
            assert pa.rank == pb.rank and pa.ops == pb.ops
        assert (steady_check._early_copies(shared, a, topo, None, options.launch_s, 1.0)
                == steady_check._early_copies(own, b, topo, None, options.launch_s, 1.0))
        got = []
        for cut, prog in ((a, shared), (b, own)):
            planner = Planner(topo, p.collectives, job.workload.comm.algorithm, job.workload.comm.protocol)
            r = Engine(topo, cut.workload, durations, models, planner, options).run()
            got.append((r.iteration_time_s, steady_check.check(r, cut, prog, topo, planner,
                                                         np.asarray(durations).tolist(), options)))
        assert got[0] == got[1]
        verdicts.append(got[0][1])
    assert verdicts[0] == ""  # the cut holds on the job as built


REPEATS = {
    "zero1 opg": [*OPG, "training.grad_accumulation=4"],
    "tp2 sp userbuffers fp8": [*OPG, "parallelism.tp=2", "parallelism.dp=8", "parallelism.sp=true",
                               "parallelism.tp_comm_overlap=true", "training.precision=fp8",
                               "training.grad_accumulation=2"],
    "interleaved pp2 opg": [*PP, "parallelism.zero=1", "parallelism.overlap_param_gather=true"],
    "interleaved pp2 overlap_p2p": [*PP, "parallelism.zero=1", "parallelism.overlap_param_gather=true",
                                    "parallelism.overlap_p2p_comm=true"],
    "ddp bucket copies, always": [*ZERO1[:3], "training.steady_state=always", "training.grad_accumulation=2"],
    "zero1 without opg, always": [*ZERO1, "training.steady_state=always"],
    "zero3, always (emitted)": [*ZERO1[:3], "parallelism.zero=3", "training.steady_state=always"],
}


@pytest.mark.parametrize("over", list(REPEATS.values()), ids=list(REPEATS))
@pytest.mark.parametrize("fold", [False, True], ids=["every rank", "folded"])
def test_later_iterations_repeat_the_first_as_emitting_them_would(over, fold, monkeypatch):
    """The Transformer builder emits the first of several iterations once and repeats its ops (keys
    tagged, the waits on the previous iteration's all-gathers put where the first iteration's waits
    stood): every rank's program is the one emitting each iteration gives, op for op."""
    from simgpu.config.checks import gpus_per_node
    from simgpu.platform.topology import Topology
    from simgpu.workload.transformer import builder

    job = load_job(GPT, over)
    topo = Topology(job.platform, job.workload.nodes, gpus_per_node(job))
    repeated = build(job, fold=fold, topo=topo)
    monkeypatch.setattr(builder, "REPEAT_ITERATIONS", False)
    emitted = build(job, fold=fold, topo=topo)
    assert repeated.iterations == emitted.iterations == 2
    assert [p.rank for p in repeated.programs] == [p.rank for p in emitted.programs]
    for a, b in zip(repeated.programs, emitted.programs, strict=True):
        assert a.ops == b.ops
    if "parallelism.overlap_param_gather=true" in over:  # the second forward waits on the first step's all-gathers
        p = repeated.programs[0]
        waited = {p.ops[d].name for o in p.ops if o.iteration == 1 for d in o.deps if p.ops[d].iteration == 0}
        assert waited and all(n.startswith("params.") and n.endswith(".all_gather") for n in waited)
