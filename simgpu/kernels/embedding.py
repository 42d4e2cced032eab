"""Embedding lookups on a GPU as memory traffic that knows the ids' distribution.

A lookup kernel gathers rows of a table (``embedding_fwd``) or applies their gradients
(``embedding_bwd``); both are bound by memory, so this model counts the bytes each level of the
memory hierarchy moves and times them at that level's bandwidth. It is the analytical model's
formula for the two families (:mod:`simgpu.kernels.analytical`); no GPU measurement of lookups was
given to this project, so every figure below is a hardware fact or a count, named where it is used.

**Forward.** ``L = batch x tables x pooling`` ids select rows; ``D = L x reuse_unique`` of them
are distinct (the reuse statistics of the ids' distribution: :func:`~simgpu.kernels.lookups.uniform_reuse`
for uniform ids, :func:`~simgpu.workload.dlrm.embedding.zipf_reuse` for a Zipf skew, or measured
from a trace). Each row is read in whole 32-byte sectors. The first touch of every distinct row
comes from HBM; a repeated id hits L2 when the distinct rows it is drawn from fit in the cache (the
share of the working set ``D x row`` that L2 holds, ``min(1, L2 / (D x row))``), else it goes to
HBM again; with a skewed distribution L2 keeps the hottest rows, so a repeat hits it with the share
of lookups that fall on as many of the most-looked-up rows as L2 holds (:func:`hot_share`, from the
reuse statistics' top shares). So a table that fits in L2 (few distinct rows) or a skewed
distribution (the same hot rows again and again) costs fewer HBM bytes than uniform ids over a large table at the same
pooling. The ids (8 bytes), the bag offsets (4 bytes per bag) and the pooled output
(``batch x tables x dim`` at ``out_bytes``) are streamed once.

**Backward with the fused optimizer** (``fused`` 1: FBGEMM's table-batched kernels, NVIDIA's DLRM
custom kernels): the ids are sorted with their positions (a radix sort of ``ceil(log2(rows x
tables) / 8)`` passes of 8-bit digits, plus one histogram pass, each reading and writing key and
value), every id reads its bag's pooled gradient, the gradients of one row are reduced, and each
distinct row (with its ``state_bytes`` of optimizer state) is read and written once.

**Backward of PyTorch's sparse gradients** (``fused`` 0: ``nn.Embedding(sparse=True)`` and an
optimizer step): the backward writes one gradient row per id (a COO tensor), the optimizer's
``coalesce`` sorts them and writes the reduced rows, then ``index_add_`` reads them and updates
the rows: the same sort and row update, with the per-id gradient rows written and read back.

Bandwidths: HBM at the platform's ``hbm_gbytes_per_s x memory_efficiency``; L2 at
:data:`L2_OVER_HBM` times the HBM figure. Each backward runs :data:`BWD_KERNELS` kernels (sort
passes, reduction, update), each at least the platform's shortest kernel.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np

from ..config.platform import GPUSpec

#: Bytes of one DRAM sector, the unit in which a row is read.
SECTOR: Final = 32
#: Bytes of an id (int64) and of one bag's offset (int32).
ID_BYTES: Final = 8
OFFSET_BYTES: Final = 4
#: Bytes of a sorted id's value (its int32 position).
POSITION_BYTES: Final = 4
#: L2 over HBM bandwidth: the Volta microbenchmarks of Jia et al. ("Dissecting the NVIDIA Volta GPU
#: Architecture via Microbenchmarking", 2018) measure 2,155 GB/s from L2 against ~850 GB/s from HBM2
#: on a V100, about 2.5x; Ampere's and Hopper's L2 keep a similar ratio to their HBM.
L2_OVER_HBM: Final = 2.5
#: L2 assumed where a platform gives none (V100: 6 MiB, Volta whitepaper).
DEFAULT_L2_MIB: Final = 6.0
#: Bits sorted per radix pass (CUB's onesweep radix sort uses 8-bit digits).
RADIX_BITS: Final = 8
#: Kernels of a backward: histogram, sort passes (counted in bytes, launched as about four),
#: the segment reduction and the row update.
BWD_KERNELS: Final = 6


def l2_resident(distinct_bytes: float, l2_bytes: float) -> float:
    """The share of a lookup's working set (its distinct rows' bytes) that L2 holds."""
    return 1.0 if distinct_bytes <= l2_bytes else l2_bytes / distinct_bytes


def hot_share(fraction: float, p: dict[str, float]) -> float:
    """The share of lookups that hit the ``fraction`` most-looked-up rows, from the reuse statistics'
    top 0.1%, 1% and 10% shares: linear in the fraction up to 0.1%, then linear in its logarithm
    between the points, reaching 1 at all rows. Uniform ids give about ``fraction``; skewed ids
    concentrate their lookups on the few hot rows."""
    points = [(1e-3, p["reuse_top0p1"]), (1e-2, p["reuse_top1"]), (1e-1, p["reuse_top10"]), (1.0, 1.0)]
    if any(np.isnan(v) for _, v in points):
        return fraction
    f = min(max(fraction, 0.0), 1.0)
    if f <= points[0][0]:
        return f / points[0][0] * points[0][1]
    for (f0, s0), (f1, s1) in zip(points, points[1:], strict=False):
        if f <= f1:
            return s0 + (s1 - s0) * math.log(f / f0) / math.log(f1 / f0)
    return 1.0


def row_bytes(dim: float, elem: float) -> float:
    """Bytes a row of ``dim`` elements of ``elem`` bytes takes to read: whole 32-byte sectors."""
    return math.ceil(dim * elem / SECTOR) * SECTOR


def lookup_seconds(gpu: GPUSpec, family: str, elem: float, p: dict[str, float]) -> float:
    """Seconds of one ``embedding_fwd`` / ``embedding_bwd`` kernel with parameters ``p`` (see
    :data:`~simgpu.kernels.lookups.LOOKUP_PARAMS`) on ``gpu``, tables of ``elem`` bytes per
    element, before the platform's shortest-kernel floor."""
    hbm = gpu.hbm_gbytes_per_s * 1e9 * gpu.memory_efficiency
    l2_bw = hbm * L2_OVER_HBM
    l2 = (gpu.l2_mib or DEFAULT_L2_MIB) * 2.0 ** 20
    batch, tables, pooling, dim = p["batch"], p["tables"], p["pooling"], p["dim"]
    row = row_bytes(dim, elem)
    lookups = batch * tables * pooling
    distinct = min(lookups * p["reuse_unique"], tables * p["rows"])
    # the repeated ids that L2 serves: all of them when the distinct rows fit, else those that fall on
    # the hottest rows, as many as L2 holds (LRU keeps the rows hit most often)
    resident = max(l2_resident(distinct * row, l2), hot_share(l2 / row / max(tables * p["rows"], 1.0), p))
    repeats = max(lookups - distinct, 0.0)
    out = p["out_bytes"] if not np.isnan(p["out_bytes"]) else elem
    pooled = batch * tables * dim * out
    if family == "embedding_fwd":
        from_hbm = (distinct + repeats * (1.0 - resident)) * row + lookups * ID_BYTES + batch * tables * OFFSET_BYTES
        return from_hbm / hbm + repeats * resident * row / l2_bw + pooled / hbm
    # backward
    key_bits = max(1.0, math.log2(max(tables * p["rows"], 2.0)))
    passes = math.ceil(key_bits / RADIX_BITS) + 1
    sort = lookups * (ID_BYTES + POSITION_BYTES) * 2.0 * passes
    grad_row = row_bytes(dim, out)
    grads = lookups * grad_row  # each id reads its bag's pooled gradient
    update = distinct * (2.0 * row + 2.0 * p["state_bytes"])
    nbytes = sort + grads + update + pooled
    if not p["fused"]:
        nbytes += 2.0 * lookups * row  # the per-id gradient rows written, then read by coalesce
        nbytes += 2.0 * distinct * row  # the coalesced rows written, then read by index_add_
    return nbytes / hbm + BWD_KERNELS * gpu.kernel_min_us * 1e-6
