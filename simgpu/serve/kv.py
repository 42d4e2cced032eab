"""The paged KV cache of one replica: blocks of ``block_tokens`` tokens, allocated per request.

A request holds ``ceil(tokens / block_tokens)`` blocks for the tokens in its cache; blocks are
taken as its cache grows and all given back when it finishes, is preempted, or (disaggregated) its
cache has been sent to the decode pool.
"""

from __future__ import annotations


class BlockManager:
    """Free and used blocks of one replica; ``held[r]`` is what request ``r`` holds."""

    __slots__ = ("block_tokens", "free", "held", "total", "watermark")

    def __init__(self, total: int, block_tokens: int) -> None:
        if total < 0 or block_tokens < 1:
            raise ValueError(f"expected blocks >= 0 and block_tokens >= 1, got {total}, {block_tokens}")
        self.total, self.block_tokens, self.free = total, block_tokens, total
        self.held: dict[int, int] = {}
        #: blocks kept free when admitting a new request (vLLM's watermark: 1% of the cache)
        self.watermark = max(total // 100, 1)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def extra(self, r: int, tokens: int) -> int:
        """Blocks request ``r`` still needs to hold ``tokens`` tokens."""
        return max(self.blocks_for(tokens) - self.held.get(r, 0), 0)

    def grow(self, r: int, tokens: int) -> bool:
        """Hold enough blocks for ``tokens`` tokens of ``r``; False (and nothing taken) when too few are free."""
        need = self.extra(r, tokens)
        if need > self.free:
            return False
        if need:
            self.free -= need
            self.held[r] = self.held.get(r, 0) + need
        return True

    def room(self, r: int, tokens: int) -> int:
        """Tokens request ``r`` (now holding ``tokens``) could add with the blocks it holds and those free."""
        return (self.held.get(r, 0) + self.free) * self.block_tokens - tokens

    def release(self, r: int) -> None:
        self.free += self.held.pop(r, 0)

    @property
    def used(self) -> int:
        return self.total - self.free
