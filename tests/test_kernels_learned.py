"""Unit tests of the learned kernel models: features, the harness (sweeps, index distributions,
measuring, resuming), the stored tables and their hash, fitting and reloading, and the predictor's
place in the default chain."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import ROOT

from simgpu.bench.__main__ import main as bench_main
from simgpu.bench.cases import DISTRIBUTIONS, SCALES, Case, Scale, parse_groups, sweep
from simgpu.bench.harness import Options, run
from simgpu.bench.indices import draw
from simgpu.bench.timing import Policy, measure
from simgpu.errors import ConfigError
from simgpu.fit import fit_platform
from simgpu.fit import main as fit_main
from simgpu.graph import KernelSpec
from simgpu.kernels import learned, store
from simgpu.kernels.features import FAMILY_PARAMS, feature_frame, kernel_params
from simgpu.kernels.learned import Learned, errors, load_models
from simgpu.kernels.lookups import reuse_stats, uniform_reuse
from simgpu.kernels.registry import make_predictor

#: A sweep small enough to measure in a second or two.
TINY = Scale(max_flops=1e7, max_bytes=2e6, max_dim=256, shapes=8)

# ---- features ------------------------------------------------------------------------------------


def test_reuse_stats_of_known_ids():
    ids = np.array([0, 0, 0, 0, 1, 2, 3, 4, 5, 6])  # row 0 takes 4 of 10 lookups
    s = reuse_stats(ids, rows=1000)
    assert s["reuse_top0p1"] == pytest.approx(0.4)   # the one hottest row
    assert s["reuse_top1"] == pytest.approx(1.0)     # 10 rows cover all 7 distinct ones
    assert s["reuse_unique"] == pytest.approx(0.7)


@pytest.mark.parametrize("rows,lookups", [(1000, 100), (100_000, 50_000), (5000, 200_000)])
def test_uniform_reuse_matches_uniform_draws(rows, lookups):
    rng = np.random.default_rng(0)
    got = reuse_stats(draw("uniform", rows, lookups, rng), rows)
    want = uniform_reuse(rows, lookups)
    assert want["reuse_unique"] == pytest.approx(got["reuse_unique"], rel=0.02)
    for k in ("reuse_top1", "reuse_top10"):
        assert want[k] == pytest.approx(got[k], rel=0.25, abs=0.01), k


def test_skewed_distributions_reuse_more():
    rng = np.random.default_rng(1)
    rows, n = 100_000, 50_000
    stats = {d: reuse_stats(draw(d, rows, n, rng), rows) for d in ("uniform", "zipf1.05", "hot1_90")}
    assert stats["uniform"]["reuse_top1"] < stats["zipf1.05"]["reuse_top1"]
    assert stats["hot1_90"]["reuse_top1"] == pytest.approx(0.9, abs=0.02)
    assert stats["zipf1.05"]["reuse_unique"] < stats["uniform"]["reuse_unique"]
    with pytest.raises(ConfigError):
        draw("gauss", rows, n, rng)


def test_kernel_params_fill_defaults_and_reject_unknown():
    p = kernel_params(KernelSpec.make("embedding_fwd", "fp32", batch=64, tables=2, pooling=4, dim=16, rows=1000))
    assert p["reuse_unique"] == pytest.approx(uniform_reuse(1000, 256)["reuse_unique"])
    assert kernel_params(KernelSpec.make("norm", "fp32", rows=8, cols=8))["rms"] == 0.0
    with pytest.raises(KeyError):
        kernel_params(KernelSpec.make("conv", "fp32", n=1))
    with pytest.raises(KeyError):
        kernel_params(KernelSpec.make("gemm", "fp32", m=1, n=2))


def test_feature_frame_is_finite_for_every_family(dgx_a100):
    examples = {"gemm": dict(m=7, n=4096, k=1), "bmm": dict(b=3, m=5, n=6, k=7),
                "attention_fwd": dict(batch=2, heads=4, seq_q=128, seq_kv=128, head_dim=64, causal=1),
                "attention_bwd": dict(batch=2, heads=4, seq_q=128, seq_kv=128, head_dim=64),
                "embedding_fwd": dict(batch=64, tables=2, pooling=3, dim=16, rows=10),
                "embedding_bwd": dict(batch=64, tables=1, pooling=3, dim=16, rows=10**7, reuse_top0p1=0.5,
                                      reuse_top1=0.6, reuse_top10=0.9, reuse_unique=0.2),
                "elementwise": dict(numel=1, reads=0, writes=1), "norm": dict(rows=1, cols=1, bwd=1),
                "softmax": dict(rows=4, cols=50000), "optimizer": dict(numel=10, states=2),
                "memcpy": dict(nbytes=4096),
                "moe": dict(rows=0.5, experts=8, hidden=16, inter=8, topk=2, gated=0, bwd=2),
                "mla_context": dict(batch=2, seq_q=128, seq_kv=128, heads=16),
                "mla_decode": dict(batch=4, seq_kv=1024, heads=16),
                "linear_attention": dict(batch=2, seq_q=64, heads_k=4, heads_v=8),
                "sparse_attention": dict(batch=2, seq_q=1, seq_kv=4096, heads=16, decode=1),
                "quantize": dict(m=64, k=1024, block=128)}
    assert set(examples) == set(FAMILY_PARAMS)
    for fam, params in examples.items():
        x = feature_frame(fam, [KernelSpec.make(fam, "fp32", **params)], dgx_a100.gpu)
        assert np.isfinite(x.to_numpy(dtype=float)).all(), fam


def test_errors_geomean_and_mean():
    e = errors(np.array([1.1, 0.9, 2.0]), np.array([1.0, 1.0, 1.0]))
    assert e["mape"] == pytest.approx((0.1 + 0.1 + 1.0) / 3)
    assert e["geomean_ape"] == pytest.approx((0.1 * 0.1 * 1.0) ** (1 / 3))


# ---- harness ---------------------------------------------------------------------------------------


def test_sweep_is_deterministic_and_keyed_like_kernel_specs():
    a = sweep(["gemm", "embedding", "norm"], SCALES["cpu"], seed=3)
    assert a == sweep(["gemm", "embedding", "norm"], SCALES["cpu"], seed=3)
    assert a != sweep(["gemm", "embedding", "norm"], SCALES["cpu"], seed=4)
    for c in a:
        names = {k for k, _ in c.params}
        required = {k for k, v in FAMILY_PARAMS[c.family].items() if v is None}
        assert required <= names <= set(FAMILY_PARAMS[c.family]), c
    assert len({c.key() for c in a}) == len(a)
    # the serving families are timed from imported framework tables only (no harness kernel for them)
    serving = {"mla_context", "mla_decode", "linear_attention", "sparse_attention", "quantize"}
    assert {c.family for c in sweep(parse_groups("all"), SCALES["cpu"], 0)} == set(FAMILY_PARAMS) - serving


def test_unknown_groups_are_rejected():
    with pytest.raises(ConfigError, match="unknown op group"):
        parse_groups("gemm,conv")
    assert Case.make("gemm", "linear", "fp32", m=1, n=2, k=3).get("n") == 2.0


def test_harness_measures_resumes_and_summarises(tmp_path: Path, capsys):
    out = tmp_path / "mb"
    args = ["--device", "cpu", "--ops", "elementwise,optimizer,memcpy", "--shapes", "4", "--out", str(out),
            "--quiet", "--min-time", "0.001", "--dtypes", "fp32", "--max-mbytes", "4"]
    assert bench_main(args) == 0
    first = {p.name: p.read_text() for p in out.glob("*.csv")}
    assert set(first) == {"elementwise.csv", "optimizer.csv", "memcpy.csv"}
    t = pd.read_csv(out / "elementwise.csv")
    assert list(t.columns) == store.columns("elementwise")
    assert (t["median_s"] > 0).all() and (t["p10_s"] <= t["median_s"]).all() and (t["median_s"] <= t["p90_s"]).all()
    assert "measured" in capsys.readouterr().out
    assert bench_main(args) == 0  # resumes: nothing left to measure, nothing appended
    assert "measured 0 case" in capsys.readouterr().out
    assert {p.name: p.read_text() for p in out.glob("*.csv")} == first
    summary = json.loads((out / "device.json").read_text())
    assert summary["copy_largest_gbytes_per_s"] > 0 and summary["memcpy_largest_gbytes_per_s"] > 0
    assert summary["clock"] == ("thread_cpu" if torch.get_num_threads() == 1 else "wall")


def test_harness_embedding_rows_carry_reuse(tmp_path: Path):
    cases = sweep(["embedding"], dataclasses.replace(TINY, shapes=3), seed=0)
    assert run(cases, Options("cpu", tmp_path, policy=Policy(warmup=1, min_repeats=2, min_time_s=0.0),
                              progress=False, flush_bytes=2**22)) == len(cases)
    t = pd.read_csv(tmp_path / "embedding_bwd.csv")
    assert len(t) == len(cases) // 2
    assert t["reuse_unique"].between(0, 1).all() and t["reuse_top1"].between(0, 1).all()
    assert set(t["dist"]) <= set(DISTRIBUTIONS)


def test_measure_flushes_before_every_call_and_batches_short_ones():
    calls = {"run": 0, "prepare": 0, "flush": 0}

    def count(name: str):
        def f() -> None:
            calls[name] += 1
        return f

    stats = measure(count("run"), count("prepare"), "cpu", Policy(warmup=2, min_repeats=5, min_time_s=0.0),
                    count("flush"))
    assert stats.repeats == 5 and calls == {"run": 7, "prepare": 7, "flush": 7}
    calls["run"] = 0
    stats = measure(count("run"), None, "cpu", Policy(warmup=2, min_repeats=5, min_time_s=0.0))
    assert stats.repeats == 5 and calls["run"] > 7  # a call this short is timed in batches
    assert 0 < stats.p10_s <= stats.median_s <= stats.p90_s


@pytest.mark.parametrize("argv", [["--device", "cpu", "--ops", "conv", "--out", "x"],
                                  ["--device", "cpu", "--ops", "gemm", "--out", "x", "--shapes", "0"],
                                  ["--device", "cpu", "--ops", "gemm", "--out", "x", "--dtypes", "fp64"]])
def test_bench_bad_input_exits_2(argv, capsys):
    assert bench_main(argv) == 2
    assert capsys.readouterr().err.startswith("error: ")


# ---- store, fit, reload ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory) -> Path:
    """Elementwise and norm ops over a small sweep, measured once for the tests that fit."""
    out = tmp_path_factory.mktemp("sweep")
    cases = sweep(["elementwise", "norm"], TINY, seed=0, dtypes=frozenset({"fp32"}))
    run(cases, Options("cpu", out, policy=Policy(warmup=1, min_repeats=3, min_time_s=0.0), progress=False))
    return out


@pytest.fixture()
def tmp_platform(tmp_path: Path, monkeypatch, small_sweep: Path) -> Path:
    """A copy of cpu_host named tmp_host with the small sweep's measurements, found by name."""
    plats = tmp_path / "platforms"
    plats.mkdir()
    text = (ROOT / "platforms" / "cpu_host.yaml").read_text().replace("name: cpu_host", "name: tmp_host")
    (plats / "tmp_host.yaml").write_text(text)
    shutil.copytree(small_sweep, plats / "tmp_host" / "microbench")
    monkeypatch.setenv("SIMGPU_PLATFORMS", str(plats))
    return plats


