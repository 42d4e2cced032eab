"""The (query, key) pairs attention's analytical model counts: never negative, and under a sliding
window the exact count of the keys each query attends."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as hs

from simgpu.kernels.analytical import attention_pairs


def brute(sq: int, skv: int, window: int) -> int:
    """Causal, the queries the last ``sq`` positions of ``skv``: each attends its last ``window`` keys."""
    return sum(min(window, p + 1) for p in range(skv - sq, skv))


@settings(max_examples=200, deadline=None)
@given(hs.integers(1, 3000), hs.integers(0, 3000), hs.integers(1, 4000), hs.booleans())
def test_windowed_pairs_are_the_keys_each_query_attends(sq: int, extra: int, window: int, causal: bool) -> None:
    skv = sq + extra
    got = float(attention_pairs(sq, skv, int(causal), window))
    assert got >= 0
    if window < skv:
        want = brute(sq, skv, window) if causal else sq * window
        assert got <= sq * skv
        assert abs(got - min(want, sq * skv * (0.5 if causal else 1.0))) < 1e-6


def test_a_chunk_at_the_end_of_a_long_context_attends_its_window():
    assert attention_pairs(32, 8192, 1, 128) == 32 * 128  # was negative: 32 x 128 - 128^2 / 2
    assert attention_pairs(8192, 8192, 1, 0) == 8192 * 8192 / 2  # no window: half, as before
