"""Reading kernel names, shapes and collective arguments of traces; finding the traced platform."""

from __future__ import annotations

import pytest

from simgpu.trace.classify import (
    classify_kernel,
    collective_info,
    gemm_shape,
    normalise_collective,
    parse_ranks,
    short_name,
)
from simgpu.trace.load import platform_for_gpu


def test_short_name_drops_templates_and_parameters() -> None:
    name = "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, 4>(float*, int)"
    assert short_name(name) == "at::native::CatArrayBatchedCopy"
    assert short_name("ampere_sgemm_128x64_nn") == "ampere_sgemm_128x64_nn"


@pytest.mark.parametrize("name, kind, category, cls", [
    ("ampere_sgemm_128x64_nn", "kernel", "gemm", "flops"),
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32", "kernel", "conv", "flops"),
    ("void cudnn::bn_bw_1C11_kernel_new<float>(float)", "kernel", "norm", "memory"),
    ("flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64>>", "kernel", "attention", "flops"),
    ("void at::native::vectorized_elementwise_kernel<4>(int)", "kernel", "elementwise", "memory"),
    ("void at::native::reduce_kernel<512, 1>(int)", "kernel", "reduction", "memory"),
    ("void fbgemm_gpu::split_embedding_codegen_forward_kernel(int)", "kernel", "embedding", "memory"),
    ("void at::native::multi_tensor_apply_kernel<Adam>(int)", "kernel", "optimizer", "memory"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "kernel", "nccl", "comm"),
    ("Memcpy HtoD (Pinned -> Device)", "memcpy", "memcpy", "pcie"),
    ("Memcpy DtoD (Device -> Device)", "memcpy", "memcpy", "memory"),
    ("Memset (Device)", "memset", "memset", "memory"),
])
def test_kernel_classes(name: str, kind: str, category: str, cls: str) -> None:
    info = classify_kernel(name, kind)
    assert (info.category, info.cls, info.known) == (category, cls, True)


def test_unknown_kernel_is_flagged_and_dtype_read_from_names_or_inputs() -> None:
    assert not classify_kernel("zz_custom_thing", "kernel").known
    assert classify_kernel("sm90_gemm_bf16bf16_bf16f32", "kernel").dtype == "bf16"
    assert classify_kernel("cutlass_kernel", "kernel", "aten::mm", [[4, 4], [4, 4]], ["c10::Half"]).dtype == "fp16"


@pytest.mark.parametrize("op, dims, want", [
    ("aten::mm", [[64, 32], [32, 128]], (1.0, 64, 128, 32)),
    ("aten::addmm", [[128], [64, 32], [32, 128], [], []], (1.0, 64, 128, 32)),
    ("aten::bmm", [[8, 64, 32], [8, 32, 16]], (8, 64, 16, 32)),
    ("aten::linear", [[4, 10, 512], [256, 512], [256]], (1.0, 40, 256, 512)),
    ("aten::matmul", [[2, 3, 64, 32], [2, 3, 32, 16]], (6.0, 64, 16, 32)),
    ("aten::relu", [[4, 4]], None),
    ("aten::mm", None, None),
])
def test_gemm_shapes_from_input_dims(op: str, dims, want) -> None:
    assert gemm_shape(op, dims) == want


@pytest.mark.parametrize("name, want", [
    ("allreduce", "all_reduce"), ("nccl:_reduce_scatter_base", "reduce_scatter"),
    ("c10d::_allgather_base_", "all_gather"), ("nccl:all_to_all", "all_to_all"), ("alltoall_base", "all_to_all"),
    ("SendRecv", "send_recv"), ("Broadcast", "broadcast"), ("frobnicate", None), (None, None),
])
def test_collective_names(name, want) -> None:
    assert normalise_collective(name) == want


def test_parse_ranks() -> None:
    assert parse_ranks("[0, 1, 2]") == (0, 1, 2)
    assert parse_ranks([4, 5]) == (4, 5)
    assert parse_ranks("[]") is None and parse_ranks(None) is None


def test_collective_from_kernel_arguments() -> None:
    args = {"Collective name": "allgather", "In msg nelems": 1000, "Out msg nelems": 4000, "dtype": "BFloat16",
            "Group size": 4, "Process Group Name": "3", "Process Group Ranks": "[4, 5, 6, 7]"}
    c = collective_info("ncclDevKernel_AllGather_RING_LL", 20, args, [], 5, 8, [])
    assert (c.op, c.nbytes, c.group, c.pg) == ("all_gather", 8000, (4, 5, 6, 7), "3")


def test_collective_from_the_annotation_around_the_launch() -> None:
    ctx = [("nccl:_all_gather_base", None, [[8192, 64]], ["float"]), ("c10d::_allgather_base_", None, None, None)]
    c = collective_info("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", 285, None, ctx, 0, 16, [])
    # SendRecv kernel, but the annotation says all-gather: gathered output of 16 shards of 8192 x 64 floats
    assert (c.op, c.nbytes, c.group, c.pg) == ("all_gather", 8192 * 64 * 4 * 16, tuple(range(16)), "stream285")
    c = collective_info("ncclKernel_Weird", 3, None, [], 1, None, [])
    assert (c.op, c.known_op, c.nbytes, c.group) == ("all_reduce", False, -1, (1,))
    pgs = [{"pg_name": "7", "ranks": [2, 3]}]
    c = collective_info("ncclKernel_Broadcast", 3, {"Process Group Name": "7"}, [], 2, 4, pgs)
    assert (c.op, c.group) == ("broadcast", (2, 3))


def test_traced_gpu_names_find_their_platform() -> None:
    for gpu, want in (("NVIDIA A100-SXM4-80GB", "dgx_a100"), ("NVIDIA A100-PG509-200", "dgx_a100"),
                      ("NVIDIA H100 80GB HBM3", "dgx_h100")):
        found = platform_for_gpu(gpu)
        assert found is not None and found[0].name == want, gpu
    assert platform_for_gpu("Matrox G200") is None and platform_for_gpu(None) is None
