"""Pipeline-parallel serving: ``pp`` batches in flight per replica (vLLM's virtual engines), each
passing the stages in order, a stage taking the next batch as soon as it is free.

:class:`StageTimer` is a test double of the inference timer with fixed per-stage times (plus a
per-token term on every stage), so throughput, latency and the stages' occupancy have closed forms.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as hs
from test_serve_loop import AffineTimer, fixed, poisson

from simgpu.errors import ConfigError
from simgpu.serve.loop import Pool, simulate_serving
from simgpu.serve.metrics import request_table, summarize, time_average
from simgpu.serve.spec import SchedulerSpec, SloSpec, TimingSpec
from simgpu.workload.inference.api import ReplicaMemory, Step

EXACT = TimingSpec(context_bucket_tokens=1, prefill_bucket_tokens=1)


class StageTimer:
    """Stage ``k`` of a step takes ``stage_s[k] + b * tokens`` seconds; a step their sum."""

    def __init__(self, stage_s: tuple[float, ...], b: float = 0.0, blocks: int = 100_000, replicas: int = 1,
                 gpus: int = 8, block_tokens: int = 16):
        self.stage_s, self.b = np.asarray(stage_s, dtype=float), b
        self.stages = len(stage_s)
        self.replica_gpus, self.replicas = gpus, replicas
        self.memory = ReplicaMemory(1e9, 1e8, 1e8, 40960.0, 80e9, block_tokens, blocks)
        self.calls = 0

    def stage_times(self, steps: list[Step]) -> np.ndarray:
        self.calls += len(steps)
        return np.array([self.stage_s + self.b * s.tokens for s in steps])

    def time(self, steps: list[Step]) -> np.ndarray:
        return self.stage_times(steps).sum(axis=1)


def run(reqs, timer, kind="continuous", timing=EXACT, **sched):
    res = simulate_serving(reqs, [Pool("replica", timer)], SchedulerSpec(kind=kind, **sched), timing)
    return res, request_table(res)


def tokens_per_s(res) -> float:
    return summarize(res, SloSpec())["throughput"]["output_tokens_per_s"]


# --------------------------------------------------------------------------- exact small cases


@pytest.mark.parametrize("kind", ["continuous", "chunked"])
def test_a_lone_request_takes_the_sum_of_the_stages(kind):
    _, t = run(fixed([100], [10]), StageTimer((0.004, 0.006)), kind)
    assert t.ttft_ms[0] == pytest.approx(10.0)      # one prefill through both stages
    assert t.tpot_ms[0] == pytest.approx(10.0)      # each token waits for its batch to leave stage 1
    assert t.e2e_ms[0] == pytest.approx(100.0)


def test_two_requests_share_the_pipeline_on_two_virtual_engines():
    """Two requests at once: one per virtual engine; the second enters stage 0 when the first has left it."""
    res, t = run(fixed([100, 100], [3, 3]), StageTimer((0.004, 0.006)))
    assert sorted(span[2] for span in res.stage_spans[:2]) == [0, 1]   # one on each engine
    # engine 0: stage 0 [0, 4], stage 1 [4, 10]; engine 1: stage 0 [4, 8], stage 1 [10, 16]
    assert t.ttft_ms.tolist() == pytest.approx([10.0, 16.0])
    # the slower stage (6 ms) sets the pace: a token every 12 ms on each engine
    assert t.e2e_ms.tolist() == pytest.approx([10.0 + 2 * 12.0, 16.0 + 2 * 12.0])


def test_kv_blocks_are_split_between_the_virtual_engines():
    """Each engine holds blocks // pp (vLLM): a request needing more than half the replica's cache
    is refused, naming the engines; occupancy is the replica's over both."""
    with pytest.raises(ConfigError, match=r"each of the 2 virtual engines .* holds 320 .*expected"):
        run(fixed([10, 400], [5, 10]), StageTimer((0.001, 0.001), blocks=41, block_tokens=16))
    timer = StageTimer((0.001, 0.001), blocks=40, block_tokens=16)
    reqs = poisson(300, 200.0, prompt={"mean": 150, "max": 300}, output={"mean": 20, "max": 20})
    res, t = run(reqs, timer, "chunked", max_batch=32, max_tokens=512)
    assert np.isfinite(t.e2e_ms).all() and res.preemptions.sum() > 0
    assert max(u for *_, u in res.kv_samples) <= 40


# --------------------------------------------------------------------------- analytic: throughput


