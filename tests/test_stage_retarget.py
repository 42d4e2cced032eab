"""A stage's program retargeted to its ranks equals the emitter's ops copied field by field, with each
rank's groups and keys; the kernel table hands out the same indices however a shape is asked for."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from simgpu.graph import CollectiveCall, KernelSpec, KernelTable, Op
from simgpu.workload.parallel import Layout
from simgpu.workload.stage import Pair, StageEmitter, _group, _key, retarget


def _emitter(cpu_s: float | None) -> StageEmitter:
    lay = Layout(tp=2, dp=2, pp=2)
    em = StageEmitter(lay.rank(lay.coord(0)), KernelTable(), lay, cpu_s)
    a = em.kernel("a.fwd", "gemm", "bf16", phase="fwd", m=8, n=4, k=2)
    ar = em.group_op("tp", "a.all_reduce", "a.ar", "all_reduce", 64, phase="fwd", deps=(a,), stream="comm.tp")
    assert ar is not None
    send = em.p2p(Pair("pp", 1, True), "pp.send_act", "act.mb0", 32, phase="fwd", deps=(ar,), stream="comm.pp")
    em.host_wait("pp.sync", (send,), phase="fwd")
    b = em.elementwise("b.add", 16, 2, 1, "bf16", op="add", phase="bwd", deps=(send,))
    em.program.ops[b].sm_taken = 4
    em.group_op("dp", "grads.all_reduce", "grads", "all_reduce", 128, phase="bwd", deps=(b,))
    em.program.ops[0].cpu_s = 1e-3   # an op with its own host time and delay, which retarget replaces
    em.program.ops[0].delay_s = 2e-6
    em.program.ops[3].delay_s = 1e-6  # and one with a delay only
    return em


def _expected(em: StageEmitter, rank: int, cpu: float | None, hosts: dict[int, float]) -> list[Op]:
    """The emitter's ops as ``rank`` runs them, made one by one with dataclasses.replace."""
    out = [replace(o, cpu_s=hosts.get(i, cpu), delay_s=0.0) for i, o in enumerate(em.program.ops)]
    for idx, kind, suffix in em.calls:
        group = _group(em.layout, rank, kind)
        c = out[idx].coll
        assert c is not None
        out[idx] = replace(out[idx], coll=CollectiveCall(_key(kind, group, suffix), c.op, group, c.nbytes,
                                                         c.send_bytes, c.root))
    return out


@pytest.mark.parametrize("cpu", [None, 5e-6])
@pytest.mark.parametrize("hosts", [{}, {1: 3e-6, 4: 0.0}])
def test_retarget_equals_a_field_by_field_copy(cpu: float | None, hosts: dict[int, float]) -> None:
    em = _emitter(cpu)
    ranks = em.layout.stage_ranks(0)
    progs = [retarget(em, r, hosts) for r in ranks]
    for r, prog in zip(ranks, progs, strict=True):
        assert prog.rank == r
        assert prog.ops == _expected(em, r, cpu, hosts)
        assert prog.template is progs[0].template
    # the ops other than collectives are one object across the stage's ranks; a group's members share
    # their copy of a collective over it; the pipeline sends are each rank's own
    calls = {idx for idx, _, _ in em.calls}
    for i in range(len(em.program.ops)):
        same = {id(p.ops[i]) for p in progs}
        assert len(same) == (len(progs) if i == 2 else 2 if i in calls else 1), i
    # what the emitter holds is not changed by retargeting it
    assert em.program.ops[0].cpu_s == 1e-3 and em.program.ops[0].delay_s == 2e-6


def test_retarget_refuses_a_rank_of_another_stage() -> None:
    em = _emitter(None)
    with pytest.raises(ValueError, match="not on the stage"):
        retarget(em, em.layout.stage_ranks(1)[0])


def test_kernel_table_same_indices_however_asked() -> None:
    table = KernelTable()
    asks: list[tuple[str, str, dict[str, Any]]] = [
        ("gemm", "bf16", {"m": 8, "n": 4, "k": 2}), ("gemm", "bf16", {"k": 2, "n": 4, "m": 8}),
        ("gemm", "bf16", {"m": 8.0, "n": 4, "k": 2}), ("gemm", "fp8", {"m": 8, "n": 4, "k": 2}),
        ("norm", "bf16", {"rows": 3, "cols": np.array(5)}), ("norm", "bf16", {"rows": 3, "cols": 5}),
        ("gemm", "bf16", {"m": 8, "n": 4, "k": 3})]
    got = [table(f, d, **p) for f, d, p in asks]
    specs = [KernelSpec.make(f, d, **p) for f, d, p in asks]
    distinct = list(dict.fromkeys(specs))
    assert got == [distinct.index(s) for s in specs] == [0, 0, 0, 1, 2, 2, 3]
    assert table.specs == distinct
