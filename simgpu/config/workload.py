"""The workload file: which model, how it is trained and parallelised, on which platform.

Each field is documented; units are in the key names. Its sections are defined beside it: the
models in :mod:`~simgpu.config.transformer` and :mod:`~simgpu.config.dlrm` (the embedding sharding
plan in :mod:`~simgpu.config.sharding`), ``training`` in :mod:`~simgpu.config.training`,
``inference`` in :mod:`~simgpu.config.inference`, ``parallelism`` and ``comm`` in
:mod:`~simgpu.config.parallelism`, ``variability`` in :mod:`~simgpu.config.variability`; the rules
across sections are here. Cross-field rules that
involve the platform (world size, memory fit) are checked in :mod:`simgpu.config.checks`, the one
place for them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, PositiveInt, model_validator

from .base import Spec
from .dlrm import DLRMInferenceModel, DLRMModel
from .inference import Inference
from .parallelism import Comm, Parallelism
from .training import Training
from .transformer import TransformerInferenceModel, TransformerModel
from .variability import Variability

#: Model kinds that are served: their workload has an ``inference`` section instead of ``training``.
INFERENCE_KINDS = ("transformer_inference", "dlrm_inference")

Model = Annotated[DLRMModel | TransformerModel | TransformerInferenceModel | DLRMInferenceModel,
                  Field(discriminator="kind")]


class WorkloadSpec(Spec):
    """A workload file."""

    name: str = Field(description="a short name for the run")
    platform: str = Field(description="platform name in platforms/ or a path to a platform YAML")
    nodes: PositiveInt = Field(1, description="number of nodes of the platform")
    gpus_per_node: PositiveInt | None = Field(
        None, description="GPUs used per node; default all GPUs of the node")
    seed: int = Field(0, description="seed of the run's random generator")
    model: Model
    training: Training | None = Field(None, description="how one training iteration runs (training models)")
    inference: Inference | None = Field(
        None, description="how one inference iteration runs (transformer_inference, dlrm_inference)")
    parallelism: Parallelism = Field(default_factory=lambda: Parallelism())
    comm: Comm = Field(default_factory=lambda: Comm())
    variability: Variability | None = Field(
        None, description="GPUs that are not alike: slow GPUs, noise on kernel times, measured speeds (see "
                          "docs/variability.md); None: every GPU runs at its kernel models' times")

    @model_validator(mode="after")
    def _one_mode(self) -> WorkloadSpec:
        served = self.model.kind in INFERENCE_KINDS
        if served and self.training is not None:
            raise ValueError(f"training: a {self.model.kind} model is served, not trained; expected an inference "
                             "section instead of training")
        if not served and self.inference is not None:
            raise ValueError(f"inference: a {self.model.kind} model is trained; expected a training section instead "
                             "of inference (or a transformer_inference / dlrm_inference model)")
        split = [k for k in ("attention_dp", "moe_tp", "moe_ep") if getattr(self.parallelism, k) is not None]
        if split and not served:
            raise ValueError(f"parallelism.{split[0]} is a serving engine's split; expected ep for a trained model")
        if served and self.inference is None:
            raise ValueError(f"inference: missing required key (a {self.model.kind} model is served); expected "
                             "inference: {...}")
        if not served and self.training is None:
            raise ValueError(f"training: missing required key (a {self.model.kind} model is trained); expected "
                             "training: {...}")
        framework = self.training.framework if self.training is not None else "pytorch"
        if framework == "megatron" and "first_bucket_mib" in self.comm.model_fields_set:
            raise ValueError("comm.first_bucket_mib is PyTorch DDP's small first bucket; Megatron's buckets are all "
                             "comm.bucket_mib; expected no first_bucket_mib under training.framework: megatron")
        if framework == "nvidia_dlrm" and self.model.kind != "dlrm":
            raise ValueError(f"training.framework: nvidia_dlrm is NVIDIA's PyTorch DLRM; expected model.kind: dlrm, "
                             f"not {self.model.kind}")
        if framework == "megatron" and self.model.kind == "dlrm":
            raise ValueError("training.framework: megatron trains transformers; expected pytorch (TorchRec) or "
                             "nvidia_dlrm for a dlrm model")
        sharding = self.parallelism.sharding
        if framework == "nvidia_dlrm" and (sharding.model_fields_set - {"default"} or sharding.default != "table_wise"):
            raise ValueError("parallelism.sharding: nvidia_dlrm places whole tables by size itself and sends vectors "
                             "in the matmuls' precision; expected no sharding plan (or table_wise) under "
                             "training.framework: nvidia_dlrm")
        if self.training is not None and self.training.input_mbytes_per_s is not None and framework != "nvidia_dlrm":
            raise ValueError("training.input_mbytes_per_s: the host's input reading is modelled for nvidia_dlrm only; "
                             "expected training.framework: nvidia_dlrm or no input_mbytes_per_s")
        if self.training is not None and self.training.cuda_graphs and framework != "nvidia_dlrm":
            raise ValueError("training.cuda_graphs: captured training iterations are modelled for nvidia_dlrm only; "
                             "expected training.framework: nvidia_dlrm or no cuda_graphs")
        if self.parallelism.gradient_as_bucket_view and (self.model.kind != "transformer" or framework != "pytorch"):
            raise ValueError("parallelism.gradient_as_bucket_view is PyTorch DDP's for a transformer; expected "
                             "model.kind: transformer and training.framework: pytorch")
        return self

    @property
    def train(self) -> Training:
        """The training section (a trained model always has one)."""
        if self.training is None:
            raise ValueError(f"workload {self.name!r} has no training section")
        return self.training

    @property
    def serve(self) -> Inference:
        """The inference section (a served model always has one)."""
        if self.inference is None:
            raise ValueError(f"workload {self.name!r} has no inference section")
        return self.inference

    @property
    def precision(self) -> str:
        """The dtype of the matmuls, trained or served."""
        return self.serve.precision if self.training is None else self.training.precision
