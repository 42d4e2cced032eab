"""The serving kernel families (``mla_context``, ``mla_decode``, ``linear_attention``,
``sparse_attention``, ``quantize``, MLA's BMMs in ``bmm``) and the quantized dtypes (``fp8_block``,
``mxfp8``, ``mxfp4``, ``w4a16``; ``fp4`` on a GPU without an fp4 path).

The analytical model of each (monotone in its sizes, compute- or memory-bound where it should be,
each dtype at the peak of its tensor-core path); the AIConfigurator importer on every table the
families read (these skip without ``../shared/data``); the held-out error of a model fitted on a
random 80% of each GPU's shapes (seed 0, as ``python -m simgpu.fit`` reports it: geometric-mean
absolute error) within 8% for every GPU x family; and the shipped models loading without the data.
See ``docs/kernels-serving.md``.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pandas as pd
import pytest
from conftest import DATA, ROOT

from simgpu.config.loader import load_platform
from simgpu.graph import KernelSpec
from simgpu.kernels import learned, rules, store
from simgpu.kernels.analytical import Analytical, operand_bytes, peak_dtype
from simgpu.kernels.features import FAMILY_PARAMS, feature_frame, kernel_params
from simgpu.kernels.importers.aiconfigurator import read_aiconfigurator
from simgpu.kernels.learned import Sample, evaluate
from simgpu.kernels.registry import make_predictor

AIC = DATA / "kernels" / "aiconfigurator"
#: AIConfigurator's GPU folders and the platforms fitted on them.
GPUS = {"h100_sxm": "dgx_h100", "h200_sxm": "dgx_h200", "b200_sxm": "dgx_b200", "gb200": "gb200_nvl72"}
needs_data = pytest.mark.skipif(not all((AIC / g / "mla").is_dir() for g in GPUS),
                                reason=f"the published serving kernel tables are not in {AIC}")
SERVING = ("mla_context", "mla_decode", "linear_attention", "sparse_attention", "quantize")
NEW_MOE_DTYPES = ("fp8_block", "fp4", "mxfp4", "w4a16")
LIMIT = 0.08
#: Per-dtype labels allowed above :data:`LIMIT`: none (the Hopper w4a16 MoE rows, 10-11% without the
#: ``moe`` family's ``group_tokens``, are within it with it).
LABEL_LIMITS: dict[tuple[str, str], float] = {}
#: Rows per family and GPU the held-out test samples at most (the tables are smaller: all of them, as the
#: fit's report; a sample would leave the smaller dtypes' groups fewer rows than the fit has).
SAMPLE = 50000


def k(family: str, dtype: str = "bf16", **params: float) -> KernelSpec:
    return KernelSpec.make(family, dtype, **params)


def parts(platform: str, kernel: KernelSpec) -> tuple[float, float]:
    """The analytical model's (compute-bound, memory-bound) seconds of ``kernel``."""
    a = Analytical(load_platform(platform)[0])
    return a._families[kernel.family](kernel)


SHAPES = {
    "mla_context": k("mla_context", batch=2, seq_q=4096, seq_kv=4096, heads=16),
    "mla_decode": k("mla_decode", batch=64, seq_kv=4096, heads=16),
    "linear_attention": k("linear_attention", batch=4, seq_q=2048, heads_k=16, heads_v=32),
    "sparse_attention": k("sparse_attention", batch=1, seq_q=8192, seq_kv=8192, heads=16),
    "quantize": k("quantize", "fp8", m=4096, k=7168),
}
#: The parameters each family's time grows with.
SIZES = {"mla_context": ("batch", "seq_q", "seq_kv", "heads"), "mla_decode": ("batch", "seq_kv", "heads"),
         "linear_attention": ("batch", "seq_q", "heads_v"), "sparse_attention": ("batch", "seq_q", "seq_kv", "heads"),
         "quantize": ("m", "k")}


