"""Building blocks shared by the workload builders.

This module owns what DLRM and Transformer programs have in common: element sizes and the dtype
rules of mixed precision, an :class:`Emitter` that appends ops of one rank, ``nn.Linear`` / MLP
forward and backward emission, PyTorch DDP gradient buckets (assignment and the all-reduce issued
when a bucket's last gradient is produced), the optimizer step, and the memory of dense parameters.
It emits ops only; it knows nothing of timing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from ..elementwise import flops_per_element
from ..graph import CollectiveCall, KernelTable, Op, Program

#: Bytes per element of each dtype string.
DTYPE_BYTES: Final[Mapping[str, int]] = MappingProxyType(
    {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1})
#: Optimizer state tensors per parameter (each the size of the parameter, fp32).
OPTIMIZER_STATES: Final[Mapping[str, int]] = MappingProxyType({"sgd": 0, "adagrad": 1, "adam": 2})
#: Gradients (and the DDP buckets that reduce them) are fp32, also under mixed precision.
GRAD_BYTES: Final = 4
#: Master weights are fp32.
MASTER_BYTES: Final = 4
#: Size limit of the first DDP bucket (``dist._DEFAULT_FIRST_BUCKET_BYTES``). After its first
#: iteration DDP rebuilds its buckets in gradient-ready order with this smaller first bucket, so
#: the first all-reduce can start early; this is the steady state that an iteration sees.
DDP_FIRST_BUCKET_BYTES: Final = 2**20
MIB: Final = 2**20

_MIXED = ("bf16", "fp16", "fp8")


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") from None


#: The served formats whose activations stay 16-bit (:mod:`simgpu.precision`).
_SERVED_FORMATS = frozenset({"fp4", "fp8_block", "mxfp8", "mxfp4", "w4a16"})


def aux_dtype(precision: str) -> str:
    """Dtype of the non-matmul kernels (elementwise, norm, softmax) under ``precision``. Under fp4
    (serving only) the activations stay in bf16 as under fp8: NVFP4 quantises the weights and each
    GEMM's input (TensorRT-LLM and ModelOpt's NVFP4 recipe), not the residual stream or the norms."""
    return "bf16" if precision in _MIXED or precision in _SERVED_FORMATS else "fp32"


def is_mixed(precision: str) -> bool:
    """Whether matmuls run on low-precision copies of fp32 master weights (autocast)."""
    return precision in _MIXED


def optimizer_states(optimizer: str) -> int:
    try:
        return OPTIMIZER_STATES[optimizer]
    except KeyError:
        raise ValueError(f"unknown optimizer {optimizer!r}; known: {', '.join(OPTIMIZER_STATES)}") from None


def _category(family: str) -> str:
    # attention_fwd / embedding_bwd are coloured as one class each.
    got = _CATEGORIES.get(family)
    if got is None:
        got = _CATEGORIES[family] = next(
            (family[: -len(x)] for x in ("_fwd", "_bwd") if family.endswith(x)), family)
    return got


#: family -> its category (see _category), filled as families are met
_CATEGORIES: dict[str, str] = {}


class Emitter:
    """Appends the ops of one rank to its :class:`Program`, interning kernel shapes in ``kernels``."""

    def __init__(self, rank: int, kernels: KernelTable) -> None:
        self.program = Program(rank)
        self.kernels = kernels

    @property
    def rank(self) -> int:
        return self.program.rank

    @property
    def last(self) -> int:
        """Index of the op appended last."""
        if not self.program.ops:
            raise ValueError(f"rank {self.rank} has no ops yet")
        return len(self.program.ops) - 1

    def kernel(self, name: str, family: str, dtype: str, *, phase: str, deps: Iterable[int] = (),
               **params: float) -> int:
        """A kernel on the compute stream; ``params`` are the family's shape parameters."""
        return self._kernel(name, family, dtype, phase, deps, params)

    def _kernel(self, name: str, family: str, dtype: str, phase: str, deps: Iterable[int],
                params: dict[str, float]) -> int:
        idx = self.kernels(family, dtype, **params)
        return self.program.add(Op(name, "kernel", _category(family), "compute", phase, idx, None, 0, _deps(deps)))

    def elementwise(self, name: str, numel: int, reads: int, writes: int, dtype: str, *, op: str, phase: str,
                    deps: Iterable[int] = ()) -> int:
        """An elementwise kernel over ``numel`` outputs that reads ``reads`` and writes ``writes`` tensor
        elements per output; ``op`` names what it computes (a key of
        :data:`~simgpu.elementwise.FLOPS_PER_ELEMENT`), which sets its ``flops_per_element``."""
        return self.kernel(name, "elementwise", dtype, phase=phase, deps=deps, numel=numel, reads=reads,
                           writes=writes, flops_per_element=flops_per_element(op))

    def collective(self, name: str, call: CollectiveCall, *, phase: str, deps: Iterable[int] = ()) -> int:
        """A collective on the comm stream; ``Op.nbytes`` mirrors the call's nccl-tests size."""
        if call.send_bytes is not None and sum(call.send_bytes) != call.nbytes:
            raise ValueError(f"{call.key}: send_bytes sum to {sum(call.send_bytes)}, "
                             f"not nbytes {call.nbytes}")
        if self.rank not in call.group:
            raise ValueError(f"{call.key}: rank {self.rank} is not in its group")
        return self.program.add(Op(name, "collective", call.op, stream="comm", phase=phase, coll=call,
                                   nbytes=call.nbytes, deps=_deps(deps)))

    def memcpy(self, name: str, nbytes: int, *, deps: Iterable[int] = ()) -> int:
        """A host-to-device copy on the copy stream (input data)."""
        return self.program.add(Op(name, "memcpy", "memcpy", stream="copy", phase="data", nbytes=nbytes,
                                   deps=_deps(deps)))


