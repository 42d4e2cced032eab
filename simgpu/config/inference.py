"""The ``inference`` section of a served workload: the iteration's batch, the dtypes, the memory plan
and the serving framework's host costs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from .base import Spec

InferencePrecision = Literal["fp32", "bf16", "fp16", "fp8", "fp8_block", "mxfp8", "fp4", "nvfp4", "mxfp4", "w4a16",
                             "int4"]


class Inference(Spec):
    """How an inference deployment runs one iteration, and the batch ``simgpu run`` simulates.

    The iteration's batch (on each model replica): ``prefill_requests`` requests each processing
    ``prompt_tokens`` new prompt tokens over ``cached_tokens`` already in their KV cache (earlier
    chunks of a chunked prefill), and ``decode_requests`` requests each adding one token over a KV
    cache of ``context_tokens``. A DLRM takes ``batch_per_gpu`` queries per GPU instead. The memory
    plan reserves activations for ``max_batch_tokens`` and leaves the rest of
    ``gpu_memory_utilization`` of each GPU to the KV cache, in blocks of ``block_tokens``.
    """

    precision: InferencePrecision = Field(
        "bf16", description="dtype of the weights and of the matmuls: bf16, fp16, fp32; fp8 (per tensor), fp8_block "
                            "(128x128 blocks), mxfp8, fp4 (NVFP4, also nvfp4), mxfp4, w4a16 (4-bit weights, 16-bit "
                            "activations: int4 AWQ, also int4); see simgpu.precision")
    moe_precision: InferencePrecision | None = Field(
        None, description="dtype of the experts' weights and matmuls; default precision (gpt-oss: mxfp4 experts "
                          "beside bf16 attention)")
    kv_dtype: Literal["bf16", "fp16", "fp8"] | None = Field(
        None, description="dtype of the KV cache; default fp8 under fp8 / fp4 precision, else bf16 (fp16 for fp16)")
    prefill_requests: NonNegativeInt = Field(0, description="requests prefilling in the iteration")
    prompt_tokens: PositiveInt = Field(512, description="new prompt tokens of each prefilling request")
    cached_tokens: NonNegativeInt = Field(
        0, description="tokens already in each prefilling request's KV cache (earlier chunks)")
    decode_requests: NonNegativeInt = Field(0, description="requests decoding one token in the iteration")
    context_tokens: PositiveInt = Field(512, description="tokens in each decoding request's KV cache")
    batch_per_gpu: PositiveInt | None = Field(None, description="queries per GPU per iteration (DLRM only)")
    max_batch_tokens: PositiveInt = Field(
        8192, description="most tokens one iteration processes (activations are reserved for it)")
    max_batch_size: PositiveInt = Field(256, description="most requests one iteration holds")
    block_tokens: PositiveInt = Field(16, description="tokens per KV-cache block (paged attention; vLLM's 16)")
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = Field(
        0.9, description="share of each GPU's memory the server may use (vLLM's gpu_memory_utilization)")
    host_overhead_us: Annotated[float, Field(ge=0)] | None = Field(
        None, description="CPU time the serving framework spends per launched op, us; default: the "
                          "platform's host.launch_us")
    iteration_overhead_us: Annotated[float, Field(ge=0)] = Field(
        0.0, description="CPU time per iteration outside the ops (scheduling, input preparation, "
                         "detokenisation), us")
    framework: Literal["vllm", "tensorrt_llm", "sglang"] = Field(
        "vllm", description="which kernels are fused: vllm (the residual add into the next RMSNorm; RoPE, the KV-cache "
                            "write and SwiGLU as kernels of their own), sglang (the same fusions as vllm: "
                            "fused_add_rmsnorm, silu_and_mul, RoPE and the cache write apart) or tensorrt_llm (also "
                            "RoPE and the KV-cache write into attention, SwiGLU and the fp8 / fp4 quantisation of "
                            "activations into the GEMMs' epilogues)")
    request_overhead_us: Annotated[float, Field(ge=0)] = Field(
        0.0, description="further CPU time per iteration per request in its batch (the request's inputs, "
                         "block table, sampling and detokenisation), us")
    prefill_block_overhead_us: Annotated[float, Field(ge=0)] = Field(
        0.0, description="further CPU time per block of an iteration that prefills (the prompts' attention "
                         "metadata and bias built at every layer), us; the GPUs work through queued kernels meanwhile")
    cuda_graphs: bool = Field(
        False, description="decode-only iterations replay a captured CUDA graph: one launch for all their ops")

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            from ..precision import ALIASES
            data = {k: ALIASES.get(v, v) if k in ("precision", "moe_precision") and isinstance(v, str) else v
                    for k, v in data.items()}
        return data

    @property
    def kv(self) -> str:
        if self.kv_dtype is not None:
            return self.kv_dtype
        return ("fp8" if self.precision in ("fp8", "fp8_block", "mxfp8", "fp4", "mxfp4") else
                "fp16" if self.precision == "fp16" else "bf16")

    @property
    def experts_precision(self) -> str:
        return self.moe_precision or self.precision
