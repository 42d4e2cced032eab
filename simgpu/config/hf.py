"""A Transformer from its Hugging Face ``config.json``: one adapter per architecture.

``model: {config: path/to/config.json}`` in a workload reads the file (a path relative to the
workload file) through the adapter of its ``architectures[0]`` into the fields a
:class:`~simgpu.config.transformer.TransformerModel` has; fields written beside ``config`` override the
file's. ``kind`` defaults to ``transformer_inference`` where the workload has an ``inference``
section, else ``transformer``; a served model's ``seq_len`` defaults to the config's
``max_position_embeddings``, while a trained one needs its training sequence written.

Each adapter reads what sets the kernels' shapes and the memory (layers, widths, heads and head
dims, MLA ranks, experts, shared experts, first dense blocks, sliding windows, layer types, linear
attention) and lists what it reads but approximates, or leaves out: :func:`notes` gives those lines
for the summary. A config whose architecture has no adapter is refused, naming it. Where the file
says how the checkpoint is quantised (its ``quantization_config``, or an ``hf_quant_config.json``
beside it), :func:`checkpoint_precision` gives the serving precisions it implies.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError

Fields = dict[str, Any]
Adapter = Callable[[dict[str, Any]], tuple[Fields, list[str]]]


def read_config(path: Path, key: str = "model.config") -> dict[str, Any]:
    """The JSON object of ``path``; a missing file, or one that is not a JSON object, is refused."""
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}; expected a Hugging Face config.json (a path relative to "
                          "the workload file)", key=key)
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not JSON ({e}); expected a Hugging Face config.json", key=key) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a JSON {type(data).__name__}; expected an object (a config.json)", key=key)
    return data


def _text(cfg: dict[str, Any]) -> dict[str, Any]:
    """A multimodal config's language model (``text_config``), over the outer fields."""
    inner = cfg.get("text_config")
    return {**cfg, **inner} if isinstance(inner, dict) else cfg


def _need(cfg: dict[str, Any], *names: str) -> Any:
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    raise ConfigError(f"the config has no {names[0]!r}; expected it for its architecture",
                      key=f"model.config.{names[0]}")


def _decoder(cfg: dict[str, Any]) -> Fields:
    """What every decoder of the sample shares: a LLaMA-style block (RMSNorm, RoPE, SwiGLU)."""
    out: Fields = {"arch": "llama", "layers": _need(cfg, "num_hidden_layers"), "hidden": _need(cfg, "hidden_size"),
                   "heads": _need(cfg, "num_attention_heads"), "vocab": _need(cfg, "vocab_size"),
                   "bias": bool(cfg.get("attention_bias", False)),
                   "tied_embeddings": bool(cfg.get("tie_word_embeddings", False))}
    if cfg.get("num_key_value_heads") not in (None, cfg["num_attention_heads"]):
        out["kv_heads"] = cfg["num_key_value_heads"]
    if cfg.get("head_dim") and cfg["head_dim"] != cfg["hidden_size"] // cfg["num_attention_heads"]:
        out["head_dim"] = cfg["head_dim"]
    if cfg.get("intermediate_size"):
        out["ffn_hidden"] = cfg["intermediate_size"]
    if cfg.get("max_position_embeddings"):
        out["seq_len"] = cfg["max_position_embeddings"]
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swiglu"):
        raise ConfigError(f"hidden_act {act!r} is not modelled; expected silu (SwiGLU MLPs)",
                          key="model.config.hidden_act")
    return out


def _common_notes(cfg: dict[str, Any]) -> list[str]:
    notes = []
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if isinstance(rope, dict) and (rope.get("type") or rope.get("rope_type")) not in (None, "default"):
        notes.append(f"rope_scaling {rope.get('type') or rope.get('rope_type')}: no kernel of its own (RoPE timed "
                     "as plain)")
    mtp = cfg.get("num_nextn_predict_layers") or cfg.get("mtp_num_hidden_layers") or cfg.get("num_mtp_modules")
    if mtp:
        notes.append(f"{mtp} multi-token-prediction layer(s): ignored (no speculative decoding)")
    if isinstance(cfg.get("vision_config"), dict):
        notes.append("vision encoder: ignored (text tokens only)")
    return notes


