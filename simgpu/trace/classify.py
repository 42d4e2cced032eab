"""What a traced GPU activity is: its category, how it scales across GPUs, and its collective.

Kineto names kernels by their C++ symbol and rarely records shapes, so this module reads what it
can: the kernel name (cuBLAS / CUTLASS / cuDNN / ATen / Triton / NCCL naming conventions), the
input shapes and types of the CPU op that launched it (Kineto ``Input Dims`` or the Execution
Trace), and, for NCCL kernels, the collective arguments of the kernel or of the ``nccl:*`` /
``record_param_comms`` annotation around the launch. Units: bytes for sizes, element counts for
shapes; no times.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..graph import CollectiveOp

#: Bytes per element of the dtype names found in Kineto and ET arguments (lower case).
ELEMENT_BYTES = {
    "float": 4, "float32": 4, "c10::float": 4, "double": 8, "float64": 8, "half": 2, "c10::half": 2,
    "float16": 2, "bfloat16": 2, "c10::bfloat16": 2, "long": 8, "long int": 8, "int64": 8, "int": 4,
    "int32": 4, "short": 2, "int16": 2, "char": 1, "signed char": 1, "unsigned char": 1, "byte": 1,
    "int8": 1, "uint8": 1, "bool": 1, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1,
}
_SIM_DTYPE = {"float": "fp32", "float32": "fp32", "double": "fp32", "half": "fp16", "c10::half": "fp16",
              "float16": "fp16", "bfloat16": "bf16", "c10::bfloat16": "bf16", "c10::float8_e4m3fn": "fp8",
              "c10::float8_e5m2": "fp8"}
#: Collective names (arguments, annotations, c10d ops, NCCL kernels) -> simgpu collective op.
COLLECTIVES: dict[str, CollectiveOp] = {
    "allreduce": "all_reduce", "allgather": "all_gather", "allgatherbase": "all_gather",
    "allgatherintotensor": "all_gather", "allgatherintotensorcoalesced": "all_gather",
    "reducescatter": "reduce_scatter", "reducescatterbase": "reduce_scatter",
    "reducescattertensor": "reduce_scatter", "reducescattertensorcoalesced": "reduce_scatter",
    "alltoall": "all_to_all", "alltoallbase": "all_to_all", "alltoallv": "all_to_all",
    "broadcast": "broadcast", "reduce": "reduce", "send": "send_recv", "recv": "send_recv",
    "sendrecv": "send_recv", "allreducecoalesced": "all_reduce",
}
_NCCL_KERNEL = re.compile(r"nccl(?:dev)?kernel_([a-z]+)", re.IGNORECASE)

# (category, class, name fragments), checked in order; class: "flops" (compute-bound) or "memory"
_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("attention", "flops", ("flash", "fmha", "attention", "sdpa")),
    ("norm", "memory", ("norm", "bn_fw", "bn_bw", "welford")),
    ("softmax", "memory", ("softmax",)),
    ("optimizer", "memory", ("adam", "adagrad", "sgd", "lamb", "multi_tensor_apply", "fused_optim", "shampoo")),
    ("embedding", "memory", ("embedding", "_tbe", "lookup", "bag_")),
    ("conv", "flops", ("conv", "winograd", "wgrad", "dgrad", "fprop", "implicit_convolve", "cudnn")),
    ("gemm", "flops", ("gemm", "cutlass", "xmma", "cublas", "gemv", "matmul", "s884", "h884", "s1688",
                       "h1688", "s16816", "h16816", "triton_tem", "dot_kernel")),
    ("reduction", "memory", ("reduce", "sum_kernel", "cub::", "argmax", "topk", "sort", "radix", "scan",
                             "triton_red", "triton_per", "splitk")),
    ("elementwise", "memory", ("elementwise", "vectorized", "unrolled", "pointwise", "copy", "fill",
                               "triton_poi", "cat", "index", "gather", "scatter", "where", "mul", "add", "div",
                               "relu", "gelu", "silu", "sigmoid", "tanh", "dropout", "cast", "transpose",
                               "permute", "clamp", "exp", "pow", "sqrt", "abs", "neg", "masked", "compare")),
)
_GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
             "aten::_scaled_mm")


@dataclass(frozen=True, slots=True)
class KernelInfo:
    """How to re-time a measured GPU activity on another GPU.

    ``cls``: ``flops`` (compute-bound: scales with peak FLOP/s), ``memory`` (scales with HBM
    bandwidth), ``pcie`` (host copies: scale with PCIe bandwidth) or ``comm`` (NCCL); ``known`` is
    false when the name matched no rule; ``gemm`` is ``(b, m, n, k)`` when the shape is known.
    """

    category: str
    cls: str
    dtype: str = "fp32"
    known: bool = True
    gemm: tuple[float, float, float, float] | None = None


@dataclass(frozen=True, slots=True)
class CollInfo:
    """A traced collective: ``pg`` names its process group (for matching across ranks), ``nbytes``
    follows nccl-tests' convention (-1 when unknown), ``group`` lists global ranks."""

    pg: str
    op: CollectiveOp
    nbytes: int
    group: tuple[int, ...]
    known_op: bool = True


