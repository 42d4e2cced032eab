"""The Transformer builder under every parallelism: collectives that meet, their counts per block and
micro-batch, recomputation, gradient reduction, facts, and random valid combinations that simulate."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu.config.loader import Job, load_platform
from simgpu.config.workload import WorkloadSpec
from simgpu.graph import Workload
from simgpu.sim import simulate
from simgpu.workload import World, get_builder
from simgpu.workload.transformer.attention import fused_softmax_available
from simgpu.workload.transformer.shapes import active_matmul_params, parameter_count

LAYERS, HIDDEN, HEADS, SEQ = 4, 256, 8, 128


def spec(model: dict[str, Any] | None = None, training: dict[str, Any] | None = None, **par: Any) -> WorkloadSpec:
    return WorkloadSpec.model_validate({
        "name": "t", "platform": "dgx_h100",
        "model": {"kind": "transformer", "layers": LAYERS, "hidden": HIDDEN, "heads": HEADS, "seq_len": SEQ,
                  "vocab": 1000, **(model or {})},
        "training": {"micro_batch": 2, "precision": "bf16", "optimizer": "adam", **(training or {})},
        "parallelism": par})


def build(s: WorkloadSpec, gpus: int, nodes: int = 1) -> Workload:
    return get_builder("transformer")(s, World(nodes, gpus))


def ops_named(w: Workload, rank: int, part: str) -> list[Any]:
    return [op for op in w.programs[rank].ops if part in op.name]


def check_collectives(w: Workload) -> dict[str, list[int]]:
    """Every key is issued once by each member of its group, with one op, group and size."""
    members: dict[str, list[int]] = defaultdict(list)
    calls: dict[str, Any] = {}
    for p in w.programs:
        for op in p.ops:
            if op.coll is None:
                continue
            c = op.coll
            assert p.rank in c.group and len(c.group) > 1, c
            assert op.stream.startswith("comm"), op.stream
            first = calls.setdefault(c.key, c)
            assert (first.op, first.group, first.nbytes) == (c.op, c.group, c.nbytes), c.key
            members[c.key].append(p.rank)
    for key, ranks in members.items():
        assert sorted(ranks) == sorted(calls[key].group), key
    return members


CONFIGS = [
    pytest.param(dict(tp=2), 2, id="tp"),
    pytest.param(dict(tp=2, sp=True), 2, id="tp-sp"),
    pytest.param(dict(pp=2, training={"global_batch": 8}), 2, id="pp-1f1b"),
    pytest.param(dict(pp=2, pp_schedule="interleaved", virtual_stages=2, training={"global_batch": 8}), 2,
                 id="pp-interleaved"),
    pytest.param(dict(cp=2), 2, id="cp-ring"),
    pytest.param(dict(cp=2, cp_comm="all_gather"), 2, id="cp-all-gather"),
    pytest.param(dict(zero=1), 4, id="zero1"),
    pytest.param(dict(fsdp=True, training={"grad_accumulation": 2}), 4, id="fsdp"),
    pytest.param(dict(ep=2, model={"moe": {"experts": 4, "top_k": 2}}), 4, id="moe-ep"),
    pytest.param(dict(tp=2, pp=2, cp=2, ep=2, sp=True, zero=1, model={"moe": {"experts": 4, "top_k": 1}},
                      training={"global_batch": 8, "recompute": "full", "framework": "megatron"}), 16, id="all"),
]


@pytest.mark.parametrize("par, gpus", CONFIGS)
def test_collectives_meet(par: dict[str, Any], gpus: int) -> None:
    model, training = par.pop("model", None), par.pop("training", None)
    w = build(spec(model, training, **par), gpus if gpus <= 8 else 8, 1 if gpus <= 8 else gpus // 8)
    check_collectives(w)
    assert len(w.programs) == gpus and len(w.memory) == gpus


def count(w: Workload, rank: int, op: str, stream: str | None = None) -> int:
    return sum(1 for o in w.programs[rank].ops if o.coll is not None and o.coll.op == op
               and (stream is None or o.stream == stream))


def test_tensor_parallel_all_reduces_per_block() -> None:
    """Megatron: forward all-reduces after the attention and MLP output projections, backward after
    the QKV and first MLP input gradients; plus the embedding (forward), the output layer's input
    gradient and the cross entropy's three (max, target, sum of exponentials)."""
    w = build(spec(tp=2), 2)
    per_block = 2 + 2
    assert count(w, 0, "all_reduce", "comm.tp") == LAYERS * per_block + 1 + 1 + 3
    recompute = build(spec(training={"recompute": "full"}, tp=2), 2)
    assert count(recompute, 0, "all_reduce", "comm.tp") == LAYERS * (per_block + 2) + 1 + 1 + 3