def _moe(cfg: dict[str, Any], experts_key: str, width_key: str) -> Fields:
    moe: Fields = {"experts": _need(cfg, experts_key), "top_k": _need(cfg, "num_experts_per_tok", "experts_per_token"),
                   "expert_ffn_hidden": _need(cfg, width_key)}
    return moe


def llama(cfg: dict[str, Any]) -> tuple[Fields, list[str]]:
    """LlamaForCausalLM, MistralForCausalLM: dense GQA decoders."""
    return _decoder(cfg), _common_notes(cfg)


def mixtral(cfg: dict[str, Any]) -> tuple[Fields, list[str]]:
    """MixtralForCausalLM: every block's MLP is num_local_experts SwiGLU experts of intermediate_size."""
    out = _decoder(cfg)
    out["moe"] = _moe(cfg, "num_local_experts", "intermediate_size")
    notes = _common_notes(cfg)
    if cfg.get("sliding_window"):
        notes.append(f"sliding_window {cfg['sliding_window']}: not applied (Mixtral's serving engines attend fully)")
    return out, notes


def qwen3(cfg: dict[str, Any]) -> tuple[Fields, list[str]]:
    """Qwen3ForCausalLM: a free head_dim and an RMSNorm over each head's query and key (QK-norm)."""
    out = _decoder(cfg)
    out["qk_norm"] = True
    notes = _common_notes(cfg)
    if cfg.get("use_sliding_window"):
        notes.append("use_sliding_window: not applied")
    return out, notes


def qwen3_moe(cfg: dict[str, Any]) -> tuple[Fields, list[str]]:
    """Qwen3MoeForCausalLM: Qwen3's attention, MoE MLPs of moe_intermediate_size (no shared expert;
    decoder_sparse_step apart, mlp_only_layers dense)."""
    out, notes = qwen3(cfg)
    moe = _moe(cfg, "num_experts", "moe_intermediate_size")
    if cfg.get("decoder_sparse_step", 1) != 1:
        moe["every"] = cfg["decoder_sparse_step"]
    if cfg.get("shared_expert_intermediate_size"):
        moe.update(shared_experts=1, shared_ffn_hidden=cfg["shared_expert_intermediate_size"])
    dense = cfg.get("mlp_only_layers") or []
    if dense:
        if list(dense) != list(range(len(dense))):
            raise ConfigError(f"mlp_only_layers {dense} are not the first blocks; expected dense blocks first only",
                              key="model.config.mlp_only_layers")
        moe["first_dense"] = len(dense)
    out["moe"] = moe
    if cfg.get("norm_topk_prob"):
        notes.append("norm_topk_prob: the renormalised top-k weights cost no kernel of their own")
    return out, notes


def deepseek_v3(cfg: dict[str, Any]) -> tuple[Fields, list[str]]:
    """DeepseekV3ForCausalLM (DeepSeek-V3/R1, Kimi K2): MLA, routed + shared experts, first dense blocks."""
    out = _decoder(cfg)
    out.pop("kv_heads", None)
    out.pop("head_dim", None)
    out["mla"] = {"q_lora_rank": cfg.get("q_lora_rank"), "kv_lora_rank": _need(cfg, "kv_lora_rank"),
                  "qk_nope_head_dim": _need(cfg, "qk_nope_head_dim"),
                  "qk_rope_head_dim": _need(cfg, "qk_rope_head_dim"),
                  "v_head_dim": _need(cfg, "v_head_dim")}
    moe = _moe(cfg, "n_routed_experts", "moe_intermediate_size")
    if cfg.get("n_shared_experts"):
        moe["shared_experts"] = cfg["n_shared_experts"]
    if cfg.get("first_k_dense_replace"):
        moe["first_dense"] = cfg["first_k_dense_replace"]
    if cfg.get("moe_layer_freq", 1) != 1:
        moe["every"] = cfg["moe_layer_freq"]
    out["moe"] = moe
    notes = _common_notes(cfg)
    if cfg.get("scoring_func") == "sigmoid" or cfg.get("topk_method") == "noaux_tc":
        notes.append("sigmoid scoring with group-limited top-k (n_group, topk_group): timed as the router's softmax "
                     "and top-k")
    return out, notes


