"""Iteration times for the serving loop: each distinct step shape asked of the engine once.

A step reaches the :class:`Clock` as its prompt chunks (new tokens, cached tokens, each rounded up
to a bucket), its number of decoding requests and their mean KV length (rounded up to a bucket).
``timing.mode: direct`` times every such shape on the engine. ``additive`` (the default) times a
step from three small tables that the engine fills on demand: decode-only steps (requests x mean
KV length), a prompt chunk beside decodes at a reference KV length (chunk tokens x requests), and a
lone chunk over its cached tokens (chunk x cached), each read between the points of a geometric
grid around it and interpolated linearly, as Vidur interpolates its predictions. A mixed step is
the second table plus what the chunk's cached tokens and the decodes' longer caches add, each from
its own table: the forward's attention kernels run one after another with the GEMMs on the compute
stream and depend only on their own sizes. A serving run then asks the engine for hundreds of
shapes, not one per iteration; ``tests/test_serve_timing.py`` measures what it costs against
``direct``.

Under pipeline parallelism a pool has one clock per stage (``stage``), each reading its own tables
of that stage's share of a step (:meth:`~simgpu.serve.timer.EngineTimer.stage_times`);
a shape missing from one stage's table is timed once for all stages. The interpolation is linear,
so the stages' clocks sum to what one clock of whole steps gives.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import SimulationError
from ..workload.inference.api import Step
from .spec import TimingSpec

if TYPE_CHECKING:
    from .loop import Pool

Prefill = tuple[tuple[int, int], ...]
Shape = tuple[Prefill, int, int]

#: Decode counts and token counts up to these are timed as they are, above on the grid.
EXACT_DECODES = 16
EXACT_TOKENS = 128
#: A prompt chunk's new tokens are timed as they are (the GEMMs' times step with their row count
#: where the kernel tiles fill, so a chunk between two grid points is not their average).
EXACT_CHUNK = 1 << 30
#: Grid points are multiples of these: the GEMMs' row counts (tokens, requests) run fastest aligned,
#: and an unaligned grid point would stand for its aligned neighbours with its slower time.
TOKEN_ALIGN = 64
ROW_ALIGN = 8


def around(n: int, per_octave: int, exact_below: int, align: int = 1) -> tuple[int, int]:
    """The points of a geometric grid (``per_octave`` per doubling, rounded to multiples of
    ``align``) at or just below and above ``n``; ``(n, n)`` for ``n`` up to ``exact_below`` or on the grid."""
    if n <= exact_below:
        return n, n

    def point(k: int) -> int:
        return max(round(2.0 ** (k / per_octave) / align), 1) * align

    k = math.floor(math.log2(n) * per_octave)
    while point(k) > n:
        k -= 1
    lo = point(k)
    while point(k) < n:
        k += 1
    hi = point(k)
    return (n, n) if n in (lo, hi) else (lo, hi)


class Clock:
    """Times steps of one pool; ``cache`` (shape -> seconds) is the pool's, shared across runs.
    With ``stage``, the share of pipeline stage ``stage`` of each step (the pool's stage tables)."""

    def __init__(self, pool: Pool, timing: TimingSpec, stage: int | None = None) -> None:
        self.pool, self.stage = pool, stage
        self.cache = pool.cache if stage is None else pool.stage_table(stage)
        self.additive = timing.mode == "additive"
        self.per_octave = timing.grid_per_octave
        self.ref = timing.context_bucket_tokens

    def timed(self, pf: Prefill, nd: int, m: int) -> float:
        """The engine's time of one shape (cached)."""
        key = (pf, nd, m)
        t = self.cache.get(key)
        if t is None:
            if self.stage is not None:
                return self._stage_timed(key)
            t = float(self.pool.timer.time([Step(pf, (m,) * nd)])[0])
            if not t > 0 or not math.isfinite(t):
                raise SimulationError(f"the {self.pool.name} pool's timer gave {t} s for a step; expected a "
                                      "positive time")
            self.cache[key] = t
        return t

    def _stage_timed(self, key: Shape) -> float:
        """One shape timed on the engine stage by stage, kept in every stage's table."""
        pf, nd, m = key
        row = self.pool.timer.stage_times([Step(pf, (m,) * nd)])[0]  # type: ignore[attr-defined]
        if not row.sum() > 0 or not math.isfinite(row.sum()) or (row < 0).any():
            raise SimulationError(f"the {self.pool.name} pool's timer gave stage times {list(row)} s for a step; "
                                  "expected times >= 0 with a positive sum")
        for k, t in enumerate(row):
            self.pool.stage_table(k)[key] = float(t)
        self.pool.cache[key] = float(row.sum())
        return self.cache[key]

    def grid(self, fn: Callable[[int, int], Shape], x: int, y: int, ex: int, ey: int) -> float:
        """``timed(*fn(x, y))`` interpolated bilinearly between the grid points around ``x`` and ``y``
        (token counts on points aligned to :data:`TOKEN_ALIGN`, request counts to :data:`ROW_ALIGN`)."""
        x0, x1 = around(x, self.per_octave, ex, ROW_ALIGN if ex == EXACT_DECODES else TOKEN_ALIGN)
        y0, y1 = around(y, self.per_octave, ey, ROW_ALIGN if ey == EXACT_DECODES else TOKEN_ALIGN)
        fx = (x - x0) / (x1 - x0) if x1 > x0 else 0.0
        fy = (y - y0) / (y1 - y0) if y1 > y0 else 0.0
        t00 = self.timed(*fn(x0, y0))
        lo = t00 + fx * (self.timed(*fn(x1, y0)) - t00) if fx else t00
        if not fy:
            return lo
        t01 = self.timed(*fn(x0, y1))
        hi = t01 + fx * (self.timed(*fn(x1, y1)) - t01) if fx else t01
        return lo + fy * (hi - lo)

    def decode(self, nd: int, m: int) -> float:
        nd = -(-nd // ROW_ALIGN) * ROW_ALIGN if nd > EXACT_DECODES else nd
        return self.grid(lambda n, k: ((), n, k), nd, m, EXACT_DECODES, EXACT_TOKENS)

    def chunk(self, c: int, cached: int) -> float:
        return self.grid(lambda n, k: (((n, k),), 0, 0), c, cached, EXACT_CHUNK, EXACT_TOKENS)

    def time(self, pf: Prefill, nd: int, m: int) -> float:
        """Seconds of a step of prompt chunks ``pf`` and ``nd`` decodes over ``m`` KV tokens each."""
        if not self.additive:
            return self.timed(pf, nd, m)
        ref = self.ref
        if nd > EXACT_DECODES:  # the GEMMs' rows are padded to a multiple of ROW_ALIGN
            nd = -(-nd // ROW_ALIGN) * ROW_ALIGN
        if not pf:
            return self.decode(nd, m)
        if len(pf) > 1:
            if not nd:
                return self.timed(pf, 0, 0)
            base = self.grid(lambda n, _: (pf, n, ref), nd, 0, EXACT_DECODES, 0)
        else:
            c, cached = pf[0]
            if not nd:
                return self.chunk(c, cached)
            base = self.grid(lambda n, k: (((n, 0),), k, ref), c, nd, EXACT_CHUNK, EXACT_DECODES)
            if cached:  # the chunk's attention over its cached tokens
                base += self.chunk(c, cached) - self.chunk(c, 0)
        # the decodes' attention over their caches, beyond the reference length
        return base + self.decode(nd, m) - self.decode(nd, ref)
