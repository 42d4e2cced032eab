"""Several jobs' programs as one workload on the cluster's ranks.

Each job is built on its own (ranks 0 to its world size - 1); :func:`merge` moves job ``j``'s rank
``r`` to the cluster's global rank ``nodes_j[r // gpus_per_node] * gpus_per_node + r %
gpus_per_node``, renames its collectives' keys with the job's name (two jobs' keys never meet in
one rendezvous) and moves their groups alike, and indexes every kernel in one table of the union.
Ranks no job has run an empty program. Ops a job's programs share stay shared (a pipeline stage's
template is moved once), and an op that needs no change is the job's own object.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..graph import CollectiveCall, KernelSpec, MemoryEstimate, Op, Program, Workload


@dataclass(frozen=True)
class Placed:
    """One job's workload and where it runs: its global rank per job rank."""

    name: str
    workload: Workload
    ranks: np.ndarray  # job rank -> global rank


def global_ranks(nodes: Sequence[int], world: int, gpus_per_node: int) -> np.ndarray:
    """Job rank -> global rank for a job on ``nodes`` (``world`` ranks, whole nodes)."""
    r = np.arange(world)
    return np.asarray(nodes, dtype=np.int64)[r // gpus_per_node] * gpus_per_node + r % gpus_per_node


class _Mover:
    """Moves one job's ops onto the cluster: kernels reindexed, collectives renamed and regrouped."""

    def __init__(self, prefix: str, ranks: np.ndarray, kmap: list[int]) -> None:
        self.prefix, self.ranks, self.kmap = prefix, ranks.tolist(), kmap
        self._ops: dict[int, Op] = {}
        self._calls: dict[int, CollectiveCall] = {}
        self._lists: dict[int, list[Op]] = {}

    def call(self, c: CollectiveCall) -> CollectiveCall:
        got = self._calls.get(id(c))
        if got is None:
            got = self._calls[id(c)] = replace(c, key=self.prefix + c.key,
                                               group=tuple(self.ranks[g] for g in c.group))
        return got

    def op(self, o: Op) -> Op:
        got = self._ops.get(id(o))
        if got is None:
            kernel = self.kmap[o.kernel] if o.kernel >= 0 else o.kernel
            if o.coll is None and kernel == o.kernel:
                got = o
            else:
                got = replace(o, kernel=kernel, coll=None if o.coll is None else self.call(o.coll))
            self._ops[id(o)] = got
        return got

    def ops(self, ops: list[Op]) -> list[Op]:
        got = self._lists.get(id(ops))
        if got is None:
            got = self._lists[id(ops)] = [self.op(o) for o in ops]
        return got


def merge(jobs: Sequence[Placed], world: int, name: str,
          movers: dict[tuple[str, tuple[int, ...]], _Mover] | None = None) -> Workload:
    """One workload of ``world`` ranks running every job of ``jobs`` on its ranks (unfolded builds);
    ``movers`` keeps each job's moved ops between merges (a job whose kernels land at the same
    indices again reuses them: the cluster's run together and each job's run alone)."""
    table: dict[KernelSpec, int] = {}
    kernels: list[KernelSpec] = []
    programs: list[Program | None] = [None] * world
    memory = [MemoryEstimate()] * world
    for job in jobs:
        w = job.workload
        if w.replicas is not None:
            raise ValueError(f"job {job.name}: a folded workload; expected every rank's program")
        kmap = []
        for k in w.kernels:
            if k not in table:
                table[k] = len(kernels)
                kernels.append(k)
            kmap.append(table[k])
        key = (job.name, tuple(kmap))
        move = movers.get(key) if movers is not None else None
        if move is None:
            move = _Mover(f"{job.name}/", job.ranks, kmap)
            if movers is not None:
                movers[key] = move
        for p in w.programs:
            g = int(job.ranks[p.rank])
            if programs[g] is not None:
                raise ValueError(f"rank {g} is run by two jobs")
            t = p.template
            programs[g] = Program(g, move.ops(p.ops), None if t is None else move.ops(t))
            memory[g] = w.memory[p.rank]
    return Workload(
        name, [p if p is not None else Program(r) for r, p in enumerate(programs)], kernels, memory,
        samples=sum(j.workload.samples for j in jobs), tokens=sum(j.workload.tokens for j in jobs),
        model_flops=sum(j.workload.model_flops for j in jobs),
        compute_dtype=jobs[0].workload.compute_dtype if jobs else "fp32",
        iterations=max((j.workload.iterations for j in jobs), default=1))
