"""The engine's records: built once from every op's times, in the order the events gave them, and
the same whether a stage's ranks share their ops (Program.template) or each has its own copies."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import run_programs

from simgpu.comm.planner import Planner
from simgpu.config.checks import gpus_per_node
from simgpu.config.loader import load_job
from simgpu.engine import EngineOptions
from simgpu.engine.core import Engine
from simgpu.graph import CollectiveCall, Op, Program, Workload
from simgpu.kernels.registry import make_predictor
from simgpu.platform.topology import Topology
from simgpu.result import RECORD_COLUMNS
from simgpu.sim import build

ROOT = Path(__file__).resolve().parents[1]


def test_ties_keep_the_order_the_records_happened_in(dgx_a100):
    """Records of one rank and stream with the same start and end keep the order they happened in:
    zero host times and zero-length kernels put a host op, launches, a host_wait and kernels all at
    t = 0."""
    p = Program(0)
    p.add(Op("h", "host", "host", cpu_s=0.0))
    a = p.add(Op("a", "kernel", "elementwise", kernel=0, cpu_s=0.0))
    b = p.add(Op("b", "kernel", "elementwise", kernel=0, cpu_s=0.0, deps=(a,)))
    p.add(Op("w", "host_wait", "sync", deps=(b,), cpu_s=0.0))
    p.add(Op("c", "kernel", "elementwise", kernel=0, cpu_s=0.0))
    p.add(Op("x", "kernel", "elementwise", kernel=0, stream="copy", cpu_s=0.0))
    res = run_programs(dgx_a100, 1, [p], [0.0], gpus_per_node=1)
    rec = res.records
    assert (rec["start_s"] == 0.0).all() and (rec["end_s"] == 0.0).all()
    got = list(zip(rec["stream"], rec["name"], rec["kind"], strict=True))
    assert got == [("compute", "a", "kernel"), ("compute", "b", "kernel"), ("compute", "c", "kernel"),
                   ("copy", "x", "kernel"),
                   ("cpu", "h", "host"), ("cpu", "a", "launch"), ("cpu", "b", "launch"), ("cpu", "w", "launch"),
                   ("cpu", "w", "host_wait"), ("cpu", "c", "launch"), ("cpu", "x", "launch")]


def test_records_of_a_small_program(dgx_a100):
    """Each column as the op and its run give it: a launch on the CPU thread, the kernel on its stream
    with its model, a collective's bytes and the network as its model, a host_wait's wait."""
    progs = []
    for r in range(2):
        p = Program(r)
        k = p.add(Op("k", "kernel", "gemm", phase="bwd", kernel=0))
        ar = p.add(Op("ar", "collective", "all_reduce", stream="comm", nbytes=1 << 20, deps=(k,),
                      coll=CollectiveCall("ar", "all_reduce", (0, 1), 1 << 20)))
        p.add(Op("sync", "host_wait", "sync", deps=(ar,)))
        progs.append(p)
    res = run_programs(dgx_a100, 1, progs, [10e-6], gpus_per_node=2, launch_s=2e-6)
    rec = res.records
    assert list(rec.columns) == list(RECORD_COLUMNS)
    assert len(rec) == 2 * 6  # each op: its launch and its own record
    r0 = rec[rec["rank"] == 0].set_index(["stream", "kind"])
    assert r0.loc[("compute", "kernel"), "model"] == "fixed"
    assert r0.loc[("compute", "kernel"), "start_s"] == pytest.approx(2e-6)
    assert r0.loc[("comm", "collective"), "nbytes"] == 1 << 20
    assert r0.loc[("comm", "collective"), "model"] == "network"
    wait = r0.loc[("cpu", "host_wait")]
    assert wait["start_s"] == pytest.approx(6e-6)  # three launches of 2 us
    assert wait["end_s"] == r0.loc[("comm", "collective"), "end_s"]
    assert rec.equals(rec.sort_values(["rank", "stream", "start_s", "end_s"], kind="stable").reset_index(drop=True))


CASES = {
    # PP2 TP8 DP4: stages differ, a stage's ranks share their ops
    "gpt-3 pp2": ("workloads/gpt3_175b_1024x_a100.yaml",
                  ["model.layers=4", "nodes=8", "parallelism.tp=8", "parallelism.pp=2", "parallelism.dp=4",
                   "training.global_batch=64"]),
    # ZeRO-1 with the parameter all-gathers overlapped: two iterations, collectives on several streams
    "gpt zero-1": ("workloads/gpt3_175b_1024x_a100.yaml",
                   ["model.layers=2", "nodes=2", "parallelism.tp=4", "parallelism.pp=2", "parallelism.dp=2",
                    "training.global_batch=16", "parallelism.zero=1", "parallelism.overlap_param_gather=true",
                    "training.framework=megatron"]),
    # DLRM: every rank its own program (no template), all-to-alls
    "dlrm": ("workloads/dlrm_2x_dgx_a100.yaml", []),
}


def _engine(name: str, own_copies: bool) -> tuple[Engine, Workload]:
    path, overrides = CASES[name]
    job = load_job(ROOT / path, overrides)
    p = job.platform
    topo = Topology(p, job.workload.nodes, gpus_per_node(job))
    workload = build(job, fold=False)
    if own_copies:  # every rank its own Op objects, no template
        workload.programs = [Program(q.rank, [copy.copy(o) for o in q.ops]) for q in workload.programs]
    durations, models = make_predictor(("learned", "analytical"), p).predict(workload.kernels)
    options = EngineOptions(launch_s=p.host.launch_us * 1e-6, cpu_threads_per_node=p.host.cpu_threads,
                            overlap_slowdown=p.gpu.overlap_slowdown, sms=p.gpu.sms,
                            overlap_slowdown_by_op=tuple(sorted(p.gpu.overlap_slowdown_by_op.items())))
    planner = Planner(topo, p.collectives, job.workload.comm.algorithm, job.workload.comm.protocol)
    return Engine(topo, workload, durations, models, planner, options), workload


@pytest.mark.parametrize("name", sorted(CASES))
def test_shared_ops_run_as_own_copies(name):
    """Ranks sharing their stage's ops and the engine's per-op tables give the records, link
    statistics, events and iteration that ranks with their own copies of every op give."""
    shared, workload = _engine(name, own_copies=False)
    if name != "dlrm":
        assert all(q.template is not None for q in workload.programs)
        ops = {id(o) for q in workload.programs for o in q.ops}
        assert len(ops) < sum(len(q.ops) for q in workload.programs) / 2  # shared, not copied
    a = shared.run()
    own, _ = _engine(name, own_copies=True)
    b = own.run()
    pd.testing.assert_frame_equal(a.records, b.records)
    pd.testing.assert_frame_equal(a.link_stats, b.link_stats)
    assert (a.events, a.iteration_time_s, a.meta) == (b.events, b.iteration_time_s, b.meta)
    counts = a.records.groupby("rank").size()
    expected = {q.rank: len(q.ops) + sum(o.kind != "host" for o in q.ops) for q in workload.programs}
    assert counts.to_dict() == expected
    assert np.isfinite(a.records[["start_s", "end_s"]].to_numpy()).all()


def test_run_time_is_the_last_record_end():
    """``run_time`` (what the inference timer asks) is the records' last end, without the table."""
    engine, _ = _engine("gpt zero-1", own_copies=False)
    t = engine.run_time()
    again, _ = _engine("gpt zero-1", own_copies=False)
    assert t == float(again.run().records["end_s"].max())


