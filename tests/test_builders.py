"""Unit tests of the DLRM and Transformer workload builders (programs, keys, buckets, memory)."""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any

import numpy as np
import pytest

from simgpu.config.dlrm import DLRMModel
from simgpu.config.transformer import TransformerModel
from simgpu.config.workload import WorkloadSpec
from simgpu.graph import Workload
from simgpu.workload import World, get_builder
from simgpu.workload.common import (
    DDP_FIRST_BUCKET_BYTES,
    MIB,
    Param,
    assign_buckets,
)
from simgpu.workload.dlrm import arch as dlrm_arch
from simgpu.workload.dlrm import builder as dlrm
from simgpu.workload.dlrm import embedding, sharding
from simgpu.workload.transformer import builder as transformer

#: Shape parameters of each kernel family, exactly as the kernel models key them.
FAMILY_PARAMS = {
    "gemm": {"m", "n", "k"},
    "bmm": {"b", "m", "n", "k"},
    "attention_fwd": {"batch", "heads", "seq_q", "seq_kv", "head_dim", "causal"},
    "attention_bwd": {"batch", "heads", "seq_q", "seq_kv", "head_dim", "causal"},
    "embedding_fwd": {"batch", "tables", "pooling", "dim", "rows"},
    "embedding_bwd": {"batch", "tables", "pooling", "dim", "rows"},
    "elementwise": {"numel", "reads", "writes", "flops_per_element"},
    "norm": {"rows", "cols", "bwd"},
    "softmax": {"rows", "cols", "bwd"},
    "optimizer": {"numel", "states"},
    "moe": {"rows", "experts", "hidden", "inter", "topk", "gated", "skew", "bwd"},
}
#: Parameters a family's kernels may add (index-reuse statistics of skewed embedding tables).
OPTIONAL_PARAMS = {
    "embedding_fwd": {"reuse_unique", "reuse_top0p1", "reuse_top1", "reuse_top10"},
    "embedding_bwd": {"reuse_unique", "reuse_top0p1", "reuse_top1", "reuse_top10"},
}
DTYPES = {"fp32", "tf32", "bf16", "fp16", "fp8"}


def gpt_spec(layers: int = 2, hidden: int = 256, heads: int = 4, seq: int = 128, vocab: int = 1000,
             batch: int = 2, precision: str = "bf16", bucket_mib: float = 1.0, **model: Any) -> WorkloadSpec:
    return WorkloadSpec.model_validate({
        "name": "gpt", "platform": "test",
        "model": {"kind": "transformer", "layers": layers, "hidden": hidden, "heads": heads,
                  "seq_len": seq, "vocab": vocab, **model},
        "training": {"batch_per_gpu": batch, "precision": precision, "optimizer": "adam"},
        "comm": {"bucket_mib": bucket_mib},
    })


def dlrm_spec(batch: int = 256, interaction: str = "dot", tables: list[dict[str, Any]] | None = None,
              precision: str = "fp32", embedding_optimizer: str = "sgd") -> WorkloadSpec:
    if tables is None:  # 26 tables of varied sizes, Criteo-like
        tables = [{"rows": 1000 * (1 + (7 * i) % 13), "pooling_factor": 1.0 + i % 5} for i in range(26)]
    return WorkloadSpec.model_validate({
        "name": "dlrm", "platform": "test",
        "model": {"kind": "dlrm", "dense_features": 13, "bottom_mlp": [64, 32, 16],
                  "top_mlp": [128, 64, 1], "embedding_dim": 16, "tables": tables,
                  "interaction": interaction},
        "training": {"batch_per_gpu": batch, "precision": precision, "optimizer": "adagrad",
                     "embedding_optimizer": embedding_optimizer},
        "comm": {"bucket_mib": 0.01},
    })


def gpt_model(spec: WorkloadSpec) -> TransformerModel:
    assert isinstance(spec.model, TransformerModel)
    return spec.model


def build(spec: WorkloadSpec, nodes: int = 1, gpus: int = 4) -> Workload:
    return get_builder(spec.model.kind)(spec, World(nodes, gpus))