def test_sequence_parallel_swaps_all_reduce_for_gather_and_scatter() -> None:
    w = build(spec(tp=2, sp=True), 2)
    # forward: all-gather before QKV and MLP, reduce-scatter after them; backward: all-gather of the
    # output gradients and of the inputs (for the weight gradients), reduce-scatter of the input gradients
    assert count(w, 0, "all_gather", "comm.tp") == LAYERS * (2 + 2 + 2) + 1 + 1
    assert count(w, 0, "reduce_scatter", "comm.tp") == LAYERS * (2 + 2) + 1 + 1
    # the cross-entropy reductions and the norms' gradients remain all-reduces
    assert count(w, 0, "all_reduce", "comm.tp") == 3 + 1
    norm = next(o for o in w.programs[0].ops if o.name == "h0.ln1.fwd")
    assert w.kernels[norm.kernel].get("rows") == 2 * SEQ // 2


def test_recompute_full_reruns_each_block_forward() -> None:
    base, full = build(spec(), 1), build(spec(training={"recompute": "full"}), 1)
    gemms = Counter(o.category for o in base.programs[0].ops)["gemm"]
    extra = Counter(o.category for o in full.programs[0].ops)["gemm"] - gemms
    assert extra == LAYERS * 4
    assert all(o.phase == "bwd" for o in full.programs[0].ops if o.name.endswith(".recompute"))
    sel = build(spec(model={"attention": "unfused"}, training={"recompute": "selective"}), 1)
    assert sum(o.name.endswith(".recompute") for o in sel.programs[0].ops) == LAYERS * 4  # bmm, softmax, bmm, permute


@pytest.mark.parametrize("batches, sq, sk, causal, half, want", [
    (4, 1024, 1024, True, True, True),      # one 128-thread block takes 4 rows of 1,024
    (2, 1024, 1024, True, True, False),     # micro-batch 1 x 2 heads: not a multiple of 4
    (4, 1024, 1024, True, False, False),    # fp32 scores: no fused kernel
    (8, 8192, 8192, True, True, False),     # keys beyond 4,096
    (4, 128, 128, True, True, False),       # two rows per warp up to 128 keys: 8 per block
    (4, 128, 128, False, True, True),       # a padding mask needs the query rows in blocks of 8
    (4, 18, 18, True, True, False),         # keys not a multiple of 4
])
def test_megatron_fused_softmax_rule(batches: int, sq: int, sk: int, causal: bool, half: bool, want: bool) -> None:
    assert fused_softmax_available(batches, sq, sk, causal, half) is want


def test_unfused_softmax_falls_back_to_pytorch_where_the_kernel_does_not_fit() -> None:
    """One head per rank and micro-batch 2 give 2 score matrices: Megatron's fused kernel needs a
    multiple of 4, so the softmax runs as five PyTorch ops in fp32 each way."""
    model = {"attention": "unfused", "dropout": 0.1}
    fused, fallback = build(spec(model, tp=2), 2), build(spec(model, tp=8), 8)
    names = [o.name for o in fallback.programs[0].ops if o.name.startswith("h0.attention.softmax")]
    assert names == [f"h0.attention.softmax.{p}" if p else "h0.attention.softmax"
                     for p in ("cast_in", "scale", "mask", "", "cast_out")] + \
        [f"h0.attention.softmax_bwd.{p}" if p else "h0.attention.softmax_bwd"
         for p in ("cast_grad", "", "mask", "scale", "cast_in")]
    softmax = next(o for o in fallback.programs[0].ops if o.name == "h0.attention.softmax")
    assert fallback.kernels[softmax.kernel].dtype == "fp32"
    assert [o.name for o in fused.programs[0].ops if o.name.startswith("h0.attention.softmax")] == \
        ["h0.attention.softmax", "h0.attention.softmax_bwd"]
    extra = len(fallback.programs[0].ops) - len(fused.programs[0].ops)
    assert extra == LAYERS * 8


