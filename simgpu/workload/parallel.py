"""Where each rank sits in a parallel job, and the process groups it belongs to, as Megatron-LM lays them out.

This module owns the mapping between a global rank and its coordinates (tp, cp, dp, pp) in Megatron's
default order ``tp-cp-ep-dp-pp``: tensor parallelism is innermost, so a tensor-parallel group is
consecutive ranks (GPUs of one node first), then context, then data parallelism, and pipeline stages
are outermost. Expert parallelism is carved out of data parallelism: the ``ep`` consecutive
data-parallel ranks form an expert-parallel group, and ranks with the same position in those groups
form an expert-data-parallel group. It knows nothing of models or of time.

Group kinds (each rank is in exactly one group of each kind; :meth:`Layout.group`):

========== =====================================================================================
``tp``      same cp, dp, pp: tensor-parallel collectives
``cp``      same tp, dp, pp: context-parallel K/V exchange
``dp``      same tp, cp, pp: data-parallel replicas
``dp_cp``   same tp, pp: replicas of the same parameters (gradients are reduced over it)
``ep``      same tp, cp, pp and dp // ep: expert all-to-all
``edp_cp``  same tp, pp and dp % ep: replicas of the same experts (expert gradients reduced over it)
``pp``      same tp, cp, dp: the pipeline, stage order
``embed``   the first and last stage of the pipeline (tied embeddings share gradients over it);
            a rank of a middle stage is alone
========== =====================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

GROUP_KINDS: Final = ("tp", "cp", "dp", "dp_cp", "ep", "edp_cp", "pp", "embed")


@dataclass(frozen=True, slots=True)
class Coord:
    """A rank's position along each parallel dimension (0-based)."""

    tp: int
    cp: int
    dp: int
    pp: int


@dataclass(frozen=True)
class Layout:
    """Parallel degrees of a job; ``tp * cp * dp * pp`` ranks, Megatron order ``tp-cp-ep-dp-pp``."""

    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "dp", "pp", "ep"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dp % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide dp ({self.dp})")

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def coord(self, rank: int) -> Coord:
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is outside a world of {self.world}")
        r, tp = divmod(rank, self.tp)
        r, cp = divmod(r, self.cp)
        pp, dp = divmod(r, self.dp)
        return Coord(tp, cp, dp, pp)

    def rank(self, c: Coord) -> int:
        for name, n in (("tp", self.tp), ("cp", self.cp), ("dp", self.dp), ("pp", self.pp)):
            if not 0 <= getattr(c, name) < n:
                raise ValueError(f"{name} coordinate {getattr(c, name)} is outside 0..{n - 1}")
        return c.tp + self.tp * (c.cp + self.cp * (c.dp + self.dp * c.pp))

    def group(self, rank: int, kind: str) -> tuple[int, ...]:
        """The ranks of ``rank``'s group of ``kind`` (see the module docstring), in group order."""
        c = self.coord(rank)
        at = self.rank
        if kind == "tp":
            return tuple(at(Coord(t, c.cp, c.dp, c.pp)) for t in range(self.tp))
        if kind == "cp":
            return tuple(at(Coord(c.tp, k, c.dp, c.pp)) for k in range(self.cp))
        if kind == "dp":
            return tuple(at(Coord(c.tp, c.cp, d, c.pp)) for d in range(self.dp))
        if kind == "dp_cp":
            return tuple(at(Coord(c.tp, k, d, c.pp)) for d in range(self.dp) for k in range(self.cp))
        if kind == "ep":
            base = c.dp - c.dp % self.ep
            return tuple(at(Coord(c.tp, c.cp, base + e, c.pp)) for e in range(self.ep))
        if kind == "edp_cp":
            off = c.dp % self.ep
            return tuple(at(Coord(c.tp, k, d, c.pp))
                         for d in range(off, self.dp, self.ep) for k in range(self.cp))
        if kind == "pp":
            return tuple(at(Coord(c.tp, c.cp, c.dp, s)) for s in range(self.pp))
        if kind == "embed":
            if c.pp not in (0, self.pp - 1):
                return (rank,)
            ends = (0, self.pp - 1) if self.pp > 1 else (0,)
            return tuple(at(Coord(c.tp, c.cp, c.dp, s)) for s in ends)
        raise KeyError(f"unknown group kind {kind!r}; known: {', '.join(GROUP_KINDS)}")

    def groups(self, kind: str) -> list[tuple[int, ...]]:
        """Every group of ``kind``, each once, ordered by its first rank."""
        seen: dict[tuple[int, ...], None] = {}
        for r in range(self.world):
            seen.setdefault(self.group(r, kind), None)
        return sorted(seen, key=lambda g: g[0])

    def size(self, kind: str) -> int:
        """Members of a group of ``kind`` (the same for every rank)."""
        return len(self.group(0, kind))

    def stage_ranks(self, stage: int) -> list[int]:
        """The ranks of pipeline stage ``stage``, ascending."""
        n = self.tp * self.cp * self.dp
        return list(range(stage * n, (stage + 1) * n))

    def neighbour(self, rank: int, step: int) -> int:
        """The rank ``step`` stages further down the pipeline (wrapping around), same tp, cp, dp."""
        c = self.coord(rank)
        return self.rank(Coord(c.tp, c.cp, c.dp, (c.pp + step) % self.pp))
