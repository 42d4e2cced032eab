"""HugeCTR's hybrid embedding as a DLRM sharding type (``parallelism.sharding`` type ``hybrid``).

This module owns the split of a hybrid table into frequent and infrequent rows and the ops a
hybrid table adds to a rank's program. HugeCTR's hybrid embedding (NVIDIA's MLPerf DLRM
submissions, v1.0 to v2.0; HugeCTR's ``HybridSparseEmbedding``) keeps the frequent categories of
each table on every GPU and trains them data-parallel: their lookups read the local replica over
the local batch, and their gradients are all-reduced over all GPUs, then every GPU applies them.
The infrequent categories are distributed model-parallel over all GPUs: their ids go to the owning
GPU by all-to-all, which looks them up for the global batch and sends the vectors back by
all-to-all; backward, the vectors' gradients return by all-to-all and the owner applies them
(fused SGD). Here the frequent rows are the table's most popular ones under its id distribution,
the infrequent rows are cut into near-equal blocks, one per GPU (ids hashed: a block receives its
share of the infrequent ids in proportion to its rows), and a block returns one vector per sample
whose bag has an id among its rows (one-hot tables: a vector per infrequent id).

**The split rule** (HugeCTR's ``ModelInitializationFunctors::calculate_threshold`` and
``calculate_num_frequent_categories``, ``HugeCTR/src/embeddings/hybrid_embedding/calibration_data.cu``,
with its parameters as ``HybridEmbeddingParam`` names them, see
:class:`~simgpu.config.sharding.HybridSettings`). A row is frequent when its expected hits per
iteration, ``h_k = G * pooling * p_k`` (global batch ``G``, ``p_k`` the row's probability under the
table's distribution), reach a threshold ``h*``:

- across ``n > 1`` nodes (``IB_NVLink``): ``h* = n**2 / (n - 1) * (B_a2a / B_ar) * efficiency``,
  with ``B_a2a`` and ``B_ar`` the all-to-all and all-reduce bandwidths (HugeCTR's defaults
  1.9e11 and 1.3e11 B/s). All-reducing a row's gradient costs about ``2 row_bytes / B_ar`` per
  node; each of its hits from another node costs ``2 row_bytes`` of all-to-all (vector forward,
  gradient backward) over ``n`` nodes' links: replication is cheaper once ``h`` passes ``h*``.
- inside one node (``NVLink_SingleNode``): ``h* = G * sqrt(2 p_dup / (M (M - 1)))``, ``M = G / N``
  the per-GPU batch, ``p_dup`` (default 0.01) the largest chance that the row appears twice in
  one GPU's batch (``1/2 M (M-1) (h / G)**2``) while it stays infrequent.

Over all hybrid tables at most ``max_frequent_per_batch * G`` rows are frequent (HugeCTR's
``max_num_frequent_categories``, 2 in its MLPerf configs); beyond, the threshold rises until they
fit, keeping the most-hit rows. Under Zipf(``alpha``) over ``R`` rows, ``p_k = k**-alpha / H(R)``,
so the frequent count is ``floor((G pooling / (H(R) h*)) ** (1 / alpha))``; uniform ids make all
rows frequent or none. A table's ``frequent_rows`` overrides the rule. HugeCTR rounds the count
up to a multiple of the GPUs; that is left out.

Lookup kernels take the parameters :func:`simgpu.workload.dlrm.builder._lookups` gives its
kernels (batch: bags written, tables, pooling, dim, rows, the reuse statistics): keep them in step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from ...config.sharding import HybridSettings
from ...graph import CollectiveCall
from ..common import Emitter
from .embedding import Shard, Table, batched_lookup, zipf_harmonic

if TYPE_CHECKING:
    from .builder import Layout

_BISECTIONS = 80


def threshold_hits(settings: HybridSettings, nodes: int, gpus: int, global_batch: int) -> float:
    """HugeCTR's ``h*``: expected hits per iteration from which a row is frequent (see the module
    docstring); infinite where no row can be duplicated in one GPU's batch (one sample a GPU)."""
    if nodes > 1:
        ratio = settings.all_to_all_gbytes_per_s / settings.all_reduce_gbytes_per_s
        return nodes * nodes / (nodes - 1) * ratio * settings.efficiency_bandwidth_ratio
    m = global_batch / gpus
    if m <= 1:
        return math.inf
    return global_batch * math.sqrt(2.0 * settings.p_dup_max / (m * (m - 1.0)))


