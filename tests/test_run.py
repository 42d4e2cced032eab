"""End to end: each shipped workload runs as it is, writes its outputs, is deterministic and stays
within tolerance of its golden figures; more NIC bandwidth never slows a 2-node iteration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu import load_job, simulate
from simgpu.__main__ import main as cli_main
from simgpu.report import summarize
from simgpu.run import main

WORKLOADS = sorted((ROOT / "workloads").glob("*.yaml"))
GOLDEN = ROOT / "tests" / "golden" / "workloads.json"
TOLERANCE = 0.02  # golden figures may drift this much (relative) before the test fails


def golden_figures(summary: dict) -> dict[str, float]:
    b = summary["breakdown_ms"]
    return {"iteration_time_ms": summary["iteration_time_ms"], "compute_ms": b["compute"],
            "exposed_communication_ms": b["exposed_communication"]}


@pytest.mark.parametrize("path", WORKLOADS, ids=[p.stem for p in WORKLOADS])
def test_workload_runs_and_writes_outputs(path: Path, tmp_path: Path, capsys):
    out = tmp_path / "out"
    assert main([str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "iteration" in printed and "ms" in printed
    for name in ("summary.json", "timeline.png", "trace.json", "records.csv"):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["iteration_time_ms"] > 0
    golden = json.loads(GOLDEN.read_text())[path.stem]
    for key, want in golden.items():
        got = golden_figures(summary)[key]
        assert got == pytest.approx(want, rel=TOLERANCE, abs=1e-3), (
            f"{path.stem} {key}: {got} vs golden {want}; if the change is intended, regenerate with "
            f"`python tests/test_run.py`")


def test_same_inputs_same_timeline(tmp_path: Path):
    path = ROOT / "workloads" / "dlrm_2x_dgx_a100.yaml"
    a, b = tmp_path / "a", tmp_path / "b"
    assert main([str(path), "--out", str(a), "--quiet"]) == 0
    assert main([str(path), "--out", str(b), "--quiet"]) == 0
    for name in ("summary.json", "trace.json", "records.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_faster_nic_what_if_from_the_command_line(tmp_path: Path):
    path = ROOT / "workloads" / "gpt_2x_dgx_h100.yaml"
    base = load_job(path, ["model.layers=4"])
    fast = load_job(path, ["model.layers=4", "platform.network.nic_gbps=800"])
    t_base, t_fast = simulate(base).iteration_time_s, simulate(fast).iteration_time_s
    assert t_fast <= t_base


def test_links_recorded_and_parquet(tmp_path: Path):
    path = ROOT / "workloads" / "gpt2_small_pcie_4gpu.yaml"
    out = tmp_path / "o"
    assert main([str(path), "--out", str(out), "--links", "--format", "parquet", "--set", "model.layers=2",
                 "--quiet"]) == 0
    assert (out / "records.parquet").stat().st_size > 0


def test_console_script_dispatch(tmp_path: Path, capsys):
    assert cli_main(["run", str(ROOT / "workloads" / "gpt2_small_pcie_4gpu.yaml"), "--out", str(tmp_path),
                     "--set", "model.layers=1", "--quiet"]) == 0
    assert cli_main(["nope"]) == 2


SMALL = {
    "gpt": (ROOT / "workloads" / "gpt_2x_dgx_h100.yaml", ["model.layers=2", "model.hidden=512", "model.heads=8",
                                                          "model.seq_len=512", "gpus_per_node=2",
                                                          "parallelism.dp=4"]),
    "dlrm": (ROOT / "workloads" / "dlrm_2x_dgx_a100.yaml", ["gpus_per_node=2", "training.batch_per_gpu=512"]),
}


@settings(max_examples=12)
@given(st.sampled_from(sorted(SMALL)), st.sampled_from([25, 50, 100, 200, 400]), st.sampled_from([1, 4, 25]),
       st.sampled_from(["auto", "ring", "tree"]))
def test_doubling_nic_bandwidth_never_slows_two_nodes(which, nic, bucket, algorithm):
    """Property: with twice the NIC bandwidth a 2-node iteration is never slower."""
    path, over = SMALL[which]
    over = over + [f"comm.bucket_mib={bucket}", f"comm.algorithm={algorithm}"]
    slow = simulate(load_job(path, over + [f"platform.network.nic_gbps={nic}"])).iteration_time_s
    fast = simulate(load_job(path, over + [f"platform.network.nic_gbps={2 * nic}"])).iteration_time_s
    assert fast <= slow * (1 + 1e-9)


def _regenerate() -> None:
    figures = {}
    for path in WORKLOADS:
        figures[path.stem] = {k: round(v, 4) for k, v in golden_figures(summarize(simulate(load_job(path)))).items()}
    GOLDEN.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    _regenerate()
