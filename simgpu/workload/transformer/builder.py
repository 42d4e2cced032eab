"""The Transformer builder: every rank's program for one training iteration, under any parallelism.

This module owns how a stage's iteration is put together from the pieces of the other modules: the
pipeline schedule's steps (:mod:`~simgpu.workload.transformer.pipeline`) with a batched P2P exchange and a host
synchronisation before each step, the forward / backward of the stage's model chunks for each
micro-batch (:mod:`~simgpu.workload.transformer.blocks`), input copies on the stages that need data, gradient
reduction (DDP / ZeRO buckets during the last micro-batch's backward, or FSDP's per-block
all-gathers with its prefetch and rate limiter, :mod:`~simgpu.workload.transformer.fsdp`, and
reduce-scatters every micro-batch, :mod:`~simgpu.workload.dataparallel`),
the tied embedding's gradient all-reduce between the first and last stage, the norms' gradient
all-reduce over tp under sequence parallelism, the optimizer step and, under ZeRO 1-2, the
parameter all-gather per bucket after the step (under ``overlap_param_gather`` the next
iteration's forward waits for each bucket's all-gather before the layers that use it; the
programs then run two iterations back to back, see :func:`simgpu.sim.simulate`). One program is
built per stage and retargeted to its ranks (:mod:`~simgpu.workload.stage`; the ranks that fold and how
the pipeline repeats, :mod:`~simgpu.workload.transformer.folding`); it also gives the job's useful FLOPs
and memory per GPU.

With no model parallelism, ``framework: pytorch`` and no recomputation the program is nanoGPT's
under DDP: one micro-batch forward, backward with bucketed all-reduces, a fused optimizer step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ...config.workload import WorkloadSpec
from ...graph import CollectiveCall, CollectiveOp, KernelTable, Op, Program, Workload
from ..common import Param, assign_buckets, is_mixed, optimizer_step
from ..dataparallel import BucketCopies, GradSink, NoSync, Reducer
from ..parallel import Coord
from ..registry import World, register
from ..stage import Pair, StageEmitter, retarget
from .blocks import Blocks
from .folding import pipeline_shape, replicas, simulated_setup
from .fsdp import Gatherer, Pass, UnitReducer
from .memory import stage_memory, weight_bytes
from .pipeline import Batch, Step, plan
from .shapes import (
    Block,
    Setup,
    active_matmul_params,
    block,
    embedding_params,
    head_params,
    make_setup,
    model_flops,
    parameter_count,
)

__all__ = ["active_matmul_params", "build", "model_flops", "parameter_count"]

#: Bytes of one token id (int64) in the input batch.
_TOKEN_ID_BYTES = 8
#: P2P streams, one per direction and kind of tensor: each is a FIFO whose order both sides of a
#: stage pair share (activations and gradients leave and arrive in schedule order).
_PP_STREAMS = {("act", True): "comm.pp_send_fwd", ("act", False): "comm.pp_recv_fwd",
               ("grad", True): "comm.pp_send_bwd", ("grad", False): "comm.pp_recv_bwd"}
#: Programs of several iterations: the iterations after the first are the first's ops repeated (see
#: :meth:`_Stage.build`); False emits each one (the tests compare the two).
REPEAT_ITERATIONS = True
#: Marks (at or below it) that the first iteration's waits hand out in place of the previous
#: iteration's ops they will stand for (see :class:`_Marked`).
_MARK = -(1 << 40)


@dataclass
class _Marked(Program):
    """A stage's program whose first iteration is emitted once for all: an op's dependencies at or
    below :data:`_MARK` are not ops but marks, each the number of a call to a wait on the previous
    iteration (the mark ``_MARK - k`` for the ``k``-th call); they are taken off the op and kept in
    ``marks`` by its index, where the later iterations put what the calls then hand out."""

    marks: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def add(self, op: Op) -> int:
        if op.deps and min(op.deps) <= _MARK:
            marks = tuple(_MARK - d for d in op.deps if d <= _MARK)
            op.deps = tuple(d for d in op.deps if d > _MARK)
            idx = super().add(op)
            self.marks[idx] = marks
            return idx
        return super().add(op)


#: What FSDP wraps and gathers as one: a block, the embedding ("embed") or the output head ("head").
Unit = Block | str


class _Stage:
    """Emits one pipeline stage's program for its representative rank."""

    def __init__(self, s: Setup, stage: int, kernels: KernelTable) -> None:
        self.s, self.stage = s, stage
        lay = s.layout
        self.em = StageEmitter(lay.rank(Coord(0, 0, 0, stage)), kernels, lay, s.host_s)
        self.bl = Blocks(s, self.em)
        self.chunks = s.stage_chunks(stage)
        self.blocks = {g: [block(s, i) for i in s.chunk_layers(g)] for g in self.chunks}
        self.last_g = s.chunks - 1
        self.out: dict[tuple[str, int, int], int] = {}   # (act|grad, mb, global chunk) -> producing op
        self.reductions: list[int] = []
        steps = [x for x in plan(s.schedule, lay.pp, s.m, s.v, stage) if isinstance(x, Step)]
        final = [self.chunks[x.chunk] for x in steps if x.kind == "B" and x.mb == s.m - 1]
        dense_chunks = [(g, self._chunk_params(g)) for g in final]
        expert_chunks = [(g, [p for b in reversed(self.blocks[g]) if b.experts for p in b.experts.params])
                         for g in final]
        self.dense_order = [p for _, ps in dense_chunks for p in ps]
        self.expert_order = [p for _, ps in expert_chunks for p in ps]
        #: the gradient (and, under the distributed optimizer, parameter) buckets per process group
        self.buckets = {"dp_cp": self._buckets(dense_chunks), "edp_cp": self._buckets(expert_chunks)}
        self.dense: Reducer | None = None
        self.expert: Reducer | None = None
        #: module name -> the previous iteration's all-gathers of its parameters' buckets, not yet waited for
        self.gathered: dict[str, set[int]] = {}
        self._every_gather: tuple[int, ...] = ()
        #: the parameter all-gathers each iteration's step adds to ``gathered``, in order
        self._gather_log: list[tuple[str, int]] = []
        #: while the first iteration is emitted for all (see :meth:`build`): the calls to the waits on the
        #: previous iteration, in order, each as the function and argument that hand out its ops
        self._calls: list[tuple[Callable[[object], tuple[int, ...]], object]] | None = None
        self._waiting: list[tuple[Callable[[object], tuple[int, ...]], object]] = []  # the first iteration's calls
        #: the first iteration as the later ones repeat it: its ops, the all-gathers its step added (to
        #: ``gathered``, and all of them in order), its collectives' entries of ``em.calls``
        self._first: tuple[int, list[tuple[str, int]], tuple[int, ...], list[tuple[int, str | Pair, str]]] = (
            0, [], (), [])
        if s.param_overlap:
            self.bl.waits = self._module_waits
        self.fsdp = Gatherer(self.em, weight_bytes(s.precision), self._copy_out, forward_prefetch=s.forward_prefetch,
                             backward_prefetch=s.backward_prefetch, limit_all_gathers=s.limit_all_gathers,
                             reshard_after_forward=s.reshard_after_forward) if s.zero == 3 else None

    def _reducers(self) -> None:
        """Fresh gradient reducers for an iteration (ZeRO 0-2)."""
        s = self.s
        if s.zero < 3:
            op: CollectiveOp = "all_reduce" if s.zero == 0 else "reduce_scatter"
            kind = BucketCopies if s.bucket_copies else Reducer
            self.dense = kind(self.em, self.buckets["dp_cp"], "dp_cp", op=op)
            if self.expert_order:
                self.expert = kind(self.em, self.buckets["edp_cp"], "edp_cp", op=op, key="expert_grads")

    def _buckets(self, chunks: list[tuple[int, list[Param]]]) -> list[tuple[Param, ...]]:
        """Buckets of the stage's gradients, ``chunks`` (global chunk, its parameters in gradient-ready
        order) in the order their last backward runs. PyTorch DDP: one DDP over the stage, a small
        first bucket. Megatron-core: a DDP per model chunk, its buckets all of ``bucket_bytes``, and
        one bucket per chunk (``bucket_size`` None) where bucketing is off: without
        overlap_grad_reduce, on pipeline stages after the first (``pp_rank > 0``) and for model
        chunks after the first (``disable_bucketing=(model_chunk_idx > 0)``; Megatron-LM
        ``training.get_model``, megatron/core/distributed/distributed_data_parallel.py). Of all the
        chunks only the global chunk 0 (stage 0's first) is bucketed."""
        s = self.s
        if not s.megatron:
            order = [p for _, ps in chunks for p in ps]
            return assign_buckets(order, s.bucket_bytes, s.first_bucket_bytes) if order else []
        out: list[tuple[Param, ...]] = []
        for g, ps in chunks:
            if ps:
                cap = s.bucket_bytes if s.dp_overlap and g == 0 else math.inf
                out += assign_buckets(ps, cap, cap)
        return out

    def _chunk_params(self, g: int) -> list[Param]:
        out: list[Param] = list(head_params(self.s)) if g == self.last_g else []
        for b in reversed(self.blocks[g]):
            out += b.dense_params()
        if g == 0:
            out += embedding_params(self.s)
        return out

    # ---- the schedule

    def build(self) -> StageEmitter:
        """``s.iterations`` iterations back to back, each op tagged with its own (Op.iteration).

        Each iteration emits the same ops as the first but for the collectives' keys (tagged with the
        iteration) and what its first forward waits for of the iteration before (the parameter
        all-gathers after its step). So where the stage's state carries nothing else over (no FSDP
        units), the first is emitted with each such wait handing out a mark (:class:`_Marked`) and
        the later ones are its ops shifted, each mark replaced by what that wait hands out then, the
        waits called in the same order (:meth:`_repeat`)."""
        s, em = self.s, self.em
        repeat = REPEAT_ITERATIONS and s.iterations > 1 and self.fsdp is None and not em.program.ops
        if repeat:
            em.program = _Marked(em.program.rank)
            self._calls = []
        ops = em.program.ops
        for it in range(s.iterations):
            em.iteration = it
            if it and repeat and not em._gate:
                self._repeat(it)
                continue
            first = len(ops)
            self._gather_log = []
            self.reductions = []
            self._reducers()
            for item in plan(s.schedule, s.layout.pp, s.m, s.v, self.stage):
                if isinstance(item, Step):
                    self.bl.mb = item.mb
                    g = self.chunks[item.chunk]
                    if item.kind == "F":
                        self.out[("act", item.mb, g)] = self.forward(g)
                    else:
                        self.out[("grad", item.mb, g)] = self.backward(g, item.mb == s.m - 1)
                else:
                    self.p2p(item)
            self.finish()
            for op in ops[first:]:
                op.iteration = it
            if it == 0 and repeat:
                self._first = (len(ops), list(self._gather_log), self._every_gather,
                               [c for c in em.calls if c[0] < len(ops)])
                self._waiting, self._calls = self._calls or [], None
        return em

    def _repeat(self, it: int) -> None:
        """Iteration ``it`` as the first one's ops shifted by ``it`` iterations: their collectives' keys
        tagged with it, each op's marks replaced by what the waits they stand for hand out now
        (called in the order the first iteration called them), and the step's all-gathers added to
        what the next iteration waits for."""
        em = self.em
        program = em.program
        assert isinstance(program, _Marked)
        n, log, every, calls = self._first
        shift = it * n
        handed = [fn(arg) for fn, arg in self._waiting]
        marks = program.marks
        ops = program.ops
        tag = f"it{it}."
        for i in range(n):
            o = ops[i]
            deps = tuple([d + shift for d in o.deps])
            m = marks.get(i)
            if m:
                extra = [d for k in m for d in handed[k]]
                if extra:
                    deps = tuple(sorted(set(deps).union(extra)))
            c = o.coll
            if c is not None:
                c = CollectiveCall(tag + c.key, c.op, c.group, c.nbytes, c.send_bytes, c.root, c.duration_s,
                                   c.comm_size)
            # appended as Program.add would (the first iteration's ops passed its checks; what the waits
            # hand out is earlier)
            ops.append(Op(o.name, o.kind, o.category, o.stream, o.phase, o.kernel, c, o.nbytes, deps, o.cpu_s,
                          o.delay_s, it, o.sm_taken))
        em.calls.extend((idx + shift, kind, tag + suffix) for idx, kind, suffix in calls)
        for module, ag in log:
            self.gathered.setdefault(module, set()).add(ag + shift)
        self._every_gather = tuple(g + shift for g in every)

    def _mark(self, fn: Callable[[object], tuple[int, ...]], arg: object) -> tuple[int, ...]:
        """While the first iteration is emitted for all: a mark for this call of ``fn(arg)`` (which hands
        out nothing in the first iteration), else the call's own answer."""
        if self._calls is None:
            return fn(arg)
        self._calls.append((fn, arg))
        return (_MARK - (len(self._calls) - 1),)

    def _module_waits(self, module: str) -> tuple[int, ...]:
        if self._calls is not None:
            return self._mark(self._module_waits_now, module)  # type: ignore[arg-type]
        return self._module_waits_now(module)

    def _module_waits_now(self, module: str) -> tuple[int, ...]:
        found = self.gathered.pop(module, None)
        return tuple(sorted(found)) if found else ()

    def _waits(self, u: Unit) -> tuple[int, ...]:
        if self._calls is not None:
            return self._mark(self._waits_now, u)  # type: ignore[arg-type]
        return self._waits_now(u)

    def _waits_now(self, u: Unit) -> tuple[int, ...]:
        """What unit ``u``'s first forward of an iteration waits for, before its first kernel, from the
        iteration before. Under overlap_param_gather, Megatron's forward pre-hook on each module
        waits for the all-gathers of the buckets holding the module's parameters: a dense block's
        linears and norms wait as they run (:attr:`Blocks.waits`); the embedding, the head and an
        MoE block wait here for all of theirs. Without it, the first unit waits for every
        all-gather (the step waits for them all)."""
        if not self.s.param_overlap:
            out, self._every_gather = self._every_gather, ()
            return out
        if isinstance(u, Block) and u.experts is None:
            return ()
        dense, expert = self._unit_params(u)
        found: set[int] = set()
        for p in dense + expert:
            found |= self.gathered.pop(_module(p.name), set())
        return tuple(sorted(found))

    def p2p(self, batch: Batch) -> None:
        """Megatron's batched isend/irecv (all posted at once, on per-kind streams), then the host
        waits for the batch (``batch_p2p_sync``). Under overlap_p2p_comm the sends and receives go
        one by one with no host wait, and the next step's first kernel waits for the receives on
        the GPU (its ``wait_handles``)."""
        s = self.s
        nbytes = s.rows * s.model.hidden * s.width
        ops = []
        for t in batch:
            deps = (self.out[(t.what, t.mb, t.src)],) if t.send else ()
            ops.append(self.em.p2p(Pair("pp", t.peer, t.send), f"pp.{'send' if t.send else 'recv'}_{t.what}",
                                   t.key, nbytes, phase="fwd" if t.what == "act" else "bwd", deps=deps,
                                   stream=_PP_STREAMS[(t.what, t.send)]))
        if s.p2p_overlap:
            self.em.gate(op for op, t in zip(ops, batch, strict=True) if not t.send)
            return
        self.em.host_wait("pp.sync", ops, phase="fwd" if batch[0].what == "act" else "bwd")

    def forward(self, g: int) -> int:
        s, bl, em = self.s, self.bl, self.em
        first, last = g == 0, g == self.last_g
        copy = -1
        if first or last:
            copy = em.memcpy("batch.h2d", (int(first) + int(last)) * s.tokens * _TOKEN_ID_BYTES)
        units: list[Unit] = (["embed"] if first else []) + list(self.blocks[g]) + (["head"] if last else [])
        gather = self._pass(units, "fwd")
        gate: tuple[int, ...] = ()   # the embedding's tp reduction, which the first block waits for
        for i, u in enumerate(units):
            if gather:
                gather.before(i)
            waits = self._waits(u)
            if u == "embed":
                gate = (bl.embedding_fwd(copy, deps=waits),)
            elif u == "head":
                bl.head_fwd(copy, deps=waits)
            else:
                assert isinstance(u, Block)
                bl.block_fwd(u, deps=gate + waits)
                gate = ()
            if gather:
                gather.after(i)
        return em.last

    def backward(self, g: int, final: bool) -> int:
        s, bl = self.s, self.bl
        sink: GradSink | None
        esink: GradSink | None
        units: list[Unit] = (["head"] if g == self.last_g else []) + list(reversed(self.blocks[g])) \
            + (["embed"] if g == 0 else [])
        gather = self._pass(units, "bwd")
        if s.zero == 3:
            sink, esink = self._unit_reducers(units, g, gather)
        elif final and s.dp_overlap:
            sink, esink = self.dense, self.expert
        else:
            sink = esink = NoSync()
        for i, u in enumerate(units):
            if gather:
                gather.before(i)
            if u == "head":
                bl.head_bwd(sink)
            elif u == "embed":
                bl.embedding_bwd(sink)
            else:
                assert isinstance(u, Block)
                bl.block_bwd(u, sink, esink)
            if gather:
                gather.after(i)
        if s.zero == 3:
            for r in (sink, esink):
                if isinstance(r, Reducer):
                    self.reductions += r.done()
        return self.em.last

    # ---- ZeRO-3 / FSDP

    def _unit_params(self, u: Unit) -> tuple[list[Param], list[Param]]:
        if u == "embed":
            return list(embedding_params(self.s)), []
        if u == "head":
            return list(head_params(self.s)), []
        assert isinstance(u, Block)
        return list(u.dense_params()), list(u.experts.params) if u.experts else []

    def _pass(self, units: list[Unit], phase: str) -> Pass | None:
        """Under ZeRO-3, FSDP's gathering of ``units`` for one pass (:mod:`.fsdp`); None otherwise."""
        if self.fsdp is None:
            return None
        return self.fsdp.run([(_unit_name(u), *self._unit_params(u)) for u in units], phase, f"mb{self.bl.mb}")

    def _copy_out(self, name: str, numel: int, phase: str, deps: tuple[int, ...]) -> None:
        self.bl.ew(f"{name}.copy_out", numel, 1, 1, phase, deps=deps, op="copy")

    def _unit_reducers(self, units: list[Unit], g: int, gather: Pass | None) -> tuple[Reducer, Reducer]:
        """FSDP's reduce-scatter per unit, on each process group's stream; the dense group's after
        the pass's post-backward prefetch (:class:`.fsdp.UnitReducer`)."""
        key = f"grads.g{g}.mb{self.bl.mb}"
        dense = [tuple(self._unit_params(u)[0]) for u in units]
        expert = [tuple(self._unit_params(u)[1]) for u in units if self._unit_params(u)[1]]
        return (UnitReducer(self.em, [b for b in dense if b], "dp_cp", key=key, hook=gather),
                UnitReducer(self.em, expert, "edp_cp", key="expert_" + key))

    # ---- after the last backward

    def finish(self) -> None:
        s, em = self.s, self.em
        last = em.last
        for r in (self.dense, self.expert):
            if r is not None:
                if not s.dp_overlap:
                    r.flush(last)
                self.reductions += r.done()
        deps = list(self.reductions) or [last]
        for r in (self.dense, self.expert):
            if isinstance(r, BucketCopies):
                deps += r.copy_back()
        if s.layout.pp > 1 and s.model.tied and (0 in self.chunks or self.last_g in self.chunks):
            nbytes = s.vocab // s.tp * s.model.hidden * 4
            ar = em.group_op("embed", "embed.wte_grad.all_reduce", "embed.wte_grad", "all_reduce", nbytes,
                             phase="bwd", deps=deps)
            deps += [] if ar is None else [ar]
        if s.sp:
            norms = sum(p.numel for g in self.chunks for b in self.blocks[g] for p in (*b.ln1, *b.ln2))
            ar = em.group_op("tp", "norms.grad.all_reduce", "norms.grad", "all_reduce", norms * 4, phase="bwd",
                             deps=deps, stream="comm.tp")
            deps += [] if ar is None else [ar]
        dense = sum(p.numel for p in self.dense_order)
        expert = sum(p.numel for p in self.expert_order)
        lay = s.layout
        local = dense + expert
        if s.zero:  # the optimizer updates this rank's shard
            local = -(-dense // (lay.dp * lay.cp)) + -(-expert // (lay.dp // lay.ep * lay.cp))
        optimizer_step(em, local, s.optimizer, deps=deps)
        if s.megatron and is_mixed(s.precision):
            em.elementwise("optimizer.copy_to_model", local, 1, 1, s.aux, op="cast", phase="opt")
        if s.zero in (1, 2):
            # Per bucket, in the order the next forward uses them (Megatron dispatches the
            # all-gathers in forward order: the last gradient bucket first).
            wb = weight_bytes(s.precision)
            step = em.last
            gathers: list[int] = []
            for kind in ("dp_cp", "edp_cp"):
                buckets = self.buckets[kind]
                for i in reversed(range(len(buckets))):
                    b = buckets[i]
                    ag = em.group_op(kind, f"params.bucket{i}.all_gather", f"params.{kind}.bucket{i}", "all_gather",
                                     sum(p.numel for p in b) * wb, phase="opt", deps=(step,), stream="comm.ag")
                    if ag is not None:
                        gathers.append(ag)
                        for p in b:
                            self.gathered.setdefault(_module(p.name), set()).add(ag)
                            self._gather_log.append((_module(p.name), ag))
            self._every_gather = tuple(gathers)


def _module(param: str) -> str:
    """The module a parameter belongs to: ``h0.attn.qkv`` for ``h0.attn.qkv.weight``."""
    head, _, tail = param.rpartition(".")
    return head if head and tail in ("weight", "bias") else param


def _unit_name(u: Unit) -> str:
    return u.name if isinstance(u, Block) else str(u)


@register("transformer")
def build(spec: WorkloadSpec, world: World) -> Workload:
    """One program per pipeline stage, retargeted to each of its ranks (to each representative
    rank only, when ``world.fold`` and the replicas fold). Where ``world.micro_batches`` chooses
    fewer micro-batches than the job's, the programs run that many; samples, FLOPs and memory stay
    the job's."""
    job = make_setup(spec, world)
    s, shape = simulated_setup(job, pipeline_shape(job), world)
    lay = s.layout
    fold = replicas(lay, world, s.tp_overlap) if world.fold else None
    kernels = KernelTable()
    programs: dict[int, Program] = {}
    memory = {}
    for stage in range(lay.pp):
        em = _Stage(s, stage, kernels).build()
        mem = stage_memory(job, stage)
        for r in lay.stage_ranks(stage):
            if fold is None or fold.is_rep(r):
                programs[r] = retarget(em, r)
            memory[r] = mem
    samples = job.global_batch
    return Workload(name=spec.name, programs=[programs[r] for r in sorted(programs)], kernels=kernels.specs,
                    memory=[memory[r] for r in range(lay.world)], samples=samples,
                    tokens=samples * s.model.seq_len, model_flops=model_flops(s.model, samples),
                    compute_dtype=s.precision, replicas=fold, iterations=s.iterations, pipeline=shape)