def _deps(deps: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(set(deps)))


@dataclass(frozen=True)
class Param:
    """A parameter tensor as DDP sees it: a unique name and its element count."""

    name: str
    numel: int


@dataclass(frozen=True)
class Linear:
    """An ``nn.Linear(inputs, outputs, bias)`` named ``name``."""

    name: str
    inputs: int
    outputs: int
    bias: bool = True

    @property
    def params(self) -> tuple[Param, ...]:
        """Weight then bias: the order autograd makes their gradients ready."""
        w = Param(f"{self.name}.weight", self.inputs * self.outputs)
        return (w, Param(f"{self.name}.bias", self.outputs)) if self.bias else (w,)

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.params)

    def flops(self, tokens: int) -> int:
        """Forward matmul FLOPs over ``tokens`` rows."""
        return 2 * tokens * self.inputs * self.outputs


def linear_fwd(em: Emitter, lin: Linear, tokens: int, precision: str, *, phase: str = "fwd",
               deps: Iterable[int] = (), cast_weights: bool = True) -> int:
    """``y = x @ W.T + b`` over ``tokens`` rows; returns the gemm's index.

    Under autocast the fp32 weight (and bias) is first cast to the compute dtype; the cast needs no
    input data, so ``deps`` are put on the gemm only. ``cast_weights=False``: the weights are stored
    in the compute dtype (a served model), so there is no cast. The bias is fused into the gemm
    (cuBLASLt epilogue).
    """
    if is_mixed(precision) and cast_weights:
        em.elementwise(f"{lin.name}.cast", lin.numel, 1, 1, aux_dtype(precision), op="cast", phase=phase)
    return em.kernel(f"{lin.name}.fwd", "gemm", precision, phase=phase, deps=deps,
                     m=tokens, n=lin.outputs, k=lin.inputs)


