"""tp_comm_overlap (Transformer Engine's userbuffers): the forward all-gathers as ring exchanges
with a GEMM chunk per step, the row-parallel GEMMs in chunks beside their reduce-scatters, the
backward's bulk overlaps beside the column-parallel dgrad and wgrad GEMMs, the SMs those take (the
ub config's num_sm per layer); the work done stays the same."""

from __future__ import annotations

import pytest
from conftest import run_programs

from simgpu import load_job, simulate
from simgpu.errors import ConfigError
from simgpu.graph import Op, Program
from simgpu.sim import build
from simgpu.workload.transformer.blocks import UB_SPLITS, _split

GPT = "workloads/gpt_2x_dgx_h100.yaml"
TP = ["model.layers=1", "model.hidden=8192", "model.heads=64", "parallelism.tp=8", "parallelism.dp=2",
      "parallelism.sp=true", "training.framework=megatron", "training.precision=bf16"]


def gemms(ops: list[Op], name: str, kernels) -> list[tuple[int, int, int]]:
    out = []
    for o in ops:
        if o.name == name:
            p = dict(kernels[o.kernel].params)
            out.append((int(p["m"]), int(p["n"]), int(p["k"])))
    return out


def test_needs_sequence_parallelism():
    with pytest.raises(ConfigError, match="expected sp: true and tp > 1"):
        load_job(GPT, ["parallelism.tp=8", "parallelism.dp=2", "parallelism.tp_comm_overlap=true"])


def test_split_rows_cover_the_tokens():
    assert _split(10, 4) == [3, 3, 2, 2]
    assert _split(3, 8) == [1, 1, 1]
    assert sum(_split(8192, 8)) == 8192


def test_gemms_split_but_the_work_stays():
    off = build(load_job(GPT, TP))
    on = build(load_job(GPT, [*TP, "parallelism.tp_comm_overlap=true"]))
    a, b = off.programs[0].ops, on.programs[0].ops
    for name, parts in (("h0.attn.qkv.fwd", 8), ("h0.mlp.fc1.fwd", 8), ("h0.attn.proj.fwd", UB_SPLITS),
                        ("h0.mlp.fc2.fwd", UB_SPLITS), ("h0.attn.proj.dgrad", 8), ("h0.mlp.fc2.dgrad", 8)):
        whole, chunks = gemms(a, name, off.kernels), gemms(b, name, on.kernels)
        assert len(whole) == 1 and len(chunks) == parts, name
        m, n, k = whole[0]
        assert sum(c[0] for c in chunks) == m and {c[1:] for c in chunks} == {(n, k)}, name
    sends = [o for o in b if o.name == "h0.ln1.ring_send"]
    recvs = [o for o in b if o.name == "h0.ln1.ring_recv"]
    assert len(sends) == len(recvs) == 7
    assert sum(o.nbytes for o in recvs) * 8 // 7 == next(o.nbytes for o in a if o.name == "h0.ln1.all_gather")
    taken = [o.sm_taken for o in b if o.name == "h0.attn.proj.fwd"]
    assert taken == [0] + [16] * (UB_SPLITS - 1)   # Transformer Engine's default num_sm
    assert not any(o.name == "h0.ln1.all_gather" for o in b)


def test_runs_and_hides_the_all_gathers():
    off = simulate(load_job(GPT, TP))
    on = simulate(load_job(GPT, [*TP, "parallelism.tp_comm_overlap=true"]))
    assert on.iteration_time_s < off.iteration_time_s


def test_sm_taken_stretches_the_kernel(dgx_a100):
    """A kernel beside a communication kernel that holds c of the GPU's S SMs lasts S / (S - c) as long."""
    sms = dgx_a100.gpu.sms
    prog = Program(0, [Op("k", "kernel", "gemm", kernel=0, sm_taken=16)])
    res = run_programs(dgx_a100, 1, [prog], [100e-6], gpus_per_node=1, sms=sms)
    assert res.iteration_time_s == pytest.approx(100e-6 * sms / (sms - 16), rel=1e-9)


#: NeMo's GPT-3 175B bf16 userbuffers config (userbuffers_bf16_h100_h12288_tp4_mbs1_seqlen2048).
NEMO_175B = ["parallelism.tp_comm_overlap_sms.qkv_dgrad=4", "parallelism.tp_comm_overlap_sms.qkv_wgrad=4",
             "parallelism.tp_comm_overlap_sms.fc1_dgrad=2", "parallelism.tp_comm_overlap_sms.fc1_wgrad=4",
             "parallelism.tp_comm_overlap_sms.proj_fprop=24"]


def test_bulk_overlaps_take_the_ub_configs_sms():
    """The qkv and fc1 dgrad GEMMs run beside the input's all-gather and the wgrad GEMMs beside the
    input gradient's reduce-scatter, each on the SMs the ub config leaves them; without the overlap
    they take none (NCCL's kernels slow them by the platform's figure instead)."""
    def taken(extra: list[str]) -> dict[str, int]:
        ops = build(load_job(GPT, [*TP, *extra])).programs[0].ops
        return {o.name: o.sm_taken for o in ops if o.name.startswith("h0.") and o.name.endswith(("grad", "fwd"))
                and o.kind == "kernel" and (o.name.endswith((".dgrad", ".wgrad")) or ".proj.fwd" in o.name)}
    off, on, nemo = taken([]), taken(["parallelism.tp_comm_overlap=true"]), taken(
        ["parallelism.tp_comm_overlap=true", *NEMO_175B])
    assert not any(off.values())
    for lin in ("h0.attn.qkv", "h0.mlp.fc1"):
        assert on[f"{lin}.dgrad"] == on[f"{lin}.wgrad"] == 16
    assert (nemo["h0.attn.qkv.dgrad"], nemo["h0.attn.qkv.wgrad"], nemo["h0.mlp.fc1.dgrad"],
            nemo["h0.mlp.fc1.wgrad"], nemo["h0.attn.proj.fwd"]) == (4, 4, 2, 4, 24)
    assert on["h0.attn.proj.dgrad"] == on["h0.mlp.fc2.dgrad"] == 0   # ring exchanges: the copy engines


def test_fewer_sms_for_the_bulk_overlaps_shorten_the_gemms_beside_them():
    """NeMo's GPT-3 175B config gives the backward's communication 4 SMs instead of 16: the qkv
    dgrad and wgrad GEMMs beside it keep more of the 132 SMs, (132 - 16) / (132 - 4) of the time."""
    def spans(extra: list[str]) -> dict[str, float]:
        rec = simulate(load_job(GPT, [*TP, "parallelism.tp_comm_overlap=true", *extra])).records
        rec = rec[(rec["rank"] == 0) & (rec["stream"] == "compute")]
        return {n: float((r["end_s"] - r["start_s"]).iloc[0]) for n, r in rec.groupby("name")
                if n in ("h0.attn.qkv.dgrad", "h0.attn.qkv.wgrad")}
    on, nemo = spans([]), spans(NEMO_175B[:4])
    for name in ("h0.attn.qkv.dgrad", "h0.attn.qkv.wgrad"):
        assert nemo[name] / on[name] == pytest.approx((132 - 16) / (132 - 4), rel=1e-6)


def test_ub_sms_need_tp_comm_overlap():
    with pytest.raises(ConfigError, match="expected tp_comm_overlap: true"):
        load_job(GPT, [*TP, "parallelism.tp_comm_overlap_sms.qkv_dgrad=4"])
