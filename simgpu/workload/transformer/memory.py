"""Memory per GPU of a Transformer job: parameters, gradients, optimizer states, activations, buffers.

This module owns the byte counts of :class:`~simgpu.graph.MemoryEstimate` for one rank of
a pipeline stage.

- Weights: under mixed precision 2-byte model weights and 4-byte fp32 master weights (Megatron; with
  autocast the fp32 weights and their cached casts, the same 6 bytes); fp32 training keeps 4 bytes.
  ZeRO 1+ shards the master weights, ZeRO 3 the model weights too, over the replicas of the
  parameters (dp x cp ranks; experts over their expert-data-parallel ranks).
- Gradients: fp32, 4 bytes each; sharded from ZeRO 2. Optimizer states: 4 bytes per state
  (Adam 2, Adagrad 1, SGD 0); sharded from ZeRO 1.
- Activations per block and micro-batch follow Korthikanti et al. 2022 ("Reducing Activation
  Recomputation in Large Transformer Models"), tensor by tensor so that GQA, SwiGLU, MoE and
  flash attention change the right terms: for GPT with dropout and unfused attention they give
  s b h (34 + 5 a s / h) bytes at 16 bits, and with tensor parallelism s b h (10 + 24/t + 5 a s/(h t))
  (34/t + ... under sequence parallelism). Selective recomputation drops the attention core's
  s^2 terms, full recomputation keeps only each block's input (plus one block's full set while it
  is recomputed). A stage holds the activations of as many chunk forwards as its schedule has in
  flight at its peak (1F1B: ``pp - stage`` micro-batches; GPipe: all of them).
- Buffers: DDP's flat gradient buckets (PyTorch without ``gradient_as_bucket_view``; with it, and
  under Megatron, whose main grads are the buckets, the gradients are the buckets), ZeRO-3's
  gathered weights and gradients of the unit computing and the one prefetched (FSDP's rate limiter,
  ``limit_all_gathers``; without it, or without ``reshard_after_forward``, the gathered weights of
  every unit of the stage), P2P send/receive buffers, MoE all-to-all buffers.
"""

from __future__ import annotations

from ...graph import MemoryEstimate
from ..common import GRAD_BYTES, MASTER_BYTES, dtype_bytes, is_mixed, optimizer_states
from .attention import fused_softmax_available
from .moe import tokens_per_expert
from .pipeline import in_flight
from .shapes import Block, Setup, block, embedding_params, head_params

_MASK_BYTES = 1  # a dropout mask element


def block_activation_bytes(s: Setup, blk: Block, recompute: str | None = None) -> float:
    """Bytes one block keeps for its backward per micro-batch on one rank."""
    recompute = s.recompute if recompute is None else recompute
    w, md, tp = s.width, s.model, s.tp
    t, r, h, d = s.tokens, s.rows, md.hidden, md.d_head
    if recompute == "full":
        return r * h * w
    a, kv = md.heads // tp, md.kv_heads_n // tp
    mask = _MASK_BYTES if md.dropout else 0
    seq, b = s.seq, s.micro
    out = 2 * r * h * w                        # norm input, QKV input (norm output)
    out += t * (a + 2 * kv) * d * w            # Q, K, V
    if md.attention == "flash":
        out += 4 * b * a * seq                 # the softmax log-sum-exp (fp32)
    elif recompute != "selective":
        kv_len = md.seq_len if s.layout.cp > 1 and s.cp_comm == "all_gather" else seq
        scores = b * a * seq * kv_len
        out += scores * w + (scores * (mask + w) if md.dropout else 0)   # softmax out, dropout mask and out
        if w == 2 and not fused_softmax_available(b * a, seq, kv_len, md.causal, True):
            # Megatron's fallback softmax runs in fp32 and keeps its output so; the cast back feeds
            # the next op
            out += scores * (4 - w + (0 if md.dropout else w))
    out += t * a * d * w                       # output projection input
    out += r * h * mask                        # attention dropout mask
    out += 2 * r * h * w                       # norm input, MLP input (norm output)
    gate = 2 if md.act == "swiglu" else 1
    if blk.experts is not None:
        assert md.moe is not None
        ex = blk.experts
        te = tokens_per_expert(s) * ex.local
        f = ex.fc2.inputs
        out += t * md.moe.experts * 4                   # router probabilities (fp32)
        out += 2 * t * md.moe.top_k * h * w             # permuted tokens, combined outputs
        out += te * (h + gate * f + f) * w              # expert fc1 input, activation input, fc2 input
    else:
        f = md.ffn // tp
        out += t * (gate * f + f) * w                   # activation input, fc2 input
    out += r * h * mask                        # MLP dropout mask
    return float(out)