def saturated(stage_s, pp_style=False, n=2000):
    """Output tokens/s of an offline run (every request at time 0) at a fixed step time."""
    timer = StageTimer(stage_s) if not pp_style else AffineTimer(a=float(sum(stage_s)), gpus=8)
    res, _ = run(fixed([16] * n, [64] * n), timer, "continuous", max_batch=64, max_tokens=4096)
    return tokens_per_s(res)


def test_saturated_throughput_is_pp_times_the_sequential_figure():
    """Equal stages: pp batches in flight, so pp times the tokens/s of running the same steps one
    after another (the figure before batches were kept in flight); bounded by the slowest stage."""
    for pp in (2, 4):
        stages = (0.005,) * pp
        seq = saturated(stages, pp_style=True)
        assert saturated(stages) == pytest.approx(pp * seq, rel=0.03)
    # unequal stages: a batch leaves every max(stage) seconds, not every sum / pp
    seq = saturated((0.002, 0.006), pp_style=True)
    pipe = saturated((0.002, 0.006))
    assert pipe == pytest.approx(seq * 8 / 6, rel=0.03)
    assert pipe == pytest.approx(64 / 0.006, rel=0.03)   # 64 tokens per batch, one every 6 ms


def test_stages_take_one_batch_at_a_time_in_order():
    timer = StageTimer((0.003, 0.005, 0.002), b=1e-6, replicas=2, gpus=12)
    res, _ = run(poisson(400, 80.0, seed=4), timer, "chunked", max_batch=16, max_tokens=512)
    free: dict[tuple[int, int], float] = {}
    engine_free: dict[tuple[int, int], float] = {}
    for _, r, v, bounds, _pf, _dec in sorted(res.stage_spans, key=lambda x: x[3][0]):
        assert bounds[0] >= engine_free.get((r, v), 0.0) - 1e-12   # one batch in flight per engine
        engine_free[(r, v)] = bounds[-1]
        for k in range(3):
            s, e = bounds[2 * k], bounds[2 * k + 1]
            assert s >= free.get((r, k), 0.0) - 1e-12                # the stage is free when it starts
            assert k == 0 or s >= bounds[2 * k - 1] - 1e-12          # after the stage before
            free[(r, k)] = e
    assert len(res.stage_spans) == len(res.iterations)


# --------------------------------------------------------------------------- analytic: queueing


def test_littles_law_with_batches_in_flight():
    timer = StageTimer((0.002, 0.003), b=1e-6, replicas=2)
    rate = 40.0
    reqs = poisson(30_000, rate, seed=3, prompt={"mean": 300, "max": 1000}, output={"mean": 60, "max": 200})
    res = simulate_serving(reqs, [Pool("replica", timer)], SchedulerSpec(kind="continuous"), TimingSpec())
    t = request_table(res)
    t0, t1 = 0.2 * reqs.arrival_s[-1], 0.8 * reqs.arrival_s[-1]
    inside = (reqs.arrival_s >= t0) & (reqs.arrival_s < t1)
    assert time_average(res.in_system, t0, t1) == pytest.approx(rate * t.e2e_ms[inside].mean() / 1e3, rel=0.02)


def test_deterministic_and_timed_once():
    from simgpu.serve.requests import make_requests
    from simgpu.serve.spec import RequestsSpec

    spec = RequestsSpec(kind="poisson", count=600, rate_per_s=30, prompt_tokens={"mean": 200, "max": 800},
                        output_tokens={"mean": 40, "max": 200})
    tables, calls = [], []
    for seed in (5, 5, 6):
        timer = StageTimer((0.004, 0.005), b=2e-6, replicas=2)
        res = simulate_serving(make_requests(spec, seed), [Pool("r", timer)], SchedulerSpec(kind="chunked"),
                               TimingSpec())
        tables.append(request_table(res))
        calls.append((timer.calls, res.distinct_steps, len(res.iterations)))
    assert tables[0].equals(tables[1]) and not tables[0].equals(tables[2])
    # each distinct shape timed once for both stages
    assert all(c == d < it / 5 for c, d, it in calls)


@settings(max_examples=20, deadline=None)
@given(hs.lists(hs.tuples(hs.integers(1, 300), hs.integers(1, 40), hs.floats(0, 0.3)), min_size=1, max_size=30),
       hs.sampled_from(["static", "continuous", "chunked"]), hs.integers(2, 4))
def test_property_every_request_finishes(items, kind, pp):
    reqs = fixed([p for p, _, _ in items], [o for _, o, _ in items], sorted(a for *_, a in items))
    timer = StageTimer(tuple(0.001 * (k + 1) for k in range(pp)), b=1e-5, blocks=200)
    _, t = run(reqs, timer, kind, max_batch=8, max_tokens=256)
    assert np.isfinite(t.e2e_ms).all() and (t.ttft_ms >= sum(timer.stage_s) * 1e3 - 1e-9).all()
    assert (t.e2e_ms >= t.ttft_ms - 1e-9).all()