def collectives(w: Workload) -> dict[str, list[tuple[int, Any]]]:
    """key -> [(rank, op)]"""
    out: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    for p in w.programs:
        for op in p.ops:
            if op.coll is not None:
                out[op.coll.key].append((p.rank, op))
    return out


def by_name(w: Workload, rank: int, name: str) -> Any:
    (op,) = [op for op in w.programs[rank].ops if op.name == name]
    return op


WORKLOADS = [
    pytest.param(lambda: build(gpt_spec(), 2, 2), id="gpt-bf16"),
    pytest.param(lambda: build(gpt_spec(precision="fp32", bucket_mib=25), 1, 3), id="gpt-fp32"),
    pytest.param(lambda: build(dlrm_spec(), 1, 4), id="dlrm-dot"),
    pytest.param(lambda: build(dlrm_spec(interaction="cat", precision="bf16"), 2, 4), id="dlrm-cat"),
    pytest.param(lambda: build(dlrm_spec(tables=[{"rows": 100, "pooling_factor": 2.0}]), 1, 3),
                 id="dlrm-idle-ranks"),
]


# ---- properties every workload has

@pytest.mark.parametrize("make", WORKLOADS)
def test_structure(make: Any) -> None:
    w = make()
    world = len(w.programs)
    assert [p.rank for p in w.programs] == list(range(world))
    assert len(w.memory) == world
    for p in w.programs:
        for i, op in enumerate(p.ops):
            assert all(0 <= d < i for d in op.deps), (p.rank, op.name)
            assert op.phase in {"data", "fwd", "bwd", "opt"}
            if op.kind == "kernel":
                assert op.stream == "compute" and op.coll is None
                spec = w.kernels[op.kernel]
                names = {k for k, _ in spec.params}
                assert FAMILY_PARAMS[spec.family] <= names <= FAMILY_PARAMS[spec.family] | \
                    OPTIONAL_PARAMS.get(spec.family, set()), spec
                assert spec.dtype in DTYPES
                assert op.category == spec.family.removesuffix("_fwd").removesuffix("_bwd")
                assert all(v >= 0 for _, v in spec.params)
            elif op.kind == "collective":
                assert op.stream == "comm" and op.coll is not None
                assert op.category == op.coll.op and op.nbytes == op.coll.nbytes
            else:
                assert op.kind == "memcpy" and op.stream == "copy" and op.phase == "data" and op.nbytes > 0
    # every kernel in the table is used, no duplicates
    used = {op.kernel for p in w.programs for op in p.ops if op.kind == "kernel"}
    assert used == set(range(len(w.kernels)))
    assert len(set(w.kernels)) == len(w.kernels)


@pytest.mark.parametrize("make", WORKLOADS)
def test_collective_keys_match_across_members(make: Any) -> None:
    w = make()
    for key, members in collectives(w).items():
        ranks = [r for r, _ in members]
        assert len(ranks) == len(set(ranks)), f"{key} twice on one rank"
        first = members[0][1].coll
        assert sorted(ranks) == sorted(first.group), key
        for _, op in members:
            assert (op.coll.op, op.coll.group) == (first.op, first.group), key
            if op.coll.send_bytes is None:
                assert op.coll.nbytes == first.nbytes, key
            else:
                assert len(op.coll.send_bytes) == len(op.coll.group)
                assert sum(op.coll.send_bytes) == op.coll.nbytes
    # all ranks issue their collectives on the comm stream in the same relative order (no deadlock)
    orders = [[op.coll.key for op in p.ops if op.coll is not None] for p in w.programs]
    assert all(o == orders[0] for o in orders)


