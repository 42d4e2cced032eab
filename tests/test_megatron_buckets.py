"""Megatron-core's gradient (and distributed-optimizer parameter) buckets: the default bucket_size,
max(40,000,000, 1,000,000 x dp) parameters, one bucket per model chunk where Megatron turns
bucketing off (no overlap_grad_reduce, pipeline stages after the first, model chunks after the
first), and no small first bucket."""

from __future__ import annotations

import re
from typing import Any

import pytest
from test_transformer_build import build, spec

from simgpu.config.workload import WorkloadSpec
from simgpu.errors import ConfigError
from simgpu.graph import Program
from simgpu.workload.common import GRAD_BYTES
from simgpu.workload.transformer.shapes import megatron_bucket_params

#: 4 blocks of hidden 2,048 (50M parameters each): a 40M-parameter bucket closes in every block.
BIG = {"hidden": 2048, "heads": 16, "layers": 4}


def megatron(training: dict[str, Any] | None = None, **par: Any) -> WorkloadSpec:
    return spec(BIG, {"framework": "megatron", **(training or {})}, zero=1, **par)


def buckets(p: Program) -> list[int]:
    """Bytes of the dense gradient reduce-scatters of ``p``'s last iteration, in issue order."""
    out = [(int(m.group(1)), o.coll.nbytes) for o in p.ops
           if o.coll is not None and o.coll.op == "reduce_scatter" and (m := re.match(r"grads\.bucket(\d+)\.", o.name))]
    assert [i for i, _ in out] == list(range(len(out)))
    return [n for _, n in out]


def stage_programs(w: Any) -> tuple[Program, Program]:
    """A rank of the first pipeline stage and one of the last (it holds the output head)."""
    def head(p: Program) -> bool:
        return any(o.name.startswith("ln_f.") for o in p.ops)
    return next(p for p in w.programs if not head(p)), next(p for p in w.programs if head(p))


def test_default_bucket_size_is_megatron_cores() -> None:
    assert megatron_bucket_params(1) == megatron_bucket_params(40) == 40_000_000
    assert megatron_bucket_params(64) == 64_000_000
    assert megatron_bucket_params(1024) == 1_024_000_000


@pytest.mark.parametrize("gpus, nodes", [(8, 1), (8, 8)])
def test_buckets_close_at_megatron_cores_default(gpus: int, nodes: int) -> None:
    """Every bucket but the last reaches the default size (dp 8: 40M parameters; dp 64: 64M), and
    none is a small first bucket; together they hold every gradient once."""
    w = build(megatron(), gpus, nodes)
    sizes = buckets(w.programs[0])
    cap = megatron_bucket_params(gpus * nodes) * GRAD_BYTES
    assert len(sizes) > 1
    assert all(n >= cap for n in sizes[:-1])
    assert all(n < 2 * cap for n in sizes)
    ddp = build(megatron(training={"framework": "pytorch"}), gpus, nodes)
    assert sum(sizes) == sum(buckets(ddp.programs[0]))
    assert buckets(ddp.programs[0])[0] <= 2**20 + 4 * 2048 * 2048 * GRAD_BYTES  # DDP's small first one


def test_one_bucket_without_overlap_grad_reduce() -> None:
    """bucket_size is None when overlap_grad_reduce is off: one reduce-scatter of every gradient."""
    on, off = build(megatron(), 8), build(megatron(overlap_grad_reduce=False), 8)
    assert len(buckets(off.programs[0])) == 1
    assert buckets(off.programs[0]) == [sum(buckets(on.programs[0]))]


def test_bucketing_only_on_the_first_stage_and_model_chunk() -> None:
    """Megatron-core turns bucketing off on pipeline stages after the first and for model chunks
    after the first: with pp 2 the last stage reduces its gradients in one bucket; interleaved with
    two chunks per stage, the first stage buckets its first chunk and reduces its second in one."""
    first, last = stage_programs(build(megatron(pp=2), 8))
    assert len(buckets(first)) > 1 and len(buckets(last)) == 1
    w = build(megatron({"global_batch": 16}, pp=2, pp_schedule="interleaved", virtual_stages=2), 8)
    first, last = stage_programs(w)
    assert len(buckets(last)) == 2                 # a bucket per chunk
    sizes = buckets(first)
    assert len(sizes) > 2 and sizes[0] >= megatron_bucket_params(4) * GRAD_BYTES
    # the chunk after the first (global chunk 2: blocks of the second half) is reduced first, in one
    assert sizes[0] == max(sizes)


def test_bucket_mib_given_overrides_the_default_and_first_bucket_is_refused() -> None:
    given = WorkloadSpec.model_validate({**megatron().model_dump(exclude_unset=True), "comm": {"bucket_mib": 40}})
    sizes = buckets(build(given, 8).programs[0])
    assert all(40 * 2**20 <= n < megatron_bucket_params(8) * GRAD_BYTES for n in sizes[:-1])
    with pytest.raises((ConfigError, ValueError), match="expected no first_bucket_mib"):
        WorkloadSpec.model_validate({**megatron().model_dump(exclude_unset=True), "comm": {"first_bucket_mib": 2}})
