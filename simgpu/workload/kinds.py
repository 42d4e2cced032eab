"""A workload's programs on nodes of several kinds (a mixed platform, :mod:`simgpu.config.mixed`).

A kernel's time depends on the GPU that runs it, so the kernel table is repeated once per kind of
GPU: kind ``k``'s copy of kernel ``i`` is entry ``k * K + i`` (``K`` kernels a kind), and the
kernel ops of a rank of kind ``k`` index its kind's copy. The engine then looks every kernel's
time up as before; the kernel models time each copy on its kind's GPU. Ops other than kernels are
kept as they are (the same objects), and ranks of one template and kind keep sharing their ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..graph import Op, Program, Workload


def by_kind(workload: Workload, rank_kind: Sequence[int], kinds: int) -> Workload:
    """``workload`` with its kernel table repeated ``kinds`` times and the kernel ops of rank ``r``
    indexing copy ``rank_kind[r]``; unchanged where there is one kind."""
    if kinds <= 1:
        return workload
    K = len(workload.kernels)
    made: list[dict[int, Op]] = [{} for _ in range(kinds)]  # per kind: id of an op -> its copy
    templates: dict[tuple[int, int], list[Op]] = {}

    def moved(op: Op, kind: int) -> Op:
        if op.kind != "kernel" or op.kernel < 0:
            return op
        got = made[kind].get(id(op))
        if got is None:
            got = made[kind][id(op)] = replace(op, kernel=op.kernel + kind * K)
        return got

    programs = []
    for prog in workload.programs:
        k = rank_kind[prog.rank]
        if k == 0:
            programs.append(prog)
            continue
        template = prog.template
        if template is not None:
            key = (id(template), k)
            if key not in templates:
                templates[key] = [moved(op, k) for op in template]
            template = templates[key]
        programs.append(Program(prog.rank, [moved(op, k) for op in prog.ops], template))
    return replace(workload, programs=programs, kernels=list(workload.kernels) * kinds)
