"""The documentation: the input reference matches the models, every accepted key is in it, and the
site builds with ``mkdocs build --strict``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from simgpu import reference
from simgpu.cluster.spec import ClusterSpec
from simgpu.config.mixed import MixFile
from simgpu.config.platform import PlatformSpec
from simgpu.config.workload import WorkloadSpec
from simgpu.goodput.spec import GoodputSpec
from simgpu.serve.dlrm import DlrmServingSpec
from simgpu.serve.spec import ServingSpec
from simgpu.whatif.study import StudySpec

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"

#: reference page -> the models whose files it documents
MODELS: dict[str, tuple[type[BaseModel], ...]] = {
    "workload.md": (WorkloadSpec,),
    "platform.md": (PlatformSpec, MixFile),
    "serving.md": (ServingSpec, DlrmServingSpec),
    "study.md": (StudySpec,),
    "goodput.md": (GoodputSpec,),
    "cluster.md": (ClusterSpec,),
}


def test_reference_is_regenerated() -> None:
    """The committed pages are what the generator writes now: a key added, removed or redocumented
    without ``python -m simgpu.reference docs/reference`` fails here."""
    written = reference.pages()
    assert sorted(written) == sorted(p.name for p in REFERENCE.glob("*.md"))
    for name, text in written.items():
        committed = (REFERENCE / name).read_text(encoding="utf-8")
        assert committed == text, f"docs/reference/{name} is stale; run {reference.COMMAND}"


def _paths(schema: dict[str, Any], node: dict[str, Any], prefix: str) -> Iterator[str]:
    """Every dotted key path under a JSON-schema node: a list item is ``<i>``, a mapping's value
    ``<key>``, as the reference writes them."""
    if "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    for option in node.get("anyOf", []) + node.get("oneOf", []) + node.get("allOf", []):
        yield from _paths(schema, option, prefix)
    for name, sub in node.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        yield path
        yield from _paths(schema, sub, path)
    if isinstance(node.get("items"), dict):
        yield from _paths(schema, node["items"], f"{prefix}.<i>")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _paths(schema, node["additionalProperties"], f"{prefix}.<key>")


@pytest.mark.parametrize("page", sorted(MODELS))
def test_every_key_is_in_the_reference(page: str) -> None:
    """Every key the loaders accept (walked from the models' JSON schema, not from the generator)
    appears as a dotted path in the committed page."""
    text = (REFERENCE / page).read_text(encoding="utf-8")
    missing = set()
    for model in MODELS[page]:
        schema = model.model_json_schema()
        paths = set(_paths(schema, schema, ""))
        assert paths, model
        missing |= {p for p in paths if f"`{p}`" not in text}
    assert not missing, f"keys missing from docs/reference/{page}: {sorted(missing)}"


def test_reference_names_known_keys() -> None:
    """Spot checks of keys nested in lists, mappings and tagged unions."""
    text = {name: (REFERENCE / name).read_text(encoding="utf-8") for name in MODELS}
    for page, key in [("workload.md", "model.tables.<i>.rows"), ("workload.md", "model.moe.top_k"),
                      ("workload.md", "parallelism.sharding.tables.<key>.frequent_rows"),
                      ("platform.md", "collectives.protocols.<key>.step_net_us"),
                      ("platform.md", "network.dragonfly.routing"),
                      ("serving.md", "requests.prompt_tokens.mean"), ("serving.md", "batcher.max_queue_delay_us"),
                      ("study.md", "variants.<i>.set")]:
        assert f"`{key}`" in text[page], (page, key)


def test_reference_command_writes_the_pages(tmp_path: Path) -> None:
    assert reference.main([str(tmp_path / "ref")]) == 0
    assert sorted(p.name for p in (tmp_path / "ref").iterdir()) == sorted(MODELS)
    assert reference.main([str(REFERENCE / "workload.md")]) == 2  # a file, not a folder


def test_docs_site_builds_strict(tmp_path: Path) -> None:
    """``mkdocs build --strict``: every page in the nav, every link and anchor resolved."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs-material is not installed (pip install -e '.[dev]' installs it)")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "reference" / "workload" / "index.html").is_file()