def test_ddp_buckets_only_in_the_last_micro_batch() -> None:
    w = build(spec(training={"grad_accumulation": 3}), 2)
    ops = w.programs[0].ops
    reduces = [i for i, o in enumerate(ops) if o.stream == "comm"]
    third_fwd = [i for i, o in enumerate(ops) if o.name == "h0.attention.fwd"][2]
    assert reduces and min(reduces) > third_fwd
    nbytes = sum(ops[i].nbytes for i in reduces)
    assert nbytes == 4 * parameter_count(w.programs and spec().model)  # type: ignore[arg-type]
    late = build(spec(training={"grad_accumulation": 3}, dp_overlap=False), 2).programs[0].ops
    last_bwd = max(i for i, o in enumerate(late) if o.phase == "bwd" and o.kind == "kernel"
                   and not o.name.startswith("grads."))   # DDP's copies into and out of its buckets aside
    assert all(i > last_bwd for i, o in enumerate(late) if o.stream == "comm")


def test_fsdp_gathers_and_scatters_every_unit_every_micro_batch() -> None:
    w = build(spec(training={"grad_accumulation": 2}, fsdp=True), 4)
    units = LAYERS + 2  # blocks, embedding, head
    assert count(w, 0, "all_gather", "comm") == 2 * 2 * units        # forward and backward
    assert count(w, 0, "reduce_scatter", "comm") == 2 * units
    # implicit forward prefetch: the next unit's all-gather is issued after this unit's kernels;
    # forward_prefetch issues it before them
    for explicit in (False, True):
        ops = build(spec(training={"grad_accumulation": 2}, fsdp=True, forward_prefetch=explicit), 4).programs[0].ops
        last_h0 = next(i for i, o in enumerate(ops) if o.name == "h0.mlp.fc2.fwd")
        ag_h1 = next(i for i, o in enumerate(ops) if o.name == "h1.all_gather")
        assert (ag_h1 < last_h0) == explicit