def test_the_families_and_their_parameters_are_declared():
    assert set(SERVING) <= set(FAMILY_PARAMS)
    assert FAMILY_PARAMS["mla_context"]["qk_head_dim"] == 192.0 and FAMILY_PARAMS["mla_context"]["causal"] == 1.0
    assert FAMILY_PARAMS["mla_decode"]["kv_lora"] == 512.0 and FAMILY_PARAMS["mla_decode"]["seq_q"] == 1.0
    assert FAMILY_PARAMS["sparse_attention"]["topk"] == 2048.0
    assert set(FAMILY_PARAMS["quantize"]) == {"m", "k", "block"}
    # NaN kv_bytes: the dtype's width
    assert kernel_params(k("mla_decode", "fp8", batch=1, seq_kv=8, heads=1))["kv_bytes"] == 1.0


@pytest.mark.parametrize("family", SERVING)
@pytest.mark.parametrize("platform", ["dgx_h100", "dgx_b200"])
def test_analytical_time_grows_with_every_size(family, platform):
    base = SHAPES[family]
    t0, _ = Analytical(load_platform(platform)[0]).predict([base])
    for name in SIZES[family]:
        bigger = KernelSpec.make(family, base.dtype, **{**dict(base.params), name: 2 * base.get(name)})
        t1, _ = Analytical(load_platform(platform)[0]).predict([bigger])
        assert t1[0] > t0[0], name


def test_compute_and_memory_bound_where_expected():
    compute = [SHAPES["mla_context"], SHAPES["sparse_attention"]]
    memory = [k("mla_decode", batch=1, seq_kv=8192, heads=16), SHAPES["quantize"],
              k("linear_attention", batch=256, seq_q=1, heads_k=16, heads_v=32, decode=1),
              k("sparse_attention", batch=1, seq_q=1, seq_kv=65536, heads=16, decode=1)]
    for kern in compute:
        c, m = parts("dgx_h100", kern)
        assert c > m, kern.family
    for kern in memory:
        c, m = parts("dgx_h100", kern)
        assert m > c, kern.family
    # Gated DeltaNet: the chunked prefill does more arithmetic per byte than the recurrent decode
    pre = parts("dgx_h100", SHAPES["linear_attention"])
    dec = parts("dgx_h100", k("linear_attention", batch=256, seq_q=1, heads_k=16, heads_v=32, decode=1))
    assert pre[0] / pre[1] > dec[0] / dec[1]
    # the sparse attention's keys are capped at top-k: past it, a longer context adds the indexer's work only
    short, long = (parts("dgx_h100", k("sparse_attention", batch=1, seq_q=1, seq_kv=s, heads=16, decode=1))
                   for s in (2048, 4096))
    assert long[0] < 2 * short[0]


def test_quantized_dtypes_run_at_their_tensor_core_paths_peak():
    h100, b200 = (load_platform(p)[0].gpu for p in ("dgx_h100", "dgx_b200"))
    assert [peak_dtype(d, h100.peak_tflops) for d in ("fp8_block", "mxfp8", "w4a16", "fp4", "mxfp4")] == [
        "fp8", "fp8", "bf16", "bf16", "bf16"]                     # Hopper: no fp4 path, the dequantize one
    assert [peak_dtype(d, b200.peak_tflops) for d in ("fp4", "mxfp4", "w4a16")] == ["fp4", "fp4", "bf16"]
    assert operand_bytes("w4a16", b200.peak_tflops)[::2] == (2.0, 2.0)
    assert operand_bytes("fp4", h100.peak_tflops)[0] == 2.0
    a = Analytical(load_platform("dgx_h100")[0])
    big = {d: a.predict([k("gemm", d, m=8192, n=8192, k=8192)])[0][0] for d in ("bf16", "fp8", "fp8_block", "fp4")}
    assert big["fp8"] == big["fp8_block"] < big["bf16"] == big["fp4"]   # compute-bound: the path's peak
    # a decode GEMM reads its weights: 4-bit ones in about a quarter of bf16's bytes; fp4 on Hopper no error
    small = {d: parts("dgx_h100", k("gemm", d, m=16, n=8192, k=8192)) for d in ("bf16", "w4a16", "fp4", "fp8_block")}
    assert small["w4a16"][1] < small["fp8_block"][1] < small["bf16"][1]
    assert small["fp4"][0] == small["w4a16"][0] and small["fp4"][1] == pytest.approx(small["w4a16"][1], rel=0.05)
    assert small["w4a16"][1] / small["bf16"][1] == pytest.approx(0.26, abs=0.01)
    moe = {d: a.predict([k("moe", d, rows=64, experts=8, hidden=4096, inter=2048)])[0][0] for d in ("bf16", "w4a16")}
    assert moe["w4a16"] < moe["bf16"]
    # the features tell fp8 from fp8_block (same peak and element width, other scales)
    f = feature_frame("gemm", [k("gemm", d, m=64, n=64, k=64) for d in ("fp8", "fp8_block")], h100)
    assert f["act_bytes"][0] < f["act_bytes"][1]