def test_fit_writes_models_and_reloads_by_content_hash(tmp_platform: Path, capsys, monkeypatch):
    assert fit_main(["--platform", "tmp_host"]) == 0
    assert "fitted" in capsys.readouterr().out
    folder = tmp_platform / "tmp_host"
    manifest = json.loads((folder / "models" / "manifest.json").read_text())
    assert set(manifest["families"]) == {"elementwise", "norm"}
    assert manifest["data_sha256"] == store.data_hash(folder / "microbench")
    assert manifest["families"]["norm"]["heldout"]["n_test"] > 0
    assert (folder / "models" / "norm.txt.gz").stat().st_size > 0
    _, refitted = fit_platform("tmp_host")
    assert not refitted  # same data: kept
    models = load_models(folder)
    assert set(models) == {"elementwise", "norm"}
    # corrections learned against one analytical model are stale against another
    monkeypatch.setattr(learned, "baseline_hash", lambda families=(): "edited")
    with pytest.raises(ConfigError, match="analytical model"):
        load_models(folder)
    monkeypatch.undo()
    monkeypatch.setenv("SIMGPU_PLATFORMS", str(tmp_platform))
    # changed data: the stored models no longer load, and a fit refits
    with (folder / "microbench" / "norm.csv").open("a") as f:
        f.write("extra,norm,layernorm,fp32,,64,64,0,0,0.001,0.001,0.001,5\n")
    with pytest.raises(ConfigError, match=r"simgpu\.fit"):
        load_models(folder)
    _, refitted = fit_platform("tmp_host")
    assert refitted and set(load_models(folder)) == {"elementwise", "norm"}


