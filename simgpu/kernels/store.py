"""A platform's measurements and fitted kernel models on disk.

Beside ``platforms/<name>.yaml`` lies ``platforms/<name>/``: ``microbench/<family>.csv`` holds one
row per measured case (columns :func:`columns`: the case key, family, torch op, dtype, index
distribution, the family's KernelSpec parameters, then ``median_s``, ``p10_s``, ``p90_s`` in seconds
and ``repeats``), and ``models/`` holds one LightGBM model file per family (``<family>.txt.gz``,
gzip-compressed text) plus ``manifest.json`` (content hashes of the measurements, feature lists,
held-out errors). This module owns those paths, reading and appending the tables, the content hash,
and writing and reading model files; it fits nothing.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import pandas as pd

from ..errors import ConfigError
from .features import FAMILY_PARAMS, measured_params

TIME_COLUMNS: Final = ("median_s", "p10_s", "p90_s", "repeats")
MANIFEST: Final = "manifest.json"


def columns(family: str) -> list[str]:
    """The columns of ``family``'s measurement table, in file order: its parameters but those that
    follow from the op (:data:`~simgpu.kernels.features.FROM_OP`)."""
    if family not in FAMILY_PARAMS:
        raise ConfigError(f"unknown kernel family {family!r}; known: {', '.join(FAMILY_PARAMS)}")
    return ["key", "family", "op", "dtype", "dist", *measured_params(family), *TIME_COLUMNS]


def platform_dir(ref: str) -> Path | None:
    """The data folder of platform ``ref`` (a name or a YAML path), or None if it has no YAML.

    ``platforms/x.yaml`` -> ``platforms/x/``; ``platforms/x/platform.yaml`` -> ``platforms/x/``.
    """
    from ..config.loader import platform_path

    path = platform_path(ref)
    if not path.is_file():
        return None
    return path.parent if path.name == "platform.yaml" else path.with_suffix("")


def read_tables(folder: str | Path, families: tuple[str, ...] | None = None) -> dict[str, pd.DataFrame]:
    """Every ``<family>.csv`` in ``folder`` with at least one row; raises if there is none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError("no microbenchmark folder; run `python -m simgpu.bench` first", file=str(folder))
    out: dict[str, pd.DataFrame] = {}
    for path in sorted(folder.glob("*.csv")):
        family = path.stem
        if family not in FAMILY_PARAMS or (families is not None and family not in families):
            continue
        table = pd.read_csv(path, keep_default_na=True)
        missing = [c for c in ("family", "dtype", "median_s") if c not in table.columns]
        if missing:
            raise ConfigError(f"missing columns {', '.join(missing)}", file=str(path))
        table = table[table["median_s"] > 0]
        if len(table):
            out[family] = table.reset_index(drop=True)
    if not out:
        raise ConfigError("no measurements of a known kernel family here", file=str(folder))
    return out


def known_keys(folder: str | Path) -> set[str]:
    """The case keys already measured in ``folder`` (for resuming); a row cut short by an
    interrupted run does not count, so its case is measured again."""
    keys: set[str] = set()
    for path in Path(folder).glob("*.csv"):
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                if row.get("key") and row.get("repeats") not in (None, ""):
                    keys.add(row["key"])
    return keys


def append_row(folder: str | Path, family: str, row: Mapping[str, Any]) -> None:
    """Append one measurement to ``folder/<family>.csv``, writing the header to a new file."""
    path = Path(folder) / f"{family}.csv"
    cols = columns(family)
    new = not path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="raise")
        if new:
            w.writeheader()
        w.writerow({c: _fmt(row.get(c, "")) for c in cols})


def _fmt(v: Any) -> Any:
    return f"{v:.6g}" if isinstance(v, float) else v


def data_hash(folder: str | Path, families: tuple[str, ...] | None = None) -> str:
    """SHA-256 over the names and contents (newlines normalised) of the tables in ``folder``."""
    h = hashlib.sha256()
    for path in sorted(Path(folder).glob("*.csv")):
        if path.stem not in FAMILY_PARAMS or (families is not None and path.stem not in families):
            continue
        h.update(path.name.encode() + b"\0")
        h.update(path.read_bytes().replace(b"\r\n", b"\n"))
        h.update(b"\0")
    return h.hexdigest()


def platforms_root() -> Path:
    """The folder of the shipped platform files (``platforms/`` beside the package)."""
    from ..config.loader import REPO_PLATFORMS

    return REPO_PLATFORMS


def save_booster(booster: Any, path: Path) -> None:
    """A LightGBM model as text, gzip-compressed when ``path`` ends in ``.gz`` (mtime 0: the same
    model gives the same bytes)."""
    text = booster.model_to_string()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text)


def cache_dir() -> Path:
    """Where parsed model files are kept between runs: ``$SIMGPU_CACHE``, else ``$XDG_CACHE_HOME/simgpu``
    (``~/.cache/simgpu``)."""
    env = os.environ.get("SIMGPU_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "simgpu"


def load_booster(path: Path) -> Any:
    """A model file's trees, ready to predict without LightGBM (:class:`~simgpu.kernels.trees.TreeEnsemble`).

    Parsing a model's text takes a tenth of a second; the parsed arrays are kept in :func:`cache_dir`
    under a hash of the file's path, size and modification time (as Python keeps compiled modules),
    so a later run loads them in a millisecond. A cache that cannot be read or written is passed over.
    """
    from .trees import TreeEnsemble

    st = path.stat()
    stamp = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()
    cached = cache_dir() / f"{hashlib.sha256(stamp).hexdigest()[:32]}.pkl"
    try:
        return TreeEnsemble.load(cached)
    except (OSError, ValueError, KeyError, EOFError, pickle.UnpicklingError):
        pass
    raw = path.read_bytes()
    model = TreeEnsemble.from_text(gzip.decompress(raw).decode() if path.suffix == ".gz" else raw.decode())
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        model.save(cached)
    except OSError:
        pass
    return model


def read_manifest(models: str | Path) -> dict[str, Any] | None:
    path = Path(models) / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"not valid JSON: {e}", file=str(path)) from None
    if not isinstance(data, dict) or not isinstance(data.get("families"), dict):
        raise ConfigError("expected an object with a 'families' object", file=str(path))
    return data


def write_manifest(models: str | Path, manifest: Mapping[str, Any]) -> Path:
    path = Path(models) / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return path