@pytest.mark.parametrize("make", WORKLOADS)
def test_optimizer_waits_for_every_all_reduce(make: Any) -> None:
    w = make()
    for p in w.programs:
        (opt,) = [i for i, op in enumerate(p.ops) if op.phase == "opt"]
        reduces = [i for i, op in enumerate(p.ops) if op.coll is not None and op.coll.op == "all_reduce"]
        assert reduces and set(reduces) <= set(p.ops[opt].deps)
        for i in reduces:  # each bucket waits on the compute kernel that produced its last gradient
            (d,) = p.ops[i].deps
            assert p.ops[d].stream == "compute" and p.ops[d].phase == "bwd"
            # issued right after its producer (or after another bucket that completed with it)
            assert all(p.ops[j].category == "all_reduce" for j in range(d + 1, i)), p.ops[i].name


def test_deterministic() -> None:
    a, b = build(dlrm_spec(), 1, 4), build(dlrm_spec(), 1, 4)
    assert a.kernels == b.kernels
    assert [[(o.name, o.kernel, o.coll, o.deps) for o in p.ops] for p in a.programs] == \
           [[(o.name, o.kernel, o.coll, o.deps) for o in p.ops] for p in b.programs]


def test_registry_knows_both() -> None:
    assert get_builder("dlrm") is dlrm.build and get_builder("transformer") is transformer.build
    with pytest.raises(KeyError, match="dlrm"):
        get_builder("nope")


# ---- DDP buckets

def test_assign_buckets_follows_ddp() -> None:
    params = [Param(f"p{i}", 100_000) for i in range(10)]  # 400 kB each
    buckets = assign_buckets(params, cap_bytes=1.5 * MIB)
    # the first closes at 1 MiB (3 params), later ones at 1.5 MiB (4 params); nothing is split
    assert [len(b) for b in buckets] == [3, 4, 3]
    assert [p for b in buckets for p in b] == params
    assert len(assign_buckets(params, cap_bytes=0.1 * MIB)) == 10
    assert len(assign_buckets(params, cap_bytes=100 * MIB, first_cap_bytes=100 * MIB)) == 1
    assert DDP_FIRST_BUCKET_BYTES == MIB
    with pytest.raises(ValueError, match="unique"):
        assign_buckets([Param("a", 1), Param("a", 1)], MIB)


@pytest.mark.parametrize("bucket_mib", [0.5, 4.0, 25.0])
def test_gpt_bucket_bytes_sum_to_gradients(bucket_mib: float) -> None:
    spec = gpt_spec(bucket_mib=bucket_mib)
    w = build(spec, 1, 2)
    n = transformer.parameter_count(gpt_model(spec))
    for p in w.programs:
        assert sum(op.nbytes for op in p.ops if op.category == "all_reduce") == 4 * n
    (opt,) = [w.kernels[op.kernel] for op in w.programs[0].ops if op.category == "optimizer"]
    assert opt.get("numel") == n and opt.get("states") == 2