def short_name(name: str) -> str:
    """A kernel's name without return type, namespace noise, template arguments and parameters."""
    s = name.strip().replace("(anonymous namespace)::", "")
    if s.startswith("void "):
        s = s[5:]
    out, depth = [], 0
    for ch in s:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    return ("".join(out).strip() or s)[:120]


def dtype_of(types: Sequence[Any] | None) -> str | None:
    """simgpu dtype (``fp32``, ``bf16``, ...) of the first tensor input type, if recognisable."""
    for t in types or ():
        key = _type_key(t)
        if key in _SIM_DTYPE:
            return _SIM_DTYPE[key]
    return None


def _type_key(t: Any) -> str:
    s = str(t).strip().lower()
    if s.startswith("tensor(") and s.endswith(")"):
        s = s[7:-1]
    return s


def _dtype_from_name(low: str) -> str | None:
    if "bf16" in low or "bfloat16" in low:
        return "bf16"
    if "fp8" in low or "e4m3" in low or "e5m2" in low:
        return "fp8"
    if "tf32" in low or "s1688" in low or "s16816" in low:
        return "tf32"
    if "f16" in low or "half" in low or "h884" in low or "h1688" in low or "h16816" in low:
        return "fp16"
    if "sgemm" in low or "f32" in low or "float" in low:
        return "fp32"
    return None


def classify_kernel(name: str, kind: str, ctx_name: str | None = None, dims: Sequence[Any] | None = None,
                    types: Sequence[Any] | None = None) -> KernelInfo:
    """The :class:`KernelInfo` of a GPU activity; ``ctx_*`` describe the CPU op that launched it."""
    low = name.lower()
    if kind == "memset":
        return KernelInfo("memset", "memory")
    if kind == "memcpy":
        host = "htod" in low or "dtoh" in low or "host" in low or "pinned" in low or "pageable" in low
        return KernelInfo("memcpy", "pcie" if host else "memory")
    if "nccl" in low:
        return KernelInfo("nccl", "comm")
    dtype = _dtype_from_name(low) or dtype_of(types) or "fp32"
    for category, cls, frags in _RULES:
        if any(f in low for f in frags):
            gemm = gemm_shape(ctx_name, dims) if category == "gemm" else None
            return KernelInfo(category, cls, dtype, True, gemm)
    return KernelInfo("other", "memory", dtype, False)


def gemm_shape(op: str | None, dims: Sequence[Any] | None) -> tuple[float, float, float, float] | None:
    """``(b, m, n, k)`` of a matmul-like ATen op from its input shapes, or None."""
    if op not in _GEMM_OPS or not dims:
        return None
    try:
        shapes = [tuple(int(x) for x in d) if isinstance(d, (list, tuple)) else () for d in dims]
    except (TypeError, ValueError):
        return None
    if op == "aten::mm" and len(shapes) >= 2 and len(shapes[0]) == 2 and len(shapes[1]) == 2:
        (m, k), (_, n) = shapes[0], shapes[1]
        return 1.0, m, n, k
    if op == "aten::addmm" and len(shapes) >= 3 and len(shapes[1]) == 2 and len(shapes[2]) == 2:
        (m, k), (_, n) = shapes[1], shapes[2]
        return 1.0, m, n, k
    if op == "aten::bmm" and len(shapes) >= 2 and len(shapes[0]) == 3 and len(shapes[1]) == 3:
        (b, m, k), (_, _, n) = shapes[0], shapes[1]
        return b, m, n, k
    if op == "aten::baddbmm" and len(shapes) >= 3 and len(shapes[1]) == 3 and len(shapes[2]) == 3:
        (b, m, k), (_, _, n) = shapes[1], shapes[2]
        return b, m, n, k
    if op == "aten::linear" and len(shapes) >= 2 and shapes[0] and len(shapes[1]) == 2:
        x, w = shapes[0], shapes[1]
        return 1.0, math.prod(x[:-1]) if len(x) > 1 else 1, w[0], x[-1]
    if op in ("aten::matmul", "aten::_scaled_mm") and len(shapes) >= 2 and len(shapes[0]) >= 2 and len(shapes[1]) >= 2:
        lhs, rhs = shapes[0], shapes[1]
        return float(math.prod(lhs[:-2]) or 1), lhs[-2], rhs[-1], lhs[-1]
    return None


