"""The ``training`` section of a workload file: the batch, precision, optimizers, recomputation and
the framework whose conventions the iteration follows.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from .base import Spec

Precision = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]


class Training(Spec):
    """How one iteration is run.

    Batch: ``micro_batch`` (or its older name ``batch_per_gpu``, give one) is the samples of one
    micro-batch of one model replica (Megatron's --micro-batch-size). Each data-parallel replica runs
    ``grad_accumulation`` micro-batches per iteration, so ``global_batch`` = micro_batch x dp x
    grad_accumulation; give at most one of the two (default one micro-batch: under pure data
    parallelism ``batch_per_gpu`` is then the samples per GPU per iteration, as before).
    """

    batch_per_gpu: PositiveInt = Field(
        description="samples per micro-batch of each data-parallel replica (= micro_batch; under pure data "
                    "parallelism without accumulation, samples per GPU per iteration)")
    micro_batch: PositiveInt | None = Field(
        None, description="samples per micro-batch of one model replica (Megatron --micro-batch-size); "
                          "the same number as batch_per_gpu, give one of them")
    global_batch: PositiveInt | None = Field(
        None, description="samples per iteration over the whole job (Megatron --global-batch-size); a multiple "
                          "of micro_batch x dp; default micro_batch x dp x grad_accumulation")
    grad_accumulation: PositiveInt | None = Field(
        None, description="micro-batches per iteration of each data-parallel replica (give this or global_batch)")
    precision: Precision = Field(
        "fp32", description="compute precision of matmuls (mixed precision keeps fp32 master weights)")
    optimizer: Literal["sgd", "adam", "adagrad"] = Field("adam", description="dense optimizer")
    embedding_optimizer: Literal["sgd", "adagrad"] = Field(
        "sgd", description="fused optimizer applied in the embedding backward (DLRM)")
    recompute: Literal["none", "selective", "full"] = Field(
        "none", description="activation recomputation (Transformer): none, selective (attention core) or full "
                            "(every block re-runs its forward in backward)")
    framework: Literal["pytorch", "megatron", "nvidia_dlrm"] = Field(
        "pytorch", description="conventions of the program: pytorch (Transformer: autocast casts fp32 weights "
                               "each forward, DDP/FSDP; DLRM: TorchRec's sharded embeddings), megatron "
                               "(Transformer: low-precision weights with fp32 main params and grads, fused "
                               "kernels, batched P2P with a device sync) or nvidia_dlrm (DLRM: NVIDIA's PyTorch "
                               "DLRM of DeepLearningExamples and MLPerf v0.7: whole tables placed by size, the "
                               "bottom MLP on GPU 0, one all-to-all, fused interaction and embedding kernels)")
    input_mbytes_per_s: PositiveFloat | None = Field(
        None, description="(nvidia_dlrm) the rate, MB/s, at which one GPU's process reads and stages its input "
                          "batch on the host, one batch ahead of the GPU; None: input reading is not modelled")
    cuda_graphs: bool = Field(
        False, description="the iteration is captured in a CUDA graph and launched at once: no op pays the host's "
                           "per-launch time (nvidia_dlrm's --cuda_graphs)")
    sync_each_layer: bool = Field(
        False, description="the host synchronises with the GPU at the start and end of every block's forward and "
                           "backward (Megatron-DeepSpeed --synchronize-each-layer, DeepSpeed checkpointing's "
                           "synchronize)")
    steady_state: Literal["auto", "always", "never", "check"] = Field(
        "auto", description="how the reported iteration is found: auto simulates two iterations and reports the "
                            "second where work crosses the iteration boundary (overlap_param_gather), one "
                            "isolated iteration otherwise; always: two iterations in every case; never: one "
                            "isolated iteration (what crosses the boundary is then exposed at its end); check: "
                            "three iterations, the third reported, the summary giving the second's and third's "
                            "lengths and how far each iteration's tail (its step and what follows) is from the one "
                            "before (is the second, which auto and always report, already steady?)")
    host_overhead_us: Annotated[float, Field(ge=0)] | None = Field(
        None, description="CPU time the framework spends per launched op (Python, dispatcher, autograd), us; "
                          "default: the platform's host.launch_us")

    @model_validator(mode="before")
    @classmethod
    def _micro_batch_alias(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("micro_batch") is not None:
            if data.get("batch_per_gpu") is None:
                return {**data, "batch_per_gpu": data["micro_batch"]}
            if data["batch_per_gpu"] != data["micro_batch"]:
                raise ValueError(f"micro_batch ({data['micro_batch']}) and batch_per_gpu ({data['batch_per_gpu']}) "
                                 "name the same number; give one of them")
        return data

    @model_validator(mode="after")
    def _one_batch_rule(self) -> Training:
        if self.global_batch is not None and self.grad_accumulation is not None:
            raise ValueError("give global_batch or grad_accumulation, not both")
        return self