def test_learned_times_only_its_families(tmp_platform: Path):
    from simgpu.config.loader import load_platform

    assert fit_platform("tmp_host")[1]
    platform, _ = load_platform("tmp_host")
    chain = make_predictor(("learned", "analytical"), platform)
    ks = [KernelSpec.make("norm", "fp32", rows=1024, cols=768, bwd=0),
          KernelSpec.make("elementwise", "fp32", numel=2**20, reads=2, writes=1),
          KernelSpec.make("gemm", "fp32", m=64, n=64, k=64),
          KernelSpec.make("norm", "fp8", rows=1024, cols=768, bwd=0)]
    secs, names = chain.predict(ks)
    assert names == ["lightgbm", "lightgbm", "analytical", "analytical"]
    assert (secs > 0).all()
    big = chain.predict([KernelSpec.make("elementwise", "fp32", numel=2**22, reads=2, writes=1)])[0][0]
    assert big > secs[1]  # 4x the elements take longer


def test_gpu_without_measurements_gets_the_transfer_models():
    from simgpu.config.loader import load_platform

    a40, _ = load_platform("a40_4gpu")  # no measurements of its own
    learned = make_predictor("learned", a40)
    assert isinstance(learned, Learned) and learned.name == "lightgbm-transfer" and learned.models
    ks = [KernelSpec.make("gemm", "fp16", m=1024, n=1024, k=1024),
          KernelSpec.make("embedding_fwd", "fp32", batch=64, tables=2, pooling=4, dim=64, rows=1000)]
    secs, names = make_predictor(("learned", "analytical"), a40).predict(ks)
    assert names == ["lightgbm-transfer", "analytical"]  # no embedding data on any GPU
    alone, _ = make_predictor("analytical", a40).predict(ks)
    assert secs[1] == alone[1] and secs[0] != alone[0]


def test_fit_bad_input_exits_2(tmp_path: Path, capsys, monkeypatch):
    assert fit_main(["--platform", "no_such_platform"]) == 2
    assert "not found" in capsys.readouterr().err
    plats = tmp_path / "platforms"
    plats.mkdir()
    shutil.copy(ROOT / "platforms" / "cpu_host.yaml", plats / "bare.yaml")
    monkeypatch.setenv("SIMGPU_PLATFORMS", str(plats))
    assert fit_main(["--platform", "bare"]) == 2  # no microbench folder
    assert "no measurements" in capsys.readouterr().err
    (plats / "bare" / "microbench").mkdir(parents=True)
    assert fit_main(["--platform", "bare"]) == 2  # no data
    assert "no measurements" in capsys.readouterr().err
    assert fit_main(["--neusight", str(tmp_path)]) == 2
    assert "NeuSight" in capsys.readouterr().err