def normalise_collective(name: Any) -> CollectiveOp | None:
    """simgpu collective op of a collective name in any of its spellings, or None."""
    if not isinstance(name, str):
        return None
    key = re.sub(r"[^a-z]", "", name.lower().split("::")[-1].removeprefix("nccl:").replace("_base", "base"))
    key = key.removesuffix("_")
    return COLLECTIVES.get(key) or COLLECTIVES.get(key.removeprefix("c10d"))


def parse_ranks(value: Any) -> tuple[int, ...] | None:
    """Ranks from ``[0, 1]`` (a list, or a string as Kineto writes it), or None."""
    if isinstance(value, list):
        items: list[Any] = value
    elif isinstance(value, str):
        items = re.findall(r"-?\d+", value)
    else:
        return None
    try:
        ranks = tuple(int(x) for x in items)
    except (TypeError, ValueError):
        return None
    return ranks or None


def _nelems_bytes(nelems: Any, dtype: Any) -> int | None:
    try:
        n = int(nelems)
    except (TypeError, ValueError):
        return None
    return n * ELEMENT_BYTES.get(_type_key(dtype), 4) if n >= 0 else None


def collective_info(kernel_name: str, stream: int, args: Mapping[str, Any] | None,
                    context: Sequence[tuple[str, Mapping[str, Any] | None, Sequence[Any] | None,
                                            Sequence[Any] | None]],
                    rank: int, world: int | None, pg_config: Sequence[Mapping[str, Any]]) -> CollInfo:
    """The :class:`CollInfo` of an NCCL kernel.

    ``args`` are the kernel's collective arguments (may be None); ``context`` lists the CPU spans
    around the launch, innermost first, as ``(name, collective args, input dims, input types)``.
    """
    sources: list[Mapping[str, Any]] = [args] if args else []
    sources += [c[1] for c in context if c[1]]
    op = next((normalise_collective(s.get("Collective name")) for s in sources
               if normalise_collective(s.get("Collective name"))), None)
    nccl_span = next((c for c in context if c[0].startswith("nccl:")), None)
    if op is None:
        op = next((normalise_collective(c[0]) for c in context
                   if (c[0].startswith("nccl:") or c[0].startswith("c10d::")) and normalise_collective(c[0])), None)
    known = True
    if op is None:
        m = _NCCL_KERNEL.search(kernel_name)
        op = normalise_collective(m.group(1)) if m else None
    if op is None:
        op, known = "all_reduce", False
    group: tuple[int, ...] | None = None
    pg_name: str | None = None
    for s in sources:
        group = group or parse_ranks(s.get("Process Group Ranks"))
        pg_name = pg_name or (str(s["Process Group Name"]) if "Process Group Name" in s else None)
    size_arg = next((s for s in sources if "In msg nelems" in s), None)
    gsize = next((int(s["Group size"]) for s in sources if isinstance(s.get("Group size"), int)), None)
    if group is None and pg_name is not None:
        group = next((parse_ranks(pg.get("ranks")) for pg in pg_config if str(pg.get("pg_name")) == pg_name), None)
    if group is None and size_arg is not None and gsize:
        start = int(size_arg.get("Global rank start", 0) or 0)
        stride = int(size_arg.get("Global rank stride", 1) or 1)
        group = tuple(start + i * stride for i in range(gsize))
    if group is None:
        group = tuple(range(world)) if world and world > 0 and rank < world else (rank,)
    n = len(group)
    nbytes: int | None = None
    if size_arg is not None:
        field_name = "Out msg nelems" if op == "all_gather" and "Out msg nelems" in size_arg else "In msg nelems"
        nbytes = _nelems_bytes(size_arg.get(field_name), size_arg.get("dtype"))
    if nbytes is None and nccl_span is not None and nccl_span[2]:
        first = nccl_span[2][0]
        if isinstance(first, (list, tuple)) and all(isinstance(x, int) for x in first):
            elem = ELEMENT_BYTES.get(_type_key(nccl_span[3][0]), 4) if nccl_span[3] else 4
            nbytes = math.prod(first) * elem * (n if op == "all_gather" else 1)
    return CollInfo(pg_name if pg_name is not None else f"stream{stream}", op,
                    -1 if nbytes is None else int(nbytes), group, known)
