"""Input validation: every kind of bad input gets one clear error naming file and key, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from simgpu.config.loader import load_job, load_platform
from simgpu.errors import ConfigError
from simgpu.run import main

GPT = ROOT / "workloads" / "gpt_2x_dgx_h100.yaml"


def write(tmp_path: Path, data: dict | str, name: str = "w.yaml") -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return p


def gpt(**changes: object) -> dict:
    d = yaml.safe_load(GPT.read_text())
    d["platform"] = "dgx_h100"
    for k, v in changes.items():
        cur = d
        *head, last = k.split(".")
        for h in head:
            cur = cur[h]
        if v is None:
            del cur[last]
        else:
            cur[last] = v
    return d


def run_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    assert err.count("\n") == 1, err  # one line
    return err


@pytest.mark.parametrize("change, key, words", [
    ({"model.hiddn": 5}, "model.hiddn", "unknown key; did you mean 'hidden'? expected one of: kind, "),
    ({"model.layers": None}, "model.layers", "missing required key"),
    ({"model.layers": "many"}, "model.layers", "expected a number, got 'many'"),
    ({"model.layers": -3}, "model.layers", "greater than 0"),
    ({"model.kind": "lstm"}, "model.kind", "expected one of: 'dlrm', 'transformer', "
     "'transformer_inference', 'dlrm_inference'; got 'lstm'"),
    ({"training.precision": "fp4"}, "training.precision", "'fp32', 'tf32', 'bf16', 'fp16' or 'fp8'"),
    ({"parallelism.dp": 12}, "parallelism.dp", "does not match the world size"),
    ({"model.heads": 7}, "model", "divisible by heads"),
    ({"gpus_per_node": 9}, "gpus_per_node", "node has 8"),
    ({"platform": "dgx_z100"}, None,
     "platform 'dgx_z100' not found; expected a YAML path or one of: a40_4gpu, aws_p4de"),
])
def test_bad_workload_values(tmp_path, capsys, change, key, words):
    p = write(tmp_path, gpt(**change))
    err = run_error(capsys, [str(p), "--out", str(tmp_path / "out")])
    if key:
        assert f": {key}: " in err
    assert words in err
    if "platform" not in change:
        assert str(p) in err


def test_line_numbers_point_at_the_key(tmp_path):
    text = GPT.read_text().replace("  hidden: 2048", "  hidden: wide")
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_job(p)
    line = text.splitlines().index("  hidden: wide") + 1
    assert e.value.line == line and e.value.key == "model.hidden"


def test_malformed_yaml(tmp_path, capsys):
    p = write(tmp_path, "name: x\nmodel: [unclosed\n")
    err = run_error(capsys, [str(p)])
    assert "malformed YAML" in err and str(p) in err


def test_not_a_mapping(tmp_path, capsys):
    err = run_error(capsys, [str(write(tmp_path, "- 1\n- 2\n"))])
    assert "expected a mapping" in err


def test_missing_file(tmp_path, capsys):
    err = run_error(capsys, [str(tmp_path / "nope.yaml")])
    assert "workload file not found" in err and "nope.yaml" in err


def test_bad_platform_file(tmp_path, capsys):
    plat = yaml.safe_load((ROOT / "platforms" / "dgx_h100.yaml").read_text())
    plat["network"]["nic_gbps"] = -1
    pp = write(tmp_path, plat, "plat.yaml")
    p = write(tmp_path, gpt(platform=str(pp)))
    err = run_error(capsys, [str(p)])
    assert str(pp) in err and "network.nic_gbps" in err and "greater than 0" in err


def test_override_is_validated_like_the_file(tmp_path, capsys):
    err = run_error(capsys, [str(GPT), "--set", "platform.network.nic_gbps=fast"])
    assert "network.nic_gbps" in err and "dgx_h100.yaml" in err
    err = run_error(capsys, [str(GPT), "--set", "training.batch_per_gpu=0"])
    assert "training.batch_per_gpu" in err
    err = run_error(capsys, [str(GPT), "--set", "model.nope=1"])
    assert "model.nope: unknown key" in err
    err = run_error(capsys, [str(GPT), "--set", "novalue"])
    assert "key.path=value" in err
    # keys under a named entry (a protocol) are listed from that entry's schema
    err = run_error(capsys, [str(GPT), "--set", "platform.collectives.protocols.simple.stepnet_us=1"])
    assert ("collectives.protocols.simple.stepnet_us: unknown key; did you mean 'step_net_us'? "
            "expected one of: base_us,") in err
    assert "step_net_us" in err


def test_overrides_apply():
    job = load_job(GPT, ["platform.network.nic_gbps=800", "nodes=4", "parallelism.dp=32", "model.layers=2"])
    assert job.platform.network.nic_gbps == 800
    assert job.workload.nodes == 4 and job.workload.model.layers == 2


def test_model_too_large_for_memory(tmp_path, capsys):
    p = write(tmp_path, gpt(**{"model.layers": 96, "model.hidden": 12288, "model.heads": 96}))
    err = run_error(capsys, [str(p), "--out", str(tmp_path / "o")])
    assert "does not fit in GPU memory" in err and "GiB" in err and "80 GiB" in err


@pytest.mark.parametrize("name", ["dgx_a100", "dgx_h100", "pcie_4gpu"])
def test_shipped_platforms_load(name):
    spec, path = load_platform(name)
    assert spec.name == name and Path(path).is_file()
    assert spec.network.nic_gbps > 0


def test_every_workload_loads():
    for p in sorted((ROOT / "workloads").glob("*.yaml")):
        job = load_job(p)
        assert job.workload.name
