"""ZeRO-3 / FSDP: forward and backward prefetch, the rate limiter and reshard after forward, checked
on the simulated timeline of one rank against what each setting of PyTorch FSDP lets overlap."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_transformer_build import LAYERS, build, check_collectives, spec

from simgpu import load_job, simulate
from simgpu.config.transformer import TransformerModel
from simgpu.result import SimResult
from simgpu.sim import build as build_job
from simgpu.workload import World
from simgpu.workload.transformer.memory import weight_bytes
from simgpu.workload.transformer.shapes import block, make_setup, parameter_count

GPT = "workloads/gpt_2x_dgx_h100.yaml"
L = 4
#: A ZeRO-3 job over two nodes: a block's all-gather (100 MB over InfiniBand) and its compute take
#: about as long, so which of them waits shows.
FSDP = [f"model.layers={L}", "model.vocab=1024", "training.batch_per_gpu=8", "parallelism.zero=3"]
#: On one node (NVLink) a block's all-gather is much shorter than its forward.
ONE_NODE = [*FSDP, "nodes=1", "parallelism.dp=8"]
EPS = 1e-9


def run(*extra: str, base: list[str] = FSDP) -> tuple[SimResult, pd.DataFrame]:
    r = simulate(load_job(GPT, [*base, *extra]))
    rec = r.records
    return r, rec[(rec["rank"] == 0) & (rec["stream"] != "cpu")]   # the GPU's, not the host's


def one(rec: pd.DataFrame, name: str, phase: str) -> pd.Series:
    rows = rec[(rec["name"] == name) & (rec["phase"] == phase)]
    assert len(rows) == 1, (name, phase, len(rows))
    return rows.iloc[0]


def compute(rec: pd.DataFrame, unit: str, phase: str) -> tuple[float, float]:
    """Start and end of ``unit``'s kernels in ``phase``, its copy out of the gathered weights aside."""
    k = rec[rec["name"].str.startswith(unit + ".") & (rec["phase"] == phase) & (rec["stream"] == "compute")
            & (rec["kind"] == "kernel") & (rec["name"] != f"{unit}.copy_out")]
    return float(k["start_s"].min()), float(k["end_s"].max())


def reduce_scatter(rec: pd.DataFrame, k: int) -> pd.Series:
    """Block k's gradient reduce-scatter: one bucket per unit in backward order (head first)."""
    return one(rec, f"grads.g0.mb0.bucket{L - k}.reduce_scatter", "bwd")


def test_backward_prefetch_none_exposes_each_all_gather_behind_the_reduce_scatter():
    """backward_prefetch: none gathers block k-1 when its backward starts, after block k's
    reduce-scatter on the process group's stream: nothing overlaps the all-gather."""
    _, rec = run("parallelism.backward_prefetch=none")
    for k in range(L - 1, 0, -1):
        _, end_k = compute(rec, f"h{k}", "bwd")
        ag = one(rec, f"h{k - 1}.all_gather", "bwd")
        rs = reduce_scatter(rec, k)
        assert ag["start_s"] >= rs["end_s"] - EPS >= end_k - EPS
        start_next, _ = compute(rec, f"h{k - 1}", "bwd")
        assert start_next >= ag["end_s"] - EPS
        # the gap between the two blocks' kernels is the reduce-scatter and the all-gather back to back
        assert start_next - end_k >= (rs["end_s"] - end_k) + (ag["end_s"] - ag["start_s"]) - 1e-7


def test_backward_pre_hides_the_next_all_gather_under_this_block():
    """The default, backward_pre, issues block k-1's all-gather before block k's gradient kernels:
    where it fits under them, block k-1's backward follows block k's with no wait for it."""
    _, rec = run()
    fits = 0
    for k in range(L - 1, 0, -1):
        _, end_k = compute(rec, f"h{k}", "bwd")
        ag = one(rec, f"h{k - 1}.all_gather", "bwd")
        assert ag["start_s"] < end_k
        if ag["end_s"] <= end_k:
            fits += 1
            copy = one(rec, f"h{k - 1}.copy_out", "bwd")
            assert copy["start_s"] - end_k < 1e-5   # a launch gap, no communication wait
    assert fits >= L - 2  # the case the test is about: the all-gathers fit under the block before


def test_backward_post_gathers_in_the_post_backward_hook_ahead_of_the_reduce_scatter():
    """backward_post issues block k-1's all-gather in block k's post-backward hook, after its
    gradient kernels and before its reduce-scatter (FSDP's ``_post_backward_reshard`` prefetches,
    then ``_reduce_grad``): on the group's one NCCL stream the reduce-scatter waits for the
    all-gather. The hook runs once block k's last gradient (its first norm's) is produced, so only
    the residual's gradient may still run beside the all-gather. The time lies between
    backward_pre's and none's."""
    r_post, rec = run("parallelism.backward_prefetch=backward_post")
    for k in range(L - 1, 0, -1):
        _, end_k = compute(rec, f"h{k}", "bwd")
        last_grad = one(rec, f"h{k}.ln1.bwd", "bwd")["end_s"]
        ag = one(rec, f"h{k - 1}.all_gather", "bwd")
        rs = reduce_scatter(rec, k)
        assert last_grad - EPS <= ag["start_s"] and ag["end_s"] <= rs["start_s"] + EPS
        assert ag["end_s"] > end_k   # exposed: block k-1 waits for it
    r_pre, _ = run()
    r_none, _ = run("parallelism.backward_prefetch=none")
    assert r_pre.iteration_time_s < r_post.iteration_time_s < r_none.iteration_time_s


