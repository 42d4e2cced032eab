"""The workload file: which model, how it is trained and parallelised, on which platform.

Each field is documented; units are in the key names. Cross-field rules that involve the platform
(world size, memory fit) are checked in :mod:`simgpu.config.checks`, the one place for them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveInt, model_validator

from .base import Spec

Precision = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]


class TableSpec(Spec):
    """One embedding table (or ``count`` identical ones)."""

    rows: PositiveInt = Field(description="number of rows (distinct ids)")
    dim: PositiveInt | None = Field(None, description="embedding dimension; default model.embedding_dim")
    pooling_factor: Annotated[float, Field(gt=0)] = Field(
        description="mean number of ids looked up per sample (bag size)")
    count: PositiveInt = Field(1, description="how many identical tables this entry stands for")


class DLRMModel(Spec):
    """A DLRM: bottom MLP over dense features, embedding bags over sparse ones, an interaction,
    then the top MLP."""

    kind: Literal["dlrm"]
    dense_features: PositiveInt = Field(13, description="number of dense input features")
    bottom_mlp: list[PositiveInt] = Field(description="bottom MLP layer widths; the last equals embedding_dim")
    top_mlp: list[PositiveInt] = Field(description="top MLP layer widths; the last is usually 1")
    embedding_dim: PositiveInt = Field(description="default embedding dimension of the tables")
    tables: list[TableSpec] = Field(min_length=1, description="embedding tables")
    interaction: Literal["dot", "cat"] = Field("dot", description="feature interaction")

    @model_validator(mode="after")
    def _bottom_matches_dim(self) -> DLRMModel:
        if self.interaction == "dot" and self.bottom_mlp[-1] != self.embedding_dim:
            raise ValueError(
                f"bottom_mlp must end in embedding_dim ({self.embedding_dim}) for the dot "
                f"interaction, got {self.bottom_mlp[-1]}")
        return self


class TransformerModel(Spec):
    """A decoder-only (GPT-style) Transformer."""

    kind: Literal["transformer"]
    layers: PositiveInt = Field(description="number of Transformer blocks")
    hidden: PositiveInt = Field(description="model width (d_model)")
    heads: PositiveInt = Field(description="attention heads")
    ffn_hidden: PositiveInt | None = Field(None, description="MLP inner width; default 4 * hidden")
    seq_len: PositiveInt = Field(description="tokens per sample")
    vocab: PositiveInt = Field(description="vocabulary size")

    @model_validator(mode="after")
    def _heads_divide(self) -> TransformerModel:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        return self

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden


Model = Annotated[DLRMModel | TransformerModel, Field(discriminator="kind")]


class Training(Spec):
    """How one iteration is run."""

    batch_per_gpu: PositiveInt = Field(description="samples per GPU per iteration")
    precision: Precision = Field(
        "fp32", description="compute precision of matmuls (mixed precision keeps fp32 master weights)")
    optimizer: Literal["sgd", "adam", "adagrad"] = Field("adam", description="dense optimizer")
    embedding_optimizer: Literal["sgd", "adagrad"] = Field(
        "sgd", description="fused optimizer applied in the embedding backward (DLRM)")


class Parallelism(Spec):
    """How the job is split over GPUs. ``dp`` defaults to the world size."""

    dp: PositiveInt | None = Field(None, description="data-parallel degree; must equal the number of GPUs")
    sharding: Literal["table_wise"] = Field("table_wise", description="embedding sharding plan (DLRM)")


class Comm(Spec):
    """Communication settings of the job."""

    algorithm: Literal["auto", "ring", "tree"] = Field(
        "auto", description="collective algorithm; auto picks the fastest for each size and group")
    bucket_mib: Annotated[float, Field(gt=0)] = Field(
        25.0, description="gradient bucket size of data-parallel all-reduce, MiB (DDP default 25)")


class WorkloadSpec(Spec):
    """A workload file."""

    name: str = Field(description="a short name for the run")
    platform: str = Field(description="platform name in platforms/ or a path to a platform YAML")
    nodes: PositiveInt = Field(1, description="number of nodes of the platform")
    gpus_per_node: PositiveInt | None = Field(
        None, description="GPUs used per node; default all GPUs of the node")
    seed: int = Field(0, description="seed of the run's random generator")
    model: Model
    training: Training
    parallelism: Parallelism = Field(default_factory=lambda: Parallelism())
    comm: Comm = Field(default_factory=lambda: Comm())
