"""What-if studies: a base workload and its variants, read from a study file.

A study file names a base workload, overrides applied to every variant (``set``), and the variants:
an explicit list (``variants``, each a name and its overrides) and/or a product over keys of the
platform and workload (``grid``). Every variant is a list of ``key.path=value`` overrides, the same
language as ``simgpu.run --set``, and has a stable id (a hash of its overrides) by which a study
that was interrupted resumes.
"""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import Field

from ..config.base import Spec
from ..config.hf import expand as expand_config
from ..config.loader import JobKind, check_name, job_kind, read_yaml, validate
from ..errors import ConfigError
from ..variant import StudyKind, Variant


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
    uncertainty: int = Field(0, ge=0, description="correlated draws per variant of a workload study (as simgpu run "
                                                  "--uncertainty): each row gains P10 / P50 / P90 of the iteration "
                                                  "and the ranking says whose intervals overlap the best's; 0: none")


@dataclass(frozen=True)
class Study:
    spec: StudySpec
    file: str
    base: Path
    variants: tuple[Variant, ...]
    kind: JobKind = "workload"  # what the base file is


def study_kind(kind: JobKind) -> StudyKind:
    """How a study runs the variants of a base file of ``kind``: a workload's iterations here
    (:mod:`.workload`), serving files by the serving stage's kinds (:data:`simgpu.serve.studies.KINDS`)."""
    from ..serve.studies import KINDS
    from .workload import KIND

    return KINDS.get(kind, KIND)


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
        raise ConfigError(f"variants with identical overrides: {', '.join(names[:4])}; expected each variant to "
                          "differ", key="variants")
    return out


def load_study(path: str | Path) -> Study:
    """Read a study file, check that its base exists and that every override names a key of the
    workload or platform with a value of the right kind, before any variant runs."""
    data, lines = read_yaml(path, "study")
    spec = validate(StudySpec, data, str(path), lines)
    check_name(spec.name, str(path), lines.get(("name",)))
    for key, values in spec.grid.items():
        if not values:
            raise ConfigError("expected a non-empty list of values", file=str(path), key=f"grid.{key}",
                              line=lines.get(("grid", key)))
    base = Path(spec.base)
    if not base.is_absolute():
        rel = Path(path).parent / base
        base = rel if rel.exists() else base
    if base.is_dir():
        raise ConfigError(f"base workload {spec.base!r} is a folder; expected a workload YAML file",
                          file=str(path), key="base", line=lines.get(("base",)))
    if not base.is_file():
        raise ConfigError(f"base workload {spec.base!r} not found; expected a workload YAML, relative to the study "
                          "file or absolute", file=str(path), key="base",
                          line=lines.get(("base",)))
    kind = job_kind(base, what="workload")
    check = study_kind(kind).check_overrides
    if check is not None:  # a serving study: its keys are the serving file's
        at = [*spec.set.items(), *((k, v) for k, vs in spec.grid.items() for v in vs),
              *((k, v) for var in spec.variants for k, v in var.set.items())]
        check(base, at, str(path))
    else:
        check_overrides(spec, base, str(path), lines)
    if spec.uncertainty and kind != "workload":
        raise ConfigError(f"uncertainty draws are for workload studies; expected 0 for a {kind.replace('_', ' ')} base",
                          file=str(path), key="uncertainty", line=lines.get(("uncertainty",)))
    try:
        variants = expand(spec)
    except ConfigError as e:
        raise ConfigError(e.message, file=str(path), key=e.key, line=lines.get(("variants",))) from None
    if spec.uncertainty:
        variants = [replace(v, draws=spec.uncertainty) for v in variants]
    return Study(spec, str(path), base, tuple(variants), kind)


def _related(error_key: str | None, key: str) -> bool:
    target = key.removeprefix("platform.").removeprefix("workload.")
    return error_key is not None and (error_key == target or target.startswith(error_key + ".")
                                      or error_key.startswith(target + "."))


def check_overrides(spec: StudySpec, base: Path, file: str, lines: dict[tuple[str, ...], int]) -> None:
    """Each override of the study applied alone to the base: an unknown key, or a value refused for
    that key itself (of the wrong kind, out of range), is an error of the study file. The base
    with the common ``set`` must itself be valid where no variant changes it. Rules that tie keys
    together are left to the variants, where a combination may break them."""
    common = list(spec.set.items())
    where: list[tuple[tuple[str, ...], str, Any]] = [(("set", k), k, v) for k, v in common]
    varied: list[tuple[tuple[str, ...], str, Any]] = [(("grid", k), k, v) for k, vs in spec.grid.items() for v in vs]
    varied += [(("variants", str(i), "set", k), k, v) for i, var in enumerate(spec.variants)
               for k, v in var.set.items()]
    wdata, _ = read_yaml(base, "workload")
    for at, key, value in where + varied:
        try:
            _validate_one(wdata, common, key, value, str(base))
        except ConfigError as e:
            if _related(e.key, key):
                raise ConfigError(f"{json.dumps(value, default=str)}: {e.message}", file=file, key=".".join(at),
                                  line=lines.get(at)) from None
    try:
        _validate_one(wdata, common, None, None, str(base))
    except ConfigError as e:
        if not any(_related(e.key, key) for _, key, _ in varied):
            raise


def _validate_one(wdata: dict[str, Any], common: list[tuple[str, Any]], key: str | None, value: Any,
                  wfile: str) -> None:
    """Validate the base workload's data with ``common`` and ``key = value`` applied: the workload's
    schema, or for a platform key the platform's (both for ``key`` None)."""
    from ..config.loader import apply_override, load_platform
    from ..config.workload import WorkloadSpec

    data = copy.deepcopy(wdata)
    plat: list[tuple[str, Any]] = []
    for k, v in [*common, *([(key, value)] if key is not None else [])]:
        if k.startswith("platform."):
            plat.append((k.removeprefix("platform."), v))
        else:
            apply_override(data, k.removeprefix("workload."), v, wfile)
    if key is None or not key.startswith("platform."):
        validate(WorkloadSpec, expand_config(data, wfile), wfile)
    if key is None or key.startswith("platform."):
        ref = data.get("platform")
        if isinstance(ref, str):
            load_platform(ref, plat, relative_to=Path(wfile).parent)


def ranking(table: pd.DataFrame, limit: int = 20, kind: JobKind = "workload") -> str:
    """The feasible variants ranked, best first, then the others, as the study's kind ranks them."""
    return study_kind(kind).ranking(table, limit)