def test_one_process_group_serialises_its_all_gathers_and_reduce_scatters():
    """PyTorch runs one process group's collectives on its communicator's one NCCL stream, in the
    order the CPU issued them: under backward_pre block k-2's all-gather (issued before block k-1's
    gradient kernels) waits for block k's reduce-scatter (issued after block k's), and no two of
    the group's collectives run at once."""
    _, rec = run()
    for k in range(L - 1, 1, -1):
        assert one(rec, f"h{k - 2}.all_gather", "bwd")["start_s"] >= reduce_scatter(rec, k)["end_s"] - EPS
    group = rec[rec["name"].str.endswith((".all_gather", ".reduce_scatter"))].sort_values("start_s")
    assert len(group) > 2 * L
    assert (group["start_s"].to_numpy()[1:] >= group["end_s"].to_numpy()[:-1] - EPS).all()


def _max_gathered(rec: pd.DataFrame, units: list[str]) -> int:
    """Most units of the forward gathered at once: from the start of a unit's all-gather to the end
    of its forward kernels (its free)."""
    spans = [(float(one(rec, f"{u}.all_gather", "fwd")["start_s"]), compute(rec, u, "fwd")[1]) for u in units]
    return max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)


def test_limit_all_gathers_bounds_gathered_units_to_two():
    """FSDP's rate limiter holds an all-gather until the older of the two pending frees: in the
    forward at most two units are gathered at once. Without it, where all-gathers are shorter
    than the forward, they run ahead and more units are gathered."""
    units = ["embed", *(f"h{i}" for i in range(L)), "head"]
    _, rec = run(base=ONE_NODE)
    assert _max_gathered(rec, units) <= 2
    _, free = run("parallelism.limit_all_gathers=false", base=ONE_NODE)
    assert _max_gathered(free, units) > 2
    for limit, n in ((True, len(units) - 2), (False, 0)):   # the CPU's waits, two per pass without one
        w = build_job(load_job(GPT, [*ONE_NODE, f"parallelism.limit_all_gathers={str(limit).lower()}"]))
        fwd = [o for o in w.programs[0].ops if o.name == "fsdp.rate_limiter" and o.phase == "fwd"]
        assert len(fwd) == n


def test_reshard_after_forward_false_keeps_weights_for_the_backward():
    """reshard_after_forward: false (ZeRO-2 style) removes the backward all-gathers and their copies
    and holds the stage's unsharded weights: the buffers grow by every unit's weights less the two
    units the rate limiter holds."""
    keep = load_job(GPT, [*FSDP, "parallelism.reshard_after_forward=false"])
    w_keep, w_base = build_job(keep), build_job(load_job(GPT, FSDP))
    bwd_ag = [o for o in w_keep.programs[0].ops if o.phase == "bwd" and o.coll is not None
              and o.coll.op == "all_gather"]
    assert not bwd_ag
    assert not [o for o in w_keep.programs[0].ops if o.phase == "bwd" and o.name.endswith(".copy_out")]
    assert [o for o in w_base.programs[0].ops if o.phase == "bwd" and o.coll is not None and o.coll.op == "all_gather"]
    model = keep.workload.model
    assert isinstance(model, TransformerModel)
    s = make_setup(keep.workload, World(2, 8))
    unit = max(block(s, i).numel() for i in range(L))
    grown = w_keep.memory[0].buffers - w_base.memory[0].buffers
    assert grown == pytest.approx((parameter_count(model) - 2 * unit) * weight_bytes(s.precision), rel=1e-9)
    r_keep, r_base = simulate(keep), simulate(load_job(GPT, FSDP))
    assert r_keep.iteration_time_s < r_base.iteration_time_s


def test_fsdp_keys_need_zero_3():
    from simgpu.errors import ConfigError
    with pytest.raises((ConfigError, ValueError), match="expected zero: 3"):
        load_job(GPT, ["parallelism.backward_prefetch=none"])


@settings(max_examples=25, deadline=None)
@given(fwd=st.booleans(), bwd=st.sampled_from(["backward_pre", "backward_post", "none"]), limit=st.booleans(),
       reshard=st.booleans(), m=st.integers(1, 2), pp=st.sampled_from([1, 2]))
def test_every_unit_is_gathered_before_it_computes(fwd: bool, bwd: str, limit: bool, reshard: bool, m: int,
                                                   pp: int) -> None:
    """Under any FSDP setting the collectives meet, each pass's copy out waits for its unit's
    all-gather, and a unit's kernels in a pass find its weights gathered: by an all-gather of the
    pass, or by the forward before when it kept them (reshard_after_forward: false)."""
    w = build(spec(training={"grad_accumulation": m} if pp == 1 else {"global_batch": 2 * 2 * m}, fsdp=True,
                   pp=pp, forward_prefetch=fwd, backward_prefetch=bwd, limit_all_gathers=limit,
                   reshard_after_forward=reshard), 2 * pp)
    check_collectives(w)
    ops = w.programs[0].ops
    gathered: set[str] = set()
    for op in ops:
        unit = op.name.split(".")[0]
        if op.coll is not None and op.coll.op == "all_gather":
            gathered.add(unit)
        elif op.name.endswith(".copy_out"):
            assert all(ops[d].coll is not None and ops[d].name.startswith(unit + ".") for d in op.deps)
        elif op.kind == "kernel" and unit.startswith("h") and unit[1:].isdigit():
            assert unit in gathered, op.name
    if pp == 1:
        units = LAYERS + 2
        ags = sum(1 for o in ops if o.coll is not None and o.coll.op == "all_gather")
        assert ags == m * units * (2 if reshard else 1)
        waits = sum(1 for o in ops if o.name == "fsdp.rate_limiter")
        assert (waits > 0) == (limit and reshard) if m == 1 else waits == 0 or limit
