"""PyTorch DDP's gradient buckets: their order and sizes (bucket_mib, first_bucket_mib) and the
copies into and out of them that gradient_as_bucket_view saves, with their memory."""

from __future__ import annotations

import re

import pytest
from test_transformer_build import LAYERS, build, spec

from simgpu import load_job, simulate
from simgpu.config.workload import WorkloadSpec
from simgpu.errors import ConfigError
from simgpu.graph import Workload
from simgpu.workload.common import GRAD_BYTES
from simgpu.workload.transformer.shapes import parameter_count

GPT = "workloads/gpt_2x_dgx_h100.yaml"
SMALL = ["model.layers=4", "model.vocab=1024"]


def buckets(w: Workload, rank: int = 0) -> list[tuple[int, int]]:
    """The all-reduces' bucket numbers in issue order and their bytes."""
    out = []
    for o in w.programs[rank].ops:
        if o.coll is not None and o.coll.op == "all_reduce" and o.name.startswith("grads."):
            m = re.search(r"bucket(\d+)", o.name)
            assert m is not None
            out.append((int(m.group(1)), o.coll.nbytes))
    return out


def test_buckets_follow_reverse_parameter_order_with_a_small_first_one():
    """DDP fills buckets in the order backward readies gradients (the last block's first), the first
    closed at 1 MiB and the rest at bucket_mib; each parameter's gradient in exactly one."""
    w = build(spec(), 2)
    b = buckets(w)
    assert [i for i, _ in b] == list(range(len(b)))
    assert sum(n for _, n in b) == GRAD_BYTES * parameter_count(spec().model)  # type: ignore[arg-type]
    first = b[0][1]
    assert first >= 2**20 and first < 2 * 2**20      # closes once it reaches 1 MiB (one parameter over)
    ops = w.programs[0].ops
    ar = {o.name: i for i, o in enumerate(ops) if o.coll is not None}
    last_block_bwd = min(i for i, o in enumerate(ops) if o.name.startswith(f"h{LAYERS - 1}.") and o.phase == "bwd")
    first_block_bwd = min(i for i, o in enumerate(ops) if o.name.startswith("h0.") and o.phase == "bwd")
    assert last_block_bwd < ar["grads.bucket0.all_reduce"] < first_block_bwd   # the last block's gradients first
    bigger = buckets(build(spec_with_comm(first_bucket_mib=4), 2))
    assert bigger[0][1] >= 4 * 2**20 and len(bigger) <= len(b)


def spec_with_comm(**comm: float) -> WorkloadSpec:
    s = spec()
    return s.model_copy(update={"comm": s.comm.model_copy(update=comm)})


def test_gradient_copies_into_and_out_of_buckets():
    """Without gradient_as_bucket_view (DDP's default) each bucket's gradients are copied in before
    its all-reduce and back after it: 8 bytes moved per parameter each way; with it, none, and the
    buckets' memory (4 bytes per parameter) is saved."""
    off, on = build(spec(), 2), build(spec(gradient_as_bucket_view=True), 2)
    ops = off.programs[0].ops
    n = parameter_count(spec().model)  # type: ignore[arg-type]
    for part in ("copy_in", "copy_back"):
        copies = [o for o in ops if o.name.startswith("grads.") and o.name.endswith(part)]
        assert len(copies) == len(buckets(off))
        assert sum(off.kernels[o.kernel].get("numel") for o in copies) == n
    for o in ops:
        if o.name.startswith("grads.") and o.name.endswith(".all_reduce"):
            assert ops[o.deps[0]].name == o.name.replace("all_reduce", "copy_in")
        if o.name.endswith(".copy_back"):
            assert ops[o.deps[0]].name == o.name.replace("copy_back", "all_reduce")
    assert not [o for o in on.programs[0].ops if "copy_in" in o.name or "copy_back" in o.name]
    assert off.memory[0].buffers - on.memory[0].buffers == pytest.approx(GRAD_BYTES * n)
    megatron = build(spec(training={"framework": "megatron"}), 2).programs[0].ops
    assert not [o for o in megatron if "copy_in" in o.name]


def test_bucket_copies_cost_time():
    """The copies back run after the last all-reduce, before the optimizer step: the iteration
    without gradient_as_bucket_view is longer by at least the last one's time."""
    off = simulate(load_job(GPT, SMALL))
    on = simulate(load_job(GPT, [*SMALL, "parallelism.gradient_as_bucket_view=true"]))
    rec = off.records
    back = rec[(rec["rank"] == 0) & rec["name"].str.endswith(".copy_back") & (rec["stream"] == "compute")]
    assert len(back) > 0
    last = back.sort_values("end_s").iloc[-1]
    assert off.iteration_time_s - on.iteration_time_s >= 0.9 * float(last["end_s"] - last["start_s"])


@pytest.mark.parametrize("extra, expected", [
    (["parallelism.zero=1", "parallelism.gradient_as_bucket_view=true"], "expected zero: 0"),
    (["training.framework=megatron", "parallelism.gradient_as_bucket_view=true"], "expected model.kind: transformer"),
])
def test_gradient_as_bucket_view_is_ddps(extra: list[str], expected: str):
    with pytest.raises((ConfigError, ValueError), match=expected):
        load_job(GPT, extra)
