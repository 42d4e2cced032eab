"""Embedding tables of a DLRM and their shards.

This module owns the tables a DLRM looks up (given one by one, ``count`` expanded, or generated from
the run's seed), the index-reuse statistics their id distributions give the lookup kernels, the
shards a sharding plan cuts them into (whole tables, column slices, row blocks, replicas), how many
ids each shard receives, and each shard's memory on its GPU.

Tables are fp32 and looked up by FBGEMM table-batched kernels; ids are int64 and bag lengths int32,
one per sample per table. Ids are assumed hashed, so each row block of a row-wise table receives
its share of a table's ids in proportion to its rows. A hybrid table (HugeCTR's hybrid embedding,
:mod:`~simgpu.workload.dlrm.hybrid`) has a replica of its most-hit rows on every rank and its other
rows in even blocks; each part receives the share of the table's ids its rows draw under the
table's distribution (:func:`zipf_share`), the blocks of the rest in proportion to their rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from ...config.dlrm import DLRMModel, IndexDistribution
from ...config.sharding import ShardingType
from ...graph import MemoryEstimate
from ...kernels.lookups import uniform_reuse

EMB_BYTES: Final = 4     # fp32 table rows, pooled embeddings and their gradients
ID_BYTES: Final = 8      # int64 sparse ids
LENGTH_BYTES: Final = 4  # int32 bag lengths
ROW_STATE_BYTES: Final = 4  # row-wise adagrad: one fp32 per row
#: Names of the reuse statistics the lookup kernels carry for skewed tables (see :func:`zipf_reuse`).
REUSE_TOP: Final = (("reuse_top0p1", 0.001), ("reuse_top1", 0.01), ("reuse_top10", 0.1))
_EXACT_RANKS: Final = 1024  # zipf ranks summed one by one; beyond, geometric bins
_BINS: Final = 2048


@dataclass(frozen=True)
class Table:
    """One embedding table; ``index`` is its position among all tables (``count`` expanded, generated
    ones last). ``zipf_alpha`` is 0 for uniformly drawn ids."""

    index: int
    rows: int
    dim: int
    pooling: float
    zipf_alpha: float = 0.0

    @property
    def nbytes(self) -> int:
        return self.rows * self.dim * EMB_BYTES

    def ids(self, batch: int) -> int:
        """Ids looked up for ``batch`` samples."""
        return round(batch * self.pooling)


def _alpha(d: IndexDistribution) -> float:
    return d.alpha if d.kind == "zipf" else 0.0


def expand_tables(model: DLRMModel, rng: np.random.Generator) -> list[Table]:
    """The model's tables in order: those given (``count`` expanded), then the generated ones.

    Generation draws, from ``rng`` and in this order, every table's rows (log-uniform, rounded),
    then dims (uniform choice), then pooling factors (uniform), so a seed gives one set of tables.
    """
    tables: list[Table] = []
    for t in model.tables:
        for _ in range(t.count):
            tables.append(Table(len(tables), t.rows, t.dim or model.embedding_dim, t.pooling_factor,
                                _alpha(t.distribution)))
    g = model.generate
    if g is not None:
        lo, hi = g.rows
        rows = np.rint(np.exp(rng.uniform(math.log(lo), math.log(hi), g.count))).astype(np.int64)
        dims = rng.choice(np.asarray(g.dims or [model.embedding_dim]), g.count)
        pooling = rng.uniform(g.pooling[0], g.pooling[1], g.count)
        for r, d, p in zip(rows, dims, pooling, strict=True):
            tables.append(Table(len(tables), int(np.clip(r, lo, hi)), int(d), float(p), _alpha(g.distribution)))
    return tables


def zipf_reuse(rows: int, lookups: float, alpha: float) -> dict[str, float]:
    """Expected index-reuse statistics of ``lookups`` ids drawn from Zipf(``alpha``) over ``rows``.

    ``reuse_unique`` is distinct rows / lookups, ``sum_k 1 - (1 - p_k)^n``; ``reuse_topX`` the share
    of lookups that hit the X% most-hit rows, taken as the most popular rows: walking ranks in
    order, the expected hits of the first rows that together are expected to be seen X% of the
    table's rows times (chance makes the real top rows a little hotter, so this is a slight
    underestimate). Ranks beyond the first 1,024 are summed in geometric bins of equal per-row
    probability.
    """
    n = max(float(lookups), 1.0)
    if rows <= _EXACT_RANKS:
        edges = np.arange(1, rows + 2, dtype=float)
    else:
        tail = np.unique(np.floor(np.geomspace(_EXACT_RANKS + 1, rows + 1, _BINS)))
        edges = np.concatenate([np.arange(1, _EXACT_RANKS + 1, dtype=float), tail])
    lo, hi = edges[:-1], edges[1:]
    count = hi - lo
    # sum of k^-alpha over [lo, hi): exact for single ranks, the midpoint integral for bins
    a, b = lo - 0.5, hi - 0.5
    integral = np.log(b / a) if abs(alpha - 1.0) < 1e-12 else (b ** (1 - alpha) - a ** (1 - alpha)) / (1 - alpha)
    weight = np.where(count == 1, lo ** -alpha, integral)
    p = weight / weight.sum() / count  # probability of one row of each bin
    touched = -np.expm1(n * np.log1p(-np.minimum(p, 1 - 1e-15)))
    cum_rows = np.cumsum(count * touched)   # distinct rows seen, most popular first
    cum_hits = np.cumsum(count * n * p)     # and the lookups that hit them
    distinct = float(cum_rows[-1])
    out = {"reuse_unique": min(1.0, distinct / n)}
    for name, share in REUSE_TOP:
        m = max(1.0, math.floor(share * rows))
        i = int(np.searchsorted(cum_rows, m))
        if i >= len(cum_rows):
            hits = n
        else:  # part of bin i, pro rata
            prev_rows, prev_hits = (cum_rows[i - 1], cum_hits[i - 1]) if i else (0.0, 0.0)
            hits = prev_hits + (m - prev_rows) / (count[i] * touched[i]) * count[i] * n * p[i]
        out[name] = float(min(1.0, hits / n))
    return out


def zipf_harmonic(n: int, alpha: float) -> float:
    """``sum_{k=1..n} k ** -alpha``: the first 1,024 terms one by one, the rest as the midpoint
    integral (as :func:`zipf_reuse` bins them)."""
    if n <= 0:
        return 0.0
    m = min(n, _EXACT_RANKS)
    head = float(np.sum(np.arange(1, m + 1, dtype=float) ** -alpha))
    if n <= m:
        return head
    a, b = m + 0.5, n + 0.5
    tail = math.log(b / a) if abs(alpha - 1.0) < 1e-12 else (b ** (1 - alpha) - a ** (1 - alpha)) / (1 - alpha)
    return head + tail


def zipf_share(rows: int, top: int, alpha: float) -> float:
    """The share of a table's ids that hit its ``top`` most popular rows, ids drawn from
    Zipf(``alpha``) over ``rows`` (``alpha`` 0: uniform)."""
    top = max(0, min(top, rows))
    if top in (0, rows):
        return float(top == rows)
    if alpha <= 0:
        return top / rows
    return min(1.0, zipf_harmonic(top, alpha) / zipf_harmonic(rows, alpha))


def table_reuse(rows: int, lookups: float, alpha: float) -> dict[str, float]:
    """The reuse statistics of ``lookups`` ids over ``rows`` rows: Zipf(``alpha``), or uniform at 0."""
    return zipf_reuse(rows, lookups, alpha) if alpha > 0 else uniform_reuse(rows, lookups)


def batched_lookup(parts: Sequence[tuple[int, int, float, float, float]],
                   reuse: Callable[[int, float, float], dict[str, float]] = table_reuse) -> dict[str, float]:
    """The parameters of one table-batched lookup kernel (FBGEMM's TBE: all of a rank's tables of a
    sharding in one launch) over ``parts``, each ``(rows, dim, bags, ids, alpha)`` of one table or
    shard, all of one ``dim``: ``batch`` the mean bags per table, ``pooling`` ids per bag, ``rows``
    the mean rows (so ``tables x rows`` is every row the kernel may touch), ``reuse_unique`` the
    distinct rows over the ids summed over the parts, and each top share weighted by the parts' ids.
    ``reuse`` gives a part's statistics (:func:`table_reuse`, or a cached one)."""
    n = len(parts)
    ids = sum(p[3] for p in parts)
    bags = sum(p[2] for p in parts)
    out = {"batch": bags / n, "tables": float(n), "pooling": ids / max(bags, 1.0),
           "dim": float(parts[0][1]), "rows": sum(p[0] for p in parts) / n}
    stats = [(p[3], reuse(p[0], p[3], p[4])) for p in parts]
    for name in ("reuse_unique", *(k for k, _ in REUSE_TOP)):
        out[name] = sum(w * st[name] for w, st in stats) / max(ids, 1.0)
    return out


