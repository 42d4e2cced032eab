"""The steady iteration's shortcut: the first of two iterations cut to its last micro-batch.

**The shortened first iteration.** The first of two iterations is there for the state it leaves at
the boundary. :func:`shorten` cuts every rank's first iteration to its last micro-batch (from that
micro-batch's first op, its input copy, on; the earlier micro-batches are dropped) where nothing
kept depends on a dropped op, no collective is dropped on some members and kept on others, no
dropped op waits on the host and no op runs context parallelism's communication
(:data:`CP_STREAMS`). The input copies after the cut one, up to the rank's first host wait, run
there with no bytes (the full run's CPU issues them long before it reaches the last
micro-batch's kernels, so that they run among the dropped micro-batches, not where the cut run's
CPU issues them); their bytes are put back into the link counters afterwards (:func:`restore`). The
engine runs the cut programs keeping each op's issue, start and end times, and :func:`check`
decides from that run alone whether its steady window is the full run's. Where it finds a reason it
may not be, the full programs are run (:mod:`simgpu.engine.shortcuts`). The argument the check
makes is in :mod:`simgpu.engine.steady_check`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from itertools import compress, count, islice
from operator import attrgetter, is_not
from typing import Final

import numpy as np

from ..graph import Op, Program, Workload
from ..platform.topology import Topology
from ..result import SimResult
from .fold import FoldMap

#: The shortened run's times must repeat within this fraction of the run (as the periodic shortcut's).
TOLERANCE: Final = 1e-9


#: Streams of context parallelism's communication (its ring's sends and receives, its all-gathers: where
#: simgpu.workload.transformer.attention puts them): programs with them are not cut. On small ZeRO-1
#: jobs with cp 2 and the ring (``tests/test_steady_state.py``) the check passed cuts whose window was up
#: to 3.4e-4 off the full run's, the tails repeating to 1e-17: inside the window a memory-bound kernel
#: starts at the instant a collective beside it begins or stops moving bytes, and whether it is slowed
#: follows the last bits of the two runs' clocks and the order of that instant's events (docs/steady-state.md, "Context
#: parallelism is not cut").
CP_STREAMS: Final = frozenset({"comm.cp_send", "comm.cp_recv", "comm.cp"})

#: Kinds of op that run on a stream (a host_wait and a host op run on the CPU thread).
_GPU_KINDS: Final = ("kernel", "memcpy", "collective")


@dataclass(frozen=True)
class Cut:
    """The programs with every rank's first iteration cut to its last micro-batch: ``workload`` runs
    them, ``dropped`` is, per rank, how many ops were dropped from the front of its program, and
    ``off``, per rank, the input copies taken off the links (run with no bytes: see :func:`shorten`),
    each ``(index in the cut program, bytes)``."""

    workload: Workload
    dropped: dict[int, int]
    off: dict[int, list[tuple[int, int]]]


def _micro_batches(ops: Sequence[Op], iteration: int) -> list[int]:
    """Where each micro-batch of ``iteration`` begins: the first op of each run of ``data`` ops."""
    return [i for i, o in enumerate(ops) if o.iteration == iteration and o.phase == "data"
            and (i == 0 or ops[i - 1].phase != "data" or ops[i - 1].iteration != iteration)]


#: an Op's fields in order, read at once (a new Op from them is faster to make than dataclasses.replace)
_FIELDS: Final = [f.name for f in fields(Op)]
_GET: Final = attrgetter(*_FIELDS)
_DEPS: Final = _FIELDS.index("deps")


def _shift(o: Op, c: int) -> Op:
    """``o`` with its dependencies renumbered from ``c`` (a new Op where it has any)."""
    if not o.deps:
        return o
    v = list(_GET(o))
    v[_DEPS] = tuple([d - c for d in o.deps])
    return Op(*v)


def _shifted(ops: list[Op], c: int) -> list[Op]:
    """``ops[c:]``, each :func:`_shift`-ed."""
    return [_shift(o, c) for o in ops[c:]]


@dataclass(frozen=True)
class _Plan:
    """What :func:`shorten` finds of one op list, alike for every program copied from it (its
    :attr:`~simgpu.graph.Program.template`: the same kinds, phases, iterations and deps at the same
    places): where its last micro-batch of the first iteration begins (``c``, or why it cannot be
    cut), the places of its collectives before and from ``c``, its ops from ``c`` on shifted with
    their input copies taken off the links (:func:`_take_off`), which those are, and where the
    first host wait of the shifted ops is."""

    c: int
    why: str
    dropped_calls: list[int]
    kept_calls: list[int]
    taken_ops: list[Op]
    taken: list[tuple[int, int]]
    wait: int

    @staticmethod
    def of(ops: list[Op], rank: int) -> _Plan:
        starts = _micro_batches(ops, 0)
        none: list[Op] = []
        if len(starts) < 2:
            return _Plan(0, f"rank {rank}'s first iteration has {len(starts)} micro-batch(es) that begin with data "
                         "ops: nothing to drop (two or more expected)", [], [], none, [], 0)
        c = starts[-1]
        calls = [i for i, o in enumerate(ops) if o.coll is not None]
        for o in ops[:c]:
            if o.kind == "host_wait":
                return _Plan(c, f"rank {rank} waits on the host ({o.name!r}) before its last micro-batch",
                             [], [], none, [], 0)
        cp = next((o for o in ops if o.stream in CP_STREAMS), None)
        if cp is not None:
            return _Plan(c, f"rank {rank} runs context parallelism's communication ({cp.name!r}), which the check "
                         "does not cover", [], [], none, [], 0)
        for o in ops[c:]:
            if o.deps and min(o.deps) < c:
                return _Plan(c, f"rank {rank}'s op {o.name!r} depends on an op of an earlier micro-batch",
                             [], [], none, [], 0)
        moved = _shifted(ops, c)
        taken_ops, taken = _take_off(moved)
        wait = next((k for k, o in enumerate(moved) if o.kind == "host_wait"), len(moved))
        return _Plan(c, "", [i for i in calls if i < c], [i - c for i in calls if i >= c], taken_ops, taken, wait)


def _take_off(ops: list[Op]) -> tuple[list[Op], list[tuple[int, int]]]:
    """``ops`` (a cut program) with its input copies after the first, up to its first host wait,
    moving no bytes; and which they were, with their bytes."""
    wait = next((k for k, o in enumerate(ops) if o.kind == "host_wait"), len(ops))
    out, off = list(ops), []
    for k in range(1, wait):
        o = out[k]
        if _takes_off(o):
            out[k] = replace(o, nbytes=0)
            off.append((k, o.nbytes))
    return out, off


def _takes_off(o: Op) -> bool:
    """Whether :func:`_take_off` runs ``o`` (placed where it may) with no bytes."""
    return o.kind == "memcpy" and not o.deps and o.nbytes > 0 and o.delay_s == 0


def shorten(workload: Workload) -> Cut | str:
    """``workload``'s programs with each rank's first iteration from its last micro-batch's first op
    on, or why they cannot be cut so (see the module docstring). Where the cut is found and what
    is dropped and taken off is worked out once per op list that programs are copied from (their
    template); a rank's own ops (its collectives, over its groups) are shifted one by one."""
    if workload.iterations != 2:
        return f"programs of {workload.iterations} iterations (two expected)"
    dropped: dict[int, int] = {}
    cut_keys: set[str] = set()
    kept_keys: set[str] = set()
    plans: dict[int, _Plan] = {}  # by id of the op list the programs are copied from
    moved: dict[tuple[int, int], Op] = {}  # (id of a rank's own op, alive in ``workload``; its cut) -> shifted
    off: dict[int, list[tuple[int, int]]] = {}
    programs = []
    for prog in workload.programs:
        ops = prog.ops
        template = prog.template if prog.template is not None and len(prog.template) == len(ops) else None
        base = ops if template is None else template
        plan = plans.get(id(base))
        if plan is None:
            plan = plans[id(base)] = _Plan.of(base, prog.rank)
        if plan.why:
            return plan.why
        c = plan.c
        for i in plan.dropped_calls:
            cut_keys.add(ops[i].coll.key)  # type: ignore[union-attr]
        for i in plan.kept_calls:
            kept_keys.add(ops[c + i].coll.key)  # type: ignore[union-attr]
        if ops is base:
            new_ops, taken = plan.taken_ops, plan.taken
        else:  # the template's cut ops where the rank shares its Op objects, its own shifted elsewhere
            new_ops, taken = list(plan.taken_ops), plan.taken
            own = list(compress(count(), map(is_not, islice(ops, c, None), islice(base, c, None))))
            if own:
                was = dict(taken)
                for k in own:
                    mine = ops[c + k]
                    o = moved.get((id(mine), c))  # the members of a group share their copy of a collective
                    if o is None:
                        o = moved[id(mine), c] = _shift(mine, c)
                    was.pop(k, None)
                    if 1 <= k < plan.wait and _takes_off(o):
                        was[k] = o.nbytes
                        o = replace(o, nbytes=0)
                    new_ops[k] = o
                taken = sorted(was.items())
        programs.append(Program(prog.rank, new_ops, None if template is None else plan.taken_ops))
        dropped[prog.rank] = c
        off[prog.rank] = list(taken)
    both = cut_keys & kept_keys
    if both:
        return f"collective {sorted(both)[0]!r} is dropped on some ranks and kept on others"
    return Cut(replace(workload, programs=programs), dropped, off)


