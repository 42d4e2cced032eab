"""The DLRM model of a workload file: its MLPs, its embedding tables (given one by one or generated
from the run's seed) and their ids, its interaction, and the served DLRM.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveInt, model_validator

from .base import Spec


class IndexDistribution(Spec):
    """How a table's ids are drawn: ``uniform`` over its rows, or ``zipf`` (row k, counted from the
    most popular, has probability proportional to ``k ** -alpha``). It sets the index-reuse
    statistics of the lookup kernels; ids are assumed hashed, so hot rows are spread over row shards."""

    kind: Literal["uniform", "zipf"] = Field("uniform", description="uniform or zipf")
    alpha: Annotated[float, Field(gt=0)] = Field(1.05, description="zipf exponent (zipf only)")


class TableSpec(Spec):
    """One embedding table (or ``count`` identical ones)."""

    rows: PositiveInt = Field(description="number of rows (distinct ids)")
    dim: PositiveInt | None = Field(None, description="embedding dimension; default model.embedding_dim")
    pooling_factor: Annotated[float, Field(gt=0)] = Field(
        description="mean number of ids looked up per sample (bag size)")
    count: PositiveInt = Field(1, description="how many identical tables this entry stands for")
    distribution: IndexDistribution = Field(default_factory=lambda: IndexDistribution(),
                                            description="distribution of the ids looked up")


class TableGenerator(Spec):
    """Tables drawn at random from the run's seed: rows log-uniform in ``rows``, dims uniformly from
    ``dims``, pooling factor uniform in ``pooling``. They follow the tables given one by one."""

    count: PositiveInt = Field(description="how many tables to generate")
    rows: tuple[PositiveInt, PositiveInt] = Field(description="[min, max] rows, drawn log-uniformly")
    dims: list[PositiveInt] | None = Field(
        None, min_length=1, description="dims to choose from uniformly; default [model.embedding_dim]")
    pooling: tuple[Annotated[float, Field(gt=0)], Annotated[float, Field(gt=0)]] = Field(
        description="[min, max] pooling factor (ids per sample), drawn uniformly")
    distribution: IndexDistribution = Field(default_factory=lambda: IndexDistribution(),
                                            description="distribution of the ids of every generated table")

    @model_validator(mode="after")
    def _ranges(self) -> TableGenerator:
        for name in ("rows", "pooling"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ValueError(f"{name}: min {lo} is larger than max {hi}")
        return self


class DCNSpec(Spec):
    """DCNv2 cross layers over the concatenated dense and pooled features x0:
    ``x_{l+1} = x0 * (W x_l + b) + x_l``, with ``W = U V`` of rank ``low_rank`` when given."""

    layers: PositiveInt = Field(3, description="number of cross layers")
    low_rank: PositiveInt | None = Field(None, description="rank of the factorised W; null: full rank")


class DLRMModel(Spec):
    """A DLRM: bottom MLP over dense features, embedding bags over sparse ones (one table per
    sparse feature), an interaction, then the top MLP."""

    kind: Literal["dlrm"]
    dense_features: PositiveInt = Field(13, description="number of dense input features")
    bottom_mlp: list[PositiveInt] = Field(
        min_length=1, description="bottom MLP layer widths; the last equals embedding_dim for dot")
    top_mlp: list[PositiveInt] = Field(min_length=1, description="top MLP layer widths; the last is usually 1")
    embedding_dim: PositiveInt = Field(description="default embedding dimension of the tables")
    tables: list[TableSpec] = Field(default_factory=list, description="embedding tables given one by one")
    generate: TableGenerator | None = Field(None, description="embedding tables drawn from the run's seed")
    interaction: Literal["dot", "cat", "dcn"] = Field(
        "dot", description="feature interaction: pairwise dot products, concatenation, or DCNv2 cross layers")
    dcn: DCNSpec | None = Field(None, description="the cross layers (interaction: dcn only)")

    @model_validator(mode="after")
    def _consistent(self) -> DLRMModel:
        if not self.tables and self.generate is None:
            raise ValueError("at least one embedding table is needed: give tables or generate")
        if self.interaction == "dot":
            d = self.bottom_mlp[-1]
            if d != self.embedding_dim:
                raise ValueError(
                    f"bottom_mlp must end in embedding_dim ({self.embedding_dim}) for the dot "
                    f"interaction, got {d}")
            dims = {t.dim or self.embedding_dim for t in self.tables}
            if self.generate is not None:
                dims |= set(self.generate.dims or [self.embedding_dim])
            if dims - {d}:
                raise ValueError(f"the dot interaction needs every table's dim to equal bottom_mlp[-1] ({d}), "
                                 f"got dims {sorted(dims)}")
        if (self.interaction == "dcn") != (self.dcn is not None):
            raise ValueError("interaction: dcn needs a dcn section, and a dcn section needs interaction: dcn")
        return self

    @property
    def table_count(self) -> int:
        """Tables after expanding ``count`` and generation."""
        return sum(t.count for t in self.tables) + (self.generate.count if self.generate else 0)


class DLRMInferenceModel(DLRMModel):
    """A DLRM answering queries (:mod:`simgpu.workload.inference.dlrm`): its forward only, over the
    tables sharded as the training plans shard them."""

    kind: Literal["dlrm_inference"]  # type: ignore[assignment]