def linear_bwd(em: Emitter, lin: Linear, tokens: int, precision: str, *, dgrad: bool = True,
               grads: GradBuckets | None = None, phase: str = "bwd", deps: Iterable[int] = ()) -> int:
    """Backward of :func:`linear_fwd`; returns the index of its last op.

    Autograd runs the node's dgrad, then wgrad, then reduces the broadcast bias gradient; under
    autocast the gradients are cast back to fp32 before they accumulate. Only then do the DDP hooks
    of the layer's parameters fire, so all of them become ready at the last op. ``dgrad=False``
    where the input needs no gradient (the first layer over input data); ``grads=None`` where the
    parameters are not ready yet (a tied weight with a later use).
    """
    deps = tuple(deps)
    if dgrad:
        em.kernel(f"{lin.name}.dgrad", "gemm", precision, phase=phase, deps=deps,
                  m=tokens, n=lin.inputs, k=lin.outputs)
        deps = ()
    last = em.kernel(f"{lin.name}.wgrad", "gemm", precision, phase=phase, deps=deps,
                     m=lin.outputs, n=lin.inputs, k=tokens)
    aux = aux_dtype(precision)
    if lin.bias:
        # A reduction over the rows: reads the output gradient once, writes a vector.
        last = em.elementwise(f"{lin.name}.bias_grad", tokens * lin.outputs, 1, 0, aux, op="sum_rows", phase=phase)
    if is_mixed(precision):
        last = em.elementwise(f"{lin.name}.grad_cast", lin.numel, 1, 1, aux, op="cast", phase=phase)
    if grads is not None:
        grads.ready(lin.params, last)
    return last


def mlp_fwd(em: Emitter, layers: Sequence[Linear], tokens: int, precision: str, *, relu_last: bool,
            phase: str = "fwd", deps: Iterable[int] = (), cast_weights: bool = True) -> int:
    """Linear + ReLU layers (no ReLU after the last unless ``relu_last``); returns the last op's index.

    ``deps`` go on the first gemm (for instance the copy of the input batch); ``cast_weights`` as
    for :func:`linear_fwd`.
    """
    last = -1
    for i, lin in enumerate(layers):
        last = linear_fwd(em, lin, tokens, precision, phase=phase, deps=deps if i == 0 else (),
                          cast_weights=cast_weights)
        if relu_last or i < len(layers) - 1:
            last = em.elementwise(f"{lin.name}.relu", tokens * lin.outputs, 1, 1, aux_dtype(precision),
                                  op="relu", phase=phase)
    return last


def mlp_bwd(em: Emitter, layers: Sequence[Linear], tokens: int, precision: str, *, relu_last: bool,
            input_grad: bool, grads: GradBuckets | None, phase: str = "bwd") -> int:
    """Backward of :func:`mlp_fwd`, last layer first; returns the last op's index.

    ``input_grad`` says whether the MLP's input needs a gradient (it does after an interaction, not
    over input features).
    """
    last = -1
    for i in reversed(range(len(layers))):
        lin = layers[i]
        if relu_last or i < len(layers) - 1:
            # threshold_backward reads the gradient and the saved output.
            em.elementwise(f"{lin.name}.relu_bwd", tokens * lin.outputs, 2, 1, aux_dtype(precision),
                           op="relu_bwd", phase=phase)
        last = linear_bwd(em, lin, tokens, precision, dgrad=input_grad or i > 0, grads=grads, phase=phase)
    return last


def assign_buckets(params: Sequence[Param], cap_bytes: float,
                   first_cap_bytes: float = DDP_FIRST_BUCKET_BYTES) -> list[tuple[Param, ...]]:
    """DDP's bucket assignment (``compute_bucket_assignment_by_size``) of fp32 gradients.

    ``params`` are in the order their gradients become ready. A bucket is closed as soon as it
    reaches its limit (``first_cap_bytes`` for the first, ``cap_bytes`` after), so a bucket may
    exceed its limit by one parameter and a parameter is never split.
    """
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise ValueError("parameter names must be unique")
    limit = min(first_cap_bytes, cap_bytes)
    buckets: list[tuple[Param, ...]] = []
    current: list[Param] = []
    size = 0
    for p in params:
        current.append(p)
        size += p.numel * GRAD_BYTES
        if size >= limit:
            buckets.append(tuple(current))
            current, size, limit = [], 0, cap_bytes
    if current:
        buckets.append(tuple(current))
    return buckets


