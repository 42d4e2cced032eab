"""Shared fixtures: platforms, small hand-made workloads, paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simgpu.comm.planner import Planner
from simgpu.config.loader import load_platform
from simgpu.config.platform import PlatformSpec
from simgpu.engine import Engine, EngineOptions
from simgpu.graph import KernelSpec, MemoryEstimate, Program, Workload
from simgpu.platform.topology import Topology
from simgpu.result import SimResult

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def dgx_a100() -> PlatformSpec:
    return load_platform("dgx_a100")[0]


@pytest.fixture(scope="session")
def dgx_h100() -> PlatformSpec:
    return load_platform("dgx_h100")[0]


@pytest.fixture(scope="session")
def pcie_4gpu() -> PlatformSpec:
    return load_platform("pcie_4gpu")[0]


def run_programs(platform: PlatformSpec, nodes: int, programs: list[Program], durations: list[float],
                 *, gpus_per_node: int | None = None, launch_s: float = 0.0, overlap: float = 0.0,
                 algorithm: str = "auto", sms: int = 132,
                 by_op: tuple[tuple[str, float], ...] = (), aggregate: bool = True) -> SimResult:
    """Run hand-made programs; kernel i of the table lasts durations[i] seconds."""
    topo = Topology(platform, nodes, gpus_per_node)
    kernels = [KernelSpec.make("elementwise", "fp32", numel=i + 1) for i in range(len(durations))]
    wl = Workload("hand", programs, kernels, [MemoryEstimate()] * len(programs), samples=1)
    planner = Planner(topo, platform.collectives, algorithm)
    opts = EngineOptions(launch_s=launch_s, cpu_threads_per_node=128, overlap_slowdown=overlap, sms=sms,
                         overlap_slowdown_by_op=by_op, aggregate=aggregate)
    return Engine(topo, wl, np.asarray(durations), ["fixed"] * len(durations), planner, opts).run()


from hypothesis import settings as _settings  # noqa: E402

# CI runs the same examples every time: a property failure is reproducible, never flaky.
_settings.register_profile("ci", derandomize=True, deadline=None)
_settings.load_profile("ci")


def edit_keys(data: dict[str, Any], changes: dict[str, Any], sep: str = ".") -> dict[str, Any]:
    """``data`` with each ``changes`` key (a path of nested keys joined by ``sep``) set to its value,
    or removed where the value is None; missing mappings on the way are created."""
    for dotted, value in changes.items():
        cur = data
        *head, last = dotted.split(sep)
        for h in head:
            cur = cur.setdefault(h, {})
        if value is None:
            cur.pop(last, None)
        else:
            cur[last] = value
    return data


def refused_in_one_line(capsys: Any, main: Any, argv: list[str]) -> str:
    """The one line a refused command prints: exit 2, nothing on stdout, one ``error:`` line that
    says what was expected (pydantic's range messages say "greater than" instead)."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert not out and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "expected" in lines[0] or "greater than" in lines[0], err
    return lines[0]