def deepseek_v32(cfg: dict[str, Any]) -> tuple[Fields, list[str]]:
    """DeepseekV32ForCausalLM: DeepSeek-V3 with DeepSeek sparse attention (DSA)."""
    out, notes = deepseek_v3(cfg)
    out["sparse_attention"] = {"index_topk": cfg.get("index_topk", 2048), "index_heads": cfg.get("index_n_heads", 64),
                               "index_head_dim": cfg.get("index_head_dim", 128)}
    return out, notes


def glm5(cfg: dict[str, Any]) -> tuple[Fields, list[str]]:
    """GlmMoeDsaForCausalLM (GLM-5): MLA with DSA, routed + shared experts, first dense blocks."""
    out, notes = deepseek_v32(cfg)
    for key in ("indexer_types", "index_topk_pattern", "mlp_layer_types"):
        if cfg.get(key) is not None:
            notes.append(f"{key}: every block taken as DSA over MLA with an MoE MLP past first_k_dense_replace")
    return out, notes


def gpt_oss(cfg: dict[str, Any]) -> tuple[Fields, list[str]]:
    """GptOssForCausalLM: alternating sliding-window and full attention with sinks, biased experts."""
    out = _decoder(cfg)
    out.pop("ffn_hidden", None)
    types = cfg.get("layer_types") or []
    names = {"sliding_attention": "sliding", "full_attention": "full"}
    bad = [t for t in types if t not in names]
    if bad:
        raise ConfigError(f"layer type {bad[0]!r} is not modelled; expected sliding_attention or full_attention",
                          key="model.config.layer_types")
    out["layer_types"] = [names[t] for t in types] or ["sliding", "full"]
    out["sliding_window"] = _need(cfg, "sliding_window")
    out["attention_sinks"] = True
    out["moe"] = {**_moe(cfg, "num_local_experts", "intermediate_size"), "expert_bias": True}
    notes = _common_notes(cfg)
    notes.append("attention sinks: timed as the attention they belong to")
    if cfg.get("swiglu_limit"):
        notes.append("clamped SwiGLU (swiglu_limit): timed as SwiGLU")
    return out, notes


def qwen3_5(cfg: dict[str, Any]) -> tuple[Fields, list[str]]:
    """Qwen3_5(Moe)ForConditionalGeneration, Qwen3NextForCausalLM: Gated DeltaNet linear attention in
    three blocks of four, gated full attention (QK-norm, a partial RoPE) in the fourth; MoE MLPs
    with a shared expert, or dense ones."""
    cfg = _text(cfg)
    out = _decoder(cfg)
    out["qk_norm"] = True
    out["attention_output_gate"] = bool(cfg.get("attn_output_gate", True))
    types = cfg.get("layer_types")
    if types is None:
        every = cfg.get("full_attention_interval", 4)
        types = ["linear_attention"] * (every - 1) + ["full_attention"]
    names = {"linear_attention": "linear", "full_attention": "full"}
    bad = [t for t in types if t not in names]
    if bad:
        raise ConfigError(f"layer type {bad[0]!r} is not modelled; expected linear_attention or full_attention",
                          key="model.config.layer_types")
    out["layer_types"] = [names[t] for t in types]
    out["linear_attention"] = {"key_heads": _need(cfg, "linear_num_key_heads"),
                               "value_heads": _need(cfg, "linear_num_value_heads"),
                               "key_head_dim": cfg.get("linear_key_head_dim", 128),
                               "value_head_dim": cfg.get("linear_value_head_dim", 128),
                               "conv_kernel": cfg.get("linear_conv_kernel_dim", 4)}
    if cfg.get("num_experts"):
        moe = _moe(cfg, "num_experts", "moe_intermediate_size")
        if cfg.get("shared_expert_intermediate_size"):
            moe.update(shared_experts=1, shared_ffn_hidden=cfg["shared_expert_intermediate_size"])
        out["moe"] = moe
        out.pop("ffn_hidden", None)
    notes = _common_notes(cfg)
    notes.append("the shared expert's sigmoid gate: no kernel of its own")
    return out, notes


