"""Memory per GPU of Transformer jobs against hand calculations (Korthikanti et al. 2022, ZeRO)."""

from __future__ import annotations

from typing import Any

import pytest

from simgpu.config.transformer import TransformerModel
from simgpu.config.workload import WorkloadSpec
from simgpu.workload import World
from simgpu.workload.transformer.memory import block_activation_bytes, stage_memory
from simgpu.workload.transformer.shapes import block, make_setup, parameter_count

S, B, H, A, L = 1024, 2, 1024, 16, 8


def setup(world: int = 1, model: dict[str, Any] | None = None, training: dict[str, Any] | None = None,
          **par: Any) -> Any:
    spec = WorkloadSpec.model_validate({
        "name": "m", "platform": "test",
        "model": {"kind": "transformer", "layers": L, "hidden": H, "heads": A, "seq_len": S, "vocab": 50304,
                  "attention": "unfused", "dropout": 0.1, **(model or {})},
        "training": {"micro_batch": B, "precision": "bf16", "optimizer": "adam", **(training or {})},
        "parallelism": par})
    return make_setup(spec, World(1, world))


@pytest.mark.parametrize("tp, sp, recompute, want", [
    # Korthikanti et al. 2022, table 2 (16-bit activations, bytes per layer)
    (1, False, "none", S * B * H * (34 + 5 * A * S / H)),
    (4, False, "none", S * B * H * (10 + 24 / 4 + 5 * A * S / (H * 4))),
    (4, True, "none", S * B * H * (34 / 4 + 5 * A * S / (H * 4))),
    (4, True, "selective", S * B * H * 34 / 4),
    (4, False, "selective", S * B * H * (10 + 24 / 4)),
    (1, False, "full", 2 * S * B * H),
    (4, True, "full", 2 * S * B * H / 4),
])
def test_block_activations_match_korthikanti(tp: int, sp: bool, recompute: str, want: float) -> None:
    s = setup(tp, tp=tp, sp=sp, training={"recompute": recompute})
    assert block_activation_bytes(s, block(s, 0)) == pytest.approx(want)


def test_pytorch_softmax_keeps_fp32_scores() -> None:
    """One head and micro-batch 2: Megatron's fused softmax does not take 2 score matrices, and its
    fallback keeps the softmax output in fp32 (2 more bytes per score than the fused kernel)."""
    s = setup(model={"heads": 1})
    want = S * B * H * (34 + 5 * 1 * S / H) + 2 * B * 1 * S * S
    assert block_activation_bytes(s, block(s, 0)) == pytest.approx(want)
    no_dropout = setup(model={"heads": 1, "dropout": 0.0})
    # without dropout the fused kernel's fp16 output fed the next matmul; now fp32 plus its fp16 cast
    assert block_activation_bytes(no_dropout, block(no_dropout, 0)) == pytest.approx(
        S * B * H * 32 + 2 * B * S * S + 4 * B * S * S)


def test_flash_attention_keeps_no_scores() -> None:
    s = setup(model={"attention": "flash", "dropout": 0.0})
    # 34 s b h without the two dropout masks, plus the fp32 log-sum-exp per head and query
    assert block_activation_bytes(s, block(s, 0)) == pytest.approx(S * B * H * 32 + 4 * B * A * S)


