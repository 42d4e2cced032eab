"""The embedding sharding plan of a DLRM (``parallelism.sharding``): a sharding type per table, where
its shards live, or a plan the planner proposes, and HugeCTR's hybrid split.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from .base import Spec

ShardingType = Literal["table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel", "hybrid"]
#: Names of the plans the sharding planner proposes (see :mod:`simgpu.workload.dlrm.sharding`).
PlannerName = Literal["greedy_size", "greedy_lookups", "greedy_cost", "row_wise_large", "table_row_wise_large",
                      "column_wise_hot", "data_parallel_small", "hybrid_skewed"]


class TableSharding(Spec):
    """The sharding of one table. ``ranks``: table_wise, the one rank holding it; column_wise, one
    rank per column shard. ``shards``: column_wise without ranks, how many column shards (default
    shards of at least 32 columns, at most one per GPU). ``node``: table_row_wise, the node whose
    GPUs split its rows. ``frequent_rows``: hybrid, how many of its most-hit rows are replicated
    (default: HugeCTR's rule from the table's distribution, see :mod:`simgpu.workload.dlrm.hybrid`).
    Row-wise, data-parallel and hybrid tables span every GPU."""

    type: ShardingType = Field(
        description="table_wise, row_wise, column_wise, table_row_wise, data_parallel or hybrid")
    ranks: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, min_length=1, description="table_wise: [rank]; column_wise: a rank per column shard")
    shards: PositiveInt | None = Field(None, description="column_wise: number of column shards placed greedily")
    node: Annotated[int, Field(ge=0)] | None = Field(None, description="table_row_wise: the node holding the table")
    frequent_rows: NonNegativeInt | None = Field(
        None, description="hybrid: rows replicated on every GPU (its most-hit ones); default from its distribution")

    @model_validator(mode="after")
    def _fields_fit_type(self) -> TableSharding:
        if self.ranks is not None and self.type not in ("table_wise", "column_wise"):
            raise ValueError(f"ranks are for table_wise and column_wise tables; a {self.type} table spans "
                             f"every GPU" + (" of its node" if self.type == "table_row_wise" else ""))
        if self.type == "table_wise" and self.ranks is not None and len(self.ranks) != 1:
            raise ValueError(f"a table_wise table lives on one rank, got ranks {self.ranks}")
        if self.ranks is not None and len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"column shards need distinct ranks, got {self.ranks}")
        if self.shards is not None and (self.type != "column_wise" or self.ranks is not None):
            raise ValueError("shards is for column_wise tables without ranks")
        if self.node is not None and self.type != "table_row_wise":
            raise ValueError("node is for table_row_wise tables")
        if self.frequent_rows is not None and self.type != "hybrid":
            raise ValueError(f"frequent_rows is for hybrid tables; a {self.type} table has no frequent part")
        return self


class HybridSettings(Spec):
    """HugeCTR's settings of its hybrid embedding's frequent/infrequent split (its
    ``HybridEmbeddingParam``; defaults: HugeCTR's parser defaults, and the cap its MLPerf DLRM
    configs set). See :mod:`simgpu.workload.dlrm.hybrid` for the rule they enter."""

    all_to_all_gbytes_per_s: Annotated[float, Field(gt=0)] = Field(
        190.0, description="all-to-all bandwidth per GPU the rule assumes, GB/s (max_all_to_all_bandwidth 1.9e11)")
    all_reduce_gbytes_per_s: Annotated[float, Field(gt=0)] = Field(
        130.0, description="all-reduce bandwidth the rule assumes, GB/s (max_all_reduce_bandwidth 1.3e11)")
    efficiency_bandwidth_ratio: Annotated[float, Field(gt=0)] = Field(
        1.0, description="scales the across-nodes threshold (efficiency_bandwidth_ratio)")
    p_dup_max: Annotated[float, Field(gt=0, le=1)] = Field(
        0.01, description="one node: the largest chance a category is duplicated in one GPU's batch for it to "
                          "stay infrequent (p_dup_max)")
    max_frequent_per_batch: Annotated[float, Field(gt=0)] = Field(
        2.0, description="at most this many frequent rows over all hybrid tables per sample of the global batch "
                         "(max_num_frequent_categories)")


class EmbeddingSharding(Spec):
    """The embedding sharding plan, as TorchRec's: a sharding type per table and where its shards
    live. ``table_wise`` (a string) is short for ``{default: table_wise}``. Either the plan is given
    (``default`` for every table, ``tables`` for some by index, tables of ``count`` and generated
    ones numbered in order; shards without ranks placed greedily by ``balance``), or ``planner``
    names one of the plans the sharding planner proposes. Besides TorchRec's types, ``hybrid`` is
    HugeCTR's hybrid embedding (frequent rows replicated, the rest spread over every GPU).
    ``comm_precision`` and ``hybrid`` (the split's settings) apply to either."""

    default: ShardingType = Field("table_wise", description="sharding type of tables not in tables")
    balance: Literal["size", "lookups", "cost"] = Field(
        "size", description="what greedy placement balances: bytes, lookup traffic, or both")
    tables: dict[Annotated[int, Field(ge=0)], TableSharding] = Field(
        default_factory=dict, description="table index -> its sharding, overriding default")
    planner: PlannerName | None = Field(None, description="use the planner's plan of this name instead")
    hybrid: HybridSettings = Field(default_factory=lambda: HybridSettings(),
                                   description="how hybrid tables split into frequent and infrequent rows")
    comm_precision: Literal["fp32", "fp16", "bf16"] = Field(
        "fp32", description="dtype of pooled embeddings and their gradients in collectives (TorchRec's qcomms)")
    compute_kernel: Literal["fused", "per_table"] = Field(
        "fused", description="how lookups run: fused (FBGEMM's table-batched kernels with the optimizer fused in "
                             "the backward, TorchRec's default) or per_table (one nn.EmbeddingBag(sparse=True) per "
                             "table and an optimizer step on its sparse gradient, the reference DLRM's way)")

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any) -> Any:
        return {"default": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _hybrid_kernels(self) -> EmbeddingSharding:
        hybrid = self.default == "hybrid" or any(t.type == "hybrid" for t in self.tables.values())
        if self.compute_kernel == "per_table" and hybrid:
            raise ValueError("compute_kernel: per_table is TorchRec's and the reference DLRM's; hybrid tables run "
                             "HugeCTR's own kernels; expected compute_kernel: fused with hybrid tables")
        return self

    @model_validator(mode="after")
    def _planner_alone(self) -> EmbeddingSharding:
        if self.planner is not None and (self.tables or "default" in self.model_fields_set
                                         or "balance" in self.model_fields_set):
            raise ValueError("planner proposes the whole plan; give either planner or default/balance/tables")
        return self