def minimax_m2(cfg: dict[str, Any]) -> tuple[Fields, list[str]]:
    """MiniMaxM2ForCausalLM: full GQA attention with QK-norm and a partial RoPE, 256 experts."""
    out = _decoder(cfg)
    out.pop("ffn_hidden", None)
    out["qk_norm"] = bool(cfg.get("use_qk_norm", True))
    out["moe"] = _moe(cfg, "num_local_experts", "intermediate_size")
    if cfg.get("shared_intermediate_size"):
        out["moe"].update(shared_experts=1, shared_ffn_hidden=cfg["shared_intermediate_size"])
    notes = _common_notes(cfg)
    kinds = set(cfg.get("attn_type_list") or [1])
    if kinds != {1}:
        raise ConfigError("attn_type_list has linear-attention blocks (0), not modelled for MiniMax; expected full "
                          "attention (1) everywhere", key="model.config.attn_type_list")
    if cfg.get("rotary_dim") and cfg["rotary_dim"] != cfg.get("head_dim"):
        notes.append(f"partial RoPE (rotary_dim {cfg['rotary_dim']}): timed over the whole head")
    return out, notes


#: ``architectures[0]`` -> its adapter.
ADAPTERS: dict[str, Adapter] = {
    "LlamaForCausalLM": llama,
    "MistralForCausalLM": llama,
    "MixtralForCausalLM": mixtral,
    "Qwen3ForCausalLM": qwen3,
    "Qwen3MoeForCausalLM": qwen3_moe,
    "DeepseekV3ForCausalLM": deepseek_v3,
    "KimiK25ForConditionalGeneration": lambda c: deepseek_v3(_text(c)),
    "DeepseekV32ForCausalLM": deepseek_v32,
    "GlmMoeDsaForCausalLM": glm5,
    "GptOssForCausalLM": gpt_oss,
    "Qwen3NextForCausalLM": qwen3_5,
    "Qwen3_5MoeForConditionalGeneration": qwen3_5,
    "Qwen3_5MoeForCausalLM": qwen3_5,
    "Qwen3_5ForConditionalGeneration": qwen3_5,
    "Qwen3_5ForCausalLM": qwen3_5,
    "MiniMaxM2ForCausalLM": minimax_m2,
}


def architecture(cfg: dict[str, Any]) -> str:
    archs = cfg.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ConfigError("the config has no architectures list; expected e.g. [\"LlamaForCausalLM\"]",
                          key="model.config.architectures")
    return archs[0]


def adapt(cfg: dict[str, Any]) -> tuple[Fields, list[str]]:
    """The model fields and the notes of a parsed config.json."""
    arch = architecture(cfg)
    adapter = ADAPTERS.get(arch)
    if adapter is None:
        raise ConfigError(f"architecture {arch!r} is not modelled; expected one of: {', '.join(sorted(ADAPTERS))}",
                          key="model.config.architectures")
    return adapter(cfg)


def notes(path: str | Path) -> list[str]:
    """What the adapter of ``path`` reads but approximates or leaves out (for the summary)."""
    return adapt(read_config(Path(path)))[1]