def test_gqa_and_swiglu_change_their_terms() -> None:
    s = setup(model={"arch": "llama", "kv_heads": 4, "ffn_hidden": 2816, "attention": "flash", "dropout": 0.0})
    kv = 4 * (H // A)
    want = 2 * S * B * H * 2 + S * B * (H + 2 * kv) * 2 + 4 * B * A * S + S * B * H * 2 + 2 * S * B * H * 2 \
        + S * B * (2 * 2816 + 2816) * 2
    assert block_activation_bytes(s, block(s, 0)) == pytest.approx(want)


def test_1f1b_first_stage_holds_pp_micro_batches() -> None:
    per = S * B * H * (34 + 5 * A * S / H)
    s = setup(4, pp=4, training={"global_batch": 16 * B})
    first, last = stage_memory(s, 0), stage_memory(s, 3)
    # stage 0: pp micro-batches in flight x L/pp layers = L layers' worth, plus the embedding dropout masks
    assert first.activations == pytest.approx(4 * (L // 4) * per + 4 * S * B * H)
    # the last stage holds one micro-batch, plus the final norm, the output layer input and fp32 logits
    assert last.activations == pytest.approx((L // 4) * per + 2 * S * B * H * 2 + S * B * 50304 * 4)
    gpipe = stage_memory(setup(4, pp=4, pp_schedule="gpipe", training={"global_batch": 16 * B}), 0)
    assert gpipe.activations == pytest.approx(16 * (L // 4) * per + 16 * S * B * H)


def test_interleaving_adds_the_korthikanti_factor() -> None:
    per = S * B * H * (34 + 5 * A * S / H)
    pp, v = 2, 2
    s = setup(2, pp=pp, pp_schedule="interleaved", virtual_stages=v, training={"global_batch": 8 * B})
    # (pp - 1) * 2 + (v - 1) * pp + 1 = 5 chunks of L / (pp v) layers = L (1 + (pp - 1) / (pp v)) layers
    assert stage_memory(s, 0).activations == pytest.approx(L * (1 + (pp - 1) / (pp * v)) * per + 5 * S * B * H)


@pytest.mark.parametrize("zero, params, grads, states", [
    (0, 6.0, 4.0, 8.0), (1, 2 + 4 / 8, 4.0, 8 / 8), (2, 2 + 4 / 8, 4 / 8, 8 / 8), (3, 6 / 8, 4 / 8, 8 / 8)])
def test_zero_stages_shard_as_rajbhandari(zero: int, params: float, grads: float, states: float) -> None:
    """Mixed-precision Adam: 2 + 4 bytes of weights, 4 of gradients, 8 of states per parameter (the
    ZeRO paper's 16 with fp32 gradients), sharded over 8 data-parallel ranks by stage."""
    s = setup(8, zero=zero)
    n = parameter_count(s.model)
    m = stage_memory(s, 0)
    assert m.parameters == pytest.approx(params * n)
    assert m.gradients == pytest.approx(grads * n)
    assert m.optimizer_states == pytest.approx(states * n)


def test_tensor_parallel_splits_weights() -> None:
    one, four = stage_memory(setup(1), 0), stage_memory(setup(4, tp=4), 0)
    md = setup(1).model
    assert isinstance(md, TransformerModel)
    norms_and_row_biases = L * (4 * H + 2 * H) + 2 * H + S * H   # replicated on every tp rank
    n = parameter_count(md)
    assert four.parameters / 6 == pytest.approx((n - norms_and_row_biases) / 4 + norms_and_row_biases)
    assert one.parameters / 6 == n


def test_experts_shard_over_ep() -> None:
    moe = {"moe": {"experts": 8, "top_k": 2}, "attention": "flash", "dropout": 0.0}
    dense, sharded = setup(8, model=moe), setup(8, model=moe, ep=8)
    assert stage_memory(sharded, 0).parameters < stage_memory(dense, 0).parameters / 4
    b = block(sharded, 0)
    assert b.experts is not None and b.experts.local == 1


@pytest.mark.parametrize("model, want", [
    ({"layers": 12, "hidden": 768, "heads": 12, "seq_len": 1024, "vocab": 50257}, 124_439_808),
    ({"arch": "llama", "layers": 32, "hidden": 4096, "heads": 32, "ffn_hidden": 11008, "seq_len": 4096,
      "vocab": 32000}, 6_738_415_616),
    ({"arch": "llama", "layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn_hidden": 28672,
      "seq_len": 4096, "vocab": 32000}, 68_976_648_192),
    ({"arch": "llama", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336,
      "seq_len": 4096, "vocab": 32000, "moe": {"experts": 8, "top_k": 2}}, 46_702_792_704),
    # BertForPreTraining has 336,226,108; Megatron's pre-LN BERT adds a final LayerNorm (2 h)
    ({"arch": "bert", "layers": 24, "hidden": 1024, "heads": 16, "seq_len": 512, "vocab": 30522},
     336_226_108 + 2 * 1024),
])
def test_parameter_counts_of_known_models(model: dict[str, Any], want: int) -> None:
    """GPT-2 small (nanoGPT), LLaMA-2 7B and 70B, Mixtral 8x7B, BERT-large with its pre-training heads."""
    assert parameter_count(TransformerModel.model_validate({"kind": "transformer", **model})) == want
