"""``simgpu search stages``: balance a pipeline's blocks per stage (``parallelism.stage_layers``) over
GPUs of different speeds (a mixed platform, docs/mixed.md) or round a stage's extra work (the
embedding, the output layer and the loss).

One simulation of the even split measures each stage's compute on its slowest rank: the time of its
blocks' kernels per block (kernels named ``h<i>.``) and the rest (embedding, output layer, loss,
optimizer). Two splits are derived from these: the one *proportional* to the stages' speeds (blocks
inversely to the time per block) and the *balanced* one, the least iteration these straight lines
imply for the schedule (one micro-batch through every stage, the others at the busiest stage's pace;
:func:`pipeline_estimate`), which leans further towards the fast stages than the proportional split
when there are few micro-batches. The candidates are the even split, both of them and every split one block
away from either (a block moved from one stage to another), each at least one block a stage; the
search simulates each and ranks them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from .config.loader import load_job, parse_override
from .config.transformer import TransformerModel
from .errors import ConfigError
from .result import SimResult
from .variant import Variant

_BLOCK = re.compile(r"^h\d+\.")


@dataclass(frozen=True)
class StageCost:
    """One stage's compute per iteration on its slowest rank: ``block_s`` per block, ``rest_s`` the rest."""

    block_s: float
    rest_s: float

    def at(self, blocks: int) -> float:
        return self.rest_s + blocks * self.block_s


def even_split(layers: int, stages: int) -> list[int]:
    """``layers`` blocks over ``stages`` as evenly as they go (the first stages take the remainder)."""
    per, extra = divmod(layers, stages)
    return [per + (1 if s < extra else 0) for s in range(stages)]