@dataclass(frozen=True)
class Shard:
    """The part of ``table`` that lives on ``rank``: ``rows`` x ``dim`` from ``row_offset`` /
    ``col_offset``. A data-parallel table has one full replica per rank. A hybrid table has, per
    rank, a ``frequent`` replica of its most-hit rows and a block of the others; ``share`` is the
    share of the table's ids (of each rank's samples) that a hybrid part's rows receive."""

    table: Table
    type: ShardingType
    rank: int
    rows: int
    dim: int
    row_offset: int = 0
    col_offset: int = 0
    share: float | None = None
    frequent: bool = False

    @property
    def nbytes(self) -> int:
        return self.rows * self.dim * EMB_BYTES

    @property
    def by_rows(self) -> bool:
        """Row-split shards hold partial sums of a table's bags over their rows."""
        return self.type in ("row_wise", "table_row_wise")

    def ids_from_each_rank(self, batch: int) -> int:
        """Ids this shard receives from each rank's ``batch`` samples (all of a table's ids for whole
        tables and column shards; a row block's share for row-split shards)."""
        ids = self.table.ids(batch)
        if self.share is not None:  # a hybrid part: the ids its rows draw
            return round(ids * self.share)
        return round(ids * self.rows / self.table.rows) if self.by_rows else ids

    def input_bytes_from_each_rank(self, batch: int) -> int:
        """Ids and bag lengths this shard receives from each rank in the input all-to-all (none for a
        hybrid table's frequent replica: its lookups stay on the rank)."""
        if self.frequent:
            return 0
        return self.ids_from_each_rank(batch) * ID_BYTES + batch * LENGTH_BYTES

    def bags_from_each_rank(self, batch: int) -> int:
        """Pooled vectors this shard returns for each rank's ``batch`` samples: every sample's bag for
        whole tables and row-split shards (partial sums); for a hybrid block, the samples whose bag
        has an id among its rows, ``1 - (1 - share) ** pooling`` of them."""
        if self.type != "hybrid" or self.share is None:
            return batch
        return round(batch * -math.expm1(self.table.pooling * math.log1p(-min(self.share, 1.0 - 1e-12))))

    def reuse(self, lookups: float) -> dict[str, float]:
        """Index-reuse kernel parameters of this shard's lookups; none (the uniform default) if uniform."""
        if self.table.zipf_alpha <= 0 or self.rows == 0:
            return {}
        return zipf_reuse(self.rows, lookups, self.table.zipf_alpha)