def checkpoint_precision(path: Path) -> dict[str, str]:
    """The serving precisions a pre-quantised checkpoint implies (``precision``, ``moe_precision``,
    ``kv_dtype``), from its ``quantization_config`` or an ``hf_quant_config.json`` beside it (or named
    ``<stem>_hf_quant_config.json`` where the config is ``<stem>_config.json``); empty: none said."""
    cfg = _text(read_config(path))
    out: dict[str, str] = {}
    side = [path.parent / "hf_quant_config.json"]
    if path.name.endswith("_config.json"):
        side.insert(0, path.parent / path.name.replace("_config.json", "_hf_quant_config.json"))
    for cand in side:
        if cand.is_file():
            q = read_config(cand, key="model.config").get("quantization", {})
            algo = str(q.get("quant_algo", "")).lower()
            if algo in ("nvfp4", "fp8", "w4a16_awq", "mxfp4", "fp8_block_scales"):
                names = {"nvfp4": "fp4", "w4a16_awq": "w4a16", "fp8_block_scales": "fp8_block"}
                out[_which(q.get("exclude_modules"))] = names.get(algo, algo)
            if str(q.get("kv_cache_quant_algo", "")).lower() == "fp8":
                out["kv_dtype"] = "fp8"
            return out
    qc = cfg.get("quantization_config")
    if isinstance(qc, dict):
        method = str(qc.get("quant_method", "")).lower()
        if method == "fp8":
            out["precision"] = "fp8_block" if qc.get("weight_block_size") else "fp8"
        elif method == "mxfp4":  # gpt-oss: the experts only, attention and router kept in bf16
            out["moe_precision"] = "mxfp4"
        elif method in ("awq", "gptq") and qc.get("bits") == 4:
            out["precision"] = "w4a16"
        elif method in ("modelopt",) and str(qc.get("quant_algo", "")).lower() == "nvfp4":
            out[_which(qc.get("ignore") or qc.get("exclude_modules"))] = "fp4"
        elif method == "compressed-tensors":
            out.update(_compressed_tensors(qc))
    return out


def _compressed_tensors(qc: dict[str, Any]) -> dict[str, str]:
    """The precision a compressed-tensors checkpoint's first config group implies: 4-bit integer
    weights without quantised activations are w4a16 (Kimi K2.5's int4 experts), 4-bit float weights
    and activations NVFP4, 8-bit float fp8; where attention is left out (``ignore`` names self_attn),
    the experts only (``moe_precision``)."""
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        return {}
    first = next(iter(groups.values()))
    w, a = first.get("weights") or {}, first.get("input_activations")
    bits, kind = w.get("num_bits"), w.get("type")
    prec = ("w4a16" if bits == 4 and kind == "int" and not a else "fp4" if bits == 4 and kind == "float"
            else "fp8" if bits == 8 and kind == "float" else None)
    if prec is None:
        return {}
    return {_which(qc.get("ignore")): prec}


def _which(left_out: Any) -> str:
    """``moe_precision`` where a checkpoint leaves attention out of its quantisation (the experts, and
    here the dense MLPs, quantised; attention in 16 bits), else ``precision``."""
    return "moe_precision" if any("self_attn" in str(x) for x in left_out or []) else "precision"


def expand(data: dict[str, Any], file: str) -> dict[str, Any]:
    """A workload's ``model`` with its ``config`` read in: the config's fields under the written
    ones, the path made absolute, ``kind`` and a served model's ``seq_len`` defaulted, and a
    pre-quantised checkpoint's precisions put under the ``inference`` section's unwritten keys."""
    model = data.get("model")
    if not isinstance(model, dict) or model.get("config") is None:
        return data
    ref = model["config"]
    if not isinstance(ref, str):
        raise ConfigError(f"expected a path to a config.json, got {ref!r}", file=file, key="model.config")
    path = Path(ref)
    if not path.is_absolute():
        path = Path(file).parent / path
    try:
        fields, _ = adapt(read_config(path))
        quant = checkpoint_precision(path)
    except ConfigError as e:
        raise ConfigError(e.message, file=str(path) if "config." in (e.key or "") else file, key=e.key) from None
    served = "inference" in data
    fields.setdefault("kind", "transformer_inference" if served else "transformer")
    if not served:
        fields.pop("seq_len", None)  # the context the model was built for is not the training sequence
    merged = {**fields, **{k: v for k, v in model.items() if k != "config"}, "config": str(path.resolve())}
    for k in ("mla", "moe", "linear_attention", "sparse_attention"):
        if isinstance(fields.get(k), dict) and isinstance(model.get(k), dict):
            merged[k] = {**fields[k], **model[k]}
    out = {**data, "model": merged}
    inf = data.get("inference")
    if served and isinstance(inf, dict) and quant:
        out["inference"] = {**{k: v for k, v in quant.items()}, **inf}
    return out
