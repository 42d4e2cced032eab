"""The op graph: what each rank runs in one iteration, in program order.

Builders produce a :class:`Workload`; the engine consumes it. Nothing here knows about SimPy or
about any particular model family. Times are not stored on ops: compute ops point at a
:class:`KernelSpec` (deduplicated across the whole workload) that the kernel models time in bulk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

OpKind = Literal["kernel", "collective", "memcpy", "host_wait", "host"]
CollectiveOp = Literal[
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send_recv"
]

#: Streams a rank may use. ``compute`` and ``comm`` always exist; ``copy`` is created on first use.
STREAMS = ("compute", "comm", "copy")


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """One distinct kernel shape, the unit the kernel models time.

    ``family`` names the op family (``gemm``, ``bmm``, ``attention``, ``embedding_fwd``,
    ``embedding_bwd``, ``elementwise``, ``norm``, ``softmax``, ``optimizer``, ``moe``: one rank's
    expert FFNs of an MoE layer). ``params`` is a
    sorted tuple of ``(name, value)`` pairs with the family's shape parameters (counts, not
    bytes); ``dtype`` is the element type (``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``).
    """

    family: str
    params: tuple[tuple[str, float], ...]
    dtype: str

    @staticmethod
    def make(family: str, dtype: str, **params: float) -> KernelSpec:
        return KernelSpec(family, tuple(sorted((k, float(v)) for k, v in params.items())), dtype)

    def get(self, name: str, default: float | None = None) -> float:
        for k, v in self.params:
            if k == name:
                return v
        if default is None:
            raise KeyError(f"{self.family} kernel has no parameter {name!r}")
        return default


@dataclass(frozen=True, slots=True)
class CollectiveCall:
    """A rank's side of a collective.

    ``key`` is identical on every member and unique within the iteration; the collective starts
    when all members of ``group`` (global ranks, in order) have reached it on their comm stream.
    ``nbytes`` follows nccl-tests' size convention: the buffer of all-reduce / broadcast / reduce,
    the gathered output of all-gather, the input of reduce-scatter, the whole send buffer of
    all-to-all. ``send_bytes`` (all-to-all-v only) is this rank's bytes to each member, in group
    order; ``root`` is a group index for broadcast / reduce, the peer for send_recv.
    ``duration_s``, when set (a replayed trace), is how long the collective takes once every member
    has arrived, instead of its planned transfers over the network. ``comm_size`` is the number of
    ranks of the NCCL communicator the call runs on when that is more than ``group`` (a send/recv
    on a world communicator, as nccl-tests does; 0: the group itself, as PyTorch's pair
    communicators for send/recv), which sets how many channels NCCL gives a point-to-point transfer.
    """

    key: str
    op: CollectiveOp
    group: tuple[int, ...]
    nbytes: int
    send_bytes: tuple[int, ...] | None = None
    root: int = 0
    duration_s: float | None = None
    comm_size: int = 0


@dataclass(slots=True)
class Op:
    """One step of a rank's program.

    ``deps`` are indices of earlier ops of the same rank that must finish before this one starts
    (cross-stream waits; order within a stream is implicit). A ``host_wait`` op blocks the CPU
    thread until its deps finish (a synchronisation such as ``.item()``). A ``host`` op is CPU work
    only: the thread is busy for its ``cpu_s`` and the op touches no stream (it has no deps).
    ``cpu_s``, when set, is the op's time on the CPU thread in seconds (host work plus launch),
    replacing the engine's per-op launch overhead; a replayed trace sets it from the measured host
    timeline. ``delay_s`` is how long the op waits on its stream, once its deps are done, before it
    starts (a replayed trace's measured GPU-side delay that nothing in the program explains).
    ``iteration`` numbers the training iteration the op belongs to (0 the first), for programs that
    run several iterations back to back to reach the steady state. ``sm_taken``, on a kernel, is how
    many SMs a communication kernel running beside it by design holds (Transformer Engine's
    userbuffers overlap): the kernel runs on the rest, stretched by ``sms / (sms - sm_taken)``,
    instead of the platform's generic overlap slowdown.
    """

    name: str
    kind: OpKind
    category: str
    stream: str = "compute"
    phase: str = "fwd"
    kernel: int = -1
    coll: CollectiveCall | None = None
    nbytes: int = 0
    deps: tuple[int, ...] = ()
    cpu_s: float | None = None
    delay_s: float = 0.0
    iteration: int = 0
    sm_taken: int = 0


@dataclass
class Program:
    """The ops of one rank in program order, with a helper to append them and get their index.

    ``template``, when set, is the op list this program was copied from (a pipeline stage's program
    retargeted to each of its ranks): its ops equal the template's at the same places in name,
    kind, category, stream, phase, kernel, nbytes and deps; only a collective's ``coll`` (group and
    key), ``cpu_s``, ``delay_s`` and ``sm_taken`` may differ. Programs of one template share the
    engine's per-op tables (dependencies, the records' columns), and may share Op objects: an op of
    a program is never modified once the program is built.
    """

    rank: int
    ops: list[Op] = field(default_factory=list)
    template: list[Op] | None = None

    def add(self, op: Op) -> int:
        if op.kind == "host" and op.deps:
            raise ValueError(f"host op {op.name!r} cannot have deps (use a host_wait op to wait)")
        if op.cpu_s is not None and not op.cpu_s >= 0:
            raise ValueError(f"op {op.name!r}: cpu_s must be >= 0, got {op.cpu_s}")
        if not op.delay_s >= 0:
            raise ValueError(f"op {op.name!r}: delay_s must be >= 0, got {op.delay_s}")
        for d in op.deps:
            if not 0 <= d < len(self.ops):
                raise ValueError(f"op {op.name!r} depends on op {d}, which is not earlier in rank {self.rank}")
        self.ops.append(op)
        return len(self.ops) - 1


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU by purpose."""

    parameters: float = 0.0
    gradients: float = 0.0
    optimizer_states: float = 0.0
    activations: float = 0.0
    embeddings: float = 0.0
    buffers: float = 0.0
    kv_cache: float = 0.0       # inference: the KV cache of the requests in the batch

    @property
    def total(self) -> float:
        return (self.parameters + self.gradients + self.optimizer_states + self.activations
                + self.embeddings + self.buffers + self.kv_cache)

    def __add__(self, other: MemoryEstimate) -> MemoryEstimate:
        return MemoryEstimate(self.parameters + other.parameters, self.gradients + other.gradients,
                              self.optimizer_states + other.optimizer_states,
                              self.activations + other.activations, self.embeddings + other.embeddings,
                              self.buffers + other.buffers, self.kv_cache + other.kv_cache)

    def as_gib(self) -> dict[str, float]:
        keys = ("parameters", "gradients", "optimizer_states", "activations", "embeddings", "buffers")
        d = {k: getattr(self, k) / 2**30 for k in keys + (("kv_cache",) if self.kv_cache else ())}
        d["total"] = self.total / 2**30
        return d


