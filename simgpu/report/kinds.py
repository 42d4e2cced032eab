"""A mixed platform's ranks by kind of node (``meta["kinds"]``, see :mod:`simgpu.config.mixed`): per
kind its GPUs and their mean compute and idle time, in the summary and the printed table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd


def kinds_summary(kinds: Sequence[Mapping[str, Any]], per_rank: pd.DataFrame) -> list[dict[str, Any]]:
    """Per kind: its name, GPU, nodes, GPUs and the mean compute, exposed communication and idle ms of
    its ranks (``per_rank``: the summary's breakdown, indexed by rank)."""
    out = []
    for k in kinds:
        rows = per_rank.loc[per_rank.index.isin(list(k["ranks"]))]

        def mean(col: str, rows: pd.DataFrame = rows) -> float | None:
            return float(rows[col].mean()) * 1e3 if len(rows) else None

        out.append({"kind": str(k["kind"]), "gpu": str(k["gpu"]), "nodes": int(k["nodes"]), "gpus": len(k["ranks"]),
                    "compute_ms": mean("compute_s"), "exposed_communication_ms": mean("exposed_communication_s"),
                    "idle_ms": mean("idle_s")})
    return out


def kinds_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The summary's ``by_kind`` block as lines of the printed table."""
    def f(x: Any) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    lines = ["", "by kind of node (ms, mean over its GPUs)",
             f"  {'kind':<18}{'GPU':<18}{'GPUs':>6}{'compute':>12}{'exposed':>12}{'idle':>12}"]
    for r in rows:
        lines.append(f"  {r['kind']:<18}{r['gpu']:<18}{r['gpus']:>6}{f(r['compute_ms']):>12}"
                     f"{f(r['exposed_communication_ms']):>12}{f(r['idle_ms']):>12}")
    return lines
