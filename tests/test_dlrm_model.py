"""DLRM model side: generated tables, index-reuse statistics, DCNv2 layers, memory by hand, whole runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ROOT

from simgpu import load_job, simulate
from simgpu.config.dlrm import DLRMModel
from simgpu.config.workload import WorkloadSpec
from simgpu.kernels.lookups import uniform_reuse
from simgpu.workload import World
from simgpu.workload.dlrm import arch as dlrm_arch
from simgpu.workload.dlrm import builder as dlrm
from simgpu.workload.dlrm import embedding


def spec(tables: list[dict[str, Any]] | None = None, *, generate: dict[str, Any] | None = None, seed: int = 0,
         interaction: str = "cat", dcn: dict[str, Any] | None = None, sharding: Any = "table_wise",
         batch: int = 64, precision: str = "fp32") -> WorkloadSpec:
    model: dict[str, Any] = {"kind": "dlrm", "dense_features": 13, "bottom_mlp": [32, 16], "top_mlp": [64, 1],
                             "embedding_dim": 16, "tables": tables or [], "interaction": interaction}
    if generate is not None:
        model["generate"] = generate
    if dcn is not None:
        model["dcn"] = dcn
    return WorkloadSpec.model_validate({
        "name": "dlrm", "platform": "test", "seed": seed, "model": model,
        "training": {"batch_per_gpu": batch, "precision": precision, "optimizer": "adam",
                     "embedding_optimizer": "adagrad"},
        "parallelism": {"sharding": sharding}, "comm": {"bucket_mib": 0.05},
    })


def tables_of(s: WorkloadSpec) -> list[embedding.Table]:
    assert isinstance(s.model, DLRMModel)
    return embedding.expand_tables(s.model, np.random.default_rng(s.seed))


GEN = {"count": 400, "rows": [100, 10_000_000], "dims": [8, 16, 64], "pooling": [1.0, 30.0],
       "distribution": {"kind": "zipf", "alpha": 1.1}}


def test_generated_tables_follow_the_seed_and_the_ranges() -> None:
    a, b = tables_of(spec(generate=GEN)), tables_of(spec(generate=GEN))
    assert a == b and len(a) == 400
    assert tables_of(spec(generate=GEN, seed=1)) != a
    assert all(100 <= t.rows <= 10_000_000 and t.dim in (8, 16, 64) and 1.0 <= t.pooling <= 30.0 for t in a)
    assert all(t.zipf_alpha == 1.1 for t in a)
    assert {t.dim for t in a} == {8, 16, 64}
    # log-uniform rows: about half below the geometric mean of the range
    below = np.mean([t.rows < np.sqrt(100 * 10_000_000) for t in a])
    assert 0.42 < below < 0.58
    # given tables come first, generated ones after, numbered on
    mixed = tables_of(spec([{"rows": 7, "pooling_factor": 1.0, "count": 2}], generate=GEN))
    assert [t.rows for t in mixed[:2]] == [7, 7] and [t.index for t in mixed] == list(range(402))
    assert mixed[2:] == [embedding.Table(t.index + 2, t.rows, t.dim, t.pooling, t.zipf_alpha) for t in a]


def _sampled(rows: int, n: int, alpha: float, rng: np.random.Generator) -> dict[str, float]:
    p = np.arange(1, rows + 1, dtype=float) ** -alpha
    ids = rng.choice(rows, size=n, p=p / p.sum())
    counts = np.sort(np.bincount(ids, minlength=rows))[::-1]
    counts = counts[counts > 0]
    cum = np.cumsum(counts)
    out = {"reuse_unique": counts.size / n}
    for name, share in embedding.REUSE_TOP:
        out[name] = cum[min(max(1, int(share * rows)), counts.size) - 1] / n
    return out


@pytest.mark.parametrize(("rows", "n", "alpha"), [(100_000, 50_000, 1.05), (100_000, 1_000_000, 0.8),
                                                  (2_000_000, 200_000, 1.2), (500, 10_000, 1.0)])
def test_zipf_reuse_matches_sampled_ids(rows: int, n: int, alpha: float) -> None:
    want = _sampled(rows, n, alpha, np.random.default_rng(0))
    got = embedding.zipf_reuse(rows, n, alpha)
    assert got["reuse_unique"] == pytest.approx(want["reuse_unique"], rel=0.02)
    for name, _ in embedding.REUSE_TOP:
        assert want[name] - 0.06 <= got[name] <= want[name] + 0.01, name  # a slight underestimate at most


def test_skewed_tables_tell_their_kernels_the_reuse() -> None:
    """A row-wise rank's two row blocks (one skewed, one uniform) share one table-batched kernel,
    whose distinct rows are the sum of each block's, from its own distribution."""
    s = spec([{"rows": 10_000, "pooling_factor": 4.0, "distribution": {"kind": "zipf", "alpha": 1.2}},
              {"rows": 20_000, "pooling_factor": 4.0}], sharding="row_wise")
    w = dlrm.build(s, World(1, 2))
    emb = [w.kernels[op.kernel] for op in w.programs[0].ops if op.category == "embedding"]
    assert len(emb) == 2  # one forward, one backward
    for k in emb:  # blocks of 5,000 and 10,000 rows, each seeing 2 x 64 samples x 2 ids
        assert k.get("tables") == 2 and k.get("rows") == 7_500
        assert k.get("batch") * k.get("tables") * k.get("pooling") == 2 * 256
        skewed = embedding.zipf_reuse(5_000, 256, 1.2)["reuse_unique"] * 256
        uniform = uniform_reuse(10_000, 256)["reuse_unique"] * 256
        assert k.get("reuse_unique") == pytest.approx((skewed + uniform) / 512)
        assert 0 < k.get("reuse_unique") < 1