@lru_cache(maxsize=4096)
def _harmonic(rows: int, alpha: float) -> float:
    return zipf_harmonic(rows, alpha)


def frequent_rows(rows: int, lookups: float, alpha: float, threshold: float) -> int:
    """How many of a table's ``rows`` have at least ``threshold`` expected hits among ``lookups``
    ids drawn from Zipf(``alpha``) (``alpha`` 0: uniform): its most popular rows."""
    if threshold <= 0:
        return rows
    if math.isinf(threshold) or lookups <= 0:
        return 0
    if alpha <= 0:
        return rows if lookups / rows >= threshold else 0
    k = (lookups / (_harmonic(rows, alpha) * threshold)) ** (1.0 / alpha)
    return int(min(rows, math.floor(k * (1 + 1e-12))))


def _top_hits(t: Table, lookups: float) -> float:
    """Expected hits of the table's most popular row."""
    return lookups / (t.rows if t.zipf_alpha <= 0 else _harmonic(t.rows, t.zipf_alpha))


def frequent_counts(tables: Sequence[Table], given: dict[int, int], settings: HybridSettings, nodes: int,
                    gpus: int, global_batch: int) -> dict[int, int]:
    """Frequent rows of each of ``tables`` (the hybrid ones): ``given`` where the plan says, else
    HugeCTR's rule, under its cap over all of them (see the module docstring)."""
    out = {t.index: min(given[t.index], t.rows) for t in tables if t.index in given}
    auto = [t for t in tables if t.index not in given]
    cap = settings.max_frequent_per_batch * global_batch - sum(out.values())

    def counts(h: float) -> dict[int, int]:
        return {t.index: frequent_rows(t.rows, t.ids(global_batch), t.zipf_alpha, h) for t in auto}

    h = threshold_hits(settings, nodes, gpus, global_batch)
    found = counts(h)
    if sum(found.values()) > cap:  # raise the threshold until the most-hit rows fit under the cap
        lo, hi = max(h, 1e-12), max(_top_hits(t, t.ids(global_batch)) for t in auto) * 2.0
        for _ in range(_BISECTIONS):
            mid = math.sqrt(lo * hi)
            if sum(counts(mid).values()) > cap:
                lo = mid
            else:
                hi = mid
        found = counts(hi)
    return {**out, **found}


# ---- the ops of a rank's program


def _parts(layout: Layout, rank: int) -> tuple[list[Shard], list[Shard]]:
    parts = layout.of("hybrid", rank)
    return [s for s in parts if s.frequent], [s for s in parts if not s.frequent]


def vectors_sent(layout: Layout, rank: int) -> int:
    """Bytes of the vectors ``rank``'s infrequent blocks return to each rank (and, backward, the
    gradients each rank sends it)."""
    b = layout.batch
    return sum(s.bags_from_each_rank(b) * s.dim for s in _parts(layout, rank)[1]) * layout.wire_bytes


