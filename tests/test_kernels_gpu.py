"""The learned kernel models of the shipped GPU platforms.

Validation against the published measurements they are fitted on (``../shared/data/kernels/
aiconfigurator`` and ``vidur``; these tests skip without them): per GPU, a model fitted on a random
80% of each family's shapes (seed 0) times the other 20% within 4% (bf16 and fp8 GEMM), 6% (prefill
and decode attention) and 5% (Vidur's elementwise, norm and rotary ops), geometric-mean absolute
error, and better than the analytical model on every pair; with each of H100, H200 and B200 left
out of training, the models over the other GPUs time its bf16 GEMMs and attention within 15%.

The shipped models themselves, without the data: each names its sources with commit and licence,
a fresh clone (no shared folder) loads them, and every shipped GPU workload is timed mostly by them.
"""

from __future__ import annotations

import json

import pytest
from conftest import DATA, ROOT

from simgpu import load_job
from simgpu.fit import gpu_leave_out, gpu_samples
from simgpu.graph import KernelSpec
from simgpu.kernels import learned, rules, store
from simgpu.kernels.learned import Sample, evaluate
from simgpu.kernels.registry import make_predictor

AIC = DATA / "kernels" / "aiconfigurator"
needs_data = pytest.mark.skipif(not (AIC / "h100_sxm" / "gemm" / "gemm_perf.parquet").is_file()
                                or not (DATA / "kernels" / "vidur" / "compute").is_dir(),
                                reason=f"the published kernel tables are not in {DATA / 'kernels'}")
GPUS = ("dgx_a100", "dgx_h100", "dgx_h200", "dgx_b200")
#: Held-out limits per label ("dtype:op"); labels not listed are reported, not limited.
HELDOUT = {"bf16:gemm": 0.04, "fp8:gemm": 0.04, "fp4:gemm": 0.04, "bf16:prefill": 0.06, "bf16:decode": 0.06,
           "fp8:prefill": 0.06, "fp16:rope": 0.05, "fp16:add": 0.05, "fp16:swiglu": 0.05,
           "fp16:gather": 0.05, "fp16:rmsnorm": 0.05}
LEAVE_OUT = 0.15


@pytest.fixture(scope="module")
def samples() -> dict[str, dict[str, Sample]]:
    return gpu_samples()  # every measured platform, as `python -m simgpu.fit --gpu-leave-out` fits on


@pytest.fixture(scope="module")
def heldout(samples) -> dict[tuple[str, str], dict]:
    out = {}
    for family in ("gemm", "attention_fwd", "elementwise", "norm"):
        for gpu, sample in samples.get(family, {}).items():
            if gpu not in GPUS:
                continue
            res = evaluate(family, sample)
            for label, r in res.get("by", {"all": res}).items():
                out[(gpu, label if label != "all" else f"{sorted(sample.dtypes)[0]}:{family}")] = r
    return out


@needs_data
@pytest.mark.validation
def test_heldout_shapes_within_limits_and_better_than_analytical(heldout):
    lines, bad = [], []
    for (gpu, label), r in sorted(heldout.items()):
        lines.append(f"{gpu} {label}: {r['geomean_ape']:.1%} (analytical {r['analytical_geomean_ape']:.1%}, "
                     f"n={r['n_test']})")
        limit = HELDOUT.get(label)
        if limit is not None and not r["geomean_ape"] <= limit:
            bad.append(f"{gpu} {label} {r['geomean_ape']:.1%} > {limit:.0%}")
        if not r["geomean_ape"] < r["analytical_geomean_ape"]:
            bad.append(f"{gpu} {label}: learned {r['geomean_ape']:.1%} >= analytical")
    print("\n" + "\n".join(lines))
    assert not bad, "; ".join(bad)
    covered = {label for _, label in heldout}
    assert {"bf16:gemm", "fp8:gemm", "bf16:prefill", "bf16:decode", "fp16:rope", "fp16:rmsnorm"} <= covered
    assert {gpu for gpu, label in heldout if label == "bf16:gemm"} == set(GPUS)


@needs_data
@pytest.mark.validation
@pytest.mark.parametrize("family", ["gemm", "attention_fwd"])
def test_gpu_left_out_of_training(samples, family):
    left = gpu_leave_out(["dgx_h100", "dgx_h200", "dgx_b200"], [family], samples=samples)
    lines, bad = [], []
    for _, r in left[left["label"] == "bf16"].iterrows():
        lines.append(f"{r['gpu']} bf16 {family}: {r['geomean_ape']:.1%} (analytical {r['analytical_geomean_ape']:.1%})")
        if not r["geomean_ape"] <= LEAVE_OUT:
            bad.append(lines[-1])
    assert len(lines) == 3
    print("\n" + "\n".join(lines))
    assert not bad, "; ".join(bad)


def _manifest(name: str) -> dict:
    return json.loads((ROOT / "platforms" / name / "models" / store.MANIFEST).read_text())


@pytest.mark.parametrize("name", [*GPUS, "pcie_4gpu", "transfer"])
def test_shipped_models_name_their_data(name):
    m = _manifest(name)
    assert m["sources"] and m["version"] == learned.VERSION and m["baseline_sha256"] == learned.baseline_hash()
    for src in m["sources"]:
        assert src["commit"] and src["licence"] and src["repository"] and len(src["sha256"]) == 64
    for info in m["families"].values():
        assert (ROOT / "platforms" / name / "models" / info["file"]).is_file()


