"""Correlated draws through the engine (simgpu.uncertainty) and ``simgpu run --uncertainty N``."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu.config.loader import load_job
from simgpu.run import main
from simgpu.uncertainty import Spread, propagate, spread
from simgpu.uncertainty.draws import normals, variance_shares
from simgpu.uncertainty.sources import SIGMA_PER_GEOMEAN, kernel_sigma

ROOT = Path(__file__).resolve().parents[1]
GPT = ROOT / "workloads" / "gpt_2x_dgx_h100.yaml"
NONE = {"kernel": 0.0, "collective": 0.0, "host": 0.0}


@pytest.fixture(scope="module")
def job():
    return load_job(GPT)


def test_geomean_to_sigma_is_the_half_normal_one():
    z = np.random.default_rng(0).standard_normal(400_000)
    geomean = float(np.exp(np.mean(np.log(np.abs(0.05 * z)))))
    assert kernel_sigma(geomean) == pytest.approx(0.05, rel=0.01)
    assert abs(SIGMA_PER_GEOMEAN - 1.887) < 1e-3


def test_spread_reads_the_manifests(job):
    sp = spread(job.platform).scaled(kernel=1.0)
    assert 0 < sp.kernel("gemm", "lightgbm") < 0.1  # H100's own GEMM model: a few percent held out
    assert sp.kernel("gemm", "lightgbm (rule)") == pytest.approx(2 * sp.kernel("gemm", "lightgbm"))
    assert sp.kernel("gemm", "analytical") > sp.kernel("gemm", "lightgbm-transfer") > sp.kernel("gemm", "lightgbm")
    assert sp.transfer_measured
    assert sp.scaled(kernel=2.0).kernel("gemm", "lightgbm") == pytest.approx(2 * sp.kernel("gemm", "lightgbm"))


def test_a_gpu_the_transfer_models_never_saw_is_wider(job):
    unseen = job.platform.model_copy(update={"name": "not_a_shipped_platform"})
    assert not spread(unseen).transfer_measured
    assert spread(unseen).kernel("gemm", "lightgbm-transfer") == pytest.approx(
        2 * spread(job.platform).kernel("gemm", "lightgbm-transfer"))


def test_no_spread_reproduces_the_point(job):
    point, u = propagate(job, 4, spread=Spread().scaled(**NONE))
    assert all(t == point.iteration_time_s for t in u.times_s)
    assert set(u.shares.values()) == {0.0}


def test_draws_are_ordered_deterministic_and_seeded(job):
    point, u = propagate(job, 8)
    q = u.quantiles_s()
    assert q[10] <= q[50] <= q[90]
    assert q[10] < point.iteration_time_s < q[90]
    _, again = propagate(job, 8)
    assert again.times_s == u.times_s
    _, other = propagate(job, 8, seed=1)
    assert other.times_s != u.times_s
    assert next(iter(u.shares)).startswith("kernel:")  # a one-node-per-rank GEMM-heavy job: kernels spread it
    section = u.as_dict()
    assert section["throughput"]["samples_per_s"]["p10"] <= section["throughput"]["samples_per_s"]["p90"]


def test_latin_hypercube_fills_every_quantile():
    z = normals(10, 3, seed=0)
    for j in range(3):  # one value per tenth of the normal
        u = np.sort([NormalDist().cdf(x) for x in z[:, j]])
        assert np.all((u >= np.arange(10) / 10) & (u <= np.arange(1, 11) / 10))
    assert np.array_equal(z, normals(10, 3, seed=0))


def test_variance_shares_find_the_source():
    z = normals(40, 3, seed=2)
    shares = variance_shares(z, 0.1 * z[:, 1] + 0.01 * z[:, 2], ["a", "b", "c"])
    assert list(shares) == ["b", "c", "a"]
    assert shares["b"] == pytest.approx(1.0, abs=0.02)
    assert variance_shares(z, np.zeros(40), ["a", "b", "c"]) == {"a": 0.0, "b": 0.0, "c": 0.0}


@settings(max_examples=6, deadline=None, derandomize=True)
@given(source=st.sampled_from(["kernel:gemm", "kernel:elementwise", "collective:nvlink", "collective:network", "host"]),
       lo=st.floats(0.0, 2.0), more=st.floats(0.01, 2.0))
def test_widening_a_source_never_narrows_the_interval(job, source, lo, more):
    """One source's spread widened (the others none): P10 never rises and P90 never falls."""
    def width(scale: float) -> tuple[float, float]:
        _, u = propagate(job, 6, spread=Spread().scaled(**{**NONE, source: scale}))
        q = u.quantiles_s()
        return q[10], q[90]

    (a10, a90), (b10, b90) = width(lo), width(lo + more)
    assert b10 <= a10 * (1 + 1e-12) and b90 >= a90 * (1 - 1e-12)


def _summary(tmp_path: Path, name: str, *args: str) -> str:
    out = tmp_path / name
    assert main([str(GPT), "--out", str(out), "--no-trace", "--records", "none", "--quiet", *args]) == 0
    return (out / "summary.json").read_text()


def test_zero_draws_leave_the_summary_as_it_was(tmp_path):
    assert _summary(tmp_path, "a") == _summary(tmp_path, "b", "--uncertainty", "0")


def test_draws_add_a_section_and_a_block(tmp_path, capsys):
    plain = json.loads(_summary(tmp_path, "a"))
    out = tmp_path / "u"
    assert main([str(GPT), "--out", str(out), "--no-trace", "--records", "none", "--uncertainty", "4"]) == 0
    printed = capsys.readouterr().out
    assert "uncertainty  4 correlated draws" in printed and "spread from" in printed
    got = json.loads((out / "summary.json").read_text())
    section = got.pop("uncertainty")
    assert got == plain  # the point run is the run without draws
    assert section["draws"] == 4 and set(section["iteration_time_ms"]) == {"p10", "p50", "p90"}


def test_negative_draws_are_refused(tmp_path, capsys):
    assert main([str(GPT), "--out", str(tmp_path / "x"), "--uncertainty", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--uncertainty" in err