def split(total: int, parts: int) -> list[int]:
    """``total`` cut into ``parts`` near-equal pieces, larger ones first (column shards)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def row_blocks(rows: int, parts: int) -> list[int]:
    """TorchRec's row-wise blocks: ``ceil(rows / parts)`` rows each, the last ones smaller or empty."""
    block = -(-rows // parts)
    return [max(0, min(block, rows - i * block)) for i in range(parts)]


def table_shards(table: Table, type_: ShardingType, ranks: tuple[int, ...], frequent: int = 0) -> list[Shard]:
    """The shards of ``table`` under ``type_`` on ``ranks`` (table_wise: one rank; column_wise: a
    rank per column slice; row_wise / table_row_wise: the ranks sharing its rows in order;
    data_parallel: every rank, a full replica each; hybrid: ``frequent`` rows replicated, see
    :func:`hybrid_shards`)."""
    if type_ == "hybrid":
        return hybrid_shards(table, ranks, frequent)
    if type_ == "table_wise":
        (r,) = ranks
        return [Shard(table, type_, r, table.rows, table.dim)]
    if type_ == "column_wise":
        out, col = [], 0
        for r, d in zip(ranks, split(table.dim, len(ranks)), strict=True):
            out.append(Shard(table, type_, r, table.rows, d, col_offset=col))
            col += d
        return out
    if type_ in ("row_wise", "table_row_wise"):
        out, row = [], 0
        for r, n in zip(ranks, row_blocks(table.rows, len(ranks)), strict=True):
            out.append(Shard(table, type_, r, n, table.dim, row_offset=row))
            row += n
        return out
    return [Shard(table, type_, r, table.rows, table.dim) for r in ranks]


def hybrid_shards(table: Table, ranks: tuple[int, ...], frequent: int) -> list[Shard]:
    """A hybrid table on ``ranks``: its ``frequent`` most-hit rows replicated on each rank (none if
    0), the other rows cut into near-equal blocks, one per rank in order (none if every row is
    frequent); each part with the share of the table's ids its rows receive."""
    frequent = max(0, min(frequent, table.rows))
    hot = zipf_share(table.rows, frequent, table.zipf_alpha)
    out = [Shard(table, "hybrid", r, frequent, table.dim, share=hot, frequent=True) for r in ranks] if frequent else []
    rest = table.rows - frequent
    if rest:
        row = frequent
        for r, n in zip(ranks, split(rest, len(ranks)), strict=True):
            out.append(Shard(table, "hybrid", r, n, table.dim, row_offset=row, share=(1.0 - hot) * n / rest))
            row += n
    return out


def footprint(shard: Shard, batch: int, world: int, embedding_optimizer: str, dense_states: int) -> MemoryEstimate:
    """The bytes ``shard`` adds to its GPU with ``batch`` samples per rank over ``world`` ranks.

    Sharded tables: the rows with their fused optimizer's state (row-wise adagrad: one fp32 per
    row), the lookup output over the global batch (partial sums for row-split shards), and the
    received ids plus the received pooled-embedding gradients (the all-gather output for row-split
    shards; the intermediate of table-row-wise, 1/L of its lookup output, is left out).
    Data-parallel replicas: the table, its dense fp32 gradient and DDP's bucket copy of it, the
    dense optimizer's ``dense_states`` fp32 states, and the lookup output of the local batch.
    Hybrid parts: a frequent replica, its rows, their dense fp32 gradient (all-reduced in place)
    and the lookup output of the local batch; a block of infrequent rows, its rows with their
    optimizer state, the ids it receives and the vectors it returns (and their gradients).
    """
    gb = batch * world
    if shard.type == "hybrid":
        if shard.frequent:
            return MemoryEstimate(embeddings=shard.nbytes, gradients=shard.nbytes,
                                  activations=batch * shard.dim * EMB_BYTES)
        state = shard.rows * ROW_STATE_BYTES if embedding_optimizer == "adagrad" else 0
        vectors = world * shard.bags_from_each_rank(batch) * shard.dim * EMB_BYTES
        ids = world * shard.input_bytes_from_each_rank(batch)
        return MemoryEstimate(embeddings=shard.nbytes + state, activations=vectors, buffers=ids + vectors)
    if shard.type == "data_parallel":
        return MemoryEstimate(embeddings=shard.nbytes, gradients=shard.nbytes,
                              optimizer_states=shard.nbytes * dense_states,
                              activations=batch * shard.dim * EMB_BYTES, buffers=shard.nbytes)
    state = shard.rows * ROW_STATE_BYTES if embedding_optimizer == "adagrad" else 0
    out = gb * shard.dim * EMB_BYTES
    ids = world * shard.input_bytes_from_each_rank(batch)
    return MemoryEstimate(embeddings=shard.nbytes + state, activations=out, buffers=ids + out)
