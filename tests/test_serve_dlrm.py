"""DLRM serving: the dynamic batcher against queueing theory (constant-time batches: an idle server
answers in the service time; Little's law at steady state), latency past saturation, determinism,
the engine-timed batches, and bad DLRM serving files refused in one line naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import ROOT, edit_keys, refused_in_one_line
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu.config.loader import job_kind
from simgpu.serve.__main__ import main
from simgpu.serve.dlrm import (
    BatcherSpec,
    Queries,
    QueriesSpec,
    load_dlrm_serving,
    make_queries,
    simulate_batching,
    summarize_dlrm,
)

WORKLOAD = ROOT / "workloads" / "inference" / "dlrm_dcnv2_dgx_a100.yaml"
SHIPPED = ROOT / "workloads" / "serving" / "dlrm_dcnv2_dgx_a100.yaml"


def serving_file(tmp_path: Path, **changes) -> Path:
    data = {"name": "t", "deployment": {"workload": str(WORKLOAD)},
            "queries": {"kind": "poisson", "count": 400, "rate_per_s": 2000, "samples": 200},
            "batcher": {"max_batch_samples": 4096, "max_queue_delay_us": 500, "bucket_samples_per_gpu": 64}}
    edit_keys(data, changes, "__")
    path = tmp_path / "serving.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def constant(seconds: float):
    return lambda samples: seconds


def poisson(rate: float, n: int, samples: int = 100, seed: int = 1) -> Queries:
    return make_queries(QueriesSpec(kind="poisson", count=n, rate_per_s=rate, samples=samples), seed)


def test_an_idle_server_answers_in_the_service_time():
    service = 1e-3
    q = poisson(rate=10.0, n=500)  # gaps of 100 ms on average: almost never two in the system
    res = simulate_batching(q, BatcherSpec(max_batch_samples=1000, max_queue_delay_us=0), constant(service), 8)
    lat = res.finish_s - q.arrival_s
    gaps = np.diff(q.arrival_s)
    alone = np.concatenate([[True], gaps > service])  # the server was free when the query arrived
    assert alone.mean() > 0.95
    assert np.allclose(lat[alone], service)
    assert np.all(lat >= service - 1e-12)


def test_the_queue_delay_is_waited_when_the_batch_does_not_fill():
    q = Queries(np.array([0.0, 1e-4, 5.0]), np.array([10, 10, 10]))
    res = simulate_batching(q, BatcherSpec(max_batch_samples=100, max_queue_delay_us=300), constant(1e-3), 1)
    assert np.allclose(res.dispatch_s, [3e-4, 3e-4, 5.0 + 3e-4])
    assert [b[2] for b in res.batches] == [2, 1]


def test_a_full_batch_leaves_at_once_and_the_rest_waits():
    q = Queries(np.array([0.0, 1e-5, 2e-5, 3e-5]), np.array([40, 40, 40, 40]))
    res = simulate_batching(q, BatcherSpec(max_batch_samples=100, max_queue_delay_us=1000), constant(1e-3), 1)
    # the third query brings 120 >= 100 samples: the first two leave when it arrives
    assert res.batches[0][:1] == (2e-5,) and res.batches[0][2:] == (2, 80)
    assert res.dispatch_s[2] == pytest.approx(1e-3 + 2e-5)  # the next batch leaves when the server is free


@pytest.mark.parametrize(("rate", "delay_us"), [(300.0, 0.0), (700.0, 0.0), (1500.0, 500.0)])
def test_littles_law_at_steady_state(rate, delay_us):
    """Mean queries in the system (time average) = arrival rate x mean latency, within 2%."""
    def batch_time(samples: int) -> float:  # a fixed cost plus a per-sample cost
        return 5e-4 + 1e-6 * samples

    q = poisson(rate=rate, n=40_000, samples=100, seed=3)
    res = simulate_batching(q, BatcherSpec(max_batch_samples=2000, max_queue_delay_us=delay_us), batch_time, 8)
    s = summarize_dlrm(res, None)
    assert s["busy_share"] < 0.95
    assert s["mean_in_system"] == pytest.approx(rate * s["latency_ms"]["mean"] * 1e-3, rel=0.02)
    assert s["throughput"]["queries_per_s"] == pytest.approx(rate, rel=0.02)


def test_latency_diverges_past_saturation():
    # batches of at most 1,000 samples in 1 ms: at most 10 queries of 100 samples per ms
    cap = BatcherSpec(max_batch_samples=1000, max_queue_delay_us=200)
    lat, thr = [], []
    for rate in (2000.0, 6000.0, 9000.0, 12000.0, 20000.0):
        res = simulate_batching(poisson(rate, 20_000), cap, constant(1e-3), 8)
        s = summarize_dlrm(res, None)
        lat.append(s["latency_ms"]["p99"])
        thr.append(s["throughput"]["queries_per_s"])
    assert lat == sorted(lat) and lat[-1] > 50 * lat[0]
    assert thr[-1] == pytest.approx(10_000, rel=0.02) and thr[-2] == pytest.approx(10_000, rel=0.02)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e-2), st.integers(1, 50)), min_size=1, max_size=60),
       st.integers(50, 200), st.floats(0, 2000))
def test_batches_respect_the_batcher(items, cap, delay_us):
    arrival = np.sort(np.array([a for a, _ in items]))
    q = Queries(arrival, np.array([s for _, s in items]))
    res = simulate_batching(q, BatcherSpec(max_batch_samples=cap, max_queue_delay_us=delay_us),
                            lambda s: 1e-4 + 1e-6 * s, 1)
    assert sum(b[2] for b in res.batches) == len(q)
    assert all(b[3] <= cap for b in res.batches)
    assert np.all(res.dispatch_s >= arrival) and np.all(res.finish_s > res.dispatch_s)
    starts = [b[0] for b in res.batches]
    ends = [b[1] for b in res.batches]
    assert all(s >= e - 1e-15 for s, e in zip(starts[1:], ends[:-1], strict=False))  # one batch at a time
    assert np.all(np.diff(res.batch) >= 0)  # queries leave in arrival order
    # no query waits past its delay while the server is idle
    free = np.concatenate([[0.0], ends[:-1]])[res.batch]
    assert np.all(res.dispatch_s <= np.maximum(arrival + delay_us * 1e-6, free) + 1e-12)


def test_the_engine_times_each_bucket_once(tmp_path):
    from simgpu.serve.dlrm import build_dlrm, serve_dlrm

    serving = load_dlrm_serving(serving_file(tmp_path))
    dep = build_dlrm(serving)
    _, s = serve_dlrm(serving, dep)
    assert dep.timer.gpus == 8 and s["distinct_batches_timed"] == len(dep.timer.cache) >= 1
    assert all(b % 64 == 0 for b in dep.timer.cache)
    assert s["service_ms"]["p50"] > 0 and s["latency_ms"]["p99"] >= s["latency_ms"]["p50"]
    # a bigger batch takes longer
    assert dep.timer(8 * 2048) > dep.timer(8 * 64)


def test_deterministic_for_a_seed(tmp_path, capsys):
    path = serving_file(tmp_path, queries__samples={"dist": "lognormal", "mean": 200, "max": 1000})
    outs = []
    for k, seed in enumerate((5, 5, 6)):
        out = tmp_path / f"o{k}"
        assert main([str(path), "--out", str(out), "--seed", str(seed), "--no-plots", "--quiet"]) == 0
        outs.append((out / "requests.csv").read_text())
    assert outs[0] == outs[1] and outs[0] != outs[2]


def test_shipped_example_writes_its_files(tmp_path, capsys):
    out = tmp_path / "o"
    assert job_kind(SHIPPED) == "dlrm_serving"
    assert main([str(SHIPPED), "--out", str(out), "--set", "queries.count=2000", "--sweep", "5000,60000"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["queries"] == 2000 and s["gpus"] == 8 and s["goodput"]["slo_latency_ms"] == 60
    for f in ("requests.csv", "latency_cdf.png", "sweep.csv", "throughput_vs_load.png"):
        assert (out / f).is_file()
    assert "queries/s" in capsys.readouterr().out


def refused(capsys, argv: list[str]) -> str:
    return refused_in_one_line(capsys, main, argv)


@pytest.mark.parametrize(("changes", "where"), [
    ({"batcher__max_batch_samples": 0}, "batcher.max_batch_samples: expected a value greater than or equal to 1"),
    ({"batcher__max_delay_us": 5}, "batcher.max_delay_us: unknown key"),
    ({"queries__rate_per_s": None}, "queries: poisson queries need rate_per_s"),
    ({"queries__samples": 5000}, "a query of up to 5000 samples never fits a batch of 4096"),
    ({"batcher": None}, "batcher"),
    ({"slo": {"latency_ms": -1}}, "slo.latency_ms: expected a value greater than 0"),
    ({"queries__kind": "fixed", "outputs": {"sweep_rates_per_s": [1.0]}}, "outputs.sweep_rates_per_s: a sweep"),
    ({"outputs": {"sweep_rates_per_s": [100.0, -1.0]}}, "outputs: rate -1; expected arrival rates > 0"),
    ({"batcher__max_batch_samples": 8_000_000}, "batcher.max_batch_samples: a full batch of 8,000,000 samples "
     "(1,000,000 per GPU): does not fit in GPU memory"),
])
def test_bad_dlrm_serving_files(tmp_path, capsys, changes, where):
    line = refused(capsys, [str(serving_file(tmp_path, **changes)), "--out", str(tmp_path / "o")])
    assert where in line, line


def test_llm_serving_readers_refuse_a_dlrm_file():
    from simgpu.errors import ConfigError
    from simgpu.serve.spec import load_serving

    with pytest.raises(ConfigError, match=r"deployment\.workload: the deployment is a dlrm_inference workload"):
        load_serving(SHIPPED)


def test_a_sweep_of_fixed_queries_names_the_option(tmp_path, capsys):
    path = serving_file(tmp_path, queries__kind="fixed")
    line = refused(capsys, [str(path), "--out", str(tmp_path / "o"), "--sweep", "100,200"])
    assert "--sweep: a sweep of arrival rates needs poisson queries" in line, line
