"""``parallelism.stage_layers``: the Transformer blocks of each pipeline stage, and ``simgpu search
stages``, which balances them over GPUs of different speeds (docs/mixed.md)."""

from __future__ import annotations

from functools import cache

import pandas as pd
import pytest
from conftest import ROOT

from simgpu import load_job, simulate
from simgpu.report import summarize
from simgpu.workload import World
from simgpu.workload.transformer.memory import stage_memory
from simgpu.workload.transformer.shapes import make_setup

GPT = ROOT / "workloads" / "gpt_2x_dgx_h100.yaml"
MIXED = ROOT / "workloads" / "gpt_mixed_h100_a100.yaml"
#: A small GPT in a pipeline of two stages. The vocabulary is small so that the output layer on the
#: last stage weighs little beside a block (with GPT's 50,304 tokens it weighs about a block at this
#: width, and the last stage is best given fewer blocks even on equal GPUs: see
#: ``test_a_large_output_layer_favours_a_lighter_last_stage``).
SMALL = ["model.layers=4", "model.hidden=1024", "model.heads=8", "model.seq_len=1024", "model.vocab=4096",
         "parallelism.pp=2", "parallelism.dp=null", "training.grad_accumulation=4"]
ONE_NODE = ["nodes=1", "gpus_per_node=2"]
#: pp=2 over the mixed platform's two nodes: stage 0 on the DGX H100, stage 1 on the DGX A100
ON_MIX = SMALL + ["gpus_per_node=1"]


@cache
def _ms(path: str, *over: str) -> float:
    return simulate(load_job(path, list(over))).iteration_time_s * 1e3


def _split(split: list[int]) -> str:
    return f"parallelism.stage_layers={split}"


def test_the_even_split_given_is_the_default_exactly():
    over = SMALL + ONE_NODE
    ra, rb = simulate(load_job(GPT, over)), simulate(load_job(GPT, over + [_split([2, 2])]))
    a, b = summarize(ra), summarize(rb)
    assert a.pop("run")["overrides"] != b.pop("run")["overrides"]  # the only difference: the key given
    assert a == b
    assert ra.records.equals(rb.records)


def test_the_even_split_given_is_the_default_under_the_interleaved_schedule():
    over = SMALL + ONE_NODE + ["parallelism.pp_schedule=interleaved", "parallelism.virtual_stages=2"]
    assert _ms(str(GPT), *over) == _ms(str(GPT), *over, _split([1, 1, 1, 1]))


@pytest.mark.parametrize("split", [[1, 3], [3, 1]])
def test_on_equal_gpus_an_uneven_split_is_never_faster(split: list[int]):
    over = SMALL + ONE_NODE
    assert _ms(str(GPT), *over, _split(split)) >= _ms(str(GPT), *over)


def test_a_large_output_layer_favours_a_lighter_last_stage():
    """GPT's full vocabulary: the last stage's output layer and loss weigh about a block, so moving a
    block to the first stage shortens the iteration (why Megatron counts them in its split)."""
    over = [o for o in SMALL if not o.startswith("model.vocab")] + ONE_NODE
    assert _ms(str(GPT), *over, _split([3, 1])) < _ms(str(GPT), *over)


def test_blocks_and_memory_follow_the_split():
    job = load_job(GPT, SMALL + ONE_NODE + [_split([3, 1])])
    s = make_setup(job.workload, World(1, 2))
    assert [list(s.chunk_layers(g)) for g in range(2)] == [[0, 1, 2], [3]]
    even = make_setup(load_job(GPT, SMALL + ONE_NODE).workload, World(1, 2))
    assert stage_memory(s, 0).total > stage_memory(even, 0).total
    assert stage_memory(s, 1).total < stage_memory(even, 1).total


def test_interleaved_chunks_take_their_entries_in_model_order():
    over = SMALL + ONE_NODE + ["parallelism.pp_schedule=interleaved", "parallelism.virtual_stages=2",
                               "model.layers=6", _split([2, 1, 2, 1])]
    s = make_setup(load_job(GPT, over).workload, World(1, 2))
    assert [list(s.chunk_layers(g)) for g in s.stage_chunks(0)] == [[0, 1], [3, 4]]
    assert [list(s.chunk_layers(g)) for g in s.stage_chunks(1)] == [[2], [5]]


def test_on_the_mix_more_blocks_on_the_h100_stage_is_faster():
    assert _ms(str(MIXED), *ON_MIX, _split([3, 1])) < _ms(str(MIXED), *ON_MIX)
    assert _ms(str(MIXED), *ON_MIX, _split([1, 3])) > _ms(str(MIXED), *ON_MIX)


def test_the_search_balances_the_mix_at_least_as_well_as_the_even_split(tmp_path):
    from simgpu.search import main as search

    out = tmp_path / "s"
    over = [a for o in ON_MIX for a in ("--set", o)]
    assert search(["stages", str(MIXED), *over, "--out", str(out), "--top", "1", "--quiet", "--workers", "1"]) == 0
    table = pd.read_csv(out / "results.csv", dtype={"stage_layers": str})
    times = dict(zip(table["stage_layers"], table["iteration_time_ms"], strict=True))
    assert "2,2" in times and min(times.values()) <= times["2,2"]
    best = min(times, key=lambda k: times[k])
    assert int(best.split(",")[0]) > 2  # the H100 stage takes more blocks
    assert (out / "top1" / "summary.json").exists()


def test_splits_derived_from_the_stage_costs():
    from simgpu.stages import StageCost, balanced_split, even_split, neighbours, proportional_split

    assert even_split(10, 4) == [3, 3, 2, 2]
    fast, slow = StageCost(block_s=1.0, rest_s=0.0), StageCost(block_s=3.0, rest_s=0.0)
    assert proportional_split([fast, slow], 9) == [6, 3]
    assert proportional_split([fast, fast], 8) == [4, 4]
    assert balanced_split([fast, fast], 8, micro_batches=1000) == [4, 4]
    assert balanced_split([fast, StageCost(block_s=1.0, rest_s=2.0)], 8, micro_batches=1000) == [5, 3]
    assert sorted(neighbours([2, 1])) == [[1, 2]]