def test_dlrm_bucket_bytes_sum_to_dense_gradients() -> None:
    w = build(dlrm_spec(), 1, 4)
    widths_b, widths_t = [13, 64, 32, 16], [16 + 26 * 27 // 2, 128, 64, 1]
    dense = sum(a * b + b for ws in (widths_b, widths_t) for a, b in itertools.pairwise(ws))
    for p in w.programs:
        assert sum(op.nbytes for op in p.ops if op.category == "all_reduce") == 4 * dense


# ---- Transformer

def test_gpt2_small_parameter_count() -> None:
    model = gpt_spec(layers=12, hidden=768, heads=12, seq=1024, vocab=50257).model
    assert isinstance(model, TransformerModel)
    n = transformer.parameter_count(model)
    assert abs(n - 124e6) / 124e6 < 0.01
    assert n == 124_439_808  # nanoGPT's count with the tied LM head


def test_gpt_symmetric_and_shaped() -> None:
    spec = gpt_spec(layers=3, seq=128, batch=2, hidden=256, heads=4)
    w = build(spec, 2, 2)
    sigs = [[(op.name, op.kernel, op.coll.key if op.coll else None, op.deps) for op in p.ops]
            for p in w.programs]
    assert all(s == sigs[0] for s in sigs)
    # a stage's ranks share one copy of its ops other than collectives (the programs' template)
    assert all(p.ops == w.programs[0].ops for p in w.programs)
    assert w.programs[0].ops[5].coll is None and w.programs[1].ops[5] is w.programs[0].ops[5]
    assert all(p.template is w.programs[0].template is not None for p in w.programs)
    assert w.samples == 8 and w.tokens == 8 * 128 and w.compute_dtype == "bf16"
    ops = w.programs[0].ops
    gemm = {op.name: w.kernels[op.kernel] for op in ops if op.category == "gemm"}
    t = 2 * 128
    assert gemm["h0.attn.qkv.fwd"] == gemm["h2.attn.qkv.fwd"]
    assert (gemm["h1.attn.qkv.fwd"].get("m"), gemm["h1.attn.qkv.fwd"].get("n"),
            gemm["h1.attn.qkv.fwd"].get("k")) == (t, 768, 256)
    assert (gemm["h1.mlp.fc1.dgrad"].get("m"), gemm["h1.mlp.fc1.dgrad"].get("n"),
            gemm["h1.mlp.fc1.dgrad"].get("k")) == (t, 256, 1024)
    assert (gemm["h1.mlp.fc1.wgrad"].get("m"), gemm["h1.mlp.fc1.wgrad"].get("n"),
            gemm["h1.mlp.fc1.wgrad"].get("k")) == (1024, 256, t)
    assert gemm["lm_head.fwd"].get("n") == 1000 and gemm["lm_head.fwd"].dtype == "bf16"
    att = w.kernels[by_name(w, 0, "h0.attention.fwd").kernel]
    assert (att.get("batch"), att.get("heads"), att.get("seq_q"), att.get("head_dim"), att.get("causal")) \
        == (2, 4, 128, 64, 1)
    assert sum(op.category == "attention" for op in ops) == 2 * 3
    assert sum(op.category == "norm" for op in ops) == 2 * (2 * 3 + 1)
    assert {w.kernels[op.kernel].dtype for op in ops if op.category == "norm"} == {"bf16"}
    # the first kernel waits for the input copy
    first = next(op for op in ops if op.kind == "kernel")
    assert first.deps == (0,) and ops[0].kind == "memcpy"


def test_gpt_tied_embedding_bucket_is_last() -> None:
    spec = gpt_spec(vocab=50_000, hidden=256, bucket_mib=1.0)  # wte is 51 MB: its own bucket
    w = build(spec, 1, 2)
    ops = w.programs[0].ops
    reduces = [i for i, op in enumerate(ops) if op.category == "all_reduce"]
    last = ops[reduces[-1]]
    assert 4 * 50_000 * 256 <= last.nbytes <= 4 * 50_000 * 256 + 1 * MIB
    copy_in = ops[last.deps[0]]   # DDP copies the bucket's gradients in (no gradient_as_bucket_view)
    assert copy_in.name.endswith(".copy_in") and ops[copy_in.deps[0]].name == "embed.tok_grad_accumulate"
    # earlier buckets overlap backward: they are issued before the last backward kernel
    last_bwd = max(i for i, op in enumerate(ops) if op.phase == "bwd" and op.kind == "kernel"
                   and not op.name.startswith("grads."))
    assert sum(i < last_bwd for i in reduces) == len(reduces) - 1


def test_gpt_fp32_has_no_casts() -> None:
    w32 = build(gpt_spec(precision="fp32"), 1, 1)
    w16 = build(gpt_spec(precision="bf16"), 1, 1)
    assert not any("cast" in op.name for op in w32.programs[0].ops)
    linears = 4 * 2 + 1
    assert sum("cast" in op.name for op in w16.programs[0].ops) == 2 * linears
    assert {k.dtype for k in w32.kernels} == {"fp32"}


def test_gpt_model_flops() -> None:
    spec = gpt_spec(layers=12, hidden=768, heads=12, seq=1024, vocab=50257, batch=4)
    w = build(spec, 1, 2)
    n = 124_439_808 - 1024 * 768
    assert w.model_flops == pytest.approx(6 * n * 8 * 1024 + 12 * 12 * 8 * 1024**2 * 768)


def test_gpt_memory_grows_with_batch() -> None:
    small, big = (build(gpt_spec(batch=b), 1, 2).memory[0] for b in (1, 4))
    assert small.total > 0 and big.activations > small.activations
    assert big.parameters == small.parameters
    n = transformer.parameter_count(gpt_model(gpt_spec()))
    assert small.parameters == n * (4 + 2) and small.gradients == 4 * n
    assert small.optimizer_states == 8 * n


def test_gpt_rejects_other_parallelism() -> None:
    spec = WorkloadSpec.model_validate({**gpt_spec().model_dump(exclude_defaults=True),
                                        "parallelism": {"dp": 3}})
    with pytest.raises(ValueError, match="dp=3"):
        build(spec, 1, 2)


# ---- DLRM

def dlrm_model(spec: WorkloadSpec) -> DLRMModel:
    assert isinstance(spec.model, DLRMModel)
    return spec.model


def dlrm_tables(spec: WorkloadSpec) -> list[embedding.Table]:
    return embedding.expand_tables(dlrm_model(spec), np.random.default_rng(spec.seed))


def table_wise(spec: WorkloadSpec, ranks: int) -> list[list[embedding.Table]]:
    """The tables of each rank under the default plan (table-wise, greedy by size)."""
    tables = dlrm_tables(spec)
    arch = dlrm_arch.make_arch(dlrm_model(spec), tables)
    plan = sharding.resolve_plan(spec, arch, tables, World(1, ranks))
    assert {p.type for p in plan.placements} == {"table_wise"}
    return [[t for t, p in zip(tables, plan.placements, strict=True) if p.ranks == (r,)] for r in range(ranks)]


@pytest.mark.parametrize("ranks", [1, 3, 8, 40])
def test_table_assignment_covers_and_balances(ranks: int) -> None:
    tables = dlrm_tables(dlrm_spec())
    assert len(tables) == 26
    plan = table_wise(dlrm_spec(), ranks)
    assert len(plan) == ranks
    assert sorted(t.index for p in plan for t in p) == list(range(26))
    loads = [sum(t.nbytes for t in p) for p in plan]
    # greedy largest-first: the spread never exceeds the largest table
    assert max(loads) - min(loads) <= max(t.nbytes for t in tables)
    assert plan == table_wise(dlrm_spec(), ranks)


def test_table_assignment_count_expands() -> None:
    spec = dlrm_spec(tables=[{"rows": 500, "pooling_factor": 3.0, "count": 4},
                             {"rows": 100, "dim": 16, "pooling_factor": 1.0}])
    tables = dlrm_tables(spec)
    assert [t.rows for t in tables] == [500] * 4 + [100]
    plan = table_wise(spec, 2)
    assert [len(p) for p in plan] == [3, 2]  # 500, 500 | 500, 500 -> then 100 to the lighter


@pytest.mark.parametrize("interaction", ["dot", "cat"])
def test_dlrm_all_to_all_bytes(interaction: str) -> None:
    spec = dlrm_spec(batch=64, interaction=interaction)
    world = 4
    w = build(spec, 1, world)
    plan = table_wise(spec, world)
    dims = [sum(t.dim for t in p) for p in plan]
    out = {r: by_name(w, r, "emb.tw.output_a2a").coll for r in range(world)}
    grad = {r: by_name(w, r, "emb.tw.grad_a2a").coll for r in range(world)}
    inp = {r: by_name(w, r, "emb.tw.input_a2a").coll for r in range(world)}
    for i in range(world):
        for j in range(world):
            assert out[i].send_bytes[j] == 64 * dims[i] * 4  # my samples' lookups of my tables, to j
            assert grad[j].send_bytes[i] == out[i].send_bytes[j]  # the reverse
            ids = sum(round(64 * t.pooling) * 8 + 64 * 4 for t in plan[j])
            assert inp[i].send_bytes[j] == ids
    # embedding kernels of rank r cover its tables over the global batch
    for r in range(world):
        fwd = [w.kernels[op.kernel] for op in w.programs[r].ops if op.name.endswith(".fwd")
               and op.category == "embedding"]
        assert sum(k.get("tables") for k in fwd) == len(plan[r])
        assert all(k.get("batch") == 64 * world for k in fwd)


def test_dlrm_dependencies() -> None:
    w = build(dlrm_spec(), 1, 4)
    for p in w.programs:
        ops = p.ops
        idx = {op.name: i for i, op in enumerate(ops)}
        h2d, in_a2a = idx["batch.h2d"], idx["emb.tw.input_a2a"]
        assert ops[in_a2a].deps == (h2d,) and ops[idx["bot0.fwd"]].deps == (h2d,)
        assert in_a2a < idx["bot0.fwd"]  # the bottom MLP overlaps the ids all-to-all
        emb_fwd = [i for i, op in enumerate(ops) if op.category == "embedding" and op.phase == "fwd"]
        assert ops[emb_fwd[0]].deps == (in_a2a,)
        out_a2a = idx["emb.tw.output_a2a"]
        assert ops[out_a2a].deps == (emb_fwd[-1],)
        assert ops[idx["interaction.cat"]].deps == (out_a2a,)
        assert idx["bot2.relu"] < idx["interaction.cat"]  # after the bottom MLP on the same stream
        grad_a2a = idx["emb.tw.grad_a2a"]
        emb_bwd = [i for i, op in enumerate(ops) if op.category == "embedding" and op.phase == "bwd"]
        assert ops[emb_bwd[0]].deps == (grad_a2a,)
        assert emb_bwd[-1] < idx["bot2.dgrad"]
        assert "bot0.dgrad" not in idx  # no gradient for the input features
        assert w.kernels[ops[idx["interaction.bmm"]].kernel].params == \
            (("b", 256.0), ("k", 16.0), ("m", 27.0), ("n", 27.0))


def test_dlrm_idle_rank_still_joins_collectives() -> None:
    w = build(dlrm_spec(tables=[{"rows": 100, "pooling_factor": 2.0}]), 1, 3)
    owners = [r for r in range(3) if any(op.category == "embedding" for op in w.programs[r].ops)]
    assert owners == [0]
    out = by_name(w, 1, "emb.tw.output_a2a")
    in_a2a = [i for i, op in enumerate(w.programs[1].ops) if op.name == "emb.tw.input_a2a"]
    assert out.coll.send_bytes == (0, 0, 0) and out.deps == tuple(in_a2a)


def test_dlrm_facts() -> None:
    spec = dlrm_spec(batch=32)
    w = build(spec, 2, 2)
    assert w.samples == 128 and w.tokens == 0 and w.compute_dtype == "fp32"
    f, d = 26, 16
    widths = [(13, 64), (64, 32), (32, 16), (16 + f * (f + 1) // 2, 128), (128, 64), (64, 1)]
    fwd = sum(2 * 128 * i * o for i, o in widths) + 2 * 128 * (f + 1) ** 2 * d
    assert w.model_flops == pytest.approx(3 * fwd)


def test_dlrm_memory() -> None:
    small = build(dlrm_spec(batch=64), 1, 4).memory
    big = build(dlrm_spec(batch=512), 1, 4).memory
    ada = build(dlrm_spec(batch=64, embedding_optimizer="adagrad"), 1, 4).memory
    tables = dlrm_tables(dlrm_spec())
    assert sum(m.embeddings for m in small) == sum(t.nbytes for t in tables)
    assert sum(m.embeddings for m in ada) == sum(t.nbytes + 4 * t.rows for t in tables)
    for s, b in zip(small, big, strict=True):
        assert s.total > 0 and b.activations > s.activations and b.buffers > s.buffers
        assert s.optimizer_states == s.gradients  # adagrad: one fp32 state per parameter


def test_dlrm_dot_needs_equal_dims() -> None:
    with pytest.raises(ValueError, match="dot"):
        dlrm_spec(tables=[{"rows": 10, "pooling_factor": 1.0, "dim": 8}])
    build(dlrm_spec(interaction="cat", tables=[{"rows": 10, "pooling_factor": 1.0, "dim": 8}]), 1, 2)
