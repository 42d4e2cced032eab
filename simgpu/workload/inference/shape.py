"""What one iteration's batch costs, reduced to the few numbers its kernels depend on.

A :class:`~simgpu.workload.inference.api.Step` lists every request; its kernels see only totals:
the GEMMs the tokens of the batch (``tokens``), the output layer and the sampler one row per request
(``rows``), both padded to a multiple of :data:`ROW_ALIGN` (of :data:`TILE_ROWS` above
:data:`EXACT_BELOW`), and attention three kernels of paged
attention over the KV cache, as the kernel models are measured (AIConfigurator's context and generation attention):

- the prompts' causal attention over their own new tokens: ``prefill`` sequences of ``prefill_len``
  tokens, ``prefill_len`` the root mean square of the new tokens (the causal pairs, sum n^2 / 2,
  are kept);
- the new tokens of chunked prefills over the chunks already cached: ``chunked`` sequences of
  ``chunk_q`` queries over ``chunk_kv`` keys (the pairs, sum new x cached, are kept);
- the decode tokens over their caches: ``decode`` sequences of one query over ``decode_ctx`` keys,
  the mean cache length (the keys read, sum ctx, are kept).

:func:`canonical` also rounds every count above :data:`EXACT_BELOW` to a geometric grid of
:data:`GRID_PER_OCTAVE` points per doubling (a relative step of 2.2%, so at most 1.1% off), so
that the thousands of steps a serving run asks for collapse to far fewer distinct shapes; the error
this costs in iteration time is measured in ``tests/test_inference_timer.py`` (below 1%).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .api import Step

#: Counts up to this are kept exact (decode batches of up to 256 requests take every size).
EXACT_BELOW = 256
#: Grid points per doubling of a count above :data:`EXACT_BELOW`.
GRID_PER_OCTAVE = 32
#: The batch's rows (tokens, and requests for the output layer) are padded to a multiple of 32, 16
#: bytes of fp4 (32 bytes of fp8), as TensorRT-LLM and vLLM pad their GEMMs' row counts: the kernel
#: models time a misaligned row count far slower, which no engine pays (bf16 at 197 rows 30% slower
#: than at 196 or 200). At decode sizes the padding costs nothing (the weights' bytes set the time).
ROW_ALIGN = 32
#: Above :data:`EXACT_BELOW` rows a GEMM runs in tiles of 128 rows (the CTA tile of Hopper's and
#: Ampere's large GEMM kernels), so its time is that of its rows rounded up to whole tiles: the rows
#: are padded to a multiple of this. (Between the row counts a table measured, the kernel models
#: interpolate themselves: :data:`simgpu.kernels.learned.ROW_GAP`.)
TILE_ROWS = 128


def bucket(n: float) -> int:
    """``n`` rounded to an integer, and above :data:`EXACT_BELOW` to the nearest point of the grid."""
    if n <= EXACT_BELOW:
        return max(round(n), 0)
    k = round(math.log2(n) * GRID_PER_OCTAVE)
    return round(2.0 ** (k / GRID_PER_OCTAVE))


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    """One iteration's batch as its kernels see it (see the module docstring)."""

    tokens: int
    rows: int
    prefill: int = 0
    prefill_len: int = 0
    chunked: int = 0
    chunk_q: int = 0
    chunk_kv: int = 0
    decode: int = 0
    decode_ctx: int = 0

    def split(self, ways: int) -> Shape:
        """The share of one of ``ways`` ranks that split the requests between them (attention data
        parallel under expert parallelism): every count divided, rounded up."""
        if ways == 1:
            return self

        def up(n: int) -> int:
            return -(-n // ways)
        return Shape(up(self.tokens), up(self.rows), up(self.prefill), self.prefill_len, up(self.chunked),
                     self.chunk_q, self.chunk_kv, up(self.decode), self.decode_ctx)

    @property
    def kv_tokens(self) -> int:
        """Tokens the batch holds in KV cache once its iteration has run."""
        return (self.prefill * self.prefill_len + self.chunked * self.chunk_kv
                + self.decode * (self.decode_ctx + 1))


def pad(n: int) -> int:
    """``n`` rows padded to a multiple of :data:`ROW_ALIGN`, above :data:`EXACT_BELOW` of
    :data:`TILE_ROWS`."""
    align = TILE_ROWS if n > EXACT_BELOW else ROW_ALIGN
    return -(-n // align) * align


def shape_of(step: Step, *, exact: bool = False) -> Shape:
    """The :class:`Shape` of ``step``; rounded to the grid unless ``exact``."""
    b = (lambda n: max(round(n), 0)) if exact else bucket
    new = [n for n, _ in step.prefill]
    tokens = sum(new) + len(step.decode)
    if tokens == 0:
        raise ValueError("a step needs at least one token (a prefill chunk or a decoding request)")
    if any(n < 1 for n in new) or any(c < 0 for _, c in step.prefill) or any(c < 0 for c in step.decode):
        raise ValueError(f"a step's prefill chunks need >= 1 new token and no negative cache: {step}")
    p = len(new)
    p_len = b(math.sqrt(sum(n * n for n in new) / p)) if p else 0
    pairs = [(n, c) for n, c in step.prefill if c > 0]
    q = sum(n for n, _ in pairs)
    c_q = b(q / len(pairs)) if pairs else 0
    c_kv = b(sum(n * c for n, c in pairs) / q) if pairs else 0
    d = len(step.decode)
    ctx = b(sum(step.decode) / d) if d else 0
    return Shape(tokens=pad(b(tokens)), rows=pad(b(p + d)), prefill=b(p) if p else 0, prefill_len=p_len,
                 chunked=b(len(pairs)) if pairs else 0, chunk_q=c_q, chunk_kv=c_kv, decode=b(d) if d else 0,
                 decode_ctx=max(ctx, 1) if d else 0)


def canonical(step: Step) -> Shape:
    """The grid shape :class:`~simgpu.serve.timer.EngineTimer` times ``step`` as."""
    return shape_of(step)
