"""The op identity of elementwise kernels: ``flops_per_element``, its table of op costs, the feature
the learned models see, the analytical model's roofline, the measurement tables that derive it from
their ``op`` column, NeuSight's rows that keep the default, and the builders that emit it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT

from simgpu.bench.cases import ELEMENTWISE
from simgpu.config.loader import load_platform
from simgpu.config.workload import WorkloadSpec
from simgpu.elementwise import DEFAULT_FLOPS_PER_ELEMENT, FLOPS_PER_ELEMENT, flops_per_element
from simgpu.errors import ConfigError
from simgpu.graph import KernelSpec, Workload
from simgpu.kernels import store
from simgpu.kernels.analytical import Analytical
from simgpu.kernels.features import FAMILY_PARAMS, feature_frame, kernel_params, kernels_from_table
from simgpu.kernels.importers import read_neusight
from simgpu.kernels.registry import make_predictor
from simgpu.workload import World, get_builder

CPU_HOST = ROOT / "platforms" / "cpu_host"
N = 2**19  # a GPT-small MLP activation: 4 x 128 tokens x 1024


def ew(op: str, dtype: str = "fp32", numel: int = N, reads: int = 1, writes: int = 1) -> KernelSpec:
    return KernelSpec.make("elementwise", dtype, numel=numel, reads=reads, writes=writes,
                           flops_per_element=flops_per_element(op))


# ---- the table -------------------------------------------------------------------------------------


def test_every_measured_op_has_a_cost_and_the_costs_are_ordered():
    measured = set(pd.read_csv(CPU_HOST / "microbench" / "elementwise.csv")["op"])
    assert measured <= set(FLOPS_PER_ELEMENT) and set(ELEMENTWISE) <= set(FLOPS_PER_ELEMENT)
    assert all(v >= 0 for v in FLOPS_PER_ELEMENT.values())
    c = FLOPS_PER_ELEMENT
    assert c["copy"] == c["zero"] == c["cat"] == c["transpose"] == 0
    assert c["add"] == c["mul"] == c["relu"] == c["sum_rows"] == DEFAULT_FLOPS_PER_ELEMENT == 1
    assert c["relu"] < c["relu_bwd"] < c["gelu"] < c["gelu_bwd"]
    assert c["gelu"] >= 20  # an erf polynomial and an exponential, not a handful of operations
    with pytest.raises(KeyError, match="known: "):
        flops_per_element("conv")


# ---- the feature -----------------------------------------------------------------------------------


def test_the_cost_is_a_feature_with_a_default_and_scales_the_flops(dgx_a100):
    assert FAMILY_PARAMS["elementwise"]["flops_per_element"] == DEFAULT_FLOPS_PER_ELEMENT
    bare = KernelSpec.make("elementwise", "fp32", numel=N)
    assert kernel_params(bare)["flops_per_element"] == DEFAULT_FLOPS_PER_ELEMENT
    x = feature_frame("elementwise", [ew("copy"), bare, ew("gelu"), ew("gelu_bwd", reads=2)], dgx_a100.gpu)
    assert "log_flops_per_element" in x.columns
    assert np.isfinite(x.to_numpy(dtype=float)).all()
    assert list(x["log_flops"]) == sorted(x["log_flops"]) and x["log_flops"].is_unique
    assert x["log_bytes"][0] == x["log_bytes"][2]  # same traffic: only the arithmetic tells them apart


def test_analytical_time_is_monotone_in_the_cost():
    ops = sorted(FLOPS_PER_ELEMENT, key=FLOPS_PER_ELEMENT.__getitem__)
    for name in ("cpu_host", "dgx_a100", "dgx_h100"):
        model = Analytical(load_platform(name)[0])
        for dtype in ("fp32", "bf16"):
            t, _ = model.predict([ew(op, dtype) for op in ops])
            assert (np.diff(t) >= 0).all(), (name, dtype)


def test_analytical_gelu_is_compute_bound_on_a_cpu_core_and_memory_bound_on_a_gpu():
    cpu = Analytical(load_platform("cpu_host")[0])
    (copy, gelu, gelu_bwd, add), _ = cpu.predict([ew("copy", "bf16"), ew("gelu", "bf16"),
                                                  ew("gelu_bwd", "bf16", reads=2), ew("add", "bf16", reads=2)])
    assert gelu > 1.5 * copy and gelu_bwd > 1.5 * add
    # as NeuSight measured on every GPU: a GELU takes a ReLU's (a copy's) time
    gpu = Analytical(load_platform("dgx_a100")[0])
    (copy, relu, gelu), _ = gpu.predict([ew("copy"), ew("relu"), ew("gelu")])
    assert copy == relu == gelu


def test_cpu_host_models_time_gelu_as_several_adds():
    learned = make_predictor("learned", load_platform("cpu_host")[0])
    t, names = learned.predict([ew("copy"), ew("add", reads=2), ew("gelu"), ew("gelu_bwd", reads=2)])
    copy, add, gelu, gelu_bwd = t
    assert set(names) == {"lightgbm"}
    assert gelu > 2 * copy and gelu > 2 * add and gelu_bwd > 1.5 * gelu


# ---- measurement tables ----------------------------------------------------------------------------


def test_measurement_tables_derive_the_cost_from_their_op():
    assert "flops_per_element" not in store.columns("elementwise")  # the harness's files keep their columns
    table = pd.DataFrame({"op": ["gelu", "copy", "relu_bwd"], "dtype": "fp32", "numel": 1024.0,
                          "reads": [1.0, 1.0, 2.0], "writes": 1.0})
    specs = kernels_from_table("elementwise", table)
    assert [k.get("flops_per_element") for k in specs] == [FLOPS_PER_ELEMENT[o] for o in table["op"]]
    assert "flops_per_element" not in table.columns  # the caller's table is left as it was
    given = kernels_from_table("elementwise", table.assign(flops_per_element=7.0))
    assert {k.get("flops_per_element") for k in given} == {7.0}
    with pytest.raises(ConfigError, match="conv"):
        kernels_from_table("elementwise", table.assign(op="conv"))
    with pytest.raises(ConfigError, match="'op' column"):
        kernels_from_table("elementwise", table.drop(columns="op"))


def test_neusight_rows_keep_the_default_cost(tmp_path: Path):
    (tmp_path / "linear.csv").write_text("OPName,Latency,Device,B,H,M,N,K\n")
    rows = [("gelu", 0.05), ("add", 0.07), ("tanh", 0.05)]
    (tmp_path / "elem.csv").write_text("OPName,Latency,Device,B,H\n" + "".join(
        f"{op},{ms},NVIDIA A100-PCIE-40GB,1024,4096\n" for op, ms in rows))
    t = read_neusight(tmp_path, ("elementwise",))["elementwise"]
    assert (t["flops_per_element"] == DEFAULT_FLOPS_PER_ELEMENT).all()
    assert {k.get("flops_per_element") for k in kernels_from_table("elementwise", t)} == {DEFAULT_FLOPS_PER_ELEMENT}


# ---- builders --------------------------------------------------------------------------------------


def _build(model: dict[str, Any], training: dict[str, Any] | None = None) -> Workload:
    spec = WorkloadSpec.model_validate({
        "name": "w", "platform": "test", "model": model,
        "training": {"batch_per_gpu": 2, "precision": "bf16", "optimizer": "adam", **(training or {})}})
    return get_builder(spec.model.kind)(spec, World(1, 2))


def _costs(w: Workload) -> dict[str, set[float]]:
    """Elementwise op name (without the layer) -> the costs its kernels carry."""
    out: dict[str, set[float]] = {}
    for p in w.programs:
        for op in p.ops:
            if op.kind == "kernel" and w.kernels[op.kernel].family == "elementwise":
                out.setdefault(op.name.split(".")[-1], set()).add(w.kernels[op.kernel].get("flops_per_element"))
    return out


GPT = {"kind": "transformer", "layers": 2, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1000}
DLRM = {"kind": "dlrm", "dense_features": 13, "bottom_mlp": [64, 16], "top_mlp": [64, 1], "embedding_dim": 16,
        "tables": [{"rows": 1000, "pooling_factor": 2.0, "count": 4}]}


def test_transformer_builders_emit_their_activations_cost():
    gpt = _costs(_build({**GPT, "dropout": 0.1}))
    assert gpt["gelu"] == {FLOPS_PER_ELEMENT["gelu"]} and gpt["gelu_bwd"] == {FLOPS_PER_ELEMENT["gelu_bwd"]}
    assert gpt["dropout"] == {FLOPS_PER_ELEMENT["dropout"]} and gpt["residual"] == {FLOPS_PER_ELEMENT["add"]}
    assert gpt["bias_grad"] == {FLOPS_PER_ELEMENT["sum_rows"]} and gpt["cast"] == {FLOPS_PER_ELEMENT["cast"]}
    assert gpt["tok_gather"] == {FLOPS_PER_ELEMENT["gather"]} and gpt["tok_grad_zero"] == {0.0}
    # every other block MoE: the dense blocks' SwiGLU is a kernel, the experts' is in their moe kernel
    llama = _costs(_build({**GPT, "arch": "llama", "moe": {"experts": 4, "every": 2}}, {"framework": "megatron"}))
    assert llama["swiglu"] == {FLOPS_PER_ELEMENT["swiglu"]}
    assert llama["swiglu_bwd"] == {FLOPS_PER_ELEMENT["swiglu_bwd"]}
    assert llama["rope"] == llama["rope_bwd"] == {FLOPS_PER_ELEMENT["rope"]}
    assert llama["unpermute"] == {FLOPS_PER_ELEMENT["moe_combine"]}
    assert llama["residual"] == {FLOPS_PER_ELEMENT["bias_residual_add"]}
    assert "gelu" not in llama


def test_dlrm_builder_emits_relu_and_gather_costs():
    dot = _costs(_build(DLRM, {"precision": "fp32"}))
    assert dot["relu"] == {1.0} and dot["relu_bwd"] == {FLOPS_PER_ELEMENT["relu_bwd"]}
    assert dot["triu_gather"] == {FLOPS_PER_ELEMENT["gather"]}
    assert dot["triu_scatter"] == {FLOPS_PER_ELEMENT["scatter_add"]}
    assert dot["cat"] == {0.0} and dot["fwd"] == {FLOPS_PER_ELEMENT["bce_logits"]}
    dcn = _costs(_build({**DLRM, "interaction": "dcn", "dcn": {"layers": 2}}, {"precision": "fp32"}))
    assert dcn["mul_add"] == {FLOPS_PER_ELEMENT["fma"]} and dcn["mul_bwd"] == {FLOPS_PER_ELEMENT["fma_bwd"]}


def test_every_elementwise_kernel_of_the_shipped_workloads_carries_a_known_cost():
    from simgpu.config.loader import load_job
    from simgpu.sim import build

    known = set(FLOPS_PER_ELEMENT.values())
    for path in sorted((ROOT / "workloads").glob("*.yaml")):
        w = build(load_job(path), fold=True)
        costs = {k.get("flops_per_element") for k in w.kernels if k.family == "elementwise"}
        assert costs and costs <= known, path.stem
