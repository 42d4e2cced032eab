"""The serving benchmarks' closed-loop load: clients that send their next request when the last finishes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from test_serve_loop import EXACT, AffineTimer

from simgpu.serve.loop import Pool, simulate_serving
from simgpu.serve.metrics import request_table, summarize
from simgpu.serve.requests import make_requests
from simgpu.serve.spec import RequestsSpec, SchedulerSpec, SloSpec


def closed(n: int, concurrency: int, prompt: int = 100, output: int = 10, warmup: int | None = None,
           timer: AffineTimer | None = None, **sched: int) -> tuple:
    spec = RequestsSpec(kind="closed_loop", count=n, concurrency=concurrency, prompt_tokens=prompt,
                        output_tokens=output, warmup=warmup)
    reqs = make_requests(spec, 0)
    res = simulate_serving(reqs, [Pool("replica", timer or AffineTimer(a=0.01))], SchedulerSpec(**sched), EXACT,
                           concurrency=concurrency, warmup=spec.warmup_count)
    return res, request_table(res)


def test_one_client_sends_each_request_when_the_last_finishes() -> None:
    _, t = closed(5, 1)
    assert np.allclose(t.arrival_ms[1:].to_numpy(), t.finish_ms[:-1].to_numpy())
    # alone on the replica, each request's TTFT is one prefill step and its TPOT one decode step
    assert np.allclose(t.ttft_ms, 10.0) and np.allclose(t.tpot_ms, 10.0)
    assert list(t.warmup) == [True, False, False, False, False]


@settings(max_examples=25, deadline=None)
@given(n=hs.integers(2, 60), concurrency=hs.integers(1, 12), output=hs.integers(1, 20),
       prompt=hs.integers(1, 400), budget=hs.sampled_from([64, 256, 8192]))
def test_never_more_in_flight_than_clients_and_each_arrival_is_a_finish(n: int, concurrency: int, output: int,
                                                                       prompt: int, budget: int) -> None:
    _, t = closed(n, concurrency, prompt=prompt, output=output, warmup=0, timer=AffineTimer(a=0.002, b=1e-5),
                    kind="chunked", max_tokens=budget)
    assert np.isfinite(t.finish_ms).all()
    events = sorted([(a, 1) for a in t.arrival_ms] + [(f, -1) for f in t.finish_ms], key=lambda e: (e[0], e[1]))
    level = np.cumsum([d for _, d in events])
    assert level.max() <= concurrency
    first_wave = min(concurrency, n)
    assert (t.arrival_ms[:first_wave] == 0).all()
    finishes = np.sort(t.finish_ms.to_numpy())
    for a in t.arrival_ms[first_wave:]:  # every later request is sent the moment one finishes
        assert np.isclose(finishes, a).any()
    assert (np.diff(t.arrival_ms.to_numpy()) >= 0).all()


def test_warmup_is_left_out_of_the_latency_figures() -> None:
    res, t = closed(40, 8, prompt=500, output=20, timer=AffineTimer(a=0.005, b=2e-5), kind="chunked",
                    max_tokens=1024)
    s = summarize(res, SloSpec())
    assert s["goodput"]["warmup_requests"] == 8
    assert s["ttft_ms"]["mean"] == pytest.approx(t.ttft_ms[8:].mean())
    assert s["ttft_ms"]["mean"] != pytest.approx(t.ttft_ms.mean())  # the first wave queues behind itself


def test_more_clients_more_throughput_until_the_replica_saturates() -> None:
    rates = []
    for c in (1, 4, 16):
        _, t = closed(16 * c, c, prompt=200, output=50, timer=AffineTimer(a=0.01, b=1e-5))
        rates.append(len(t) / (t.finish_ms.max() / 1e3))
    assert rates[0] < rates[1] < rates[2]


@pytest.mark.parametrize(("extra", "match"), [
    ({"concurrency": 0}, "concurrency"),
    ({}, "concurrency"),
    ({"concurrency": 4, "rate_per_s": 2.0}, "rate_per_s"),
    ({"concurrency": 4, "count": 4}, "warm-up"),
])
def test_bad_closed_loops_are_refused(extra: dict, match: str) -> None:
    data = {"kind": "closed_loop", "count": 20, "prompt_tokens": 10, "output_tokens": 5, **extra}
    with pytest.raises(ValueError, match=match):
        RequestsSpec.model_validate(data)
    with pytest.raises(ValueError, match="closed loop"):
        RequestsSpec.model_validate({"kind": "poisson", "count": 5, "rate_per_s": 1.0, "prompt_tokens": 10,
                                     "output_tokens": 5, "concurrency": 3})


def test_a_closed_loop_file_runs_from_the_command_line(tmp_path: Path) -> None:
    from simgpu.serve.__main__ import main

    root = Path(__file__).resolve().parents[1]
    path = tmp_path / "closed.yaml"
    path.write_text(
        "name: closed\n"
        f"deployment: {{workload: {root / 'workloads/inference/llama2_70b_dgx_h100_tp4.yaml'}}}\n"
        "requests: {kind: closed_loop, concurrency: 4, count: 24, prompt_tokens: 512, output_tokens: 32}\n")
    assert main([str(path), "--out", str(tmp_path / "out"), "--quiet", "--no-plots"]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("concurrency: 4", "concurrency: 0"))
    assert main([str(bad), "--out", str(tmp_path / "out2"), "--quiet", "--no-plots"]) == 2


@pytest.mark.parametrize(("framework", "kind"), [("sglang", "prefill_first"), ("vllm", "chunked"),
                                                  ("tensorrt_llm", "chunked")])
def test_the_scheduler_can_follow_the_framework(tmp_path: Path, framework: str, kind: str) -> None:
    """``scheduler.kind: framework``: SGLang prefills apart and first, vLLM and TensorRT-LLM mix."""
    from simgpu.serve.deploy import build, serve
    from simgpu.serve.spec import load_serving

    root = Path(__file__).resolve().parents[1]
    path = tmp_path / "closed.yaml"
    path.write_text(
        "name: closed\n"
        f"deployment: {{workload: {root / 'workloads/inference/llama2_70b_dgx_h100_tp4.yaml'}, "
        f"set: {{inference.framework: {framework}}}}}\n"
        "requests: {kind: closed_loop, concurrency: 8, count: 32, prompt_tokens: 2048, output_tokens: 16}\n"
        "scheduler: {kind: framework, max_tokens: 4096}\n")
    serving = load_serving(path)
    res, _ = serve(serving, build(serving))
    assert res.meta["scheduler"] == kind
    mixed = any(p and d for *_, p, d in res.iterations)
    assert mixed == (kind == "chunked")


def test_a_framework_scheduler_over_pools_of_two_frameworks_is_refused(tmp_path: Path, capsys) -> None:
    from simgpu.serve.__main__ import main

    w = Path(__file__).resolve().parents[1] / "workloads/inference/llama2_70b_dgx_h100_tp4.yaml"
    path = tmp_path / "two.yaml"
    path.write_text(
        "name: two\n"
        f"prefill: {{workload: {w}, set: {{inference.framework: sglang}}}}\n"
        f"decode: {{workload: {w}, set: {{inference.framework: vllm}}}}\n"
        "requests: {kind: closed_loop, concurrency: 4, count: 16, prompt_tokens: 512, output_tokens: 8}\n"
        "scheduler: {kind: framework}\n")
    assert main([str(path), "--out", str(tmp_path / "out"), "--quiet", "--no-plots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scheduler.kind" in err[0] and "sglang and vllm" in err[0], err
