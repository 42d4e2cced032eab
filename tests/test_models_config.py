"""Models from their Hugging Face config.json: the adapters, the fields they set, the memory they
imply, the parallelism of served MoE models, and the refusals of bad configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import DATA, ROOT, edit_keys, refused_in_one_line
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu import run
from simgpu.config.hf import ADAPTERS, adapt, checkpoint_precision, read_config
from simgpu.config.loader import load_job
from simgpu.config.transformer import TransformerInferenceModel
from simgpu.precision import gemm_path
from simgpu.workload.inference.builder import deployment
from simgpu.workload.inference.memory import kv_bytes_per_token, request_state_bytes
from simgpu.workload.registry import World
from simgpu.workload.transformer.shapes import active_matmul_params, parameter_count

MODELS = ROOT / "workloads" / "models"
SAMPLE = DATA / "inference" / "aiconfigurator-silicon"
DSR1 = ROOT / "workloads" / "inference" / "deepseek_r1_fp8_8x_h200_adp8.yaml"

#: The published sizes (total, active per token; billions), from each model's card.
PUBLISHED = {"deepseek-r1": (671, 37), "gpt-oss-120b": (117, 5.1), "qwen3-235b-a22b": (235, 22),
             "qwen3-30b-a3b": (30.5, 3.3), "qwen3.5-397b-a17b": (397, 17), "glm-5": (744, 40)}


def _model(name: str) -> TransformerInferenceModel:
    fields, _ = adapt(read_config(MODELS / name / "config.json"))
    return TransformerInferenceModel.model_validate({**fields, "kind": "transformer_inference"})


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shipped_configs_give_the_published_sizes(name: str) -> None:
    md = _model(name)
    total, active = PUBLISHED[name]
    assert parameter_count(md) / 1e9 == pytest.approx(total, rel=0.03)
    assert active_matmul_params(md) / 1e9 == pytest.approx(active, rel=0.12)


def test_deepseek_config_reads_mla_shared_experts_and_dense_blocks() -> None:
    md = _model("deepseek-r1")
    assert md.mla is not None and md.mla.kv_lora_rank == 512 and md.mla.latent == 576
    assert md.moe is not None and md.moe.experts == 256 and md.moe.top_k == 8 and md.moe.shared_experts == 1
    assert md.moe.first_dense == 3 and not md.is_moe_layer(2) and md.is_moe_layer(3)
    assert md.shared_ffn == 2048 and md.d_head == 192


def test_gpt_oss_config_reads_alternating_windows_and_sinks() -> None:
    md = _model("gpt-oss-120b")
    assert md.count_kind("sliding") == md.count_kind("full") == 18
    assert md.sliding_window == 128 and md.attention_sinks and md.head_dim == 64
    assert md.moe is not None and md.moe.expert_bias


def test_qwen35_config_reads_hybrid_linear_attention() -> None:
    md = _model("qwen3.5-397b-a17b")
    assert md.count_kind("linear") == 45 and md.count_kind("full") == 15
    assert md.linear_attention is not None and md.linear_attention.value_heads == 64
    assert md.qk_norm and md.attention_output_gate


def _setup(workload: dict[str, object], tmp: Path):  # type: ignore[no-untyped-def]
    path = tmp / "w.yaml"
    path.write_text(yaml.safe_dump(workload))
    job = load_job(path)
    world = World(job.workload.nodes, job.workload.gpus_per_node or job.platform.node.gpus,
                  job.platform.gpu.memory_gib, gpu_dtypes=tuple(job.platform.gpu.peak_tflops))
    return job, deployment(job.workload, world)


def _served(config: str, **par: int) -> dict[str, object]:
    return {"name": "t", "platform": "dgx_h200", "nodes": 1, "model": {"config": str(MODELS / config / "config.json")},
            "inference": {"decode_requests": 8, "context_tokens": 1024}, "parallelism": {"tp": 1, **par}}


def test_mla_caches_the_latent_only(tmp_path: Path) -> None:
    _, dep = _setup(_served("deepseek-r1", attention_dp=8, moe_ep=8), tmp_path)
    # 61 blocks x (512 latent + 64 rotary key) x 1 byte (fp8 cache, from the fp8 checkpoint)
    assert kv_bytes_per_token(dep.setup, 1.0) == 61 * 576
    assert dep.inference.precision == "fp8_block" and dep.inference.kv == "fp8"


def test_sliding_and_linear_blocks_hold_bounded_state(tmp_path: Path) -> None:
    _, dep = _setup(_served("gpt-oss-120b"), tmp_path)
    s = dep.setup
    # 18 full blocks a token; 18 sliding blocks hold 128 tokens a request, whatever its length
    assert kv_bytes_per_token(s, 2.0) == 18 * 8 * 64 * 2 * 2
    assert request_state_bytes(s, 2.0) == 18 * 128 * 8 * 64 * 2 * 2
    _, dep = _setup(_served("qwen3.5-397b-a17b", tp=8, moe_tp=1, moe_ep=8), tmp_path)
    assert kv_bytes_per_token(dep.setup, 2.0) == 15 * 1 * 256 * 2 * 2  # 2 KV heads replicated over tp 8
    assert request_state_bytes(dep.setup, 2.0) > 45 * 64 * 128 * 128 * 4 / 8


def test_experts_split_as_the_deployment_says(tmp_path: Path) -> None:
    from simgpu.workload.transformer.shapes import block

    _, dep = _setup(_served("qwen3-235b-a22b", tp=8, moe_tp=1, moe_ep=8), tmp_path)
    ex = block(dep.setup, 0).experts
    assert ex is not None and ex.local == 16 and ex.fc2.inputs == 1536
    _, dep = _setup(_served("qwen3-235b-a22b", tp=8), tmp_path)  # experts tensor-split by default
    ex = block(dep.setup, 0).experts
    assert ex is not None and ex.local == 128 and ex.fc2.inputs == 1536 // 8


def test_inline_fields_override_the_config(tmp_path: Path) -> None:
    w = _served("qwen3-235b-a22b", tp=8)
    w["model"] = {**w["model"], "layers": 4, "moe": {"top_k": 2}}  # type: ignore[dict-item]
    job, _ = _setup(w, tmp_path)
    md = job.workload.model
    assert isinstance(md, TransformerInferenceModel)
    assert md.layers == 4 and md.moe is not None and md.moe.top_k == 2 and md.moe.experts == 128


def test_fp4_on_hopper_takes_the_dequantize_path() -> None:
    assert gemm_path("fp4", ["fp32", "bf16", "fp8"]) == "w4a16"
    assert gemm_path("fp4", ["fp32", "bf16", "fp8", "fp4"]) == "fp4"
    assert gemm_path("mxfp4", ["fp32", "fp16"]) is None
    assert gemm_path("fp8_block", ["fp32", "bf16"]) is None


def test_checkpoint_precisions() -> None:
    assert checkpoint_precision(MODELS / "deepseek-r1" / "config.json") == {"precision": "fp8_block"}
    assert checkpoint_precision(MODELS / "gpt-oss-120b" / "config.json") == {"moe_precision": "mxfp4"}
    assert checkpoint_precision(MODELS / "glm-5" / "config.json") == {}


@settings(max_examples=25, deadline=None)
@given(adp=st.sampled_from([1, 2, 4, 8]), tp=st.sampled_from([1, 2, 4, 8]), moe_tp=st.sampled_from([1, 2, 4, 8]))
def test_moe_split_covers_the_stage(adp: int, tp: int, moe_tp: int) -> None:
    """Whatever split is written, the experts' ranks are attention's: moe_tp x moe_ep = tp x attention_dp."""
    from pydantic import ValidationError

    from simgpu.config.parallelism import Parallelism

    if tp * adp % moe_tp:
        with pytest.raises(ValidationError):
            Parallelism(tp=tp, attention_dp=adp, moe_tp=moe_tp, moe_ep=max(1, tp * adp // moe_tp) + 1)
        return
    p = Parallelism(tp=tp, attention_dp=adp, moe_tp=moe_tp)
    a, mt, me = p.serving_split
    assert a == adp and mt * me == tp * adp


def _bad(tmp: Path, edits: dict[str, object], base: Path = DSR1) -> Path:
    data = yaml.safe_load(base.read_text())
    data["model"]["config"] = str((base.parent / data["model"]["config"]).resolve())
    edit_keys(data, edits)
    path = tmp / "w.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _unknown_arch(tmp: Path) -> str:
    cfg = json.loads((MODELS / "deepseek-r1" / "config.json").read_text())
    cfg["architectures"] = ["FancyNewForCausalLM"]
    (tmp / "fancy.json").write_text(json.dumps(cfg))
    return str(tmp / "fancy.json")


def _dense(tmp: Path) -> str:
    cfg = json.loads((MODELS / "qwen3-30b-a3b" / "config.json").read_text())
    cfg["architectures"] = ["Qwen3ForCausalLM"]  # the same widths, dense MLPs
    (tmp / "dense.json").write_text(json.dumps(cfg))
    return str(tmp / "dense.json")


BAD = {
    "unknown architecture": (lambda t: {"model.config": _unknown_arch(t)}, ["FancyNewForCausalLM", "expected"]),
    "missing config": (lambda t: {"model.config": str(t / "nope.json")}, ["model.config", "not found", "expected"]),
    "config not JSON": (lambda t: {"model.config": str(t / "w.yaml")}, ["not JSON", "expected"]),
    "ep that does not divide the experts": (lambda t: {"parallelism.moe_ep": 3, "parallelism.attention_dp": 3,
                                                       "nodes": 1, "gpus_per_node": 3},
                                            ["experts", "moe_ep=3", "expected"]),
    "attention_dp x tp that does not match the GPUs": (lambda t: {"parallelism.attention_dp": 3},
                                                       ["moe_ep (8) does not divide tp x attention_dp", "expected"]),
    "moe split that does not cover the stage": (lambda t: {"parallelism.moe_tp": 2},
                                                ["moe_tp x moe_ep (2 x 8)", "expected moe_tp x moe_ep = 8"]),
    "replicas that do not fill the GPUs": (lambda t: {"parallelism.attention_dp": 2, "parallelism.moe_ep": 2,
                                                      "gpus_per_node": 3},
                                           ["parallelism", "do not fill 3 GPUs", "expected"]),
    "fp4 where no path exists": (lambda t: {"platform": "dgx1_v100", "inference.precision": "nvfp4"},
                                 ["inference.precision", "V100", "expected"]),
    "moe split on a dense model": (lambda t: {"model.config": _dense(t)},
                                   ["parallelism.attention_dp", "has none", "expected"]),
}


@pytest.mark.parametrize("name", BAD)
def test_a_bad_model_config_is_refused_in_one_line(name: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    make, words = BAD[name]
    path = _bad(tmp_path, make(tmp_path))
    out = tmp_path / "out"
    line = refused_in_one_line(capsys, run.main, [str(path), "--out", str(out)])
    for w in words:
        assert w in line, (w, line)
    assert not out.exists()


@pytest.mark.skipif(not SAMPLE.is_dir(), reason=f"the serving sample is not at {SAMPLE} (../shared/data)")
def test_every_config_of_the_sample_loads_or_is_refused_by_name() -> None:
    from simgpu.errors import ConfigError

    loaded = 0
    for path in sorted((SAMPLE / "model_configs").glob("*_config.json")):
        if path.name.endswith("_hf_quant_config.json"):
            continue
        cfg = read_config(path)
        arch = cfg["architectures"][0]
        if arch in ADAPTERS:
            fields, _ = adapt(cfg)
            TransformerInferenceModel.model_validate({**fields, "kind": "transformer_inference"})
            loaded += 1
        else:
            with pytest.raises(ConfigError, match=arch):
                adapt(cfg)
    assert loaded >= 50


@pytest.mark.skipif(not SAMPLE.is_dir(), reason=f"the serving sample is not at {SAMPLE} (../shared/data)")
def test_the_sample_rows_are_listed_expressible_or_why_not() -> None:
    from simgpu.validate.silicon import table

    t = table(SAMPLE)
    assert len(t) == 3931
    assert t["expressible"].mean() > 0.9
    assert (t.loc[~t["expressible"], "reason"].str.len() > 0).all()
    every = set(t["model"])
    assert every == set(t.loc[t["expressible"], "model"]), "every model has some expressible rows"


def test_megatron_bridge_rows_are_written_or_skipped_with_a_reason() -> None:
    """Every Megatron-Bridge MoE row is either a workload that loads (its model from the shipped
    config.json) or skipped with its reason; the iteration times are `python -m
    simgpu.validate.moe_training`'s (see docs/models.md for where they stand)."""
    from simgpu.config.checks import check_job
    from simgpu.config.hf import expand
    from simgpu.config.loader import Job, load_platform, validate
    from simgpu.config.workload import WorkloadSpec
    from simgpu.validate.iterations import PUBLISHED
    from simgpu.validate.moe_training import cases, workload

    if not PUBLISHED.is_file():
        pytest.skip(f"the published rows are not at {PUBLISHED} (../shared/data)")
    rows = cases()
    assert {"Qwen3-30B-A3B", "Qwen3-235B-A22B", "GPT-OSS-120B", "DeepSeekV3-dropless"} <= set(rows["model"])
    for r in rows.itertuples():
        if r.skip:
            assert "not modelled" in r.skip or "too long" in r.skip or "do not split" in r.skip
            continue
        data = workload(r)
        spec = validate(WorkloadSpec, expand(data, "row"), "row")
        plat, pfile = load_platform("dgx_h100")
        check_job(Job(spec, plat, "row", pfile))
    assert (rows["skip"] == "").sum() >= 4