def _lookups(em: Emitter, layout: Layout, shards: Sequence[Shard], name: str, *, local: bool, bwd: bool,
             dep: int) -> int:
    """Lookups (or their backward) of hybrid parts, parts of one width batched into one kernel: a
    frequent replica over the local batch, an infrequent block over the bags it returns to all
    ranks. Returns the last op (``dep`` if there is none)."""
    b, w = layout.batch, layout.world.size
    groups: dict[int, list[tuple[int, int, float, float, float]]] = {}
    for s in shards:
        ids = s.ids_from_each_rank(b) * (1 if local else w)
        bags = b if local else w * s.bags_from_each_rank(b)
        if s.rows > 0 and ids > 0 and bags > 0:
            groups.setdefault(s.dim, []).append((s.rows, s.dim, float(bags), float(ids), s.table.zipf_alpha))
    last = dep
    family, phase = ("embedding_bwd", "bwd") if bwd else ("embedding_fwd", "fwd")
    for i, parts in enumerate(groups.values()):
        last = em.kernel(f"{name}.group{i}.{phase}", family, "fp32", phase=phase, deps=(dep,) if i == 0 else (),
                         **batched_lookup(parts, layout.reuse))
    return last


def _everyone(layout: Layout) -> tuple[int, ...]:
    return tuple(range(layout.world.size))


def forward(em: Emitter, layout: Layout, *, local_dep: int, ids_dep: int) -> list[int]:
    """The forward of the hybrid tables on ``em``'s rank: the frequent replicas' lookups over the
    local batch (after ``local_dep``, the batch's copy), the infrequent blocks' lookups (after
    ``ids_dep``, the ids' all-to-all) and the vectors' all-to-all back to the samples' ranks.
    Returns the ops the interaction waits for."""
    hot, cold = _parts(layout, em.rank)
    done = [_lookups(em, layout, hot, "emb.hy.frequent", local=True, bwd=False, dep=local_dep)]
    looked = _lookups(em, layout, cold, "emb.hy.infrequent", local=False, bwd=False, dep=ids_dep)
    mine = vectors_sent(layout, em.rank)
    if any(layout.hybrid_vectors):
        send = (mine,) * layout.world.size
        key = "emb.hy.output_a2a"
        done.append(em.collective(key, CollectiveCall(key, "all_to_all", _everyone(layout), sum(send), send_bytes=send),
                                  phase="fwd", deps=(looked,)))
    return done


def backward(em: Emitter, layout: Layout, dep: int) -> int | None:
    """The backward of the hybrid tables on ``em``'s rank after ``dep`` (the pooled gradients'
    packing): the infrequent vectors' gradients to their owners by all-to-all and the owners'
    backward with the fused optimizer; the frequent replicas' gradient zeroed, accumulated over
    the local batch and all-reduced (``comm_precision`` on the wire). Returns the all-reduce, which
    :func:`update` waits for (None without frequent rows)."""
    hot, cold = _parts(layout, em.rank)
    grads = None
    if any(layout.hybrid_vectors):
        send = layout.hybrid_vectors
        key = "emb.hy.grad_a2a"
        grads = em.collective(key, CollectiveCall(key, "all_to_all", _everyone(layout), sum(send), send_bytes=send),
                              phase="bwd", deps=(dep,))
    reduced = None
    numel = sum(s.rows * s.dim for s in hot)
    if numel:
        zero = em.elementwise("emb.hy.frequent_grad_zero", numel, 0, 1, "fp32", op="zero", phase="bwd", deps=(dep,))
        last = _lookups(em, layout, hot, "emb.hy.frequent", local=True, bwd=True, dep=zero)
        key = "emb.hy.frequent_ar"
        reduced = em.collective(key, CollectiveCall(key, "all_reduce", _everyone(layout), numel * layout.wire_bytes),
                                phase="bwd", deps=(last,))
    if grads is not None:
        _lookups(em, layout, cold, "emb.hy.infrequent", local=False, bwd=True, dep=grads)
    return reduced


def update(em: Emitter, layout: Layout, reduced: int | None) -> int | None:
    """Every rank applies the all-reduced frequent gradients to its replicas (SGD over their fp32
    rows, as HugeCTR's hybrid embedding does), once ``reduced`` is done."""
    numel = sum(s.rows * s.dim for s in _parts(layout, em.rank)[0])
    if reduced is None or not numel:
        return None
    return em.kernel("emb.hy.frequent_step", "optimizer", "fp32", phase="opt", deps=(reduced,), numel=numel,
                     states=0)