# --------------------------------------------------------------------------- the engine's stage times

LLAMA = ROOT / "workloads" / "inference" / "llama2_70b_dgx_h100_tp4.yaml"


@pytest.mark.skipif(not LLAMA.is_file(), reason="no inference workload of Llama-2-70B")
def test_engine_stage_times_sum_to_the_step():
    from simgpu.config.loader import load_job
    from simgpu.serve.timer import make_timer

    timer = make_timer(load_job(LLAMA, ["parallelism.pp=2", "nodes=2", "gpus_per_node=4"]))
    steps = [Step(decode=(1000,) * 32, prefill=((512, 0),) * 2), Step(decode=(500,) * 8), Step(prefill=((2048, 0),))]
    st = timer.stage_times(steps)
    assert st.shape == (3, 2) and (st > 0).all()
    np.testing.assert_allclose(st.sum(axis=1), timer.time(steps), rtol=1e-9)
    # stage 0 hands its activations over the NICs, and the stages hold 40 blocks each: near halves
    assert (abs(st[:, 0] / st[:, 1] - 1) < 0.25).all()


class Sequential:
    """A timer's whole steps only: its replica served as one batch at a time (no stage times)."""

    def __init__(self, timer):
        self.timer, self.replica_gpus, self.replicas, self.memory = timer, timer.replica_gpus, timer.replicas, \
            timer.memory

    def time(self, steps):
        return self.timer.time(steps)


@pytest.mark.skipif(not LLAMA.is_file(), reason="no inference workload of Llama-2-70B")
def test_llama2_70b_pp2_tp4_on_two_nodes_against_two_tp4_replicas():
    """Llama-2-70B, 600 requests arriving at once (prompts of 400, outputs of 200 tokens on average),
    chunked prefill: PP2 x TP4 with a stage per DGX H100 (4 GPUs of each) gives 0.95x the tokens/s of
    two TP4 replicas on the same 8 GPUs (4,867 against 5,114); one batch at a time it gave 0.61x (3,117)."""
    from simgpu.config.loader import load_job
    from simgpu.serve.timer import make_timer

    reqs = poisson(600, 1000.0, seed=1, prompt={"mean": 400, "max": 2000}, output={"mean": 200, "max": 600})
    sched = SchedulerSpec(kind="chunked", max_batch=256, max_tokens=2048)
    limits = ["inference.max_batch_size=256", "inference.max_batch_tokens=2048"]
    pp = make_timer(load_job(LLAMA, ["parallelism.pp=2", "nodes=2", "gpus_per_node=4", *limits]))
    tp = make_timer(load_job(LLAMA, limits))
    assert pp.stages == 2 and pp.replicas == 1 and tp.replicas == 2
    out = {}
    for name, timer in (("pp", pp), ("tp", tp), ("seq", Sequential(pp))):
        out[name] = tokens_per_s(simulate_serving(reqs, [Pool(name, timer)], sched, TimingSpec()))
    assert 0.85 < out["pp"] / out["tp"] < 1.1
    assert out["pp"] > 1.4 * out["seq"]


def test_a_pipelined_decode_pool_of_a_disaggregated_deployment():
    """Prefill on a TP replica, decode on a PP2 replica: the KV crosses to the decode replica's
    GPUs, each request decodes on one of its two virtual engines, both engines in use."""
    from simgpu.config.loader import load_platform
    from simgpu.platform.topology import Topology
    from simgpu.serve.loop import Network

    plat, _ = load_platform("dgx_h100")
    topo = Topology(plat, 2)
    net = Network(topo.route, topo.route_latency, topo.capacity)
    pools = [Pool("prefill", AffineTimer(a=0.01, gpus=8), "prefill", 0),
             Pool("decode", StageTimer((0.004, 0.006), gpus=8), "decode", 8)]
    res = simulate_serving(fixed([500] * 6, [20] * 6), pools, SchedulerSpec(kind="continuous"), EXACT, net)
    t = request_table(res)
    assert np.isfinite(t.e2e_ms).all() and (res.decode_replica == 0).all() and (res.transfer_s > 0).all()
    assert {v for p, _, v, *_ in res.stage_spans if p == 1} == {0, 1}
    # a decode iteration of one engine passes both stages: at least 10 ms per token
    assert (t.tpot_ms >= 10.0 - 1e-9).all()
