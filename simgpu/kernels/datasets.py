"""What a platform's kernel models are fitted on: its own measurements and the published tables it names.

A platform folder ``platforms/<name>/`` may hold ``microbench/`` (tables written by ``python -m
simgpu.bench`` on that machine) and ``kernel_data.yaml``, a list of published measurement tables
read from the shared data folder (:func:`~simgpu.kernels.importers.data_root`) by their importers::

    sources:
      - source: aiconfigurator          # an importer of simgpu.kernels.importers.SOURCES
        path: kernels/aiconfigurator/h100_sxm   # relative to the shared data folder
        gpu: ...                        # optional: keep the rows of one device

:func:`platform_tables` joins both into one table per family, and says where each part came from
(the source, its commit and licence as its ``provenance.md`` states them, and a content hash), for
the manifest of the fitted models. Nothing read from the shared folder is written into the repository.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pandas as pd

from ..config.yamlio import read_yaml
from ..errors import ConfigError
from . import store
from .importers import SOURCES, data_root, provenance, read_source, source_files, source_hash

KERNEL_DATA: Final = "kernel_data.yaml"


@dataclass(frozen=True)
class Source:
    """One published table set a platform's models are fitted on."""

    source: str
    path: str
    gpu: str | None = None

    def where(self) -> Path:
        return data_root() / self.path


def sources(folder: Path) -> list[Source]:
    """The sources ``folder/kernel_data.yaml`` lists (none without the file)."""
    path = folder / KERNEL_DATA
    if not path.is_file():
        return []
    doc, _ = read_yaml(path, "kernel data")
    items = doc.get("sources")
    if not isinstance(items, list) or not items:
        raise ConfigError("expected a non-empty list of {source, path[, gpu]}", file=str(path), key="sources")
    out = []
    for i, item in enumerate(items):
        key = f"sources.{i}"
        if not isinstance(item, dict) or set(item) - {"source", "path", "gpu"} or not {"source", "path"} <= set(item):
            raise ConfigError("expected {source, path[, gpu]}", file=str(path), key=key)
        if item["source"] not in SOURCES:
            raise ConfigError(f"unknown source {item['source']!r}; known: {', '.join(SOURCES)}", file=str(path),
                              key=f"{key}.source")
        gpu = None if item.get("gpu") is None else str(item["gpu"])
        out.append(Source(str(item["source"]), str(item["path"]), gpu))
    return out


def platform_tables(folder: Path, *, check_only: bool = False) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """Every measurement of the platform in ``folder``: one table per family, and its provenance.

    The provenance has ``data_sha256`` (the platform's own ``microbench/``, None without one) and
    ``sources`` (per published source: name, path, gpu, commit, licence, repository, ``sha256`` of
    its files, rows per family). A listed source that is not in the shared folder is an error
    naming where it was looked for. With ``check_only`` the tables are not read (empty dict).
    """
    parts: dict[str, list[pd.DataFrame]] = {}
    local = folder / "microbench"
    data_sha: str | None = None
    if local.is_dir() and any(local.glob("*.csv")):
        tables = store.read_tables(local)
        data_sha = store.data_hash(local, tuple(tables))
        for family, t in tables.items():
            parts.setdefault(family, []).append(t.assign(source="microbench"))
    listed = []
    for src in sources(folder):
        where = src.where()
        if not where.exists():
            raise ConfigError(f"{src.source} data not found at {where} (the shared data folder lies at "
                              f"../shared/data beside the checkout, or set SIMGPU_DATA)",
                              file=str(folder / KERNEL_DATA), key="sources")
        info: dict[str, Any] = {"source": src.source, "path": src.path, "gpu": src.gpu, **provenance(where),
                                "sha256": source_hash(where, src.source), "files": source_files(where, src.source)}
        if not check_only:
            tables = read_source(src.source, where, src.gpu)
            info["rows"] = {f: len(t) for f, t in sorted(tables.items())}
            # which framework's table each family's dtype was taken from, where the source says
            fws = {f: {str(d): str(g["framework"].iloc[0]) for d, g in t.groupby("dtype", sort=True)}
                   for f, t in sorted(tables.items()) if "framework" in t.columns}
            if fws:
                info["frameworks"] = fws
            for family, t in tables.items():
                parts.setdefault(family, []).append(t)
        listed.append(info)
    if data_sha is None and not listed:
        raise ConfigError("no measurements: neither microbench/ (python -m simgpu.bench) nor kernel_data.yaml",
                          file=str(folder))
    joined = {f: pd.concat(ts, ignore_index=True) for f, ts in parts.items()}
    return joined, {"data_sha256": data_sha, "sources": listed}


def _size(where: Path, rel: str) -> int:
    path = where if where.is_file() else where / rel
    try:
        return path.stat().st_size
    except OSError:
        return -1


def stale_sources(manifest: dict[str, Any]) -> list[str]:
    """The sources of a manifest that are in the shared folder now with other contents than fitted
    (other files, or files of other sizes; the manifest's SHA-256 records the contents exactly).

    A source that is absent (a fresh clone without the shared folder) is not stale: the shipped
    models stand for it.
    """
    out = []
    for info in manifest.get("sources") or ():
        where = data_root() / str(info.get("path", ""))
        if not where.exists():
            continue
        if "files" in info:  # every file fitted on is still there with its size: a stat each, nothing read
            same = all(_size(where, rel) == size for rel, size in info["files"].items())
        else:
            same = source_hash(where, str(info.get("source"))) == info.get("sha256")
        if not same:
            out.append(f"{info.get('source')} ({where})")
    return out
