"""simulate() leaves the cyclic garbage collector as it found it: on, with nothing frozen, or with the
caller's own freeze untouched, also where the build fails; the programs come out the same."""

from __future__ import annotations

import gc

import pytest
from conftest import ROOT

from simgpu import load_job, sim, simulate
from simgpu.errors import ConfigError
from simgpu.sim import build

JOB = ROOT / "workloads" / "gpt_2x_dgx_h100.yaml"
SMALL = ["model.layers=2", "parallelism.pp=2", "parallelism.dp=8", "parallelism.pp_schedule=1f1b"]


def test_collector_on_and_nothing_frozen_after_a_run() -> None:
    assert gc.isenabled() and gc.get_freeze_count() == 0
    r = simulate(load_job(JOB, SMALL))
    assert r.iteration_time_s > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_callers_freeze_is_left_alone() -> None:
    keep = [object() for _ in range(10)]
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        simulate(load_job(JOB, SMALL))
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
    del keep


def test_collector_back_on_after_a_refused_build(monkeypatch: pytest.MonkeyPatch) -> None:
    job = load_job(JOB, SMALL)

    def refuse(spec: object, world: object) -> None:
        assert not gc.isenabled()  # off while the builder runs
        raise ConfigError("refused", key="model")

    monkeypatch.setattr(sim, "get_builder", lambda kind: refuse)
    with pytest.raises(ConfigError, match="refused"):
        build(job)
    assert gc.isenabled()
    gc.disable()
    try:  # a caller that turned it off keeps it off
        with pytest.raises(ConfigError, match="refused"):
            build(job)
        assert not gc.isenabled()
    finally:
        gc.enable()
