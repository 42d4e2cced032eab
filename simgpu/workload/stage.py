"""One program per pipeline stage, retargeted to every rank of the stage.

Every rank of a pipeline stage runs the same ops; only its collectives differ (their groups and
keys). This module owns :class:`StageEmitter`, an :class:`~simgpu.workload.common.Emitter` for the
stage's representative rank that records, for each collective, which kind of group it spans (a
:mod:`~simgpu.workload.parallel` group kind, or a P2P pair along the pipeline or the context ring),
and :func:`retarget`, which copies the program for another rank of the stage with that rank's
groups and keys. Building one program per stage instead of one per rank keeps 1,000-GPU jobs fast.

Keys: ``{kind}{first rank of the group}.{suffix}`` for group collectives, ``p2p{src}>{dst}.{suffix}``
for P2P transfers, so both sides of a transfer and all members of a group agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..graph import CollectiveCall, CollectiveOp, KernelTable, Op, Program
from .common import Emitter
from .parallel import GROUP_KINDS, Coord, Layout

#: Group kinds that a collective's group can be recognised by (P2P pairs are always explicit).
_INFERABLE = tuple(k for k in GROUP_KINDS if k != "pp")


@dataclass(frozen=True)
class Pair:
    """A P2P direction: along ``dim`` (``pp``, ``cp`` or ``tp``), ``step`` (+1 next, -1 previous) away; this
    rank sends (``send``) or receives."""

    dim: str
    step: int
    send: bool

    def resolve(self, layout: Layout, rank: int) -> tuple[int, int]:
        peer = _along(layout, rank, self.dim, self.step)
        return (rank, peer) if self.send else (peer, rank)


def _along(layout: Layout, rank: int, dim: str, step: int) -> int:
    c = layout.coord(rank)
    if dim == "pp":
        return layout.neighbour(rank, step)
    if dim == "cp":
        return layout.rank(Coord(c.tp, (c.cp + step) % layout.cp, c.dp, c.pp))
    if dim == "tp":
        return layout.rank(Coord((c.tp + step) % layout.tp, c.cp, c.dp, c.pp))
    raise ValueError(f"P2P runs along pp, cp or tp, not {dim!r}")


class StageEmitter(Emitter):
    """An Emitter that remembers how to retarget its collectives (see the module docstring).

    ``cpu_s`` is the host time of every op (None: the platform's launch overhead).
    """

    def __init__(self, rank: int, kernels: KernelTable, layout: Layout, cpu_s: float | None = None) -> None:
        super().__init__(rank, kernels)
        self.layout = layout
        self.cpu_s = cpu_s
        self.iteration = 0  # the training iteration being emitted (see Op.iteration)
        self._gate: tuple[int, ...] = ()
        self.calls: list[tuple[int, str | Pair, str]] = []
        self.retargeted: _Copies | None = None  # the ops as the stage's ranks run them (see retarget)
        self._groups: dict[str, tuple[int, ...]] = {}
        self._pairs: dict[Pair, tuple[int, int]] = {}
        self._by_group: dict[tuple[int, ...], str] = {}
        for kind in _INFERABLE:
            g = layout.group(rank, kind)
            if len(g) > 1:
                self._by_group.setdefault(g, kind)

    def gate(self, deps: Iterable[int]) -> None:
        """Make the next kernel also wait for ``deps`` (a stream waiting on another's event, as
        ``req.wait()`` on an NCCL work handle does)."""
        self._gate += tuple(deps)

    def kernel(self, name: str, family: str, dtype: str, *, phase: str, deps: Iterable[int] = (),
               **params: float) -> int:
        if self._gate:
            deps, self._gate = (*deps, *self._gate), ()
        return self._kernel(name, family, dtype, phase, deps, params)

    def group(self, kind: str) -> tuple[int, ...]:
        g = self._groups.get(kind)
        if g is None:
            g = self._groups[kind] = self.layout.group(self.rank, kind)
        return g

    def collective(self, name: str, call: CollectiveCall, *, phase: str, deps: Iterable[int] = (),
                   stream: str = "comm") -> int:
        """A collective whose group is one of this rank's groups (its kind is recognised by it)."""
        kind = self._by_group.get(call.group)
        if kind is None:
            raise ValueError(f"{call.key}: group {call.group} is none of rank {self.rank}'s groups")
        return self._add(name, kind, call.key, call.op, call.nbytes, phase, deps, stream)

    def group_op(self, kind: str, name: str, suffix: str, op: CollectiveOp, nbytes: int, *, phase: str,
                 deps: Iterable[int] = (), stream: str = "comm") -> int | None:
        """``op`` over this rank's group of ``kind``; None (nothing emitted) when the group is one rank."""
        if len(self.group(kind)) < 2:
            return None
        return self._add(name, kind, suffix, op, nbytes, phase, deps, stream)

    def p2p(self, pair: Pair, name: str, suffix: str, nbytes: int, *, phase: str, deps: Iterable[int] = (),
            stream: str) -> int:
        """One side of a send/recv with the peer ``pair`` names."""
        return self._add(name, pair, suffix, "send_recv", nbytes, phase, deps, stream)

    def host_wait(self, name: str, deps: Iterable[int], *, phase: str) -> int:
        """The host blocks until ``deps`` finish (a device synchronisation)."""
        return self.program.add(Op(name, "host_wait", "sync", stream="compute", phase=phase,
                                   deps=tuple(sorted(set(deps)))))

    def _add(self, name: str, kind: str | Pair, suffix: str, op: CollectiveOp, nbytes: int, phase: str,
             deps: Iterable[int], stream: str) -> int:
        if isinstance(kind, str):
            group = self.group(kind)
        else:
            pair = self._pairs.get(kind)
            if pair is None:
                pair = self._pairs[kind] = kind.resolve(self.layout, self.rank)
            group = pair
        if self.iteration:  # keys unique over the iterations a program runs
            suffix = f"it{self.iteration}.{suffix}"
        call = CollectiveCall(suffix, op, group, int(nbytes))
        idx = self.program.add(Op(name, "collective", op, stream=stream, phase=phase, coll=call,
                                  nbytes=call.nbytes, deps=tuple(sorted(set(deps)))))
        self.calls.append((idx, kind, suffix))
        return idx


def _group(layout: Layout, rank: int, kind: str | Pair) -> tuple[int, ...]:
    return kind.resolve(layout, rank) if isinstance(kind, Pair) else layout.group(rank, kind)


def _key(kind: str | Pair, group: tuple[int, ...], suffix: str) -> str:
    if isinstance(kind, Pair):
        return f"p2p{group[0]}>{group[1]}.{suffix}"
    return f"{kind}{group[0]}.{suffix}"


def retarget(em: StageEmitter, rank: int, cpu_s: Mapping[int, float] | None = None) -> Program:
    """The stage's program as ``rank`` (a rank of the same stage) runs it: every op's host time is
    the emitter's ``cpu_s``, or the op's own in ``cpu_s`` (op index -> seconds).

    The programs of a stage's ranks share one list of its ops other than collectives (made once per
    stage: the emitter's own ops where their host time is already the one to run, a copy of the op
    where it is not), and the members of a group share their copy of a collective over it (the same
    call, group and key). None is modified afterwards: the emitter's ops are not changed once the
    stage has been retargeted. Every program names the shared list as its
    :attr:`~simgpu.graph.Program.template`.
    """
    if em.layout.coord(rank).pp != em.layout.coord(em.rank).pp:
        raise ValueError(f"rank {rank} is not on the stage of rank {em.rank}")
    hosts = tuple(sorted(cpu_s.items())) if cpu_s else ()
    made = em.retargeted
    if made is None or made.hosts != hosts or len(made.ops) != len(em.program.ops):
        made = em.retargeted = _Copies(hosts, _stage_ops(em, hosts), {}, _by_kind(em.calls))
    ops = list(made.ops)
    for kind, (idxs, suffixes) in made.kinds.items():
        group = _group(em.layout, rank, kind)
        copies = made.calls.get((kind, group))
        if copies is None:
            copies = made.calls[(kind, group)] = [_call_copy(made.ops[i], _key(kind, group, x), group)
                                                  for i, x in zip(idxs, suffixes, strict=True)]
        for i, op in zip(idxs, copies, strict=True):
            ops[i] = op
    return Program(rank, ops, template=made.ops)


def _copy(o: Op, cpu_s: float | None) -> Op:
    """``o`` with host time ``cpu_s`` and no delay on its stream. Field by field: several times faster
    than dataclasses.replace."""
    return Op(o.name, o.kind, o.category, o.stream, o.phase, o.kernel, o.coll, o.nbytes, o.deps, cpu_s, 0.0,
              o.iteration, o.sm_taken)


def _call_copy(o: Op, key: str, group: tuple[int, ...]) -> Op:
    """Collective op ``o`` over ``group`` under ``key``."""
    c = o.coll
    assert c is not None
    return Op(o.name, o.kind, o.category, o.stream, o.phase, o.kernel,
              CollectiveCall(key, c.op, group, c.nbytes, c.send_bytes, c.root, None, 0), o.nbytes, o.deps, o.cpu_s,
              0.0, o.iteration, o.sm_taken)


def _stage_ops(em: StageEmitter, hosts: tuple[tuple[int, float], ...]) -> list[Op]:
    """The stage's ops with the emitter's host time (the op's own in ``hosts``) and no delay: the
    emitter's op itself where it already has them, else a copy."""
    cpu = em.cpu_s
    ops = list(em.program.ops)
    for i, o in enumerate(ops):
        if o.cpu_s != cpu or o.delay_s != 0.0:
            ops[i] = _copy(o, cpu)
    for i, host_s in hosts:
        ops[i] = _copy(ops[i], host_s)
    return ops


def _by_kind(calls: list[tuple[int, str | Pair, str]]) -> dict[str | Pair, tuple[list[int], list[str]]]:
    """The emitter's collectives by the kind of group they span: their op indices and key suffixes."""
    out: dict[str | Pair, tuple[list[int], list[str]]] = {}
    for idx, kind, suffix in calls:
        got = out.get(kind)
        if got is None:
            got = out[kind] = ([], [])
        got[0].append(idx)
        got[1].append(suffix)
    return out


@dataclass
class _Copies:
    """A stage's ops as its ranks run them (see :func:`retarget`): ``hosts`` the host times set per op,
    ``ops`` the shared ops, ``calls`` (kind of group, group) -> the copies of the collectives over that
    group, in the order of ``kinds``, the collectives' op indices and key suffixes by kind of group."""

    hosts: tuple[tuple[int, float], ...]
    ops: list[Op]
    calls: dict[tuple[str | Pair, tuple[int, ...]], list[Op]]
    kinds: dict[str | Pair, tuple[list[int], list[str]]]
