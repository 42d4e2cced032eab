"""What the serving clock's additive tables cost against timing every step on the engine."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT
from test_serve_loop import AffineTimer, poisson

from simgpu.serve.clock import Clock, around
from simgpu.serve.loop import Pool, simulate_serving
from simgpu.serve.metrics import request_table
from simgpu.serve.spec import SchedulerSpec, TimingSpec

LLAMA = ROOT / "workloads" / "inference" / "llama2_70b_dgx_h100_tp4.yaml"


def test_grid_points_bracket_the_count():
    for n in list(range(1, 300)) + [1000, 4097, 8191]:
        lo, hi = around(n, 4, 16)
        assert lo <= n <= hi and (lo == hi == n or lo < n < hi)
        if n <= 16:
            assert lo == hi == n


@pytest.mark.parametrize("kind", ["continuous", "chunked"])
def test_additive_equals_direct_for_an_affine_timer(kind):
    """An affine step time is additive and linear, so the tables reproduce it exactly (batches of
    up to 16 requests, whose counts are not padded)."""
    reqs = poisson(400, 30, seed=2, prompt={"mean": 600, "max": 3000}, output={"mean": 80, "max": 300})
    tables = []
    for mode in ("additive", "direct"):
        timer = AffineTimer(a=0.01, b=2e-5, c=3e-8)
        res = simulate_serving(reqs, [Pool("r", timer)], SchedulerSpec(kind=kind, max_tokens=1024, max_batch=16),
                               TimingSpec(mode=mode))
        tables.append(request_table(res))
    np.testing.assert_allclose(tables[0]["e2e_ms"], tables[1]["e2e_ms"], rtol=1e-9)


@pytest.mark.skipif(not LLAMA.is_file(), reason="no inference workload of Llama-2-70B")
def test_additive_tables_against_the_engine_on_llama2_70b():
    """Mixed, decode-only and prefill-only steps of Llama-2-70B TP4 on a DGX H100: the additive
    tables within 3% of the engine's time of each step, 1.5% on average."""
    from simgpu.config.loader import load_job
    from simgpu.serve.timer import make_timer

    timer = make_timer(load_job(LLAMA))
    direct = Clock(Pool("d", timer), TimingSpec(mode="direct"))
    additive = Clock(Pool("a", timer), TimingSpec())
    rng = np.random.default_rng(0)
    errs = []
    for _ in range(12):
        nd = int(rng.integers(1, 200))
        m = int(rng.integers(2, 40)) * 64
        c = int(rng.integers(2, 64)) * 32
        cached = int(rng.choice([0, int(rng.integers(1, 60)) * 64]))
        for pf, n in ((((c, cached),), nd), ((), nd), (((c, cached),), 0)):
            if not pf and not n:
                continue
            a, d = additive.time(pf, n, m if n else 0), direct.time(pf, n, m if n else 0)
            errs.append(abs(a / d - 1))
    assert max(errs) < 0.03 and float(np.mean(errs)) < 0.015