def test_rules_time_unmeasured_quantized_kernels_from_measured_ones():
    fp8 = k("quantize", "fp8", m=1024, k=4096, block=0)
    nvfp4 = k("quantize", "fp4", m=1024, k=4096, block=16)
    assert rules.kind(nvfp4) == "block16" and rules.kind(fp8) == "block0"
    assert rules.derive(nvfp4, lambda x: x == fp8) == [(nvfp4, fp8, rules.ROOFLINE)]
    assert rules.kind(k("bmm", b=16, m=8, n=512, k=128)) == "mla"
    assert rules.kind(k("bmm", b=16, m=8, n=64, k=64)) == "any"
    mx = k("gemm", "mxfp8", m=64, n=64, k=64)
    assert rules.derive(mx, lambda x: x.dtype == "fp8_block")[-1][1] == k("gemm", "fp8_block", m=64, n=64, k=64)


# -- the importer ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tables() -> dict[str, dict[str, pd.DataFrame]]:
    return {g: read_aiconfigurator(AIC / g) for g in GPUS}


@needs_data
def test_importer_reads_every_serving_table(tables):
    for g, ts in tables.items():
        for family in (*SERVING, "bmm", "moe", "gemm"):
            t = ts[family]
            assert len(t) > 500 and (t["median_s"] > 0).all(), (g, family)
            defaulted = {"b", "topk", "gated", "skew", "bwd", "qk_head_dim", "v_head_dim", "kv_lora", "rope_dim",
                         "causal", "kv_bytes"}
            assert set(FAMILY_PARAMS[family]) <= set(t.columns) | defaulted, (g, family)
            assert set(t["framework"]) <= {"trtllm", "vllm", "sglang"}
        assert set(ts["bmm"]["op"]) == {"mla_pre", "mla_post"}
        pre = ts["bmm"][ts["bmm"]["op"] == "mla_pre"]
        assert set(pre["k"]) == {128.0} and set(pre["n"]) == {512.0}
        assert set(ts["linear_attention"]["decode"]) == {0.0, 1.0}
        assert set(ts["sparse_attention"]["op"]) == {"prefill", "decode"}
        assert set(ts["quantize"]["dtype"]) == {"fp8"} and set(ts["quantize"]["block"]) == {0.0}
        assert "fp8_block" in set(ts["gemm"]["dtype"]) and "fp8_block" in set(ts["moe"]["dtype"])
        # TensorRT-LLM's table first: every family but a Blackwell MoE / DSA dtype comes from it
        for family in ("gemm", "mla_context", "mla_decode", "linear_attention", "quantize", "bmm"):
            assert set(ts[family]["framework"]) == {"trtllm"}, (g, family)
    for g in ("b200_sxm", "gb200"):
        moe = tables[g]["moe"]
        assert {"fp4", "mxfp4", "w4a16", "fp8_block"} <= set(moe["dtype"])
        assert set(moe[moe["dtype"] == "mxfp4"]["framework"]) == {"trtllm"}
        assert set(moe[moe["dtype"] == "bf16"]["framework"]) == {"vllm"}
    # a shape measured by two kernels of a framework is one row
    moe = tables["b200_sxm"]["moe"]
    key = ["dtype", "rows", "experts", "hidden", "inter", "topk", "gated", "skew"]
    assert not moe[moe["framework"] == "trtllm"].duplicated(key).any()


