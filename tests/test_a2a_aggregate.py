"""All-to-all pairs carried as aggregate flows: the same times and link loads as one flow per pair.

The network carries a collective's transfers alike (same bytes, same cap, same first slowest link)
as one flow and splits it where its members would part (:mod:`simgpu.comm.network`). These cases
run every all-to-all both ways: plain (one flow per pair) and aggregated, alone and contended by
other traffic, even and uneven, on a full-bisection and on an oversubscribed spine."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_programs

from simgpu.config.loader import load_platform
from simgpu.config.platform import PlatformSpec
from simgpu.graph import CollectiveCall, Op, Program
from simgpu.result import SimResult

A100, _ = load_platform("dgx_a100")
SIZES = (1 << 16, 1 << 22, 1 << 26, 1 << 30)


def _both(platform: PlatformSpec, nodes: int, programs: list[Program], durations: list[float],
          gpus_per_node: int | None = None) -> tuple[SimResult, SimResult]:
    agg = run_programs(platform, nodes, programs, durations, gpus_per_node=gpus_per_node)
    plain = run_programs(platform, nodes, programs, durations, gpus_per_node=gpus_per_node, aggregate=False)
    return agg, plain


def _assert_same(agg: SimResult, plain: SimResult) -> None:
    assert agg.iteration_time_s == pytest.approx(plain.iteration_time_s, rel=1e-9)
    ends = ["rank", "name", "end_s"]
    a = agg.records.sort_values(ends[:2])[ends].to_numpy()
    p = plain.records.sort_values(ends[:2])[ends].to_numpy()
    assert (a[:, :2] == p[:, :2]).all()
    assert np.allclose(a[:, 2].astype(float), p[:, 2].astype(float), rtol=1e-9, atol=0)
    la, lp = agg.link_stats.set_index("link"), plain.link_stats.set_index("link")
    assert sorted(la.index) == sorted(lp.index)
    lp = lp.loc[la.index]
    assert np.allclose(la["busy_s"], lp["busy_s"], rtol=1e-9, atol=0)
    assert np.allclose(la["nbytes"], lp["nbytes"], rtol=1e-9, atol=0)


def _a2a(world: int, nbytes: int, key: str = "a2a", send: list[list[int]] | None = None) -> list[Program]:
    programs = [Program(r) for r in range(world)]
    for r in range(world):
        call = CollectiveCall(key, "all_to_all", tuple(range(world)), nbytes,
                              send_bytes=None if send is None else tuple(send[r]))
        programs[r].add(Op(key, "collective", "all_to_all", stream="comm", coll=call, nbytes=nbytes))
    return programs


@pytest.mark.parametrize("nbytes", SIZES)
def test_alone_on_four_dgx_a100(nbytes):
    _assert_same(*_both(A100, 4, _a2a(32, nbytes), []))


def test_contended_by_point_to_point_and_a_late_start():
    """Rank 3 starts late (a kernel first) and rank 0 sends to rank 9 on another stream at once:
    some pairs' links are contended, so aggregates must split; the times still match."""
    world = 32
    programs = _a2a(world, 1 << 26)
    late = Program(3)
    late.add(Op("k", "kernel", "k", stream="compute", kernel=0))
    for op in programs[3].ops:
        late.add(Op(op.name, op.kind, op.category, stream=op.stream, coll=op.coll, nbytes=op.nbytes, deps=(0,)))
    programs[3] = late
    p2p = CollectiveCall("p2p", "send_recv", (0, 9), 1 << 28)
    for r in (0, 9):
        programs[r].add(Op("p2p", "collective", "send_recv", stream="p2p", coll=p2p, nbytes=1 << 28))
    _assert_same(*_both(A100, 4, programs, [2e-4]))


def test_uneven_all_to_all_v():
    world = 16
    rng = np.random.default_rng(3)
    send = [[0 if i == j else int(x) for j, x in enumerate(rng.choice([1 << 20, 1 << 22, 3 << 20], world))]
            for i in range(world)]
    _assert_same(*_both(A100, 2, _a2a(world, sum(send[0]), send=send), []))


def test_oversubscribed_spine_across_leaves():
    """Three leaves of two nodes on a 3:1 spine: pairs leaving their leaf are held by the spine,
    pairs within it are not, though they share the NIC port."""
    net = A100.network.model_copy(update={"nodes_per_leaf": 2, "oversubscription": 3.0})
    spec = A100.model_copy(update={"network": net})
    _assert_same(*_both(spec, 6, _a2a(24, 1 << 26), [], gpus_per_node=4))