def restore(result: SimResult, cut: Cut, topo: Topology) -> None:
    """Put the bytes of the copies :func:`shorten` took off the links back into ``result``'s link
    statistics and per-iteration byte counters (on their routes, as the engine carries them), once
    :func:`check` has found that nothing else depends on them."""
    taken = [(rank, k, n) for rank, items in cut.off.items() for k, n in items]
    if not taken or "iteration_link_bytes" not in result.meta:
        return
    reps = cut.workload.replicas
    fold = FoldMap(topo, reps) if reps is not None else None
    programs = {p.rank: p.ops for p in cut.workload.programs}
    per = np.asarray(result.meta["iteration_link_bytes"], dtype=float)
    busy = np.asarray(result.meta["iteration_link_busy_s"], dtype=float)
    links = topo.links
    ids = {links[i].name: i for i in range(len(links))}
    stats = result.link_stats
    old = [ids[str(x)] for x in stats["link"]]
    add = np.zeros((len(per), len(links)))
    for rank, k, n in taken:
        route = topo.host_route(rank, to_device=True)
        np.add.at(add[programs[rank][k].iteration], list(fold.route(route) if fold is not None else route), float(n))
    used = sorted(set(old) | set(np.flatnonzero(add.sum(axis=0)).tolist()))
    col = {lid: j for j, lid in enumerate(old)}
    def grown(a: np.ndarray, extra: np.ndarray | None) -> np.ndarray:
        out = np.zeros((len(a), len(used)))
        for j, lid in enumerate(used):
            if lid in col:
                out[:, j] = a[:, col[lid]]
            if extra is not None:
                out[:, j] += extra[:, lid]
        return out

    per, busy = grown(per, add), grown(busy, None)
    total = np.asarray(stats["nbytes"], dtype=float)
    busy_total = np.asarray(stats["busy_s"], dtype=float)
    result.link_stats = stats.__class__({
        "link": [links[i].name for i in used],
        "link_kind": [links[i].kind for i in used],
        "capacity_gbytes_per_s": topo.capacity[used] / 1e9,
        "nbytes": [(total[col[i]] if i in col else 0.0) + float(add[:, i].sum()) for i in used],
        "busy_s": [busy_total[col[i]] if i in col else 0.0 for i in used],
    }, columns=list(stats.columns))
    result.meta["iteration_link_bytes"] = per.tolist()
    result.meta["iteration_link_busy_s"] = busy.tolist()


def _base(prog: Program) -> list[Op]:
    """The op list ``prog`` was copied from (:attr:`~simgpu.graph.Program.template`), else its own."""
    return _base_of(prog.template, prog.ops)


def _base_of(template: list[Op] | None, ops: list[Op]) -> list[Op]:
    return template if template is not None and len(template) == len(ops) else ops
