"""Importers of published kernel measurements into simgpu's measurement tables.

Each source reads its own format from ``../shared/data`` (never copied into the repository) into
the tables of :mod:`simgpu.kernels.store`: one row per measured kernel shape with ``family``,
``op``, ``dtype``, the family's KernelSpec parameters and ``median_s``. :data:`SOURCES` names them
for a platform's ``kernel_data.yaml`` (the list of tables its models are fitted on):

- ``neusight``: NeuSight's fp32 per-op tables (:mod:`.neusight`), rows of one ``gpu``;
- ``aiconfigurator``: NVIDIA AIConfigurator's GEMM, attention, fused MoE and serving-family tables (MLA,
  MLA's BMMs, Gated DeltaNet, DSA, activation quantize), per framework (:mod:`.aiconfigurator`);
- ``vidur``: Microsoft Vidur's fp16 per-operator times of LLM layers (:mod:`.vidur`).

:func:`provenance` reads the commit and licence a source's ``provenance.md`` states, for the
manifest of the models fitted on it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pandas as pd

from ...config.loader import data_root
from ...errors import ConfigError
from .aiconfigurator import read_aiconfigurator
from .neusight import NEUSIGHT_FILES, SMS_CORRECTED, neusight_gpus, read_neusight
from .vidur import read_vidur

__all__ = ["NEUSIGHT_FILES", "READS", "SMS_CORRECTED", "SOURCES", "data_root", "neusight_gpus", "provenance",
           "read_aiconfigurator", "read_files", "read_neusight", "read_source", "read_vidur", "source_files",
           "source_hash"]

Reader = Callable[[Path, "tuple[str, ...] | None"], dict[str, pd.DataFrame]]
SOURCES: Final[dict[str, Reader]] = {
    "aiconfigurator": read_aiconfigurator,
    "vidur": read_vidur,
    "neusight": read_neusight,
}


def read_source(source: str, path: Path, gpu: str | None = None,
                families: tuple[str, ...] | None = None) -> dict[str, pd.DataFrame]:
    """The tables of ``source`` at ``path``; ``gpu`` keeps the rows of one device (NeuSight)."""
    if source not in SOURCES:
        raise ConfigError(f"unknown kernel data source {source!r}; known: {', '.join(SOURCES)}", key="source")
    tables = SOURCES[source](path, families)
    if gpu is not None:
        tables = {f: t[t["gpu"] == gpu].reset_index(drop=True) for f, t in tables.items() if "gpu" in t}
        tables = {f: t for f, t in tables.items() if len(t)}
        if not tables:
            raise ConfigError(f"no rows of GPU {gpu!r} here", file=str(path), key="gpu")
    return tables


def provenance(path: Path) -> dict[str, str]:
    """The ``commit``, ``licence`` and ``repository`` stated by the nearest ``provenance.md`` above ``path``."""
    for folder in (path, *path.parents):
        doc = folder / "provenance.md"
        if doc.is_file():
            text = doc.read_text(encoding="utf-8")
            commit = re.search(r"commit:?\s+`?([0-9a-f]{7,40})", text, re.I)
            licence = re.search(r"Licen[cs]e:\s*([^\n(]+)", text, re.I)
            repo = re.search(r"github\.com/[\w.-]+/[\w.-]+", text)
            return {"commit": commit.group(1) if commit else "",
                    "licence": licence.group(1).strip().rstrip(". ") if licence else "",
                    "repository": repo.group(0) if repo else "", "provenance": doc.name}
    return {"commit": "", "licence": "", "repository": "", "provenance": ""}


DATA_SUFFIXES: Final = (".csv", ".parquet", ".json")
_HASHES: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}


def source_hash(path: Path, source: str | None = None) -> str:
    """SHA-256 over the names and bytes of the files ``source`` reads under ``path``; computed once
    per process for the same files, sizes and modification times."""
    files = read_files(path, source)
    stamp = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    key = (f"{path.resolve()}:{source}", stamp)
    if key not in _HASHES:
        _HASHES[key] = _hash(path, files)
    return _HASHES[key]


#: The files each importer reads, as globs under its folder: what the content hash and the sizes cover.
READS: Final[dict[str, tuple[str, ...]]] = {
    "aiconfigurator": ("gemm/*.parquet", "gemm/*/gemm_perf.parquet", "attention/*.parquet",
                       "attention/*/*_attention_perf.parquet", "moe/*.parquet", "moe/*/moe_perf.parquet",
                       "mla_bmm/*/mla_bmm_perf.parquet", "mla/*/context_mla_perf.parquet",
                       "mla/*/generation_mla_perf.parquet", "linear_attention/*/gdn_perf.parquet",
                       "sparse_attention/*/dsa_*_module_perf.parquet", "quantize/*/scale_matrix_perf.parquet"),
    "vidur": ("*/*/mlp.csv",),
    "neusight": ("data/dataset/test/*.csv", "data/dataset/test/device_configs/*.json", "*.csv",
                 "device_configs/*.json"),
}


def read_files(path: Path, source: str | None = None) -> list[Path]:
    """The data files of ``path`` that ``source``'s importer reads (every data file without a source)."""
    if path.is_file():
        return [path]
    globs = READS.get(source or "", ("**/*",))
    return sorted({p for g in globs for p in path.glob(g) if p.is_file() and p.suffix in DATA_SUFFIXES})


def source_files(path: Path, source: str | None = None) -> dict[str, int]:
    """The files ``source`` reads under ``path`` and their sizes in bytes: what a fresh process
    checks a source against (a changed table changes its size, or its name) without reading it."""
    return {str(p.relative_to(path)) if p != path else p.name: p.stat().st_size for p in read_files(path, source)}


def _hash(path: Path, files: list[Path]) -> str:
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(path) if p != path else p.name).encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()
