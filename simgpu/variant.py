"""A variant of a job file, and what one kind of study does with its variants.

A variant is the base file with ``key.path=value`` overrides (the language of ``--set``). A
:class:`StudyKind` is how a study runs the variants of one kind of file (:data:`simgpu.config.loader.JobKind`):
the hash of the job a variant simulates, everything it reads from files (loaded once, so that a
worker on another machine reads none of them), the row it becomes, the check of an override before
any runs, and the ranking of the rows. The what-if studies (:mod:`simgpu.whatif.study`) run every kind
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
    #: correlated draws of the kernel models' and fabrics' errors through the engine (the study's
    #: ``uncertainty``; 0: the point prediction only)
    draws: int = 0

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
    #: the variant simulated as one row; never raises (failures become rows with ``status`` and ``why``):
    #: ``run_loaded`` of what ``load`` reads
    run_variant: Callable[[str, Variant], dict[str, Any]]
    #: the rows ranked, best first, at most ``limit`` of them listed
    ranking: Callable[[pd.DataFrame, int], str]
    #: everything the variant of the base file reads from files, validated after its overrides (the
    #: workloads, their platforms, a trace's requests), in one object that pickles; raises where the
    #: variant does not load (``run_variant`` then says why in its row)
    load: Callable[[str, Variant], Any]
    #: the row of a variant from what ``load`` gave, reading none of the study's files (only the
    #: installation's kernel models); never raises
    run_loaded: Callable[[Any, Variant], dict[str, Any]]
    #: each ``(key, value)`` override applied alone to the base must be a key of it with a value of its
    #: kind (None: the study checks a workload's keys itself, against the study file's lines)
    check_overrides: Callable[[Path, Sequence[tuple[str, Any]], str], None] | None = None
