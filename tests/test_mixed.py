"""Mixed platforms (docs/mixed.md): nodes of different kinds, each with its own GPU, kernel models,
memory and links, on one network."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from simgpu import load_job, simulate
from simgpu.config.mixed import MixedPlatform
from simgpu.errors import ConfigError
from simgpu.platform.topology import Topology
from simgpu.report import summarize
from simgpu.report.table import format_summary
from simgpu.result import SimResult

GPT = ROOT / "workloads" / "gpt_2x_dgx_h100.yaml"
MIXED = ROOT / "workloads" / "gpt_mixed_h100_a100.yaml"


def _mix(tmp: Path, *entries: tuple[str, int]) -> str:
    path = tmp / "mix.yaml"
    path.write_text(yaml.safe_dump({"name": "mix", "mix": [{"platform": p, "nodes": n} for p, n in entries]}))
    return str(path)


@cache
def _run(platform: str) -> SimResult:
    return simulate(load_job(GPT, [f"platform={platform}"]))


@cache
def _mixed() -> SimResult:
    return simulate(load_job(MIXED))


def test_the_slow_kind_sets_the_pace() -> None:
    mixed, a100, h100 = _mixed().iteration_time_s, _run("dgx_a100").iteration_time_s, _run("dgx_h100").iteration_time_s
    # no faster than all-A100 (the H100 node's own NVLink makes its ring steps a little faster: 1e-4 at most),
    # within a few % of it, and slower than all-H100
    assert mixed >= a100 * (1 - 1e-4)
    assert abs(mixed - a100) / a100 < 0.03
    assert mixed > 1.5 * h100


def test_the_fast_ranks_wait_at_the_all_reduce() -> None:
    s = summarize(_mixed())
    h100, a100 = s["by_kind"]
    assert (h100["kind"], h100["gpus"], a100["kind"], a100["gpus"]) == ("dgx_h100", 8, "dgx_a100", 8)
    assert h100["compute_ms"] < 0.5 * a100["compute_ms"]
    assert h100["idle_ms"] > a100["idle_ms"] + 1.0  # waiting for the A100s
    assert h100["exposed_communication_ms"] > a100["exposed_communication_ms"] + 50.0  # in the all-reduce
    assert "no folding" in s["fold"]["note"] and s["fold"]["replicas"] == 1
    assert "by kind of node" in format_summary(s)
    assert s["iteration_time_ms"] == summarize(simulate(load_job(MIXED)))["iteration_time_ms"]  # deterministic


def test_a_mix_of_one_kind_is_the_plain_platform(tmp_path: Path) -> None:
    same = simulate(load_job(GPT, [f"platform={_mix(tmp_path, ('dgx_h100', 1), ('dgx_h100', 1))}"]))
    plain = _run("dgx_h100")
    assert same.iteration_time_s == plain.iteration_time_s
    assert "kinds" not in same.meta and same.meta["fold"] == plain.meta["fold"]


def test_each_node_has_its_own_links() -> None:
    job = load_job(MIXED)
    assert isinstance(job.platform, MixedPlatform) and job.platform.node_kinds() == [0, 1]
    topo = Topology(job.platform, 2)
    cap = {lk.name: lk.capacity for lk in topo.links}
    assert cap["n0.gpu0->n0.nvsw"] == pytest.approx(450e9 * 0.80)  # NVLink 4
    assert cap["n1.gpu0->n1.nvsw"] == pytest.approx(300e9 * 0.78)  # NVLink 3
    assert cap["n0.nic0->leaf0.0"] == pytest.approx(400e9 / 8 * 0.92)  # NDR
    assert cap["n1.nic0->leaf0.0"] == pytest.approx(200e9 / 8 * 0.92)  # HDR
    assert topo.nic_bw == pytest.approx(200e9 / 8 * 0.92)  # a channel across the nodes: the slower NIC
    assert not job.platform.node.nvlink or not job.platform.node.nvlink.nvls  # NVLS only where every kind has it


def test_memory_is_checked_against_each_kinds_gpu(tmp_path: Path) -> None:
    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump({"name": "mix", "mix": [
        {"platform": "dgx_h100", "nodes": 1},
        {"platform": "dgx_a100", "nodes": 1, "overrides": {"gpu.memory_gib": 16}}]}))
    with pytest.raises(ConfigError, match=r"rank 8 \(node 1\) needs .* A100-SXM4-80GB has 16 GiB"):
        simulate(load_job(GPT, [f"platform={path}"]))
