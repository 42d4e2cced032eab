"""The serving loop against analytic iteration times: exact latencies of small cases, KV blocks and
preemption, Little's law at steady state, saturation, determinism, and KV transfers over links.

:class:`AffineTimer` is a test double of the inference timer with a known closed form: a step takes
``a + b * tokens + c * (KV tokens the decodes attend over)`` seconds.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from simgpu.errors import ConfigError
from simgpu.serve.kv import BlockManager
from simgpu.serve.loop import Network, Pool, simulate_serving
from simgpu.serve.metrics import request_table, summarize, time_average
from simgpu.serve.requests import Requests, make_requests
from simgpu.serve.spec import RequestsSpec, SchedulerSpec, SloSpec, TimingSpec
from simgpu.workload.inference.api import ReplicaMemory, Step


class AffineTimer:
    """Step time ``a + b * tokens + c * sum(decode KV lengths)`` (seconds)."""

    def __init__(self, a: float = 0.01, b: float = 0.0, c: float = 0.0, blocks: int = 100_000,
                 replicas: int = 1, gpus: int = 4, block_tokens: int = 16, kv_bytes_per_token: float = 81920.0):
        self.a, self.b, self.c = a, b, c
        self.replica_gpus, self.replicas = gpus, replicas
        self.memory = ReplicaMemory(1e9, 1e8, 1e8, kv_bytes_per_token, 80e9, block_tokens, blocks)
        self.calls = 0

    def time(self, steps: list[Step]) -> np.ndarray:
        self.calls += len(steps)
        return np.array([self.a + self.b * s.tokens + self.c * sum(s.decode) for s in steps])


def fixed(prompts: list[int], outputs: list[int], arrivals: list[float] | None = None) -> Requests:
    return Requests(np.array(arrivals or [0.0] * len(prompts)), np.array(prompts), np.array(outputs))


def poisson(n: int, rate: float, seed: int = 0, prompt: int | dict = 200, output: int | dict = 50) -> Requests:
    return make_requests(RequestsSpec(kind="poisson", count=n, rate_per_s=rate, prompt_tokens=prompt,
                                      output_tokens=output), seed)


EXACT = TimingSpec(context_bucket_tokens=1, prefill_bucket_tokens=1)


def run(reqs: Requests, timer: AffineTimer, kind: str = "continuous", **sched) -> tuple:
    res = simulate_serving(reqs, [Pool("replica", timer)], SchedulerSpec(kind=kind, **sched), EXACT)
    return res, request_table(res)


# --------------------------------------------------------------------------- unit


def test_block_manager_grows_and_releases():
    kv = BlockManager(10, 16)
    assert kv.grow(0, 17) and kv.held[0] == 2 and kv.free == 8
    assert kv.grow(0, 32) and kv.held[0] == 2          # still two blocks
    assert not kv.grow(1, 16 * 9) and kv.free == 8     # too many: nothing taken
    assert kv.room(0, 32) == 8 * 16
    kv.release(0)
    assert kv.free == 10 and kv.used == 0


def test_poisson_rate_and_fixed_and_lengths():
    r = poisson(20_000, 5.0, prompt={"mean": 300, "max": 1024}, output={"mean": 100, "max": 400})
    gaps = np.diff(r.arrival_s)
    assert abs(gaps.mean() - 0.2) < 0.01 and r.arrival_s[0] == 0
    assert r.prompt.max() <= 1024 and abs(r.output.mean() - 100) < 5
    f = make_requests(RequestsSpec(kind="fixed", count=7, prompt_tokens=10, output_tokens=3), 0)
    assert (f.arrival_s == 0).all() and (f.prompt == 10).all()


def test_trace_reading_and_rescaling(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,374,44\n"
                   "2023-11-16 18:15:48.0,396,1\n2023-11-16 18:15:50.0,10,5\n")
    r = make_requests(RequestsSpec(kind="trace", file=str(csv)), 0, csv)
    assert list(r.arrival_s) == [0.0, 2.0, 4.0] and list(r.output) == [44, 1, 5]
    fast = make_requests(RequestsSpec(kind="trace", file=str(csv), rate_per_s=2.0), 0, csv)
    assert fast.arrival_s[-1] == pytest.approx(1.0)
    # a row of no output tokens is refused, naming it, rather than served as one token
    csv.write_text(csv.read_text().replace(",396,1", ",396,0"))
    with pytest.raises(ConfigError, match="row 3: GeneratedTokens '0'"):
        make_requests(RequestsSpec(kind="trace", file=str(csv)), 0, csv)


# --------------------------------------------------------------------------- exact small cases


def test_one_request_latencies_are_the_iteration_times():
    _, t = run(fixed([100], [10]), AffineTimer(a=0.01))
    assert t.ttft_ms[0] == pytest.approx(10.0) and t.e2e_ms[0] == pytest.approx(100.0)
    assert t.tpot_ms[0] == pytest.approx(10.0)


def test_chunked_prefill_splits_a_prompt_by_the_token_budget():
    _, t = run(fixed([1000], [2]), AffineTimer(a=0.01), "chunked", max_tokens=256)
    assert t.ttft_ms[0] == pytest.approx(40.0)  # 256 + 256 + 256 + 232
    timer = AffineTimer(a=0.0, b=1e-4)
    res, t = run(fixed([1000, 10], [3, 3]), timer, "chunked", max_tokens=300)
    assert all(p + d <= 300 for *_, p, d in res.iterations)


def test_prefill_first_runs_prompts_apart_and_before_decodes():
    timer = AffineTimer(a=0.01, b=1e-4)  # batches of 300, 300, 300 and 110 prompt tokens end at 141 ms
    res, t = run(fixed([1000, 10, 600], [4, 40, 4], [0.0, 0.0, 0.15]), timer, "prefill_first", max_tokens=300)
    assert all(p == 0 or d == 0 for *_, p, d in res.iterations)  # no batch mixes the two
    # the two first prompts (1,010 tokens) run in four prefill batches of at most 300 tokens before any decode
    kinds = ["p" if p else "d" for *_, p, d in res.iterations]
    assert kinds[:5] == ["p", "p", "p", "p", "d"]
    assert all(p <= 300 for *_, p, _ in res.iterations)
    # the third arrives while the others decode, and its prompt stops their decoding until it is in
    assert kinds[5:8] == ["p", "p", "d"] and t.ttft_ms[2] < t.e2e_ms[1]
    # clients that send together are prefilled together, then decode together: one TTFT, one finish
    _, t = run(fixed([100] * 4, [20] * 4), AffineTimer(a=0.01), "prefill_first", max_tokens=1000)
    assert t.ttft_ms.nunique() == 1 and t.e2e_ms.nunique() == 1


def test_static_batch_admits_only_when_the_batch_is_done():
    _, t = run(fixed([10, 10, 10], [2, 10, 3]), AffineTimer(a=0.01), "static", max_batch=2)
    # batch of two: prefill (1) then 9 decodes; the third starts after it
    assert t.e2e_ms[1] == pytest.approx(100.0)
    assert t.ttft_ms[2] == pytest.approx(110.0) and t.e2e_ms[2] == pytest.approx(130.0)


def test_continuous_batching_admits_between_iterations():
    _, t = run(fixed([10, 10], [10, 3], [0.0, 0.015]), AffineTimer(a=0.01), "continuous")
    # the second arrives during request 0's second iteration and is prefilled in the third
    assert t.ttft_ms[1] == pytest.approx(30.0 - 15.0)


def test_preemption_recomputes_and_every_request_finishes():
    timer = AffineTimer(a=0.001, blocks=40, block_tokens=16)
    reqs = poisson(300, 50.0, prompt={"mean": 150, "max": 300}, output={"mean": 100, "max": 300})
    for kind in ("static", "continuous", "chunked", "prefill_first"):
        res, t = run(reqs, timer, kind, max_batch=32, max_tokens=512)
        assert np.isfinite(t.e2e_ms).all()
        assert res.preemptions.sum() > 0, kind
        occ = [u for *_, u in res.kv_samples]
        assert max(occ) <= 40


def test_a_request_that_can_never_fit_is_refused():
    with pytest.raises(ConfigError, match=r"request 1 needs KV for 699 tokens .*expected"):
        run(fixed([10, 600], [5, 100]), AffineTimer(blocks=10, block_tokens=16))


@settings(max_examples=25, deadline=None)
@given(hs.lists(hs.tuples(hs.integers(1, 400), hs.integers(1, 60), hs.floats(0, 0.5)), min_size=1, max_size=40),
       hs.sampled_from(["static", "continuous", "chunked", "prefill_first"]), hs.integers(8, 64))
def test_property_every_request_finishes_in_order_of_its_events(items, kind, blocks):
    reqs = fixed([p for p, _, _ in items], [o for _, o, _ in items], sorted(a for *_, a in items))
    timer = AffineTimer(a=0.002, b=1e-5, blocks=blocks, block_tokens=16)
    need = reqs.prompt + reqs.output - 1
    if (need > blocks * 16).any():
        with pytest.raises(ConfigError):
            run(reqs, timer, kind, max_batch=8, max_tokens=256)
        return
    res, t = run(reqs, timer, kind, max_batch=8, max_tokens=256)
    assert (t.ttft_ms > 0).all() and (t.e2e_ms >= t.ttft_ms - 1e-9).all()
    busy = {}
    for _, r, s, e, _, _ in res.iterations:  # one replica runs one iteration at a time
        assert s >= busy.get(r, 0.0) - 1e-12
        busy[r] = e


# --------------------------------------------------------------------------- analytic: queueing


def test_littles_law_at_steady_state():
    timer = AffineTimer(a=0.004, b=2e-6, c=1e-8, replicas=2)
    rate = 30.0
    reqs = poisson(30_000, rate, seed=3, prompt={"mean": 300, "max": 1000}, output={"mean": 60, "max": 200})
    res = simulate_serving(reqs, [Pool("replica", timer)], SchedulerSpec(kind="continuous"), TimingSpec())
    t = request_table(res)
    t0, t1 = 0.2 * reqs.arrival_s[-1], 0.8 * reqs.arrival_s[-1]
    in_window = (reqs.arrival_s >= t0) & (reqs.arrival_s < t1)
    mean_in_system = time_average(res.in_system, t0, t1)
    w = t.e2e_ms[in_window].mean() / 1e3
    assert mean_in_system == pytest.approx(rate * w, rel=0.02)


def test_throughput_saturates_and_latency_diverges_past_saturation():
    timer = AffineTimer(a=0.02, b=2e-5)
    slo = SloSpec()
    out = []
    for rate in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        res = simulate_serving(poisson(3000, rate, seed=1), [Pool("r", timer)],
                               SchedulerSpec(kind="continuous", max_batch=32), TimingSpec())
        s = summarize(res, slo)
        out.append((rate, s["throughput"]["requests_per_s"], s["e2e_ms"]["mean"]))
    thr = [x[1] for x in out]
    assert thr[0] == pytest.approx(1, rel=0.1) and thr[1] == pytest.approx(2, rel=0.1)
    assert all(b >= a * 0.97 for a, b in zip(thr, thr[1:], strict=False))   # never falls
    assert thr[-1] == pytest.approx(thr[-2], rel=0.05)                      # a plateau
    assert thr[-1] < 0.2 * 256                                              # far below the offered load
    assert out[-1][2] > 20 * out[0][2]                                      # latency diverges
    # past saturation the queue grows without bound: more requests, longer mean latency
    long = simulate_serving(poisson(6000, 256, seed=1), [Pool("r", timer)],
                            SchedulerSpec(kind="continuous", max_batch=32), TimingSpec())
    assert summarize(long, slo)["e2e_ms"]["mean"] > 1.6 * out[-1][2]


def test_deterministic_for_a_seed():
    spec = RequestsSpec(kind="poisson", count=500, rate_per_s=20, prompt_tokens={"mean": 200, "max": 800},
                        output_tokens={"mean": 40, "max": 200})
    tables = []
    for seed in (5, 5, 6):
        res = simulate_serving(make_requests(spec, seed), [Pool("r", AffineTimer(a=0.01, b=1e-5, replicas=2))],
                               SchedulerSpec(kind="chunked"), TimingSpec())
        tables.append(request_table(res))
    assert tables[0].equals(tables[1]) and not tables[0].equals(tables[2])


def test_distinct_steps_are_timed_once():
    timer = AffineTimer(a=0.01)
    res = simulate_serving(poisson(2000, 20, prompt=128, output=64), [Pool("r", timer)],
                           SchedulerSpec(kind="continuous"), TimingSpec())
    assert timer.calls == res.distinct_steps < len(res.iterations) / 10


# --------------------------------------------------------------------------- disaggregated


@pytest.fixture(scope="module")
def two_dgx_h100():
    from simgpu.config.loader import load_platform
    from simgpu.platform.topology import Topology

    plat, _ = load_platform("dgx_h100")
    topo = Topology(plat, 2)
    return topo, Network(topo.route, topo.route_latency, topo.capacity)


def test_kv_transfer_of_one_request_takes_bytes_over_the_route(two_dgx_h100):
    topo, net = two_dgx_h100
    k = 81920.0  # bytes per token per GPU
    pools = [Pool("prefill", AffineTimer(a=0.01, kv_bytes_per_token=k), "prefill", 0),
             Pool("decode", AffineTimer(a=0.01, kv_bytes_per_token=k), "decode", 8)]
    res = simulate_serving(fixed([4000], [5]), pools, SchedulerSpec(kind="continuous"), EXACT, net)
    route = topo.route(0, 8)  # each of the 4 GPU pairs sends its shard over its own NIC
    expect = k * 4000 / topo.route_capacity(route) + topo.route_latency(route)
    assert res.transfer_s[0] == pytest.approx(expect, rel=1e-6)
    t = request_table(res)
    assert t.ttft_ms[0] == pytest.approx(10.0)
    assert t.e2e_ms[0] == pytest.approx(10.0 + expect * 1e3 + 40.0, rel=1e-6)


def test_concurrent_kv_transfers_share_the_links(two_dgx_h100):
    _topo, net = two_dgx_h100
    k = 81920.0
    mk = lambda: [Pool("prefill", AffineTimer(a=0.01, replicas=2, kv_bytes_per_token=k), "prefill", 0),
                  Pool("decode", AffineTimer(a=0.01, replicas=1, gpus=1, kv_bytes_per_token=k), "decode", 8)]
    one = simulate_serving(fixed([4000], [5]), mk(), SchedulerSpec(kind="continuous"), EXACT, net)
    two = simulate_serving(fixed([4000, 4000], [5, 5]), mk(), SchedulerSpec(kind="continuous"), EXACT, net)
    # 4 shards each into one decode GPU: its NIC is shared by 4 flows, and then by 8 with two requests
    assert two.transfer_s.max() == pytest.approx(2 * one.transfer_s[0], rel=0.02)