@pytest.mark.parametrize("low_rank", [None, 8])
def test_dcn_layers(low_rank: int | None) -> None:
    tables = [{"rows": 100, "dim": 16, "pooling_factor": 1.0}, {"rows": 100, "dim": 8, "pooling_factor": 1.0}]
    s = spec(tables, interaction="dcn", dcn={"layers": 3, "low_rank": low_rank})
    arch = dlrm_arch.make_arch(s.model, tables_of(s))  # type: ignore[arg-type]
    n = 16 + 16 + 8  # bottom output and both tables
    per_layer = n * n + n if low_rank is None else n * low_rank + low_rank * n + n
    assert arch.width == n and arch.top[0].inputs == n
    assert sum(lin.numel for lin in arch.cross) == 3 * per_layer
    w = dlrm.build(s, World(1, 2))
    ops = w.programs[0].ops
    gemms = {op.name: w.kernels[op.kernel] for op in ops if op.category == "gemm"}
    if low_rank is None:
        assert (gemms["cross1.w.fwd"].get("m"), gemms["cross1.w.fwd"].get("n"), gemms["cross1.w.fwd"].get("k")) \
            == (64, n, n)
    else:
        assert (gemms["cross1.v.fwd"].get("n"), gemms["cross1.v.fwd"].get("k")) == (low_rank, n)
        assert (gemms["cross1.w.fwd"].get("n"), gemms["cross1.w.fwd"].get("k")) == (n, low_rank)
        assert "cross1.v.bias_grad" not in {op.name for op in ops}
    assert sum(op.name.endswith(".mul_add") for op in ops) == 3
    # the cross layers' gradients are reduced with the MLPs'
    assert sum(op.nbytes for op in ops if op.category == "all_reduce") == 4 * arch.dense_numel
    dense = sum(lin.flops(128) for lin in arch.linears)
    assert w.model_flops == pytest.approx(3 * dense)


