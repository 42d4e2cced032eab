"""The public API (:mod:`simgpu.api`): load any file as its kind, simulate, serve."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT

import simgpu

GPT = ROOT / "workloads" / "gpt_2x_dgx_h100.yaml"
LLM = ROOT / "workloads" / "serving" / "llama2_70b_2x_dgx_h100_disagg.yaml"
DLRM = ROOT / "workloads" / "serving" / "dlrm_dcnv2_dgx_a100.yaml"
STUDY = ROOT / "workloads" / "studies" / "faster_nic.yaml"


def test_load_returns_the_object_of_each_kind() -> None:
    assert simgpu.kind(simgpu.load(GPT)) == "workload"
    assert isinstance(simgpu.load(GPT), simgpu.Job)
    assert simgpu.kind(simgpu.load(LLM)) == "llm_serving"
    assert simgpu.kind(simgpu.load(DLRM)) == "dlrm_serving"
    assert simgpu.kind(simgpu.load(STUDY)) == "study"


def test_simulate_a_loaded_job_and_a_what_if() -> None:
    base = simgpu.simulate(simgpu.load(GPT))
    slow = simgpu.simulate(simgpu.load(GPT, ["platform.network.nic_gbps=100"]))
    assert isinstance(base, simgpu.SimResult)
    assert base.iteration_time_s > 0
    assert slow.iteration_time_s >= base.iteration_time_s


def test_serve_llm_and_dlrm_give_figures_and_a_row_per_request() -> None:
    served = simgpu.serve(simgpu.load(LLM, ["requests.count=40"]))
    assert served.kind == "llm_serving"
    assert isinstance(served.table, pd.DataFrame) and len(served.table) == 40
    assert served.summary["ttft_ms"]["p50"] > 0
    dl = simgpu.serve(simgpu.load(DLRM, ["queries.count=200"]))
    assert dl.kind == "dlrm_serving" and len(dl.table) == 200
    assert dl.summary["latency_ms"]["p99"] > 0


def test_bad_input_raises_one_config_error(tmp_path: Path) -> None:
    with pytest.raises(simgpu.ConfigError) as e:
        simgpu.load(tmp_path / "missing.yaml")
    assert "missing.yaml" in str(e.value)
    with pytest.raises(simgpu.ConfigError) as e:
        simgpu.load(STUDY, ["nodes=4"])
    assert "overrides" in str(e.value)
    with pytest.raises(TypeError):
        simgpu.serve(simgpu.load(GPT))  # type: ignore[arg-type]
