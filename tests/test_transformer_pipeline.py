"""Pipeline schedules: step order per stage, P2P transfers, in-flight micro-batches, and the bubble
of a uniform-stage simulation."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from simgpu import load_job, simulate
from simgpu.workload.transformer.pipeline import (
    Step,
    Transfer,
    bubble_fraction,
    groups,
    in_flight,
    plan,
    steps,
    transfers,
)

CASES = [("1f1b", 4, 8, 1), ("1f1b", 4, 2, 1), ("1f1b", 3, 7, 1), ("gpipe", 4, 6, 1), ("interleaved", 4, 8, 2),
         ("interleaved", 2, 6, 3), ("interleaved", 4, 4, 2), ("interleaved", 3, 9, 4)]


def names(xs: list[Step]) -> str:
    return " ".join(str(x) for x in xs)


def test_1f1b_order_per_stage() -> None:
    assert names(steps("1f1b", 4, 8, 1, 0)) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"
    assert names(steps("1f1b", 4, 8, 1, 2)) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7"
    assert names(steps("1f1b", 4, 8, 1, 3)) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"
    # fewer micro-batches than stages: all warm-up
    assert names(steps("1f1b", 4, 2, 1, 0)) == "F0 F1 B0 B1"


def test_gpipe_runs_every_forward_first() -> None:
    assert names(steps("gpipe", 3, 4, 1, 1)) == "F0 F1 F2 F3 B0 B1 B2 B3"


def test_interleaved_follows_megatron() -> None:
    # pp=2, v=2, m=4 on stage 0: warm-up (pp - 1) * 2 + (v - 1) * pp = 4 forwards, micro-batches in
    # groups of pp per chunk; then forward / backward pairs between which nothing is exchanged
    assert names(steps("interleaved", 2, 4, 2, 0)) == "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3"
    g = groups("interleaved", 2, 4, 2, 0)
    assert [len(x) for x in g] == [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1]
    with pytest.raises(ValueError, match="divisible by pp"):
        steps("interleaved", 4, 6, 2, 0)


@pytest.mark.parametrize("schedule, pp, m, v", CASES)
def test_every_step_once_and_backward_after_forward(schedule: Any, pp: int, m: int, v: int) -> None:
    for stage in range(pp):
        xs = steps(schedule, pp, m, v, stage)
        assert Counter((x.kind, x.mb, x.chunk) for x in xs) == Counter(
            (k, mb, c) for k in "FB" for mb in range(m) for c in range(v))
        pos = {(x.kind, x.mb, x.chunk): i for i, x in enumerate(xs)}
        assert all(pos[("F", mb, c)] < pos[("B", mb, c)] for mb in range(m) for c in range(v))
        # micro-batches of a chunk run in order, forward and backward
        for kind in "FB":
            for c in range(v):
                assert [x.mb for x in xs if x.kind == kind and x.chunk == c] == list(range(m))


@pytest.mark.parametrize("schedule, pp, m, v", CASES)
def test_sends_and_receives_match(schedule: Any, pp: int, m: int, v: int) -> None:
    sent: Counter[tuple[str, int, int, int]] = Counter()
    received: Counter[tuple[str, int, int, int]] = Counter()
    for stage in range(pp):
        for item in plan(schedule, pp, m, v, stage):
            if isinstance(item, tuple):
                assert item, "no empty batches"
                for t in item:
                    # (what, mb, producing chunk, stage it lands on)
                    dst = (stage + t.peer) % pp if t.send else stage
                    (sent if t.send else received)[(t.what, t.mb, t.src, dst)] += 1
    assert sent == received
    assert all(n == 1 for n in sent.values())
    # every chunk boundary is crossed once each way per micro-batch
    assert sum(k[0] == "act" for k in sent) == sum(k[0] == "grad" for k in sent) == m * (pp * v - 1)


def test_batches_pair_a_step_with_its_inputs() -> None:
    p = plan("1f1b", 2, 3, 1, 0)
    # stage 0 (first): F0 | send a0 | F1 | send a1 + recv g0 | B0, F2 (nothing to exchange between) |
    # send a2 + recv g1 | B1 | recv g2 | B2
    kinds = ["batch" if isinstance(x, tuple) else str(x) for x in p]
    assert kinds == ["F0", "batch", "F1", "batch", "B0", "F2", "batch", "B1", "batch", "B2"]
    assert p[3] == (Transfer("act", 1, 0, True, +1), Transfer("grad", 0, 1, False, +1))
    recv, send = transfers(Step("B", 1, 0), 2, 1, 1)
    assert recv == () and send == (Transfer("grad", 1, 1, True, -1),)


@pytest.mark.parametrize("schedule, pp, m, v, stage, want", [
    ("1f1b", 4, 8, 1, 0, 4), ("1f1b", 4, 8, 1, 3, 1), ("1f1b", 4, 2, 1, 0, 2), ("gpipe", 4, 8, 1, 2, 8),
    # interleaved stage 0: (pp - 1) * 2 + (v - 1) * pp warm-up chunk forwards plus the first steady one
    ("interleaved", 4, 8, 2, 0, 3 * 2 + 4 + 1),
])
def test_in_flight(schedule: Any, pp: int, m: int, v: int, stage: int, want: int) -> None:
    assert in_flight(schedule, pp, m, v, stage) == want


def test_bubble_formula() -> None:
    assert bubble_fraction(4, 12) == pytest.approx(3 / 15)
    assert bubble_fraction(4, 12, 2) == pytest.approx(3 / 27)
    assert bubble_fraction(1, 5) == 0


def _pipeline_job(tmp_path: Path, pp: int, m: int, schedule: str = "1f1b", v: int = 1) -> Any:
    """Uniform stages: one big block per chunk, a vocabulary too small to matter, one GPU per stage."""
    data = {"name": "bubble", "platform": "dgx_h100", "nodes": 1, "gpus_per_node": pp,
            "model": {"kind": "transformer", "layers": pp * v, "hidden": 4096, "heads": 32, "seq_len": 2048,
                      "vocab": 128},
            "training": {"micro_batch": 2, "global_batch": 2 * m, "precision": "bf16", "optimizer": "sgd",
                         "framework": "megatron"},
            "parallelism": {"pp": pp, "pp_schedule": schedule, "virtual_stages": v}}
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_job(path)


@pytest.mark.parametrize("pp, m, schedule, v", [(4, 4, "1f1b", 1), (4, 12, "1f1b", 1), (2, 6, "gpipe", 1),
                                                (4, 8, "interleaved", 2)])
def test_uniform_pipeline_bubble(tmp_path: Path, pp: int, m: int, schedule: str, v: int) -> None:
    """Idle share of stage 0 between its first kernel and its last backward kernel is the bubble."""
    rec = simulate(_pipeline_job(tmp_path, pp, m, schedule, v)).records
    k = rec[(rec["rank"] == 0) & (rec["kind"] == "kernel") & (rec["phase"].isin(["fwd", "bwd"]))]
    t0, t1 = k["start_s"].min(), k[k["phase"] == "bwd"]["end_s"].max()
    busy = (k["end_s"] - k["start_s"]).sum()
    idle = 1 - busy / (t1 - t0)
    assert idle == pytest.approx(bubble_fraction(pp, m, v), abs=0.03)
