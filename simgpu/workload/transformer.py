"""The GPT-style decoder-only Transformer under data parallelism (PyTorch DDP + autocast).

This module owns the Transformer's program per rank (the kernels a nanoGPT-like model issues for
one micro-batch, forward then backward, with DDP's bucketed gradient all-reduces interleaved and a
fused optimizer step), its parameter count, its useful FLOPs and its memory per GPU.

The model is GPT-2 style: learned position embeddings, pre-LayerNorm blocks with biased linears,
GELU MLP, a final LayerNorm and an LM head tied to the token embedding; flash attention (SDPA)
with a causal mask; no dropout (pretraining setting).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.workload import TransformerModel, WorkloadSpec
from .common import (
    GRAD_BYTES,
    MIB,
    Emitter,
    GradBuckets,
    Linear,
    Param,
    assign_buckets,
    aux_dtype,
    dense_memory,
    dtype_bytes,
    linear_bwd,
    linear_fwd,
    optimizer_step,
)
from .graph import KernelTable, MemoryEstimate, Op, Program, Workload
from .registry import World, register

#: Bytes of one token id (int64) in the input batch; inputs and targets are both copied.
_TOKEN_ID_BYTES = 8


@dataclass(frozen=True)
class _Block:
    """The parameterised modules of one Transformer block named ``name``."""

    name: str
    ln1: str
    qkv: Linear
    proj: Linear
    ln2: str
    fc1: Linear
    fc2: Linear


def _norm_params(name: str, h: int) -> tuple[Param, ...]:
    return (Param(f"{name}.weight", h), Param(f"{name}.bias", h))


def _blocks(model: TransformerModel) -> list[_Block]:
    h, f = model.hidden, model.ffn
    return [_Block(f"h{i}", f"h{i}.ln1", Linear(f"h{i}.attn.qkv", h, 3 * h), Linear(f"h{i}.attn.proj", h, h),
                   f"h{i}.ln2", Linear(f"h{i}.mlp.fc1", h, f), Linear(f"h{i}.mlp.fc2", f, h))
            for i in range(model.layers)]


def _ready_order(model: TransformerModel) -> list[Param]:
    """All parameters, in the order backward makes their gradients ready (DDP's rebuilt order).

    The token embedding is tied to the LM head: its gradient has two contributions and is ready
    only after the embedding backward, at the very end.
    """
    h = model.hidden
    order = list(_norm_params("ln_f", h))
    for blk in reversed(_blocks(model)):
        order += [*blk.fc2.params, *blk.fc1.params, *_norm_params(blk.ln2, h), *blk.proj.params,
                  *blk.qkv.params, *_norm_params(blk.ln1, h)]
    order += [Param("wpe", model.seq_len * h), Param("wte", model.vocab * h)]
    return order


def parameter_count(model: TransformerModel) -> int:
    """Parameters of the model, the tied embedding counted once (GPT-2 small: 124.4M)."""
    return sum(p.numel for p in _ready_order(model))


def activation_bytes(model: TransformerModel, batch: int, precision: str) -> float:
    """Activations kept for backward by one rank, bytes (no recomputation).

    Per layer Korthikanti et al. 2022 give s*b*h*(34 + 5*a*s/h) for 16-bit activations. The
    5*a*s/h term is the materialised attention scores; with the fused (flash) attention this
    builder emits they are never stored, only the softmax log-sum-exp (fp32, b*a*s), so that term
    is replaced. The 34 is scaled for other activation widths. Plus the fp32 logits (T*vocab*4)
    and the embedding output.
    """
    s, b, h, a = model.seq_len, batch, model.hidden, model.heads
    width = dtype_bytes(aux_dtype(precision))
    per_layer = 34 * s * b * h * width / 2 + 4 * b * a * s
    return model.layers * per_layer + s * b * model.vocab * 4 + s * b * h * width


def model_flops(model: TransformerModel, samples: int) -> float:
    """Useful FLOPs of one iteration of the whole job (forward + backward), nanoGPT / PaLM style.

    6 * N * tokens with N the parameters less the position embeddings (a lookup, not a matmul; the
    tied token embedding is counted because it is the LM head matmul), plus attention
    QK^T and AV counted as full (non-causal) matrices: 12 * layers * samples * s^2 * h. This is the
    usual MFU convention even though a causal kernel does about half that work.
    """
    s, h = model.seq_len, model.hidden
    n = parameter_count(model) - s * h
    return 6.0 * n * samples * s + 12.0 * model.layers * samples * s * s * h


def _rank_program(rank: int, spec: WorkloadSpec, model: TransformerModel, group: tuple[int, ...],
                  kernels: KernelTable) -> Program:
    """The ops of one rank: input copy, forward, backward with bucket all-reduces, optimizer."""
    prec = spec.training.precision
    aux = aux_dtype(prec)
    b, s, h, v = spec.training.batch_per_gpu, model.seq_len, model.hidden, model.vocab
    t = b * s
    em = Emitter(rank, kernels)
    buckets = assign_buckets(_ready_order(model), spec.comm.bucket_mib * MIB)
    grads = GradBuckets(em, buckets, group)
    lm_head = Linear("lm_head", h, v, bias=False)
    blocks = _blocks(model)

    def norm(name: str, bwd: int) -> int:
        return em.kernel(f"{name}.{'bwd' if bwd else 'fwd'}", "norm", aux, phase="bwd" if bwd else "fwd",
                         rows=t, cols=h, bwd=bwd)

    def attention(name: str, bwd: int) -> int:
        return em.kernel(name, "attention_bwd" if bwd else "attention_fwd", prec,
                         phase="bwd" if bwd else "fwd", batch=b, heads=model.heads, seq_q=s, seq_kv=s,
                         head_dim=h // model.heads, causal=1)

    # ---- data and embeddings
    copy = em.memcpy("batch.h2d", 2 * t * _TOKEN_ID_BYTES)
    em.elementwise("embed.tok_gather", t * h, 1, 1, aux, phase="fwd", deps=(copy,))
    em.elementwise("embed.pos_gather", s * h, 1, 1, aux, phase="fwd")
    em.elementwise("embed.add", t * h, 2, 1, aux, phase="fwd")

    # ---- forward
    for blk in blocks:
        norm(blk.ln1, 0)
        linear_fwd(em, blk.qkv, t, prec)
        attention(f"{blk.name}.attention.fwd", 0)
        linear_fwd(em, blk.proj, t, prec)
        em.elementwise(f"{blk.proj.name}.residual", t * h, 2, 1, aux, phase="fwd")
        norm(blk.ln2, 0)
        linear_fwd(em, blk.fc1, t, prec)
        em.elementwise(f"{blk.fc1.name}.gelu", t * model.ffn, 1, 1, aux, phase="fwd")
        linear_fwd(em, blk.fc2, t, prec)
        em.elementwise(f"{blk.fc2.name}.residual", t * h, 2, 1, aux, phase="fwd")
    norm("ln_f", 0)
    linear_fwd(em, lm_head, t, prec)
    em.kernel("loss.cross_entropy.fwd", "softmax", aux, phase="fwd", rows=t, cols=v, bwd=0)

    # ---- backward, DDP buckets issued as their last gradient is produced
    em.kernel("loss.cross_entropy.bwd", "softmax", aux, phase="bwd", rows=t, cols=v, bwd=1)
    linear_bwd(em, lm_head, t, prec, grads=None)  # tied to wte: not ready until the embedding bwd
    grads.ready(_norm_params("ln_f", h), norm("ln_f", 1))
    for blk in reversed(blocks):
        linear_bwd(em, blk.fc2, t, prec, grads=grads)
        em.elementwise(f"{blk.fc1.name}.gelu_bwd", t * model.ffn, 2, 1, aux, phase="bwd")
        linear_bwd(em, blk.fc1, t, prec, grads=grads)
        grads.ready(_norm_params(blk.ln2, h), norm(blk.ln2, 1))
        # The residual stream forks at each block input: its two gradients are summed.
        em.elementwise(f"{blk.ln2}.residual_grad", t * h, 2, 1, aux, phase="bwd")
        linear_bwd(em, blk.proj, t, prec, grads=grads)
        attention(f"{blk.name}.attention.bwd", 1)
        linear_bwd(em, blk.qkv, t, prec, grads=grads)
        grads.ready(_norm_params(blk.ln1, h), norm(blk.ln1, 1))
        em.elementwise(f"{blk.ln1}.residual_grad", t * h, 2, 1, aux, phase="bwd")
    # Position embedding: the gradient summed over the batch. Token embedding: a fresh fp32 vocab x h
    # gradient (zero, scatter-add the rows), then summed with the LM head's contribution.
    grads.ready((Param("wpe", s * h),), em.elementwise("embed.pos_grad", t * h, 1, 1, aux, phase="bwd"))
    em.elementwise("embed.tok_grad_zero", v * h, 0, 1, "fp32", phase="bwd")
    em.elementwise("embed.tok_grad_scatter", t * h, 1, 1, "fp32", phase="bwd")
    grads.ready((Param("wte", v * h),), em.elementwise("embed.tok_grad_accumulate", v * h, 2, 1, "fp32",
                                                       phase="bwd"))

    # ---- optimizer: DDP's finalize makes the compute stream wait for every bucket
    optimizer_step(em, parameter_count(model), spec.training.optimizer, deps=grads.done())
    return em.program


def _copy(op: Op) -> Op:
    # Field by field: about 4x faster than dataclasses.replace (tests check that no field is lost).
    return Op(op.name, op.kind, op.category, op.stream, op.phase, op.kernel, op.coll, op.nbytes, op.deps)


def memory_estimate(spec: WorkloadSpec, model: TransformerModel) -> MemoryEstimate:
    """Bytes per GPU; every data-parallel rank holds the same.

    ``buffers`` are DDP's flat fp32 bucket buffers (``gradient_as_bucket_view=False``, the default).
    """
    n = parameter_count(model)
    params, grads, states = dense_memory(n, spec.training.precision, spec.training.optimizer)
    return MemoryEstimate(parameters=params, gradients=grads, optimizer_states=states,
                          activations=activation_bytes(model, spec.training.batch_per_gpu,
                                                       spec.training.precision),
                          buffers=float(n * GRAD_BYTES))


@register("transformer")
def build(spec: WorkloadSpec, world: World) -> Workload:
    """One identical program per data-parallel rank."""
    model = spec.model
    if not isinstance(model, TransformerModel):
        raise TypeError(f"the transformer builder got a {model.kind} model")
    dp = spec.parallelism.dp or world.size
    if dp != world.size:
        raise ValueError(f"the transformer builder supports pure data parallelism: dp={dp} but "
                         f"{world.size} GPUs")
    group = tuple(range(world.size))
    kernels = KernelTable()
    # Ranks run the same program; building it once keeps 1000-GPU jobs fast. Ops are copied so that
    # no two programs share a mutable Op.
    first = _rank_program(0, spec, model, group, kernels)
    programs = [first] + [Program(r, [_copy(op) for op in first.ops]) for r in range(1, world.size)]
    mem = memory_estimate(spec, model)
    samples = spec.training.batch_per_gpu * world.size
    return Workload(name=spec.name, programs=programs, kernels=kernels.specs,
                    memory=[mem] * world.size, samples=samples, tokens=samples * model.seq_len,
                    model_flops=model_flops(model, samples), compute_dtype=spec.training.precision)
