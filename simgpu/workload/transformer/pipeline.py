"""Pipeline schedules: the order in which a stage runs forward and backward steps, and its P2P transfers.

This module owns the schedules of pipeline parallelism as Megatron-LM runs them: GPipe (every
forward, then every backward), 1F1B (``pp - stage - 1`` warm-up forwards, then one forward one
backward, then the cool-down backwards) and interleaved 1F1B over ``v`` model chunks per stage
(Megatron's ``forward_backward_pipelining_with_interleaving``: micro-batches taken in groups of
``pp``, ``2 (pp - stage - 1) + (v - 1) pp`` warm-up forwards). Model chunk ``c`` of stage ``s`` is
global chunk ``g = c * pp + s``; the activations of global chunk ``g`` go to ``g + 1`` and its input
gradients to ``g - 1``, on the next and previous stage (wrapping around between chunks).

:func:`plan` turns a stage's steps into the program Megatron issues: before each group of steps one
batched P2P exchange (``batch_isend_irecv``) of the sends of the group before and the receives the
group needs, after which the host synchronises. It knows nothing of layers, ranks or time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Schedule = Literal["gpipe", "1f1b", "interleaved"]


@dataclass(frozen=True, slots=True)
class Step:
    """A forward (``F``) or backward (``B``) pass of micro-batch ``mb`` through model chunk ``chunk``."""

    kind: Literal["F", "B"]
    mb: int
    chunk: int

    def __str__(self) -> str:
        return f"{self.kind}{self.mb}" + (f".{self.chunk}" if self.chunk else "")


@dataclass(frozen=True, slots=True)
class Transfer:
    """One side of a P2P transfer: ``what`` (activations forward, gradients backward) of micro-batch
    ``mb`` produced by global chunk ``src``; ``send`` is this stage's role and ``peer`` is +1 (the next
    stage) or -1 (the previous one)."""

    what: Literal["act", "grad"]
    mb: int
    src: int
    send: bool
    peer: int

    @property
    def key(self) -> str:
        """The same on both sides of the transfer, unique within an iteration."""
        return f"{self.what}.mb{self.mb}.g{self.src}"


Batch = tuple[Transfer, ...]


def groups(schedule: Schedule, pp: int, m: int, v: int, stage: int) -> list[tuple[Step, ...]]:
    """The compute steps of ``stage`` in issue order, grouped as they run between two P2P exchanges:
    one step at a time, except the steady state of the interleaved schedule, where Megatron runs a
    forward and a backward back to back and then exchanges once (``send_forward_backward_recv_forward_backward``).
    ``m`` micro-batches, ``v`` model chunks per stage."""
    if not 0 <= stage < pp:
        raise ValueError(f"stage {stage} is outside 0..{pp - 1}")
    if m < 1 or v < 1:
        raise ValueError(f"need at least one micro-batch and one chunk, got m={m}, v={v}")
    if schedule != "interleaved":
        if v != 1:
            raise ValueError(f"{schedule} runs one model chunk per stage, got v={v}")
        warmup = m if schedule == "gpipe" else min(pp - stage - 1, m)
        out = [Step("F", i, 0) for i in range(warmup)]
        for i in range(m - warmup):
            out += [Step("F", warmup + i, 0), Step("B", i, 0)]
        out += [Step("B", i, 0) for i in range(m - warmup, m)]
        return [(x,) for x in out]
    if m % pp:
        raise ValueError(f"the interleaved schedule needs micro-batches ({m}) divisible by pp ({pp})")
    total = m * v
    # Megatron: with as many micro-batches as stages, every forward runs before the first backward
    warmup = total if m == pp else min((pp - stage - 1) * 2 + (v - 1) * pp, total)

    def step(k: int, forward: bool) -> Step:
        in_group = k % (pp * v)
        chunk = in_group // pp
        if not forward:
            chunk = v - 1 - chunk
        mb = (k // (pp * v)) * pp + k % pp
        return Step("F" if forward else "B", mb, chunk)

    grouped: list[tuple[Step, ...]] = [(step(k, True),) for k in range(warmup)]
    grouped += [(step(warmup + k, True), step(k, False)) for k in range(total - warmup)]
    grouped += [(step(k, False),) for k in range(total - warmup, total)]
    return grouped


def steps(schedule: Schedule, pp: int, m: int, v: int, stage: int) -> list[Step]:
    """The compute steps of ``stage`` in issue order (:func:`groups`, flattened)."""
    return [x for g in groups(schedule, pp, m, v, stage) for x in g]


def transfers(step: Step, pp: int, v: int, stage: int) -> tuple[Batch, Batch]:
    """(receives before, sends after) ``step`` on ``stage``."""
    g = step.chunk * pp + stage
    last = pp * v - 1
    if step.kind == "F":
        recv = (Transfer("act", step.mb, g - 1, False, -1),) if g > 0 else ()
        send = (Transfer("act", step.mb, g, True, +1),) if g < last else ()
    else:
        recv = (Transfer("grad", step.mb, g + 1, False, +1),) if g < last else ()
        send = (Transfer("grad", step.mb, g, True, -1),) if g > 0 else ()
    return recv, send


def plan(schedule: Schedule, pp: int, m: int, v: int, stage: int) -> list[Step | Batch]:
    """The stage's program: P2P batches (tuples, never empty) between groups of compute steps.

    Before each group comes one batch with the sends of the group before and the receives the
    group needs, as Megatron's ``send_forward_recv_backward`` and its siblings; the last sends close
    the program. Within a batch, sends come first, then receives, each in step order.
    """
    out: list[Step | Batch] = []
    pending: list[Transfer] = []
    for group in groups(schedule, pp, m, v, stage):
        recvs: list[Transfer] = []
        sends: list[Transfer] = []
        for s in group:
            recv, send = transfers(s, pp, v, stage)
            recvs += recv
            sends += send
        if pending or recvs:
            out.append(tuple(pending + recvs))
        out.extend(group)
        pending = sends
    if pending:
        out.append(tuple(pending))
    return out


def in_flight(schedule: Schedule, pp: int, m: int, v: int, stage: int) -> int:
    """Most model-chunk forwards whose backward has not run yet, over the stage's steps: how many
    micro-batches' activations the stage holds at its peak (in units of one chunk)."""
    live = peak = 0
    for s in steps(schedule, pp, m, v, stage):
        live += 1 if s.kind == "F" else -1
        peak = max(peak, live)
    return peak


def bubble_fraction(pp: int, m: int, v: int = 1) -> float:
    """The idle share of an iteration of uniform stages: ``(pp - 1) / (v m + pp - 1)``."""
    return (pp - 1) / (v * m + pp - 1)