# -- held-out error ----------------------------------------------------------------------------------


def _heldout(gpu: str, family: str, table: pd.DataFrame) -> dict:
    if family == "moe":
        table = table[table["dtype"].isin(NEW_MOE_DTYPES)]
    if len(table) > SAMPLE:
        table = table.sample(SAMPLE, random_state=0)
    platform = load_platform(GPUS[gpu])[0]
    return evaluate(family, Sample.of(family, table.reset_index(drop=True), platform.gpu))


@needs_data
@pytest.mark.validation
def test_heldout_error_within_8_percent_for_every_gpu_and_family(tables):
    lines, bad = [], []
    for gpu, ts in tables.items():
        for family in (*SERVING, "bmm", "moe"):
            t = ts[family]
            if family == "bmm":
                t = t[t["op"].isin(["mla_pre", "mla_post"])]
            r = _heldout(gpu, family, t)
            lines.append(f"{gpu} {family}: {r['geomean_ape']:.1%} (analytical {r['analytical_geomean_ape']:.1%})")
            if not r["geomean_ape"] <= LIMIT:
                bad.append(lines[-1])
            for label, g in r.get("by", {}).items():
                if not g["geomean_ape"] <= LABEL_LIMITS.get((gpu, label), LIMIT):
                    bad.append(f"{gpu} {label}: {g['geomean_ape']:.1%}")
            assert r["geomean_ape"] < r["analytical_geomean_ape"]
    print("\n" + "\n".join(lines))
    assert not bad, "; ".join(bad)


# -- the shipped models --------------------------------------------------------------------------------


@pytest.mark.parametrize("platform", GPUS.values())
def test_shipped_models_load_without_the_data_and_time_every_family(platform, monkeypatch, tmp_path):
    monkeypatch.setenv("SIMGPU_DATA", str(tmp_path / "absent"))   # a fresh clone: no shared folder
    folder = store.platform_dir(platform)
    assert folder is not None
    manifest = store.read_manifest(folder / "models")
    assert manifest is not None and manifest["version"] == learned.VERSION
    assert manifest["baseline_sha256"] == learned.baseline_hash()
    assert set(SERVING) | {"bmm", "moe", "gemm"} <= set(manifest["families"])
    # which framework's table each dtype came from
    assert manifest["sources"][0]["frameworks"]["mla_decode"] == {"bf16": "trtllm"}
    files = [f"platforms/{platform}/models/{info['file']}" for info in manifest["families"].values()]
    if (ROOT / ".git").exists():   # committed, so that a clean checkout has them
        listed = subprocess.run(["git", "ls-files", "--", *files], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.split()
        assert sorted(listed) == sorted(files)
    p = make_predictor(("learned", "analytical"), load_platform(platform)[0])
    kernels = [*SHAPES.values(), k("bmm", b=16, m=64, n=512, k=128), k("moe", "fp8_block", rows=256, experts=32,
               hidden=7168, inter=2048)]
    secs, names = p.predict(kernels)
    assert names == ["lightgbm"] * len(kernels) and np.all(secs > 0)
    # an unmeasured target of quantize, through the rule
    _, names = p.predict([k("quantize", "fp4", m=4096, k=7168, block=16)])
    assert names == ["lightgbm (rule)"]


def test_gb200_is_timed_by_its_own_models():
    gb200 = load_platform("gb200_nvl72")[0]
    assert learned.models_folder(gb200) == store.platform_dir("gb200_nvl72")