def _working_block(s: Setup, blk: Block) -> float:
    """Extra bytes while a fully recomputed block runs its backward: its whole activation set."""
    return block_activation_bytes(s, blk, "none") if s.recompute == "full" else 0.0


def stage_memory(s: Setup, stage: int) -> MemoryEstimate:
    """Bytes per GPU on a rank of pipeline ``stage``."""
    md, lay = s.model, s.layout
    chunks = s.stage_chunks(stage)
    blocks = [block(s, i) for g in chunks for i in s.chunk_layers(g)]
    first, last = 0 in chunks, s.chunks - 1 in chunks
    dense = sum(sum(p.numel for p in b.dense_params()) for b in blocks)
    expert = sum(sum(p.numel for p in b.experts.params) for b in blocks if b.experts is not None)
    if first:
        dense += sum(p.numel for p in embedding_params(s))
    if last:
        dense += sum(p.numel for p in head_params(s))
    rep_d = lay.dp * lay.cp
    rep_e = lay.dp // lay.ep * lay.cp
    z = s.zero

    def shard(n: int, rep: int, stage_at_least: int) -> float:
        return n / rep if z >= stage_at_least else float(n)

    mixed = is_mixed(s.precision)
    wbytes = 2 if mixed else 4
    states = optimizer_states(s.optimizer) * MASTER_BYTES
    params = grads = opt = 0.0
    for n, rep in ((dense, rep_d), (expert, rep_e)):
        params += wbytes * shard(n, rep, 3) + (MASTER_BYTES * shard(n, rep, 1) if mixed else 0.0)
        grads += GRAD_BYTES * shard(n, rep, 2)
        opt += states * shard(n, rep, 1)

    # activations: peak chunk forwards in flight, each holding its blocks (and embedding / head)
    flight = in_flight(s.schedule, lay.pp, s.m, s.v, stage)
    per_chunk = len(blocks) // len(chunks)
    act = flight * sum(block_activation_bytes(s, b) for b in blocks[:per_chunk])
    w, h = s.width, md.hidden
    if first:
        act += flight * s.rows * h * (_MASK_BYTES if md.dropout else 0)
    if last:
        # final norm input, output-layer input, fp32 logits kept by the cross entropy (one micro-batch)
        act += s.rows * h * w + s.tokens * h * w + s.tokens * (s.vocab // s.tp) * 4
    act += max((_working_block(s, b) for b in blocks), default=0.0)

    buffers = 0.0
    if s.bucket_copies:
        buffers += GRAD_BYTES * (dense + expert)          # DDP's flat bucket buffers (gradients are no views)
    elif z == 2:
        buffers += 2 * s.bucket_bytes                     # buckets being reduced
    if z == 3:
        unit = max(sum(p.numel for p in b.dense_params()) + (sum(p.numel for p in b.experts.params)
                                                              if b.experts else 0) for b in blocks)
        gathered = 2 * unit                               # two units under the rate limiter
        if not (s.limit_all_gathers and s.reshard_after_forward):
            # kept from the forward to the backward, or gathered as far ahead as the CPU runs: every unit
            gathered = dense + expert
        buffers += gathered * wbytes + 2 * unit * GRAD_BYTES  # gathered weights; two units' gradients
    if lay.pp > 1:
        buffers += 4 * s.rows * h * w                     # P2P send and receive, activations and gradients
    if any(b.experts is not None for b in blocks) and lay.ep > 1:
        ex = next(b.experts for b in blocks if b.experts is not None)
        buffers += 2 * tokens_per_expert(s) * ex.local * h * w
    return MemoryEstimate(parameters=params, gradients=grads, optimizer_states=opt, activations=act,
                          buffers=buffers)


def weight_bytes(precision: str) -> int:
    """Bytes of a model weight as the matmuls read it."""
    return dtype_bytes("bf16") if is_mixed(precision) else dtype_bytes(precision)