def test_zero1_reduce_scatters_and_gathers_parameters() -> None:
    w = build(spec(zero=1), 4)
    assert count(w, 0, "reduce_scatter", "comm") >= 1 and count(w, 0, "all_reduce", "comm") == 0
    assert count(w, 0, "all_gather", "comm.ag") >= 1
    opt = next(o for o in w.programs[0].ops if o.name == "optimizer.step")
    assert w.kernels[opt.kernel].get("numel") == -(-parameter_count(spec().model) // 4)  # type: ignore[arg-type]


def test_moe_all_to_alls_and_expert_gradients() -> None:
    w = build(spec(model={"moe": {"experts": 4, "top_k": 2, "every": 2}}, ep=2), 4)
    moe_layers = LAYERS // 2
    assert count(w, 0, "all_to_all", "comm.ep") == moe_layers * 4   # dispatch, combine, and back
    groups = {o.coll.group for o in w.programs[0].ops if o.coll is not None and "expert_grads" in o.coll.key}
    assert groups == {(0, 2)}                                          # the expert-data-parallel ranks
    experts = [w.kernels[o.kernel] for o in w.programs[0].ops if o.name.startswith("h1.moe.experts.")
               and o.kind == "kernel" and w.kernels[o.kernel].family == "moe"]
    # forward, input gradients, weight gradients of the same shape: 2 local experts, each gets
    # tokens * top_k * ep / experts = 256 * 2 * 2 / 4 token copies
    assert [k.get("bwd") for k in experts] == [0, 1, 2]
    assert {(k.get("experts"), k.get("rows"), k.get("topk")) for k in experts} == {(2, 512, 2)}
    assert not any(k.family == "bmm" for k in w.kernels)


def test_context_parallel_ring_and_all_gather() -> None:
    ring = build(spec(cp=2), 2)
    sends = [o for o in ring.programs[0].ops if o.coll is not None and o.stream == "comm.cp_send"]
    # forward: cp - 1 K/V hand-offs; backward: cp - 1 (K/V with dK/dV) and dK/dV going home
    assert len(sends) == LAYERS * ((2 - 1) + (2 - 1) + 1)
    att = next(o for o in ring.programs[0].ops if o.name == "h0.attention.fwd.step0")
    assert ring.kernels[att.kernel].get("seq_q") == SEQ // 2
    ag = build(spec(cp=2, cp_comm="all_gather"), 2)
    assert count(ag, 0, "all_gather", "comm.cp") == 2 * LAYERS and count(ag, 0, "reduce_scatter", "comm.cp") == LAYERS


def test_pipeline_stages_differ_and_tied_embedding_is_reduced() -> None:
    w = build(spec(training={"global_batch": 8}, pp=2), 2)
    first = {o.name for o in w.programs[0].ops}
    last = {o.name for o in w.programs[1].ops}
    assert "embed.tok_gather" in first and "embed.tok_gather" not in last
    assert "loss.cross_entropy.fwd" in last and "loss.cross_entropy.fwd" not in first
    m = 8 // 2
    assert count(w, 0, "send_recv") == count(w, 1, "send_recv") == 2 * m
    assert any(o.coll is not None and o.coll.group == (0, 1) and "wte_grad" in o.coll.key for o in w.programs[0].ops)
    assert w.memory[0].activations > w.memory[1].activations - 2 * SEQ * 1000 * 4


def test_facts_use_the_global_batch_and_active_parameters() -> None:
    s = spec(model={"moe": {"experts": 4, "top_k": 1}}, training={"global_batch": 12}, tp=2)
    w = build(s, 4)
    assert w.samples == 12 and w.tokens == 12 * SEQ
    n = active_matmul_params(s.model)  # type: ignore[arg-type]
    assert w.model_flops == pytest.approx(6 * n * 12 * SEQ + 12 * LAYERS * 12 * SEQ**2 * HIDDEN)
    assert n < parameter_count(s.model)  # type: ignore[arg-type]


def test_host_overhead_sets_every_op_cpu_time() -> None:
    w = build(spec(training={"host_overhead_us": 40}, tp=2), 2)
    assert {o.cpu_s for p in w.programs for o in p.ops} == {40e-6}
    assert {o.cpu_s for o in build(spec(), 1).programs[0].ops} == {None}


_PAR = st.fixed_dictionaries({
    "tp": st.sampled_from([1, 2]), "pp": st.sampled_from([1, 2]), "cp": st.sampled_from([1, 2]),
    "ep": st.sampled_from([1, 2]), "sp": st.booleans(), "zero": st.sampled_from([0, 1, 2, 3]),
    "sched": st.sampled_from(["1f1b", "gpipe", "interleaved"]), "recompute": st.sampled_from(["none", "full"]),
    "framework": st.sampled_from(["pytorch", "megatron"]), "moe": st.booleans(),
    "arch": st.sampled_from(["gpt", "llama"]),
})


@settings(max_examples=20, deadline=None)
@given(_PAR)
def test_any_valid_combination_simulates(c: dict[str, Any]) -> None:
    """Property: every valid combination of parallelisms builds, its collectives meet and it runs to the end."""
    gpus = 8
    mp = c["tp"] * c["pp"] * c["cp"]
    dp = gpus // mp
    sp = c["sp"] and c["tp"] > 1
    v = 2 if c["sched"] == "interleaved" and c["pp"] > 1 else 1
    sched = c["sched"] if c["pp"] > 1 and (c["sched"] != "interleaved" or v > 1) else "1f1b"
    ep = c["ep"] if c["moe"] and dp % c["ep"] == 0 else 1
    model = {"arch": c["arch"], "layers": 4, "hidden": 64, "heads": 4, "seq_len": 32,
             **({"moe": {"experts": 4, "top_k": 2}} if c["moe"] else {})}
    s = WorkloadSpec.model_validate({
        "name": "p", "platform": "dgx_h100", "gpus_per_node": gpus,
        "model": {"kind": "transformer", "vocab": 128, **model},
        "training": {"micro_batch": 1, "global_batch": dp * 2 * c["pp"], "precision": "bf16",
                     "recompute": c["recompute"], "framework": c["framework"]},
        "parallelism": {"tp": c["tp"], "pp": c["pp"], "cp": c["cp"], "ep": ep, "sp": sp, "zero": c["zero"],
                        "pp_schedule": sched, "virtual_stages": v}})
    w = build(s, gpus)
    check_collectives(w)
    plat, pfile = load_platform("dgx_h100")
    res = simulate(Job(s, plat, "p", pfile))
    assert res.iteration_time_s > 0
    assert len(res.records[res.records["kind"] != "launch"]) == sum(len(p.ops) for p in w.programs)


def test_fp8_follows_transformer_engine() -> None:
    w = build(spec(training={"precision": "fp8", "framework": "megatron", "grad_accumulation": 2}), 1)
    ops = w.programs[0].ops
    names = Counter(o.name.rsplit(".", 1)[-1] for o in ops)
    linears = 4 * LAYERS
    assert names["weight_fp8"] == linears                  # quantised at the first micro-batch only
    assert names["quantize"] == 2 * LAYERS                 # the attention output, each micro-batch
    assert names["grad_cast_transpose"] == 2 * linears     # before every block linear's backward
    dtype = {o.name: w.kernels[o.kernel].dtype for o in ops if o.kind == "kernel"}
    assert dtype["h0.attn.qkv.fwd"] == "fp8" and dtype["lm_head.fwd"] == "bf16"
    assert dtype["h0.attention.fwd"] == "bf16"