def test_fresh_clone_without_the_shared_folder_loads_the_shipped_models(monkeypatch, tmp_path):
    monkeypatch.setenv("SIMGPU_DATA", str(tmp_path / "absent"))
    job = load_job(ROOT / "workloads" / "gpt_2x_dgx_h100.yaml")
    p = make_predictor(("learned", "analytical"), job.platform)
    _, names = p.predict([KernelSpec.make("gemm", "bf16", m=4096, n=4096, k=4096)])
    assert names == ["lightgbm"]


@pytest.mark.parametrize("workload, share", [
    ("gpt_2x_dgx_h100", 0.9), ("llama2_70b_64x_h100", 0.9), ("gpt3_175b_1024x_a100", 0.9),
    ("bert_large_8x_a100", 0.7), ("mixtral_8x7b_64x_h100", 0.9), ("dlrm_2x_dgx_a100", 0.5)])
def test_shipped_workloads_are_timed_mostly_by_learned_models(workload, share):
    from simgpu.sim import build

    job = load_job(ROOT / "workloads" / f"{workload}.yaml")
    wl = build(job)
    secs, names = make_predictor(("learned", "analytical"), job.platform).predict(wl.kernels)
    learned_s = sum(s for s, n in zip(secs, names, strict=True) if n.startswith("lightgbm"))
    assert learned_s / secs.sum() >= share, f"{learned_s / secs.sum():.1%} learned"


def _with_fpe(k: KernelSpec, fpe: float) -> KernelSpec:
    return KernelSpec.make(k.family, k.dtype, **{**dict(k.params), "flops_per_element": fpe})


def test_rules():
    h100 = load_job(ROOT / "workloads" / "gpt_2x_dgx_h100.yaml").platform
    p = make_predictor("learned", h100)
    fwd = KernelSpec.make("attention_fwd", "bf16", batch=4, heads=16, seq_q=2048, seq_kv=2048, head_dim=128, causal=1)
    bwd = KernelSpec.make("attention_bwd", "bf16", **dict(fwd.params))
    bf16 = KernelSpec.make("elementwise", "bf16", numel=2**24, reads=2, writes=1, flops_per_element=1)
    fp16 = KernelSpec.make("elementwise", "fp16", numel=2**24, reads=2, writes=1, flops_per_element=1)
    opt = KernelSpec.make("optimizer", "fp32", numel=2**24, states=2)
    same_bytes = KernelSpec.make("elementwise", "fp16", numel=2**24 * 4 * 7 / 6, reads=2, writes=1,
                                 flops_per_element=1)
    secs, names = p.predict([fwd, bwd, bf16, fp16, opt, same_bytes])
    assert names[0] == "lightgbm" and names[1] == "lightgbm (rule)" and names[2] == "lightgbm (rule)"
    assert secs[1] == pytest.approx(secs[0] * rules.ATTENTION_BWD_FLOPS / rules.ATTENTION_BWD_EFFICIENCY)
    assert secs[2] == secs[3] and secs[4] == pytest.approx(secs[5])
    # a batched GEMM follows the GEMM of its tiles, by the roofline's ratio of the two
    bmm = KernelSpec.make("bmm", "bf16", b=32, m=512, n=512, k=128)
    assert rules.derive(bmm, lambda k: k.family == "gemm" and k.dtype == "bf16") == [
        (bmm, KernelSpec.make("gemm", "bf16", m=32 * 512, n=512, k=128), rules.ROOFLINE)]
    # a full (non-causal) prefill's backward: backward -> forward -> causal forward
    full = KernelSpec.make("attention_bwd", "bf16", batch=8, heads=16, seq_q=512, seq_kv=512, head_dim=64, causal=0)
    steps = rules.derive(full, lambda k: k.family == "attention_fwd" and rules.kind(k) == "causal")
    assert [rules.kind(b) for _, b, _ in steps] == ["full", "causal"] and steps[-1][2] == pytest.approx(1.6)
    assert rules.full_over_causal(1 << 20, 1 << 20) == pytest.approx(2.0, rel=1e-3)
    # models fitted on published tables time only the kinds those measured: a dropout is not a SwiGLU
    dropout = KernelSpec.make("elementwise", "bf16", numel=2**24, reads=1, writes=2, flops_per_element=20)
    secs, names = p.predict([dropout, _with_fpe(dropout, 1.0)])
    assert names[0] == "lightgbm (rule)" and secs[0] >= secs[1]
    # no rule for a softmax: it falls through to the next model of the chain
    assert rules.derive(KernelSpec.make("softmax", "bf16", rows=8, cols=8), lambda k: k.family != "softmax") is None


def test_b200_is_faster_than_h100_on_the_same_job():
    from simgpu import simulate

    h100 = simulate(load_job(ROOT / "workloads" / "gpt_2x_dgx_h100.yaml"))
    b200 = simulate(load_job(ROOT / "workloads" / "gpt_2x_dgx_h100.yaml", ["platform=dgx_b200"]))
    assert b200.iteration_time_s < 0.8 * h100.iteration_time_s
