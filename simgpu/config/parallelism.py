"""The ``parallelism`` and ``comm`` sections of a workload file: how the job is split over GPUs
and how its collectives run.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, PositiveInt, model_validator

from .base import Spec
from .sharding import EmbeddingSharding


class UserbufferSMs(Spec):
    """SMs the communication kernel of each Transformer Engine userbuffers overlap takes beside its GEMM
    (the ub config's ``num_sm`` per layer). Defaults: Transformer Engine's ``initialize_ub``, 16 for
    "bulk" and "pipeline" (transformer_engine/pytorch/module/base.py). NeMo's GPT-3 175B bf16 config
    (nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py,
    ``userbuffers_bf16_h100_h12288_tp4_mbs1_seqlen2048``): qkv_dgrad 4, qkv_wgrad 4, fc1_dgrad 2,
    fc1_wgrad 4, proj_fprop 24 (fc2_fprop is a ring exchange there, not modelled: pipeline here)."""

    qkv_dgrad: PositiveInt = Field(16, description="bulk: the input's all-gather beside the qkv dgrad GEMM")
    qkv_wgrad: PositiveInt = Field(16, description="bulk: the input gradient's reduce-scatter beside the qkv wgrad "
                                                   "GEMM")
    fc1_dgrad: PositiveInt = Field(16, description="bulk: the input's all-gather beside the fc1 dgrad GEMM")
    fc1_wgrad: PositiveInt = Field(16, description="bulk: the input gradient's reduce-scatter beside the fc1 wgrad "
                                                   "GEMM")
    proj_fprop: PositiveInt = Field(16, description="pipeline: each chunk's reduce-scatter beside the next proj "
                                                    "GEMM chunk")
    fc2_fprop: PositiveInt = Field(16, description="pipeline: each chunk's reduce-scatter beside the next fc2 GEMM "
                                                   "chunk")


class Parallelism(Spec):
    """How the job is split over GPUs, as Megatron-LM does it: tensor (tp, innermost: consecutive
    ranks of a node), context (cp), data (dp, with experts sharded over ep of its ranks) and pipeline
    (pp, outermost) parallelism; tp * cp * dp * pp is the world size and ``dp`` defaults to the rest."""

    dp: PositiveInt | None = Field(
        None, description="data-parallel degree; default world size / (tp * pp * cp)")
    tp: PositiveInt = Field(1, description="tensor-parallel degree (Megatron column/row splits)")
    pp: PositiveInt = Field(1, description="pipeline-parallel degree (stages)")
    cp: PositiveInt = Field(1, description="context-parallel degree (the sequence split over ranks)")
    ep: PositiveInt = Field(1, description="expert-parallel degree (experts split over ep data-parallel ranks); "
                                           "served: short for attention_dp = moe_ep = ep")
    attention_dp: PositiveInt | None = Field(
        None, description="served MoE models: attention data parallelism, ranks of a replica each running attention "
                          "for its own requests with its own KV cache (TensorRT-LLM's enable_attention_dp, SGLang's "
                          "dp-attention); tp x attention_dp GPUs a pipeline stage; default ep")
    moe_tp: PositiveInt | None = Field(
        None, description="served MoE models: ranks each expert is split over; moe_tp x moe_ep = tp x attention_dp; "
                          "default tp")
    moe_ep: PositiveInt | None = Field(
        None, description="served MoE models: ranks the experts are spread over; default attention_dp")
    sp: bool = Field(False, description="sequence parallelism: all-gather / reduce-scatter instead of the tp "
                                        "all-reduces, norms and dropout on 1/tp of the tokens (needs tp > 1)")
    zero: Literal[0, 1, 2, 3] = Field(
        0, description="ZeRO stage over the data-parallel ranks: 0 replicated (DDP), 1 optimizer states, "
                       "2 and gradients, 3 and parameters (all-gathered per block, FSDP)")
    fsdp: bool = Field(False, description="PyTorch FSDP full sharding: the same as zero: 3")
    # FSDP's prefetch and rate limiter, as torch.distributed.fsdp.FullyShardedDataParallel's arguments of
    # the same names (PyTorch docs, "FullyShardedDataParallel" and "FSDP Notes: FSDP Prefetch Nuances";
    # torch/distributed/fsdp/_limiter_utils.py for the limit of two); zero: 3 only.
    forward_prefetch: bool = Field(
        False, description="zero 3 / FSDP: the next unit's all-gather is issued before this unit's forward "
                           "kernels (explicit prefetch) instead of after them (implicit prefetch: a separate "
                           "stream still lets it run under this unit's compute); PyTorch FSDP forward_prefetch, "
                           "default False")
    backward_prefetch: Literal["backward_pre", "backward_post", "none"] = Field(
        "backward_pre", description="zero 3 / FSDP: when the backward all-gathers the next unit (in backward "
                                    "order): backward_pre before this unit's gradient computation (it runs under "
                                    "it), backward_post after it, before this unit's reduce-scatter (exposed; "
                                    "the reduce-scatter runs under the next unit), none when the next unit's "
                                    "backward starts, behind this unit's reduce-scatter on the process group's "
                                    "NCCL stream (no overlap); PyTorch FSDP backward_prefetch, default "
                                    "BackwardPrefetch.BACKWARD_PRE")
    limit_all_gathers: bool = Field(
        True, description="zero 3 / FSDP's rate limiter: before issuing an all-gather the CPU waits for the "
                          "older of the two last units' frees, so at most two units are gathered at once; "
                          "false: the CPU issues all-gathers as far ahead as it runs (every unit gathered at "
                          "once in the memory estimate); PyTorch FSDP limit_all_gathers, default True")
    reshard_after_forward: bool = Field(
        True, description="zero 3 / FSDP: free each unit's gathered parameters after its forward and all-gather "
                          "them again in backward (ZeRO-3, FULL_SHARD); false: keep them from the forward to "
                          "the backward (ZeRO-2 style, SHARD_GRAD_OP): no backward all-gathers, the stage's "
                          "unsharded weights held; PyTorch FSDP2 fully_shard reshard_after_forward, default True")
    pp_schedule: Literal["1f1b", "gpipe", "interleaved"] = Field(
        "1f1b", description="pipeline schedule: 1f1b, gpipe (all forwards, then all backwards) or interleaved "
                            "1F1B over virtual_stages model chunks per stage")
    virtual_stages: PositiveInt = Field(1, description="model chunks per pipeline stage (interleaved only)")
    account_for_embedding_and_loss: bool = Field(
        False, description="the embedding and the loss count as a block each when the blocks are split over the "
                           "pipeline's chunks, so the first and the last chunk hold one block fewer (Megatron-core's "
                           "account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split); "
                           "layers + 2 must divide into pp x virtual_stages chunks")
    stage_layers: list[int] | None = Field(
        None, description="the Transformer blocks of each pipeline stage in order, e.g. [14, 10] (pp entries; under "
                          "the interleaved schedule one per model chunk in model order, pp x virtual_stages "
                          "entries: chunk c of stage s is entry c x pp + s), each at least 1, summing to "
                          "model.layers; balances a pipeline over GPUs of different speeds (docs/mixed.md). "
                          "Default: layers / (pp x virtual_stages) blocks each")
    cp_comm: Literal["ring", "all_gather"] = Field(
        "ring", description="context parallelism: ring (K/V passed around the ring, overlapping attention) or "
                            "all_gather (K/V all-gathered per block)")
    dp_overlap: bool = Field(
        True, description="reduce gradient buckets while backward runs (DDP; Megatron's overlap_grad_reduce, "
                          "which may be given by that name instead: all-reduce, or reduce-scatter per bucket "
                          "under the distributed optimizer); false: after the backward. Default true as PyTorch "
                          "DDP and NeMo (overlap_grad_sync: True); Megatron-LM's --overlap-grad-reduce is off "
                          "unless given")
    gradient_as_bucket_view: bool = Field(
        False, description="PyTorch DDP (zero: 0, framework: pytorch): gradients are views into the all-reduce "
                           "buckets; false, DDP's default: each bucket's gradients are copied into it before its "
                           "all-reduce and back after it (a copy kernel each way per bucket) and the buckets take "
                           "as much memory again as the gradients (torch.nn.parallel.DistributedDataParallel "
                           "gradient_as_bucket_view, default False)")
    overlap_param_gather: bool = Field(
        False, description="the distributed optimizer (zero: 1 or 2) all-gathers the updated parameters per "
                           "bucket after the optimizer step without waiting, and the next iteration's forward "
                           "waits for each bucket's all-gather before the layers that use it (Megatron-LM "
                           "--overlap-param-gather, default off; NeMo overlap_param_sync, on in its GPT recipes); "
                           "false: the step waits for every all-gather")

    overlap_p2p_comm: bool = Field(
        False, description="pipeline sends and receives issued one by one (not batched) and waited for on the GPU "
                           "by the step that needs them, with no host synchronisation, so they overlap the "
                           "compute around them (Megatron-LM --overlap-p2p-communication, default off, which "
                           "turns batch_p2p_comm off; interleaved schedule only); false: Megatron's batched "
                           "isend/irecv and a host wait before each step")
    tp_comm_overlap: bool = Field(
        False, description="Transformer Engine's userbuffers overlap of the tensor-parallel all-gather and "
                           "reduce-scatter with the GEMMs beside them (Megatron-core / NeMo tp_comm_overlap, default "
                           "off; NeMo's GPT and LLaMA recipes turn it on): the forward all-gather as a ring exchange "
                           "with a GEMM chunk per step, the reduce-scatter after GEMM chunks; needs sp and tp > 1")

    tp_comm_overlap_sms: UserbufferSMs = Field(
        default_factory=lambda: UserbufferSMs(),
        description="under tp_comm_overlap, the SMs each overlap's communication kernel takes beside its GEMM, per "
                    "layer (the ub config's num_sm; Transformer Engine's defaults, 16)")

    sharding: EmbeddingSharding = Field(default_factory=lambda: EmbeddingSharding(),
                                        description="embedding sharding plan (DLRM)")

    @model_validator(mode="before")
    @classmethod
    def _megatron_names(cls, data: Any) -> Any:
        if isinstance(data, dict) and "overlap_grad_reduce" in data:
            data = dict(data)
            value = data.pop("overlap_grad_reduce")
            if "dp_overlap" in data and data["dp_overlap"] != value:
                raise ValueError("overlap_grad_reduce is Megatron's name of dp_overlap; expected one of them, "
                                 "or both equal")
            data["dp_overlap"] = value
        return data

    @model_validator(mode="after")
    def _zero_or_fsdp(self) -> Parallelism:
        if self.overlap_param_gather and self.zero_stage not in (1, 2):
            raise ValueError(f"overlap_param_gather is the distributed optimizer's; expected zero: 1 or 2, got "
                             f"zero: {self.zero_stage}")
        if self.overlap_p2p_comm and self.pp_schedule != "interleaved":
            raise ValueError(f"overlap_p2p_comm is Megatron's for the interleaved schedule; expected pp_schedule: "
                             f"interleaved, got {self.pp_schedule}")
        if self.tp_comm_overlap and not (self.sp and self.tp > 1):
            raise ValueError(f"tp_comm_overlap overlaps sequence parallelism's all-gathers and reduce-scatters; "
                             f"expected sp: true and tp > 1, got sp: {str(self.sp).lower()}, tp: {self.tp}")
        if self.fsdp and self.zero not in (0, 3):
            raise ValueError(f"fsdp is ZeRO stage 3; it contradicts zero: {self.zero}; expected zero: 3 or no fsdp")
        if self.gradient_as_bucket_view and self.zero_stage != 0:
            raise ValueError(f"gradient_as_bucket_view is PyTorch DDP's; expected zero: 0, got zero: {self.zero_stage}")
        if "tp_comm_overlap_sms" in self.model_fields_set and not self.tp_comm_overlap:
            raise ValueError("tp_comm_overlap_sms are the SMs of userbuffers' overlaps; expected tp_comm_overlap: "
                             "true")
        fsdp_keys = [k for k in ("forward_prefetch", "backward_prefetch", "limit_all_gathers", "reshard_after_forward")
                     if k in self.model_fields_set]
        if fsdp_keys and self.zero_stage != 3:
            raise ValueError(f"{fsdp_keys[0]} is FSDP's (ZeRO stage 3); expected zero: 3 or fsdp: true, got "
                             f"zero: {self.zero}")
        return self

    @property
    def zero_stage(self) -> int:
        return 3 if self.fsdp else int(self.zero)

    @property
    def serving_split(self) -> tuple[int, int, int]:
        """A served model's (attention_dp, moe_tp, moe_ep), defaults resolved."""
        adp = self.attention_dp or self.ep
        moe_tp = self.moe_tp or (self.tp if self.moe_ep is None else self.tp * adp // self.moe_ep)
        moe_ep = self.moe_ep or (adp if self.moe_tp is None else self.tp * adp // self.moe_tp)
        return adp, moe_tp, moe_ep

    @model_validator(mode="after")
    def _serving_split(self) -> Parallelism:
        given = [k for k in ("attention_dp", "moe_tp", "moe_ep") if getattr(self, k) is not None]
        if given and self.ep > 1:
            raise ValueError(f"ep is short for attention_dp = moe_ep; expected ep or {given[0]}, not both")
        if given:
            adp = self.attention_dp or self.ep
            stage = self.tp * adp
            for key in ("moe_tp", "moe_ep"):
                v = getattr(self, key)
                if v is not None and stage % v:
                    raise ValueError(f"{key} ({v}) does not divide tp x attention_dp ({self.tp} x {adp} = {stage}), "
                                     f"the GPUs the MoE layers run on; expected a divisor of {stage}")
            _, mt, me = self.serving_split
            if mt * me != stage:
                raise ValueError(f"moe_tp x moe_ep ({mt} x {me}) must equal tp x attention_dp ({self.tp} x {adp}): "
                                 f"the MoE layers run on the same GPUs as attention; expected moe_tp x moe_ep = "
                                 f"{stage}")
        return self


class Comm(Spec):
    """Communication settings of the job."""

    algorithm: Literal["auto", "ring", "tree", "nvls", "direct"] = Field(
        "auto", description="collective algorithm; auto picks the fastest for each op, size and group, "
                            "as NCCL's tuner does; a named one applies where it implements the op")
    protocol: Literal["auto", "ll", "ll128", "simple"] = Field(
        "auto", description="NCCL protocol; auto picks per collective")
    bucket_mib: Annotated[float, Field(gt=0)] = Field(
        25.0, description="gradient bucket size of data-parallel reductions, MiB of fp32 gradients (PyTorch DDP "
                          "bucket_cap_mb, default 25); buckets are filled in the order backward readies the "
                          "gradients, the reverse of the parameters' order, as DDP's rebuilt buckets after the first "
                          "iteration. Under training.framework: megatron, when not given, Megatron-core's "
                          "DistributedDataParallelConfig.bucket_size default: max(40,000,000, 1,000,000 x dp) "
                          "parameters (megatron/core/distributed/distributed_data_parallel.py); given, that many "
                          "MiB (its --ddp-bucket-size in parameters of 4 bytes)")
    first_bucket_mib: Annotated[float, Field(gt=0)] = Field(
        1.0, description="size of the first gradient bucket, MiB, so that the first all-reduce starts early "
                         "(PyTorch DDP's torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, 1 MiB); PyTorch DDP's "
                         "only: Megatron's buckets are all of one size")