@settings(max_examples=30, deadline=None)
@given(pp=st.sampled_from([2, 4, 8]), v=st.sampled_from([1, 2, 4]), per=st.integers(2, 5))
def test_embedding_and_loss_in_the_pipeline_split(pp: int, v: int, per: int) -> None:
    """Megatron's split with the embedding and the loss counted: every block in exactly one chunk,
    in order, the first and the last chunk one block short."""
    from dataclasses import replace

    from simgpu.workload.transformer.shapes import make_setup

    layers = pp * v * per - 2
    path = ROOT / "workloads" / "qwen3_30b_a3b_2x_dgx_h100_ep8.yaml"
    job = load_job(path, ["model.layers=46", "parallelism.account_for_embedding_and_loss=true",
                          "parallelism.virtual_stages=1", "parallelism.pp_schedule=1f1b"])
    s = make_setup(job.workload, World(2, 8))
    assert s.embedding_in_split
    s = replace(s, model=s.model.model_copy(update={"layers": layers}), layout=replace(s.layout, pp=pp), v=v)
    chunks = [s.chunk_layers(g) for g in range(pp * v)]
    assert [i for c in chunks for i in c] == list(range(layers))
    assert len(chunks[0]) == len(chunks[-1]) == per - 1 and all(len(c) == per for c in chunks[1:-1])


