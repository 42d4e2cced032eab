"""A variant of a job file, and what one kind of study does with its variants.

A variant is the base file with ``key.path=value`` overrides (the language of ``--set``). A
:class:`StudyKind` is how a study runs the variants of one kind of file (:data:`simgpu.config.loader.JobKind`):
the hash of the job a variant simulates, the row it becomes, the check of an override before any
runs, and the ranking of the rows. The what-if studies (:mod:`simgpu.whatif.study`) run every kind
through this interface; the serving stage provides its kinds (:data:`simgpu.serve.study.KINDS`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd


@dataclass(frozen=True)
class Variant:
    """A workload to simulate: the base file with ``overrides`` applied."""

    name: str
    overrides: tuple[tuple[str, Any], ...]
    swept: tuple[tuple[str, Any], ...] = ()

    @property
    def id(self) -> str:
        blob = json.dumps([list(kv) for kv in self.overrides], sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:12]

    def as_args(self) -> list[str]:
        return [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in self.overrides]


@dataclass(frozen=True)
class StudyKind:
    """How a study runs the variants of one kind of file."""

    #: a hash of the job ``variant`` of the base file simulates (its row is reused while it holds)
    job_key: Callable[[str | Path, Variant], str]
    #: the variant simulated as one row; never raises (failures become rows with ``status`` and ``why``)
    run_variant: Callable[[str, Variant], dict[str, Any]]
    #: the rows ranked, best first, at most ``limit`` of them listed
    ranking: Callable[[pd.DataFrame, int], str]
    #: each ``(key, value)`` override applied alone to the base must be a key of it with a value of its
    #: kind (None: the study checks a workload's keys itself, against the study file's lines)
    check_overrides: Callable[[Path, Sequence[tuple[str, Any]], str], None] | None = None
