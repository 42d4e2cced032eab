"""``simgpu serve --uncertainty N``: the point run unchanged without draws, ordered and repeatable
intervals of TTFT, TPOT and throughput with draws, and the flag refused where it does not apply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, refused_in_one_line

from simgpu.serve.__main__ import main

LLAMA = ROOT / "workloads" / "inference" / "llama2_70b_dgx_h100_tp4.yaml"
SERVING = ROOT / "workloads" / "serving"
pytestmark = pytest.mark.skipif(not LLAMA.is_file(), reason="no inference workload of Llama-2-70B")
METRICS = ("ttft_mean_ms", "tpot_mean_ms", "ttft_p99_ms", "tpot_p99_ms", "output_tokens_per_s")


def serving_file(tmp_path: Path) -> Path:
    data = {"name": "t", "seed": 3, "deployment": {"workload": str(LLAMA)},
            "requests": {"kind": "poisson", "count": 40, "rate_per_s": 4, "prompt_tokens": 300,
                         "output_tokens": 30}}
    path = tmp_path / "serving.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run(path: Path, out: Path, *extra: str) -> dict:
    assert main([str(path), "--out", str(out), "--no-plots", "--quiet", *extra]) == 0
    summary = json.loads((out / "summary.json").read_text())
    summary.pop("wall_s")
    return summary


def test_zero_draws_leave_the_outputs_as_they_were(tmp_path):
    path = serving_file(tmp_path)
    plain, zero = run(path, tmp_path / "plain"), run(path, tmp_path / "zero", "--uncertainty", "0")
    assert plain == zero and "uncertainty" not in zero
    assert (tmp_path / "plain" / "requests.csv").read_bytes() == (tmp_path / "zero" / "requests.csv").read_bytes()


def test_draws_give_ordered_repeatable_intervals_and_the_point_unchanged(tmp_path, capsys):
    path = serving_file(tmp_path)
    plain = run(path, tmp_path / "plain")
    a = run(path, tmp_path / "a", "--uncertainty", "6")
    b = run(path, tmp_path / "b", "--uncertainty", "6")
    u = a.pop("uncertainty")
    assert a == plain  # the point run is the run without draws
    assert u == b["uncertainty"]  # the same seed gives the same draws
    assert u["draws"] == 6 and u["seed"] == 3
    assert any(s.startswith("kernel:") for s in u["sources"]) and "host" in u["sources"]
    for key in METRICS:
        q = u[key]
        assert q["p10"] <= q["p50"] <= q["p90"], key
    assert u["ttft_mean_ms"]["point"] == pytest.approx(plain["ttft_ms"]["mean"])
    assert u["ttft_mean_ms"]["p90"] > u["ttft_mean_ms"]["p10"]  # the kernel errors spread it
    assert set(u["variance_share"]) == {"ttft_mean_ms", "tpot_mean_ms"}
    c = run(path, tmp_path / "c", "--uncertainty", "6", "--seed", "4")
    assert c["uncertainty"]["ttft_mean_ms"] != u["ttft_mean_ms"]


def test_the_printed_block(tmp_path, capsys):
    path = serving_file(tmp_path)
    assert main([str(path), "--out", str(tmp_path / "o"), "--no-plots", "--uncertainty", "3"]) == 0
    text = capsys.readouterr().out
    assert "uncertainty  3 correlated draws (seed 3), 80% interval:" in text
    for label in ("TTFT mean ms", "TPOT mean ms", "TTFT P99 ms", "TPOT P99 ms", "output tokens/s"):
        assert f"  {label}" in text


def test_negative_draws_refused(tmp_path, capsys):
    msg = refused_in_one_line(capsys, main, [str(serving_file(tmp_path)), "--out", str(tmp_path / "o"),
                                             "--uncertainty", "-1"])
    assert "--uncertainty" in msg and ">= 0" in msg


def test_dlrm_serving_refused(tmp_path, capsys):
    path = SERVING / "dlrm_dcnv2_dgx_a100.yaml"
    if not path.is_file():
        pytest.skip("no DLRM serving example")
    msg = refused_in_one_line(capsys, main, [str(path), "--out", str(tmp_path / "o"), "--uncertainty", "2"])
    assert "--uncertainty" in msg and "DLRM" in msg


def test_cdf_bands_over_the_draws(tmp_path):
    import numpy as np

    from simgpu.serve.deploy import serve
    from simgpu.serve.spec import load_serving
    from simgpu.uncertainty.serving import CDF_COLUMNS, ServingDraws

    draws = ServingDraws(load_serving(serving_file(tmp_path), []))
    _, summary = serve(draws.serving, draws.point())
    u = draws.run(4, summary)
    assert set(u.bands) == set(CDF_COLUMNS)
    for levels, lo, hi in u.bands.values():
        assert len(levels) == len(lo) == len(hi) and np.all(lo <= hi) and np.all(np.diff(lo) >= 0)
    assert main([str(serving_file(tmp_path)), "--out", str(tmp_path / "o"), "--uncertainty", "2", "--quiet"]) == 0
    assert (tmp_path / "o" / "latency_cdf.png").is_file()