#: Every model of the measured serving sample (its config.json in the sample's folder; the shipped
#: copies where they are the same) -> its MoE-ness decides the split.
SAMPLE_MODELS = {"deepseek-ai--DeepSeek-R1": True, "openai--gpt-oss-120b": True, "meta-llama--Meta-Llama-3.1-8B": False,
                 "meta-llama--Meta-Llama-3.1-70B": False, "Qwen--Qwen3-32B": False, "Qwen--Qwen3-235B-A22B": True,
                 "Qwen--Qwen3.5-397B-A17B": True, "zai-org--GLM-5": True, "deepseek-ai--DeepSeek-V3": True}


@pytest.mark.skipif(not SAMPLE.is_dir(), reason=f"the serving sample is not at {SAMPLE} (../shared/data)")
@pytest.mark.parametrize("name", sorted(SAMPLE_MODELS))
def test_every_model_of_the_sample_serves_and_trains(name: str, tmp_path: Path) -> None:
    """One serving iteration on an HGX H200 and one training iteration on a DGX H100, each model cut
    to its first 4 blocks (so that it fits one node; the blocks are the model's own)."""
    from simgpu.sim import simulate

    config = str(SAMPLE / "model_configs" / f"{name}_config.json")
    moe = SAMPLE_MODELS[name]
    model = {"config": config, "layers": 4}
    served = {"name": "s", "platform": "dgx_h200", "nodes": 1, "model": model,
              "inference": {"prefill_requests": 2, "prompt_tokens": 512, "decode_requests": 16, "context_tokens": 1024},
              "parallelism": {"tp": 1, "attention_dp": 8, "moe_ep": 8} if moe else {"tp": 8}}
    trained = {"name": "t", "platform": "dgx_h100", "nodes": 1, "model": {**model, "seq_len": 1024},
               "training": {"micro_batch": 1, "global_batch": 8, "precision": "bf16", "framework": "megatron"},
               "parallelism": {"tp": 1, "ep": 8, "zero": 1} if moe else {"tp": 8, "sp": True}}
    for i, w in enumerate((served, trained)):
        path = tmp_path / f"{i}.yaml"
        path.write_text(yaml.safe_dump(w))
        r = simulate(load_job(path))
        assert r.iteration_time_s > 0 and r.events > 0
        notes = r.meta.get("model_notes", [])
        if "DeepSeek" in name:
            assert any("multi-token-prediction" in n for n in notes)


@pytest.mark.skipif(not SAMPLE.is_dir(), reason=f"the serving sample is not at {SAMPLE} (../shared/data)")
def test_pre_quantised_checkpoints_of_the_sample() -> None:
    """compressed-tensors int4 experts (Kimi K2.5), ModelOpt NVFP4 with attention left out (DeepSeek),
    NVFP4 everywhere (Qwen3-235B), per-tensor fp8 (Llama-3.1-70B), each read as deployed."""
    m = SAMPLE / "model_configs"
    assert checkpoint_precision(m / "moonshotai--Kimi-K2.5_config.json") == {"moe_precision": "w4a16"}
    assert checkpoint_precision(m / "nvidia--DeepSeek-V3.1-NVFP4_config.json") == {"moe_precision": "fp4",
                                                                                  "kv_dtype": "fp8"}
    assert checkpoint_precision(m / "nvidia--Qwen3-235B-A22B-NVFP4_config.json") == {"precision": "fp4",
                                                                                    "kv_dtype": "fp8"}
    assert checkpoint_precision(m / "nvidia--Llama-3.1-70B-Instruct-FP8_config.json") == {"precision": "fp8",
                                                                                         "kv_dtype": "fp8"}