def test_records_are_compact_columns(dgx_a100):
    """The string columns are categoricals whose categories are the strings each holds, sorted (so
    sorting by them sorts by the strings), with small integer codes and none missing; the rank is
    int32, the times float64 and the bytes int64."""
    engine, _ = _engine("gpt-3 pp2", own_copies=False)
    rec = engine.run().records
    assert rec["rank"].dtype == np.int32
    assert (rec["start_s"].dtype, rec["end_s"].dtype, rec["nbytes"].dtype) == (np.float64, np.float64, np.int64)
    for col in ("stream", "name", "category", "phase", "kind", "model"):
        values = rec[col]
        assert isinstance(values.dtype, pd.CategoricalDtype), col
        cats = [str(c) for c in values.cat.categories]
        assert cats == sorted(cats) and set(cats) == set(values.astype(str)), col
        assert values.cat.codes.dtype.itemsize <= 2 and (values.cat.codes >= 0).all(), col
    plain = rec.astype({c: str for c in ("stream", "name", "category", "phase", "kind", "model")})
    again = plain.sort_values(["rank", "stream", "start_s", "end_s"], kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(plain, again)


def test_readers_give_the_same_with_string_columns():
    """Every reader of the records (breakdowns, categories, exposed communication, kernel seconds,
    the steady window's records, the trace and the written table) gives the same from the engine's
    categorical columns as from the same records with plain string columns."""
    from dataclasses import replace

    from simgpu.report.chrome_trace import chrome_trace
    from simgpu.report.outputs import records_table
    from simgpu.report.summary import category_times, exposed_by_kind, rank_breakdown, summarize
    from simgpu.sim import kernel_seconds, simulate

    path, overrides = CASES["gpt zero-1"]
    res = simulate(load_job(ROOT / path, overrides), fold=False)
    rec = res.records
    assert isinstance(rec["name"].dtype, pd.CategoricalDtype)
    strings = rec.astype({c: str for c in ("stream", "name", "category", "phase", "kind", "model")})
    plain = replace(res, records=strings)
    pd.testing.assert_frame_equal(rank_breakdown(res), rank_breakdown(plain))
    pd.testing.assert_series_equal(category_times(res), category_times(plain))
    pd.testing.assert_series_equal(exposed_by_kind(res), exposed_by_kind(plain))
    assert kernel_seconds(rec) == kernel_seconds(strings)
    assert summarize(res) == summarize(plain)
    assert chrome_trace(res) == chrome_trace(plain)
    pd.testing.assert_frame_equal(records_table(res).astype(strings.dtypes.drop(["start_s", "end_s"]).to_dict()),
                                  records_table(plain))


def test_a_missing_category_reads_as_other():
    """A categorical category column with a missing value reads as "other" where the report groups
    by category, as a column of strings does."""
    from simgpu.report.summary import or_other

    col = pd.Series(pd.Categorical(["gemm", None, "gemm"]))
    assert or_other(col).astype(str).tolist() == ["gemm", "other", "gemm"]
    assert or_other(pd.Series(["gemm", None], dtype=object)).tolist() == ["gemm", "other"]
    full = pd.Series(pd.Categorical(["gemm"]))
    assert or_other(full) is full
