"""What-if studies: a base workload and its variants, read from a study file.

A study file names a base workload, overrides applied to every variant (``set``), and the variants:
an explicit list (``variants``, each a name and its overrides) and/or a product over keys of the
platform and workload (``grid``). Every variant is a list of ``key.path=value`` overrides, the same
language as ``simgpu.run --set``, and has a stable id (a hash of its overrides) by which a study
that was interrupted resumes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from ..config.base import Spec
from ..config.loader import read_yaml, validate
from ..errors import ConfigError


class VariantSpec(Spec):
    """One explicit variant."""

    name: str = Field(description="a short label for plots and tables")
    set: dict[str, Any] = Field(default_factory=dict, description="overrides: key.path -> value")


class StudySpec(Spec):
    """A study file."""

    name: str = Field(description="the study's name (default output folder out/<name>)")
    base: str = Field(description="the base workload YAML, relative to the study file or absolute")
    set: dict[str, Any] = Field(default_factory=dict, description="overrides applied to every variant")
    grid: dict[str, list[Any]] = Field(
        default_factory=dict, description="key.path -> values; the variants are the product of all lists")
    variants: list[VariantSpec] = Field(default_factory=list, description="explicit variants")
    include_base: bool = Field(False, description="also run the base workload as it is")


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
class Study:
    spec: StudySpec
    file: str
    base: Path
    variants: tuple[Variant, ...]


def expand(spec: StudySpec) -> list[Variant]:
    """The variants of a study, in a stable order: base, explicit list, then the grid."""
    common = tuple(spec.set.items())
    out: list[Variant] = []
    if spec.include_base or (not spec.grid and not spec.variants):
        out.append(Variant("base", common))
    for v in spec.variants:
        out.append(Variant(v.name, common + tuple(v.set.items()), tuple(v.set.items())))
    if spec.grid:
        keys = list(spec.grid)
        for values in itertools.product(*(spec.grid[k] for k in keys)):
            swept = tuple(zip(keys, values))
            name = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in swept)
            out.append(Variant(name, common + swept, swept))
    ids = [v.id for v in out]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        names = [v.name for v in out if v.id in dup]
        raise ConfigError(f"variants with identical overrides: {', '.join(names[:4])}", key="variants")
    return out


def load_study(path: str | Path) -> Study:
    data, lines = read_yaml(path, "study")
    spec = validate(StudySpec, data, str(path), lines)
    for key, values in spec.grid.items():
        if not values:
            raise ConfigError("expected a non-empty list of values", file=str(path), key=f"grid.{key}")
    base = Path(spec.base)
    if not base.is_absolute():
        rel = Path(path).parent / base
        base = rel if rel.is_file() else base
    if not base.is_file():
        raise ConfigError(f"base workload {spec.base!r} not found", file=str(path), key="base")
    return Study(spec, str(path), base, tuple(expand(spec)))
