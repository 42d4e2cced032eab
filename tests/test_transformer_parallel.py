"""Rank layout and process groups in Megatron's order (tp-cp-ep-dp-pp), and programs retargeted per rank."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simgpu.workload.parallel import GROUP_KINDS, Coord, Layout


def test_megatron_order_tp_innermost_pp_outermost() -> None:
    lay = Layout(tp=2, cp=2, dp=2, pp=2)
    # rank = tp + 2 * (cp + 2 * (dp + 2 * pp)), as Megatron's RankGenerator with order tp-cp-dp-pp
    assert [lay.coord(r) for r in range(4)] == [Coord(0, 0, 0, 0), Coord(1, 0, 0, 0), Coord(0, 1, 0, 0),
                                               Coord(1, 1, 0, 0)]
    assert lay.coord(4) == Coord(0, 0, 1, 0) and lay.coord(8) == Coord(0, 0, 0, 1)
    assert lay.coord(15) == Coord(1, 1, 1, 1)


def test_gpt3_layout_tp_inside_a_node() -> None:
    """TP8 PP16 DP8 on 1,024 GPUs: each tensor-parallel group is one 8-GPU node; a stage is 8 nodes."""
    lay = Layout(tp=8, dp=8, pp=16)
    assert lay.world == 1024
    for g in lay.groups("tp"):
        assert len(g) == 8 and g[0] % 8 == 0 and list(g) == list(range(g[0], g[0] + 8))
    assert lay.group(0, "dp") == tuple(range(0, 64, 8))
    assert lay.group(5, "pp") == tuple(range(5, 1024, 64))
    assert lay.stage_ranks(1) == list(range(64, 128))
    assert lay.group(3, "embed") == (3, 3 + 15 * 64)


def test_groups_partition_the_world_and_agree_among_members() -> None:
    lay = Layout(tp=2, cp=2, dp=4, pp=3, ep=2)
    sizes = {"tp": 2, "cp": 2, "dp": 4, "dp_cp": 8, "ep": 2, "edp_cp": 4, "pp": 3, "embed": 2}
    for kind in GROUP_KINDS:
        groups = lay.groups(kind)
        members = sorted(r for g in groups for r in g)
        assert members == list(range(lay.world)), kind      # every rank exactly once
        for g in groups:
            middle = kind == "embed" and lay.coord(g[0]).pp not in (0, lay.pp - 1)
            assert len(g) == (1 if middle else sizes[kind]) and len(set(g)) == len(g)
            for r in g:
                assert lay.group(r, kind) == g, (kind, r)    # each member sees the same group


def test_expert_groups_are_carved_from_data_parallel_ranks() -> None:
    lay = Layout(tp=1, dp=8, ep=4)
    assert lay.group(0, "ep") == (0, 1, 2, 3) and lay.group(6, "ep") == (4, 5, 6, 7)
    assert lay.group(1, "edp_cp") == (1, 5)   # same expert shard in each expert-parallel group


def test_coordinates_differ_only_along_the_group_dimension() -> None:
    lay = Layout(tp=4, cp=2, dp=2, pp=2)
    dims = {"tp": "tp", "cp": "cp", "dp": "dp", "pp": "pp"}
    for kind, dim in dims.items():
        for r in range(lay.world):
            c = lay.coord(r)
            for q in lay.group(r, kind):
                d = lay.coord(q)
                for other in ("tp", "cp", "dp", "pp"):
                    if other != dim:
                        assert getattr(d, other) == getattr(c, other)


@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 4), st.integers(1, 3))
def test_coord_and_rank_are_inverse(tp: int, cp: int, dp: int, pp: int) -> None:
    lay = Layout(tp=tp, cp=cp, dp=dp, pp=pp)
    assert [lay.rank(lay.coord(r)) for r in range(lay.world)] == list(range(lay.world))


def test_pipeline_neighbours_wrap_around() -> None:
    lay = Layout(tp=2, dp=2, pp=4)
    assert lay.neighbour(1, +1) == 5 and lay.neighbour(13, +1) == 1 and lay.neighbour(1, -1) == 13


@pytest.mark.parametrize("bad", [dict(tp=0), dict(dp=4, ep=3)])
def test_bad_layouts_are_refused(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        Layout(**bad)


def test_unknown_group_kind_lists_the_known() -> None:
    with pytest.raises(KeyError, match="known: tp, cp"):
        Layout().group(0, "xp")


def test_every_rank_gets_coordinates_once() -> None:
    lay = Layout(tp=2, cp=3, dp=2, pp=2)
    coords = {lay.coord(r) for r in range(lay.world)}
    assert len(coords) == lay.world
    assert coords == {Coord(*c) for c in itertools.product(range(2), range(3), range(2), range(2))}
