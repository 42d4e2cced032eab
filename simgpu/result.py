"""What a simulation returns: flat interval records plus the facts a report needs.

Computation and I/O stay apart: :func:`simgpu.simulate` returns a :class:`SimResult`; writing
files is :func:`simgpu.report.write_outputs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .graph import Replicas

#: Columns of :attr:`SimResult.records`, one row per interval on a rank's CPU thread or stream.
RECORD_COLUMNS = (
    "rank",      # global rank (int)
    "stream",    # "cpu", "compute", "comm" or "copy"
    "name",      # op name, e.g. "layer3.fc1.fwd"
    "category",  # colour / breakdown class, e.g. "gemm", "attention", "all_reduce", "launch"
    "phase",     # "data", "fwd", "bwd", "opt"
    "kind",      # "kernel", "collective", "memcpy", "launch", "host_wait"
    "start_s",   # simulated seconds from the start of the iteration
    "end_s",
    "nbytes",    # bytes moved by collectives and copies, 0 otherwise
    "model",     # what timed it: "analytical", "lightgbm", "network", "host"
)

#: Columns of :attr:`SimResult.link_records` (only when links are recorded): busy intervals, one row per
#: link and owner (whose transfers kept the link busy: a collective's key, a copy's op name), during
#: which the link carried at least one of that owner's transfers. Two owners' rows on one link overlap
#: where they shared it at once (the bytes are not split); the union of a link's rows is its busy time.
LINK_RECORD_COLUMNS = ("link", "link_kind", "start_s", "end_s", "owner")

#: Columns of :attr:`SimResult.link_stats`: one row per link of the topology that carried data.
LINK_STAT_COLUMNS = ("link", "link_kind", "capacity_gbytes_per_s", "nbytes", "busy_s")


@dataclass
class SimResult:
    """The outcome of simulating one iteration.

    ``meta`` holds the facts the report needs and that are not intervals: workload and platform
    names, ``nodes``, ``gpus``, ``samples``, ``tokens``, ``model_flops``, ``peak_flops_per_gpu``,
    ``memory_gib`` (a list of per-rank dicts), ``kernel_model_share`` (simulated kernel seconds per
    model name), ``seed``, ``fold`` (how many identical replicas each simulated rank stands for) and
    ``fold_note`` (why the replicas were not folded, if they were not).

    When ``replicas`` is set (a folded simulation), ``records`` and ``link_stats`` cover the
    representative ranks and their nodes only; :meth:`expanded` gives every rank's records.
    """

    records: pd.DataFrame
    link_stats: pd.DataFrame
    iteration_time_s: float
    events: int
    meta: dict[str, Any] = field(default_factory=dict)
    link_records: pd.DataFrame | None = None
    replicas: Replicas | None = None

    def expanded(self) -> pd.DataFrame:
        """The records of every rank: a folded simulation's records copied onto each image."""
        rep = self.replicas
        if rep is None:
            return self.records
        parts = [self.records]
        for level, (block, unit) in enumerate(rep.levels):
            grown = []
            for part in parts:
                ranks = part["rank"].to_numpy(dtype=np.int64)
                for k in range(1, block // unit):
                    image = part.copy()
                    image["rank"] = rep.shift_all(ranks, k, level)
                    grown.append(image)
            parts += grown
        out = pd.concat(parts, ignore_index=True)
        return out.sort_values(["rank", "stream", "start_s", "end_s"], kind="stable").reset_index(drop=True)