def stage_costs(result: SimResult, split: Sequence[int], world: int) -> list[StageCost]:
    """Each stage's :class:`StageCost` from a simulation of ``split`` on ``world`` GPUs (pipeline stages
    outermost: rank ``r`` is on stage ``r // (world / pp)``), from its slowest simulated rank."""
    pp = len(split)
    rec = result.records
    kern = rec[rec["kind"] == "kernel"]
    dur = kern["end_s"] - kern["start_s"]
    frame = pd.DataFrame({"rank": kern["rank"].to_numpy(), "d": dur.to_numpy(),
                          "block": kern["name"].str.match(_BLOCK).to_numpy()})
    per_stage = max(world // pp, 1)
    total = frame.groupby("rank")["d"].sum()
    blocks = frame[frame["block"]].groupby("rank")["d"].sum()
    out = []
    for s in range(pp):
        ranks = [r for r in total.index if int(r) // per_stage == s]
        if not ranks:
            raise ValueError(f"no simulated rank of pipeline stage {s}")
        r = max(ranks, key=lambda x: float(total[x]))
        b = float(blocks.get(r, 0.0))
        out.append(StageCost(block_s=b / split[s], rest_s=float(total[r]) - b))
    return out


def pipeline_estimate(costs: Sequence[StageCost], split: Sequence[int], micro_batches: int) -> float:
    """The iteration a split's compute implies under 1F1B or GPipe: one micro-batch through every stage
    and the rest at the pace of the busiest stage, ``sum(c) / m + (m - 1) max(c) / m`` (``c`` each
    stage's compute per iteration, ``m`` micro-batches)."""
    c = [cost.at(n) for cost, n in zip(costs, split, strict=True)]
    m = max(micro_batches, 1)
    return (sum(c) + (m - 1) * max(c)) / m


def balanced_split(costs: Sequence[StageCost], layers: int, micro_batches: int = 1) -> list[int]:
    """The split with the least :func:`pipeline_estimate` found by handing out blocks one at a time to
    the stage that raises it least, then moving single blocks between stages while one lowers it (at
    least one block a stage)."""
    def cost(split: Sequence[int]) -> tuple[float, tuple[int, ...]]:
        return pipeline_estimate(costs, split, micro_batches), tuple(split)

    split = [1] * len(costs)
    for _ in range(layers - len(costs)):
        trials = [[n + (1 if i == s else 0) for i, n in enumerate(split)] for s in range(len(costs))]
        split = min(trials, key=cost)
    while True:
        best = min([split, *neighbours(split)], key=cost)
        if best == split:
            return split
        split = best


def proportional_split(costs: Sequence[StageCost], layers: int) -> list[int]:
    """Blocks in proportion to each stage's speed (the inverse of its time per block), rounded by the
    largest remainders, at least one block a stage."""
    speed = [1.0 / c.block_s if c.block_s > 0 else 0.0 for c in costs]
    if not sum(speed):
        return even_split(layers, len(costs))
    spare = layers - len(costs)
    share = [spare * v / sum(speed) for v in speed]
    split = [1 + int(x) for x in share]
    order = sorted(range(len(costs)), key=lambda i: (-(share[i] - int(share[i])), i))
    for i in order[:layers - sum(split)]:
        split[i] += 1
    return split


def neighbours(split: Sequence[int]) -> list[list[int]]:
    """Every split one block away from ``split``: a block moved from one stage to another."""
    out = []
    for a in range(len(split)):
        for b in range(len(split)):
            if a != b and split[a] > 1:
                n = list(split)
                n[a] -= 1
                n[b] += 1
                out.append(n)
    return out


def _text(split: Sequence[int]) -> str:
    return ",".join(map(str, split))


def stage_candidates(workload: str, overrides: Sequence[str] = ()) -> tuple[list[Variant], dict[str, Any]]:
    """The splits to simulate (the even one first) and what they were derived from: ``even``,
    ``proportional``, ``balanced`` (lists) and ``costs`` (per stage, ms per block and of the rest)."""
    from .config.checks import gpus_per_node
    from .sim import simulate
    from .workload import World
    from .workload.transformer.shapes import make_setup

    job = load_job(workload, overrides)
    md, par, f = job.workload.model, job.workload.parallelism, job.workload_file
    if not isinstance(md, TransformerModel) or job.workload.training is None:
        raise ConfigError("stage search needs a Transformer training workload", file=f, key="model.kind")
    if par.pp < 2:
        raise ConfigError(f"stage search balances a pipeline's blocks; expected parallelism.pp >= 2, got "
                          f"{par.pp}", file=f, key="parallelism.pp")
    if par.virtual_stages > 1:
        raise ConfigError("stage search balances one model chunk per stage; expected virtual_stages: 1 (give "
                          "an interleaved split in parallelism.stage_layers yourself)", file=f,
                          key="parallelism.virtual_stages")
    if par.account_for_embedding_and_loss:
        raise ConfigError("stage search sets parallelism.stage_layers, which replaces Megatron's split; expected "
                          "account_for_embedding_and_loss: false", file=f,
                          key="parallelism.account_for_embedding_and_loss")
    if md.layers < par.pp:
        raise ConfigError(f"{md.layers} layers cannot give each of pp={par.pp} stages a block", file=f,
                          key="model.layers")
    base = tuple(parse_override(o) for o in overrides if not o.startswith(("parallelism.stage_layers=",
                                                                          "workload.parallelism.stage_layers=")))
    even = even_split(md.layers, par.pp)
    first = simulate(load_job(workload, [*Variant("even", base + (("parallelism.stage_layers", even),)).as_args()]))
    costs = stage_costs(first, even, job.workload.nodes * gpus_per_node(job))
    setup = make_setup(job.workload, World(job.workload.nodes, gpus_per_node(job)))
    prop, bal = proportional_split(costs, md.layers), balanced_split(costs, md.layers, setup.m)
    splits: dict[str, tuple[str, list[int]]] = {}
    for label, split in (("even", even), ("balanced", bal), ("proportional", prop)):
        splits.setdefault(_text(split), (label, split))
    for centre in (bal, prop):
        for n in neighbours(centre):
            splits.setdefault(_text(n), ("", n))
    variants = []
    for text, (label, split) in splits.items():
        name = f"{label} {text}".strip()
        variants.append(Variant(name, base + (("parallelism.stage_layers", split),),
                                (("stage_layers", text), ("from", label or "neighbour"))))
    info = {"even": even, "proportional": prop, "balanced": bal,
            "costs": [{"stage": s, "block_ms": c.block_s * 1e3, "rest_ms": c.rest_s * 1e3}
                      for s, c in enumerate(costs)]}
    return variants, info


def stage_lines(table: pd.DataFrame, info: dict[str, Any]) -> list[str]:
    """The estimate the search started from and its best split against the even one."""
    lines = ["", "compute per stage in the even split (its slowest rank):"]
    for c in info["costs"]:
        lines.append(f"  stage {c['stage']}: {c['block_ms']:.3f} ms per block, {c['rest_ms']:.3f} ms besides")
    lines.append(f"proportional to speed: [{_text(info['proportional'])}]; balanced: [{_text(info['balanced'])}]")
    ok = table[table["feasible"]] if "feasible" in table else table
    even = ok[ok["stage_layers"] == _text(info["even"])]
    if len(ok):
        best = ok.sort_values("iteration_time_ms").iloc[0]
        t = float(best["iteration_time_ms"])
        line = f"best split [{best['stage_layers']}]: {t:.3f} ms"
        if len(even):
            e = float(even["iteration_time_ms"].iloc[0])
            line += f" against the even split [{_text(info['even'])}]: {e:.3f} ms ({(1 - t / e) * 100:.1f}% faster)"
        lines.append(line)
    return lines
