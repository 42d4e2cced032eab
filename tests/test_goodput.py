"""``simgpu goodput``: the analytic goodput against simulated failure timelines, its monotonicity,
determinism for a seed, the shipped example, and bad input refused in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import ROOT, edit_keys
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu.goodput.__main__ import main
from simgpu.goodput.model import analytic, daly, exact, timelines, young
from simgpu.goodput.run import compute
from simgpu.goodput.spec import load_goodput

EXAMPLE = ROOT / "workloads" / "goodput" / "llama3_405b_16k_h100.yaml"
HOUR = 3600.0


def _doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "g",
        "job": {"iteration_s": 2.0, "gpus": 1024, "state_gib": 500.0},
        "failures": {"mtbf_hours_per_gpu": 20000.0},
        "checkpoint": {"checkpoint_s": 30.0, "restart_s": 300.0},
        "monte_carlo": {"replicas": 32, "horizon_mtbf": 300, "points": 9},
        "scale_gpus": [256, 1024],
    }
    return edit_keys(doc, changes, sep="__")


def _file(tmp: Path, doc: dict[str, Any], name: str = "g.yaml") -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_monte_carlo_agrees_with_young_and_daly_at_the_optimum() -> None:
    m, c, r = 10 * HOUR, 20.0, 600.0  # C << M
    tl = timelines(m, r, replicas=64, horizon_mtbf=400, seed=1)
    for tau in (young(c, m), daly(c, m)):
        want = float(analytic(tau, c, r, m))
        got, err = tl.goodput(tau, c)
        assert abs(float(got[0]) - want) / want < 0.02, (tau, got, want)
        assert float(err[0]) < 0.005
    assert abs(daly(c, m) - exact(c, m)) / exact(c, m) < 1e-3  # Daly's form is near-exact for small C / M
    assert abs(young(c, m) - exact(c, m)) / exact(c, m) < 0.05


def test_the_formula_is_the_expectation_of_the_timelines() -> None:
    """Where C and R are not small the analytic curve still matches: it is exact for the model."""
    m, c, r = HOUR, 600.0, 900.0
    tl = timelines(m, r, replicas=64, horizon_mtbf=400, seed=2)
    taus = np.array([300.0, exact(c, m), 3 * HOUR])
    got, err = tl.goodput(taus, c)
    np.testing.assert_allclose(got, analytic(taus, c, r, m), atol=4 * float(err.max()) + 1e-3)


def test_goodput_decreases_as_mtbf_decreases(tmp_path: Path) -> None:
    figures = []
    for mtbf in (80000.0, 20000.0, 5000.0, 1000.0):
        s = compute(load_goodput(_file(tmp_path, _doc(failures__mtbf_hours_per_gpu=mtbf))))
        figures.append((s["best"]["daly"]["goodput"], s["best"]["monte_carlo"]["goodput"]))
    for (a0, m0), (a1, m1) in zip(figures, figures[1:], strict=False):
        assert a1 < a0 and m1 < m0


@settings(max_examples=40, deadline=None)
@given(c=st.floats(1.0, 5000.0), r=st.floats(0.0, 5000.0), m=st.floats(600.0, 1e7),
       tau=st.floats(1.0, 1e6), more=st.floats(1.0, 100.0))
def test_goodput_is_a_share_and_dearer_checkpoints_never_help(c: float, r: float, m: float, tau: float,
                                                              more: float) -> None:
    g = float(analytic(tau, c, r, m))
    assert 0.0 < g <= 1.0
    best = float(analytic(exact(c, m), c, r, m))
    assert 0.0 < best <= 1.0 and best >= g - 1e-12
    dearer = float(analytic(exact(c * more, m), c * more, r, m))
    assert dearer <= best + 1e-12


@settings(max_examples=10, deadline=None)
@given(c=st.floats(1.0, 2000.0), m=st.floats(1800.0, 1e6), seed=st.integers(0, 2**31))
def test_monte_carlo_goodput_is_a_share(c: float, m: float, seed: int) -> None:
    tl = timelines(m, 120.0, replicas=4, horizon_mtbf=20, seed=seed)
    got, _ = tl.goodput(np.array([c, daly(c, m), 10 * m]), c)
    assert np.all((got >= 0.0) & (got <= 1.0))


def test_the_same_seed_gives_the_same_summary(tmp_path: Path) -> None:
    path = _file(tmp_path, _doc())
    a, b = compute(load_goodput(path)), compute(load_goodput(path))
    assert a == b
    other = compute(load_goodput(_file(tmp_path, _doc(seed=7), "h.yaml")))
    assert other["best"]["daly"]["goodput"] == a["best"]["daly"]["goodput"]
    assert other["best"]["daly"]["monte_carlo"] != a["best"]["daly"]["monte_carlo"]


def test_a_measured_rate_scales_per_gpu(tmp_path: Path) -> None:
    doc = _doc(failures={"interruptions": 466, "days": 54, "gpus": 16384})
    g = load_goodput(_file(tmp_path, doc))
    assert math.isclose(g.mtbf_s, 54 * 24 * HOUR / 466 * 16384 / 1024)


def test_storage_bandwidth_gives_the_checkpoint_time(tmp_path: Path) -> None:
    doc = _doc(checkpoint={"storage_gbytes_per_s": 100.0, "restart_s": 60.0})
    g = load_goodput(_file(tmp_path, doc))
    assert math.isclose(g.checkpoint_s, 500 * 2**30 / 100e9)


def test_the_example_runs_as_shipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(EXAMPLE), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "Young" in out and "Daly" in out and "Monte Carlo" in out
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (tmp_path / "out" / "goodput.png").stat().st_size > 0
    assert 2.5 < s["failures"]["mtbf_hours"] < 3.0            # 466 interruptions in 54 days
    assert 0.85 < s["best"]["daly"]["goodput"] < 0.97          # the paper reports > 90 % effective training time
    assert abs(s["difference"]["goodput"]) < 0.01
    assert s["at_interval"]["goodput"] < s["best"]["daly"]["goodput"]


def _bad(tmp: Path, doc: dict[str, Any] | str) -> Path:
    path = tmp / "bad.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize("doc, words", [
    (_doc(failures__mtbf_hours_per_gpu=-5.0), ["failures.mtbf_hours_per_gpu", "expected"]),
    (_doc(checkpoint__interval_s=0), ["checkpoint.interval_s", "expected"]),
    (_doc(job__iteration_s=None), ["job", "iteration_s"]),
    (_doc(checkpoint__cadence=3), ["checkpoint.cadence"]),
    (_doc(job={"workload": "missing.yaml"}), ["job.workload", "not found"]),
    (_doc(failures={"mtbf_hours_per_gpu": 1e4, "interruptions": 3}), ["failures", "expected one of"]),
    (_doc(failures={"interruptions": 3, "days": 2}), ["failures", "missing gpus"]),
    (_doc(failures__node={"mtbf_hours": 1e4}), ["failures.node.count", "expected"]),
    (_doc(checkpoint={"restart_s": 60}), ["checkpoint", "expected one of"]),
    ("name: g\njob: [1\n", ["malformed YAML"]),
])
def test_bad_input_is_refused_in_one_line(doc: dict[str, Any] | str, words: list[str], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # the default output folder would be made here
    path = _bad(tmp_path, doc)
    before = {p.name for p in tmp_path.rglob("*")}
    assert main([str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err.startswith("error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert str(path) in err
    for w in words:
        assert w in err, (w, err)
    assert {p.name for p in tmp_path.rglob("*")} == before, "something was written"


def test_a_missing_file_and_an_unwritable_out_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not found" in err
    (tmp_path / "file").write_text("x")
    assert main([str(EXAMPLE), "--out", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected a folder" in err


def test_a_workload_gives_the_iteration_the_gpus_and_the_state(tmp_path: Path) -> None:
    doc = _doc(job={"workload": str(ROOT / "workloads" / "gpt2_small_pcie_4gpu.yaml")},
               checkpoint={"storage_gbytes_per_s": 10.0, "restart_s": 60.0},
               failures={"mtbf_hours_per_gpu": 1e4, "node": {"mtbf_hours": 1e4}})
    g = load_goodput(_file(tmp_path, doc))
    assert g.gpus == 4 and g.iteration_s > 0
    assert g.state_gib is not None and "parameters" in g.state_note
    params = float(g.state_note.split(" B parameters")[0]) * 1e9
    assert 1e8 < params < 2e8                                   # GPT-2 small: 124M parameters
    assert math.isclose(g.checkpoint_s, g.state_gib * 2**30 / 10e9)
    assert math.isclose(g.rate_per_s * HOUR, 4 / 1e4 + 1 / 1e4)  # 4 GPUs and the workload's one node