class BucketTracker:
    """DDP's bucket bookkeeping: which buckets of gradients are complete, launched strictly in order.

    A bucket whose gradients are all ready waits for the buckets before it; once it may go,
    :meth:`_issue` is called with the bucket's index, its bytes (fp32 gradients) and the op that
    produced its last gradient (the CUDA event its reduction waits for). Subclasses emit the reduction.
    """

    def __init__(self, buckets: Sequence[tuple[Param, ...]]) -> None:
        self._buckets = list(buckets)
        self._pending = [{p.name for p in b} for b in self._buckets]
        self._bucket_of: dict[str, int] = {}
        for i, b in enumerate(self._buckets):
            for p in b:
                if p.name in self._bucket_of:
                    raise ValueError(f"parameter {p.name} is in two buckets")
                self._bucket_of[p.name] = i
        self._producer = [-1] * len(self._buckets)
        self._next = 0
        self.issued: list[int] = []

    def _issue(self, i: int, nbytes: int, producer: int) -> int | None:
        raise NotImplementedError

    def ready(self, params: Iterable[Param], op: int) -> None:
        """Mark the gradients of ``params`` produced by op ``op``; issue the buckets that completed."""
        for p in params:
            b = self._bucket_of[p.name]
            if p.name not in self._pending[b]:
                raise ValueError(f"gradient of {p.name} marked ready twice")
            self._pending[b].discard(p.name)
            self._producer[b] = max(self._producer[b], op)
        while self._next < len(self._buckets) and not self._pending[self._next]:
            i = self._next
            idx = self._issue(i, sum(p.numel for p in self._buckets[i]) * GRAD_BYTES, self._producer[i])
            if idx is not None:
                self.issued.append(idx)
            self._next += 1

    def done(self) -> tuple[int, ...]:
        """Indices of the reductions issued; raises if a gradient never became ready."""
        if self._next < len(self._buckets):
            missing = sorted(set().union(*self._pending[self._next:]))
            raise RuntimeError(f"gradients never produced: {', '.join(missing[:5])}")
        return tuple(self.issued)


class GradBuckets(BucketTracker):
    """One rank's DDP reducer: all-reduces each bucket over ``group`` once its gradients are ready."""

    def __init__(self, em: Emitter, buckets: Sequence[tuple[Param, ...]], group: tuple[int, ...],
                 key: str = "dp") -> None:
        super().__init__(buckets)
        self._em, self._group, self._key = em, group, key

    def _issue(self, i: int, nbytes: int, producer: int) -> int | None:
        call = CollectiveCall(f"{self._key}.bucket{i}", "all_reduce", self._group, nbytes)
        return self._em.collective(f"{self._key}.bucket{i}.all_reduce", call, phase="bwd", deps=(producer,))


def optimizer_step(em: Emitter, numel: int, optimizer: str, *, deps: Iterable[int] = ()) -> int:
    """One fused multi-tensor optimizer step over ``numel`` fp32 parameters."""
    return em.kernel("optimizer.step", "optimizer", "fp32", phase="opt", deps=deps, numel=numel,
                     states=optimizer_states(optimizer))


def dense_memory(numel: int, precision: str, optimizer: str) -> tuple[float, float, float]:
    """Bytes of (parameters, gradients, optimizer states) of ``numel`` data-parallel parameters.

    Parameters are fp32 masters plus, under autocast, the cached low-precision copies; gradients
    fp32; each optimizer state fp32.
    """
    params = numel * MASTER_BYTES + (numel * dtype_bytes(precision) if is_mixed(precision) else 0)
    return float(params), float(numel * GRAD_BYTES), float(numel * MASTER_BYTES * optimizer_states(optimizer))
