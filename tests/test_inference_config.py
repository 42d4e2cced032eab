"""The inference workload file: its section, its refusals (one line, exit 2, nothing written), and
the batches a replica cannot hold."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import ROOT, edit_keys

from simgpu import run
from simgpu.config.loader import load_job
from simgpu.errors import ConfigError
from simgpu.serve.timer import make_timer
from simgpu.workload.inference import Step
from simgpu.workload.inference.builder import check_fit

LLAMA = ROOT / "workloads" / "inference" / "llama2_70b_dgx_h100_tp4.yaml"
MIXTRAL = ROOT / "workloads" / "inference" / "mixtral_8x7b_8x_h100_ep.yaml"
DLRM = ROOT / "workloads" / "inference" / "dlrm_dcnv2_dgx_a100.yaml"


def _write(tmp: Path, edits: dict[str, object], base: Path = LLAMA) -> Path:
    data = yaml.safe_load(base.read_text())
    edit_keys(data, edits)
    path = tmp / "w.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


CASES = {
    "training on a served model": ({"training": {"batch_per_gpu": 1}}, ["inference", "expected"]),
    "no inference section": ({"inference": None}, ["inference", "expected"]),
    "unknown inference key": ({"inference.prompt_tokns": 3}, ["inference.prompt_tokns", "expected"]),
    "fp4 where no path exists (V100: no fp4, no bf16)": ({"platform": "dgx1_v100", "inference.precision": "fp4"},
                                                         ["inference.precision", "fp4", "V100", "expected"]),
    "KV cache too large": ({"inference.decode_requests": 250, "inference.prefill_requests": 0,
                            "inference.context_tokens": 4000},
                           ["does not fit in GPU memory", "blocks", "expected"]),
    "too many tokens": ({"inference.prefill_requests": 20, "inference.prompt_tokens": 1000},
                        ["inference.max_batch_tokens", "expected"]),
    "context beyond the model's": ({"inference.decode_requests": 1, "inference.context_tokens": 5000},
                                   ["model.seq_len", "expected"]),
    "empty batch": ({"inference.decode_requests": 0, "inference.prefill_requests": 0},
                    ["inference.decode_requests", "expected"]),
    "tp that does not divide the heads": ({"parallelism.tp": 3}, ["expected"]),
    "cp on a served model": ({"parallelism.cp": 2, "parallelism.tp": 2}, ["parallelism", "expected"]),
}


@pytest.mark.parametrize("name", CASES)
def test_a_bad_inference_workload_is_refused_in_one_line(name: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    edits, words = CASES[name]
    path = _write(tmp_path, edits)
    out = tmp_path / "out"
    code = run.main([str(path), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)
    assert not out.exists()


def test_an_inference_section_on_a_trained_model_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, {"inference": {"decode_requests": 1}}, ROOT / "workloads" / "gpt_2x_dgx_h100.yaml")
    with pytest.raises(ConfigError, match="expected a training section"):
        load_job(path)


def test_kv_dtype_follows_the_precision() -> None:
    assert load_job(LLAMA).workload.serve.kv == "bf16"
    assert load_job(LLAMA, ["inference.precision=fp8"]).workload.serve.kv == "fp8"
    assert load_job(LLAMA, ["inference.precision=fp8", "inference.kv_dtype=bf16"]).workload.serve.kv == "bf16"


def test_check_fit_refuses_what_the_blocks_cannot_hold() -> None:
    timer = make_timer(load_job(LLAMA))
    dep = timer.deployment
    fits = timer.memory.kv_tokens // 4096 - 1
    check_fit(dep, Step(decode=(4000,) * min(fits, 255)))
    with pytest.raises(ConfigError, match="does not fit"):
        check_fit(dep, Step(decode=(4000,) * (timer.memory.kv_tokens // 4000 + 1)))


@pytest.mark.parametrize("path", [LLAMA, MIXTRAL, DLRM])
def test_shipped_inference_workloads_load(path: Path) -> None:
    job = load_job(path)
    assert job.workload.training is None and job.workload.inference is not None
