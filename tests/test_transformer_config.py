"""Transformer and parallelism inputs: every impossible combination gets one error naming its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from simgpu.config.loader import load_job
from simgpu.errors import ConfigError
from simgpu.run import main

BASE: dict[str, Any] = {
    "name": "c", "platform": "dgx_h100", "nodes": 2,
    "model": {"kind": "transformer", "layers": 8, "hidden": 512, "heads": 8, "seq_len": 256, "vocab": 1000},
    "training": {"micro_batch": 1, "precision": "bf16"},
    "parallelism": {},
}


def write(tmp_path: Path, changes: dict[str, Any]) -> Path:
    data = yaml.safe_load(yaml.safe_dump(BASE))
    for k, v in changes.items():
        cur = data
        *head, last = k.split(".")
        for h in head:
            cur = cur.setdefault(h, {})
        cur[last] = v
    p = tmp_path / "w.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.parametrize("changes, key, words", [
    ({"parallelism.tp": 3}, "parallelism.tp", "does not divide the world size"),
    ({"parallelism.tp": 2, "parallelism.dp": 4}, "parallelism.dp", "expected dp=8"),
    ({"parallelism.tp": 16}, "model.heads", "do not split over tp=16"),
    ({"model.kv_heads": 2, "parallelism.tp": 4}, "model.kv_heads", "key/value heads do not split"),
    ({"model.ffn_hidden": 1000, "parallelism.tp": 16, "model.heads": 16}, "model.ffn_hidden", "does not split"),
    ({"parallelism.pp": 16}, "model.layers", "equal chunks"),
    ({"parallelism.pp": 2, "parallelism.virtual_stages": 2}, "parallelism.virtual_stages", "interleaved"),
    ({"parallelism.pp": 2, "parallelism.pp_schedule": "interleaved"}, "parallelism.pp_schedule",
     "virtual_stages >= 2"),
    ({"parallelism.pp": 2, "parallelism.pp_schedule": "interleaved", "parallelism.virtual_stages": 2,
      "training.global_batch": 8}, "training.global_batch", "divisible by pp=2"),
    ({"parallelism.sp": True}, "parallelism.sp", "expected tp > 1"),
    ({"parallelism.cp": 16, "model.seq_len": 48, "model.layers": 8}, "model.seq_len", "chunks over cp=16"),
    ({"parallelism.cp": 2, "model.attention": "unfused"}, "model.attention", "flash"),
    ({"parallelism.ep": 2}, "parallelism.ep", "the model has none"),
    ({"parallelism.ep": 16, "model.moe": {"experts": 8}}, "model.moe.experts", "do not split over ep=16"),
    ({"parallelism.ep": 3, "model.moe": {"experts": 6}}, "parallelism.ep", "must divide dp=16"),
    ({"training.global_batch": 20}, "training.global_batch", "not a multiple of micro_batch x dp"),
    ({"model.kv_heads": 3}, "model", "multiple of kv_heads"),
    ({"model.moe": {"experts": 4, "top_k": 5}}, "model.moe", "top_k (5) cannot exceed experts"),
    ({"parallelism.fsdp": True, "parallelism.zero": 2}, "parallelism", "contradicts zero: 2"),
    ({"parallelism.zero": 4}, "parallelism.zero", "0, 1, 2 or 3"),
    ({"parallelism.pp_schedule": "zb"}, "parallelism.pp_schedule", "'1f1b', 'gpipe' or 'interleaved'"),
    ({"training.global_batch": 32, "training.grad_accumulation": 2}, "training", "not both"),
    ({"training.batch_per_gpu": 2}, "training", "name the same number"),
    ({"training.recompute": "some"}, "training.recompute", "'none', 'selective' or 'full'"),
    ({"training.precision": "fp8", "platform": "dgx_a100"}, "training.precision", "not supported"),
])
def test_bad_parallel_configuration(tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any],
                                    key: str, words: str) -> None:
    p = write(tmp_path, changes)
    assert main([str(p), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f": {key}: " in err, err
    assert words in err, err


def test_dlrm_refuses_model_parallelism(tmp_path: Path) -> None:
    data = {"name": "d", "platform": "dgx_a100", "nodes": 1,
            "model": {"kind": "dlrm", "bottom_mlp": [64, 16], "top_mlp": [64, 1], "embedding_dim": 16,
                      "tables": [{"rows": 100, "pooling_factor": 1}]},
            "training": {"batch_per_gpu": 8}, "parallelism": {"tp": 2}}
    p = tmp_path / "d.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_job(p)
    assert e.value.key == "parallelism.tp" and "transformer models" in e.value.message


def test_defaults_resolve_by_architecture(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, {"model.arch": "llama", "model.hidden": 4096, "model.heads": 32}))
    md = job.workload.model
    assert (md.act, md.norm_kind, md.rope, md.has_bias, md.tied, md.causal) == (  # type: ignore[union-attr]
        "swiglu", "rmsnorm", True, False, False, True)
    assert md.ffn == 11008  # type: ignore[union-attr]  # LLaMA's 2/3 * 4h rounded up to 256
    bert = load_job(write(tmp_path, {"model.arch": "bert"})).workload.model
    assert not bert.causal and bert.tied  # type: ignore[union-attr]


def test_micro_batch_is_batch_per_gpu(tmp_path: Path) -> None:
    t = load_job(write(tmp_path, {"training.micro_batch": 4})).workload.training
    assert t.batch_per_gpu == 4 == t.micro_batch


def test_a_configuration_too_large_is_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write(tmp_path, {"model.layers": 96, "model.hidden": 12288, "model.heads": 96, "model.seq_len": 2048,
                         "parallelism.tp": 8})
    assert main([str(p), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "does not fit in GPU memory" in err and "optimizer_states" in err
