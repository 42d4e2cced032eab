"""Batch formation on one replica: static batching, continuous batching (vLLM), chunked prefill
(Sarathi-Serve), and what a replica of a disaggregated pool runs.

A scheduler looks at one replica's queues and KV cache and returns the next iteration's
:class:`Batch` (prompt chunks and decoding requests), taking KV blocks for it. When a decoding
request needs a block and none is free, the most recently admitted request is preempted: its blocks
are freed and it goes back to the front of the queue, to recompute its prompt and the tokens it has
generated (vLLM's recompute preemption). A new request is admitted only while 1% of the blocks stay
free for the running requests' next tokens (vLLM's watermark), unless nothing else runs.

- ``static``: a batch of up to ``max_batch`` queued requests is admitted only when the previous
  batch has wholly finished; its prompts run in one iteration, then it decodes until its last
  request is done.
- ``continuous``: every iteration admits queued requests while the KV cache, ``max_batch`` and a
  budget of ``max_tokens`` prompt tokens allow; an iteration with new prompts runs only prompts
  (vLLM's default), otherwise every running request decodes one token.
- ``chunked``: every iteration has a budget of ``max_tokens`` tokens: first one per decoding
  request, then chunks of prompts in progress, then of newly admitted ones (Sarathi-Serve; the
  mixed batches of vLLM's V1 engine and TensorRT-LLM's in-flight batching).
- ``prefill_first``: SGLang's default. Prefill and decode run as separate batches, and a prefill
  batch runs whenever a prompt is in progress or a queued request can be admitted: chunks of
  prompts in progress, then of newly admitted ones, within ``max_tokens`` (its
  ``chunked_prefill_size``). The running requests decode only when no prompt is left to run, so
  clients that send together are prefilled together and then decode together.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .kv import BlockManager


@dataclass
class State:
    """Per-request bookkeeping shared by every replica (lists indexed by request id)."""

    prompt: list[int]
    output: list[int]
    target: list[int] = field(default_factory=list)     # tokens to prefill (prompt, or prompt + generated)
    kv: list[int] = field(default_factory=list)         # tokens in the request's KV cache
    generated: list[int] = field(default_factory=list)
    preemptions: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.prompt)
        self.target = list(self.prompt)
        self.kv, self.generated, self.preemptions = [0] * n, [0] * n, [0] * n

    def prefilling(self, r: int) -> bool:
        return self.kv[r] < self.target[r]


@dataclass
class Batch:
    """One iteration: ``prefill`` is (request, new tokens) per prompt chunk; ``decode`` the requests
    that decode one token."""

    prefill: list[tuple[int, int]]
    decode: list[int]

    def __bool__(self) -> bool:
        return bool(self.prefill or self.decode)


@dataclass
class Replica:
    """One replica's queues: ``waiting`` (not admitted, or preempted: at the front), ``running``
    (admitted, holding KV; in admission order) and, on a decode replica, ``ready`` (KV received).
    Under pipeline parallelism, one virtual engine of replica ``unit``, with its share of the blocks."""

    index: int
    kv: BlockManager
    mode: str = "both"               # "both", "prefill" (disaggregated) or "decode" (disaggregated)
    waiting: deque[int] = field(default_factory=deque)
    running: list[int] = field(default_factory=list)
    ready: deque[int] = field(default_factory=deque)
    outstanding: int = 0             # requests routed here and not yet finished (or sent on)
    unit: int = -1                   # the model replica it runs on (pipeline parallel: one of its
                                     # virtual engines); -1: ``index``

    def __post_init__(self) -> None:
        if self.unit < 0:
            self.unit = self.index


def _preempt(rep: Replica, st: State, keep: set[int]) -> int | None:
    """Free the most recently admitted running request not in ``keep``; returns it, or None."""
    for j in range(len(rep.running) - 1, -1, -1):
        r = rep.running[j]
        if r in keep:
            continue
        del rep.running[j]
        rep.kv.release(r)
        st.target[r] = st.prompt[r] + st.generated[r]
        st.kv[r] = 0
        st.preemptions[r] += 1
        rep.waiting.appendleft(r)
        return r
    return None


def _decoders(rep: Replica, st: State) -> list[int]:
    """The running requests that decode this iteration, with a block for their next token each,
    preempting the latest admitted where the cache is full (the request itself when it is the latest)."""
    out: list[int] = []
    i = 0
    running = rep.running
    while i < len(running):
        r = running[i]
        if st.kv[r] < st.target[r]:
            i += 1
            continue
        if rep.kv.grow(r, st.kv[r] + 1):
            out.append(r)
            i += 1
            continue
        protect = set(out)
        protect.add(r)
        while _preempt(rep, st, protect) is not None:
            if rep.kv.grow(r, st.kv[r] + 1):
                out.append(r)
                break
        else:
            _preempt(rep, st, set(out))  # nothing else to free: r waits to recompute
            i = _position(running, out)
            continue
        i = running.index(r) + 1
    return out


def _position(running: list[int], out: list[int]) -> int:
    """Where the scan goes on: just after the last request chosen."""
    return running.index(out[-1]) + 1 if out else 0


def _admit(rep: Replica, st: State, budget: int, slots: int, chunked: bool,
           batch: list[tuple[int, int]]) -> int:
    """Admit queued requests (whole prompts, or chunks when ``chunked``) within ``budget`` tokens and
    ``slots`` requests; returns the budget left."""
    while rep.waiting and slots > 0 and budget > 0:
        r = rep.waiting[0]
        need = st.target[r] - st.kv[r]
        n = min(need, budget) if chunked else need
        if not chunked and n > budget and batch:
            break
        if rep.kv.free - rep.kv.extra(r, st.kv[r] + n) < rep.kv.watermark and rep.running:
            break
        if not rep.kv.grow(r, st.kv[r] + n):
            if not chunked:
                break
            n = min(n, rep.kv.room(r, st.kv[r]))
            if n <= 0 or not rep.kv.grow(r, st.kv[r] + n):
                break
        rep.waiting.popleft()
        rep.running.append(r)
        batch.append((r, n))
        budget -= n
        slots -= 1
    return budget


def schedule(rep: Replica, st: State, kind: str, max_batch: int, max_tokens: int) -> Batch:
    """The next iteration of ``rep`` (empty when it has nothing to run)."""
    if rep.mode == "decode":
        while rep.ready and len(rep.running) < max_batch:
            rep.running.append(rep.ready.popleft())
        return Batch([], [r for r in rep.running])  # blocks were reserved for every token up front
    if kind == "static":
        if not rep.running:
            batch: list[tuple[int, int]] = []
            _admit(rep, st, 1 << 62, max_batch, False, batch)
            return Batch(batch, [])
        return Batch([], _decoders(rep, st))
    if kind == "continuous":
        prefill: list[tuple[int, int]] = []
        if rep.waiting:
            _admit(rep, st, max_tokens, max_batch - len(rep.running), False, prefill)
            if not prefill and not rep.running:  # a prompt longer than the budget runs alone
                _admit(rep, st, 1 << 62, 1, False, prefill)
        if prefill or rep.mode == "prefill":
            return Batch(prefill, [])
        return Batch([], _decoders(rep, st))
    if kind == "prefill_first":
        chunks = _prompts(rep, st, max_tokens, max_batch, max_batch)
        if chunks or rep.mode == "prefill":
            return Batch(chunks, [])
        return Batch([], _decoders(rep, st))
    # chunked prefill: decodes first, then prompts in progress, then new ones, within the budget
    decode = _decoders(rep, st) if rep.mode == "both" else []
    return Batch(_prompts(rep, st, max_tokens - len(decode), max_batch - len(decode), max_batch), decode)


def _prompts(rep: Replica, st: State, budget: int, slots: int, max_batch: int) -> list[tuple[int, int]]:
    """Chunks of the prompts in progress, then of newly admitted requests, within ``budget`` tokens,
    ``slots`` requests and ``max_batch`` running ones."""
    chunks: list[tuple[int, int]] = []
    for r in rep.running:
        if budget <= 0 or slots <= 0:
            break
        if st.prefilling(r):
            n = min(st.target[r] - st.kv[r], budget)
            if not rep.kv.grow(r, st.kv[r] + n):
                n = min(n, rep.kv.room(r, st.kv[r]))
                if n <= 0 or not rep.kv.grow(r, st.kv[r] + n):
                    continue
            chunks.append((r, n))
            budget -= n
            slots -= 1
    _admit(rep, st, budget, min(slots, max_batch - len(rep.running)), True, chunks)
    return chunks