@dataclass(frozen=True, slots=True)
class Replicas:
    """Identical ranks, of which a folded workload holds one of each kind: the representatives.

    Each level ``(block, unit)`` of ``levels`` is a shift: ranks come in blocks of ``block``
    consecutive ranks, and moving every rank ``unit`` further within its block (modulo the block)
    maps every rank's program onto another's: the same ops, with every collective's group moved the
    same way. Identical data-parallel replicas are one level (a block is a pipeline stage's ranks, a
    unit one replica of whole nodes); identical tensor-parallel ranks inside a node can be another
    (a block is a tensor-parallel group, a unit the GPUs of a PCIe switch). A level's block divides
    the unit of every level before it, so the shifts commute. The representatives are the ranks in
    the first ``unit`` of their block at every level; ``factor`` ranks stand for each.
    """

    world: int
    levels: tuple[tuple[int, int], ...]
    #: the representatives (the engine asks for every member of every collective it meets)
    _reps: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.levels:
            raise ValueError("replicas need at least one level")
        for i, (block, unit) in enumerate(self.levels):
            if unit < 1 or block % unit or self.world % block:
                raise ValueError(f"replicas: unit {unit} must divide block {block}, which must divide the "
                                 f"world {self.world}")
            if any(u % block for _, u in self.levels[:i]):
                raise ValueError(f"replicas: block {block} must divide the units of the levels before it")
        ranks = np.arange(self.world)
        keep = np.ones(self.world, dtype=bool)
        for block, unit in self.levels:
            keep &= ranks % block < unit
        object.__setattr__(self, "_reps", frozenset(np.flatnonzero(keep).tolist()))

    @property
    def factor(self) -> int:
        out = 1
        for block, unit in self.levels:
            out *= block // unit
        return out

    def is_rep(self, rank: int) -> bool:
        return rank in self._reps

    def rep(self, rank: int) -> int:
        """The representative that ``rank`` is an image of."""
        for block, unit in self.levels:
            base, off = divmod(rank, block)
            rank = base * block + off % unit
        return rank

    def reps_of(self, ranks: np.ndarray) -> np.ndarray:
        """:meth:`rep` of every rank in an integer array."""
        out = np.asarray(ranks, dtype=np.int64)
        for block, unit in self.levels:
            base, off = np.divmod(out, block)
            out = base * block + off % unit
        return out

    def shift(self, rank: int, k: int = 1, level: int = 0) -> int:
        """``rank``'s image ``k`` units further on at ``level``."""
        block, unit = self.levels[level]
        base, off = divmod(rank, block)
        return base * block + (off // unit + k) % (block // unit) * unit + off % unit

    def shift_all(self, ranks: np.ndarray, k: int, level: int) -> np.ndarray:
        """:meth:`shift` of every rank in an integer array."""
        block, unit = self.levels[level]
        base, off = np.divmod(np.asarray(ranks, dtype=np.int64), block)
        return base * block + (off // unit + k) % (block // unit) * unit + off % unit

    def representatives(self) -> list[int]:
        return [r for r in range(self.world) if self.is_rep(r)]


@dataclass(frozen=True)
class PipelineShape:
    """How a pipeline schedule repeats, for the engine's periodic shortcut (:mod:`simgpu.engine.periodic`).

    ``micro_batches`` is the job's count per pipeline and ``simulated`` the count the programs run.
    Adding ``period`` micro-batches adds one period of the steady state to every stage (one
    forward and one backward under 1F1B; a group of ``pp`` micro-batches through every model chunk
    under the interleaved schedule), and with ``least`` or more every stage has a steady state.
    Counts the programs may run are ``least`` plus a multiple of ``period``.
    """

    micro_batches: int
    period: int
    least: int
    simulated: int = 0

    def __post_init__(self) -> None:
        if self.period < 1 or self.least < 1 or self.micro_batches < 1:
            raise ValueError(f"a pipeline shape needs positive counts, got {self}")


@dataclass
class Workload:
    """What a builder returns: per-rank programs and the facts the report needs.

    ``kernels`` is the table of distinct kernel shapes that ``Op.kernel`` indexes.
    ``samples`` and ``tokens`` are per iteration over the whole job; ``model_flops`` is the
    useful (model) FLOPs of one iteration over the whole job, for MFU. ``programs`` has one
    program per rank in rank order, or, when ``replicas`` is set (a folded workload), one per
    representative rank only; ``memory`` is always per rank of the whole world. ``iterations`` is
    how many training iterations the programs run back to back (their ops say which is which,
    :attr:`Op.iteration`); ``samples``, ``tokens`` and ``model_flops`` are of one of them.
    ``pipeline`` says how a pipeline schedule repeats (None: it does not, or no pipeline); where the
    programs run fewer micro-batches than the job (``pipeline.simulated``), ``samples``, ``tokens``,
    ``model_flops`` and ``memory`` are still the job's. ``memory_bound``, per kernel spec, says
    whether the kernel is bound by HBM bandwidth on the job's GPU (set by :func:`simgpu.simulate`
    where the platform has ``overlap_slowdown_memory``, :func:`simgpu.kernels.overlap.memory_bound`);
    None: every kernel counts as compute-bound beside a collective.
    """

    name: str
    programs: list[Program]
    kernels: list[KernelSpec]
    memory: list[MemoryEstimate]
    samples: int
    tokens: int = 0
    model_flops: float = 0.0
    compute_dtype: str = "fp32"
    replicas: Replicas | None = None
    iterations: int = 1
    pipeline: PipelineShape | None = None
    memory_bound: list[bool] | None = None


class KernelTable:
    """Deduplicates :class:`KernelSpec` s and hands out their indices.

    A call's arguments as given (family, dtype, the parameters in the caller's order) are looked up
    first: a builder asks for the same few hundred shapes again and again, and equal arguments give
    an equal spec, so the spec is made and sorted only the first time.
    """

    def __init__(self) -> None:
        self.specs: list[KernelSpec] = []
        self._index: dict[KernelSpec, int] = {}
        self._asked: dict[tuple[object, ...], int] = {}

    def __call__(self, family: str, dtype: str, **params: float) -> int:
        asked = (family, dtype, *params.items())
        try:
            idx = self._asked.get(asked)
        except TypeError:  # a parameter that does not hash (a 0-d array): made and sorted each time
            return self._intern(KernelSpec.make(family, dtype, **params))
        if idx is None:
            idx = self._asked[asked] = self._intern(KernelSpec.make(family, dtype, **params))
        return idx

    def _intern(self, spec: KernelSpec) -> int:
        idx = self._index.get(spec)
        if idx is None:
            idx = self._index[spec] = len(self.specs)
            self.specs.append(spec)
        return idx