def test_memory_by_hand() -> None:
    """Two tables table-wise on two GPUs, every byte counted by hand."""
    s = spec([{"rows": 1000, "pooling_factor": 2.0}, {"rows": 500, "pooling_factor": 3.0}],
             sharding={"tables": {0: {"type": "table_wise", "ranks": [0]}, 1: {"type": "table_wise", "ranks": [1]}}})
    m = dlrm.build(s, World(1, 2)).memory
    dense = (13 * 32 + 32) + (32 * 16 + 16) + (48 * 64 + 64) + (64 * 1 + 1)  # cat: top input 16 + 2 x 16
    assert dense == 4177
    for r in m:
        assert (r.parameters, r.gradients, r.optimizer_states) == (4 * dense, 4 * dense, 8 * dense)  # fp32 adam
    assert m[0].embeddings == 1000 * 16 * 4 + 1000 * 4  # rows and row-wise adagrad state
    assert m[1].embeddings == 500 * 16 * 4 + 500 * 4
    # MLP outputs (gemm and ReLU; the last layer's gemm only), the concatenation, the received
    # pooled embeddings of both tables, and the lookup output of the own table over 128 samples
    act = 2 * 64 * 32 * 4 + 2 * 64 * 16 * 4 + 2 * 64 * 64 * 4 + 64 * 1 * 4 + 64 * 48 * 4 + 64 * 32 * 4
    assert m[0].activations == m[1].activations == act + 128 * 16 * 4
    # sent: ids and lengths of both tables, the pooled gradients, DDP buckets; received: ids from both
    # ranks and the gradients of the own table over 128 samples
    sent = (128 * 8 + 64 * 4) + (192 * 8 + 64 * 4) + 64 * 32 * 4 + 4 * dense
    assert m[0].buffers == sent + 2 * (128 * 8 + 64 * 4) + 128 * 16 * 4
    assert m[1].buffers == sent + 2 * (192 * 8 + 64 * 4) + 128 * 16 * 4


def test_memory_of_row_wise_and_replicated_tables() -> None:
    tables = [{"rows": 1001, "pooling_factor": 2.0}, {"rows": 300, "pooling_factor": 1.0}]
    s = spec(tables, sharding={"tables": {0: {"type": "row_wise"}, 1: {"type": "data_parallel"}}})
    m = dlrm.build(s, World(1, 2)).memory
    tw = dlrm.build(spec(tables, sharding={"tables": {1: {"type": "data_parallel"}, 0: {
        "type": "table_wise", "ranks": [0]}}}), World(1, 2)).memory
    dense = m[0].parameters / 4
    replica = 300 * 16 * 4
    # row blocks of 501 and 500 rows (+ adagrad state); the replica everywhere with its gradient
    # and adam's two states, stepped by the dense optimizer
    assert m[0].embeddings == 501 * 16 * 4 + 501 * 4 + replica
    assert m[1].embeddings == 500 * 16 * 4 + 500 * 4 + replica
    assert all(r.gradients == 4 * dense + replica and r.optimizer_states == 8 * dense + 2 * replica for r in m)
    assert sum(r.embeddings for r in m) == sum(r.embeddings for r in tw)  # the same bytes, spread


SHIPPED = sorted((ROOT / "workloads").glob("dlrm_*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_dlrm_workloads_fit_and_use_their_plans(path: Path) -> None:
    job = load_job(path)
    from simgpu.sim import build

    w = build(job)  # includes the memory check
    assert max(m.total for m in w.memory) <= job.platform.gpu.memory_gib * 2**30
    names = {op.name.split(".")[1] for p in w.programs for op in p.ops if op.name.startswith("emb.")}
    if "dcnv2" in path.stem:
        assert sum(op.name.endswith(".mul_add") for op in w.programs[0].ops) == 3
        assert w.samples == 65536
        assert names >= ({"rw", "tw", "dp"} if job.workload.nodes == 1 else {"twrw", "tw"})


@pytest.mark.parametrize("sharding", ["table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel",
                                      {"planner": "column_wise_hot"}])
def test_each_sharding_runs_and_a_faster_nic_never_slows_it(sharding: Any) -> None:
    path = ROOT / "workloads" / "dlrm_2x_dgx_a100.yaml"
    over = ["gpus_per_node=4", "training.batch_per_gpu=256", "model.tables=[{rows: 20000, pooling_factor: 8, count: 6},"
            " {rows: 500, pooling_factor: 1, count: 4}]", f"parallelism.sharding={sharding}"]
    slow = simulate(load_job(path, over + ["platform.network.nic_gbps=100"]))
    fast = simulate(load_job(path, over + ["platform.network.nic_gbps=400"]))
    assert 0 < fast.iteration_time_s <= slow.iteration_time_s * (1 + 1e-9)
    kinds = set(slow.records["kind"])
    assert {"kernel", "memcpy"} <= kinds
    if sharding != "data_parallel":
        assert "collective" in kinds
