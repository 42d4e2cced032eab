"""Reading the YAML of input files: text that must be UTF-8, keys that must be unique, the line of
every key, and numbers written as ``1e20`` read as numbers.

Every failure is a :class:`~simgpu.errors.ConfigError` naming the file (and the line where known).
Parsed files are kept by their stamp (path, modification time, size), so reading the same file
again, as a search does for each of its candidates, costs a copy rather than a parse.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that refuses a key given twice in one mapping (YAML would keep the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                continue
            if key in seen:
                raise DuplicateKey(str(key), key_node.start_mark.line + 1, seen[key])
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 reads 1e20 (no dot) as a string; read it as the number it looks like, as YAML 1.2 does
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def load_yaml_value(text: str) -> Any:
    """A YAML document (a file's text or a ``--set`` value), each mapping's keys unique."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


class DuplicateKey(Exception):
    def __init__(self, key: str, line: int, first: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


def read_text(path: str | Path, what: str) -> str:
    """The text of an input file: UTF-8 (with or without a byte order mark), or one ConfigError
    saying what the file is instead (missing, a folder, UTF-16, another encoding, binary)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"is a folder; expected a {what} YAML file", file=str(path))
    if not p.is_file():
        raise ConfigError(f"{what} file not found; expected the path of an existing {what} file", file=str(path))
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read the {what} file: {e.strerror or e}", file=str(path)) from None
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff") or (len(raw) > 1 and b"\x00" in raw[:2]):
        raise ConfigError(f"is UTF-16 text; expected the {what} file in UTF-8", file=str(path))
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(f"byte 0x{raw[e.start]:02x} at offset {e.start} is not UTF-8; expected the {what} "
                          "file in UTF-8 (re-save it as UTF-8)", file=str(path), line=line) from None


#: Parsed files by (path, modification time, size): a search validates hundreds of candidates
#: against the same two files, and parsing YAML is most of the cost of a load.
_PARSED: dict[tuple[str, int, int], tuple[dict[str, Any], dict[tuple[str, ...], int]]] = {}


def read_yaml(path: str | Path, what: str) -> tuple[dict[str, Any], dict[tuple[str, ...], int]]:
    """Parse a YAML mapping; return it with the line number (1-based) of every key path."""
    p = Path(path)
    try:
        st = p.stat()
        stamp: tuple[str, int, int] | None = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = None
    if stamp is not None and stamp in _PARSED and p.is_file():
        data, lines = _PARSED[stamp]
        return copy.deepcopy(data), dict(lines)
    data, lines = _parse_yaml(path, what)
    if stamp is not None:
        if len(_PARSED) >= 64:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[stamp] = (copy.deepcopy(data), dict(lines))
    return data, lines


def _parse_yaml(path: str | Path, what: str) -> tuple[dict[str, Any], dict[tuple[str, ...], int]]:
    text = read_text(path, what)
    try:
        data = load_yaml_value(text)
        node = yaml.compose(text)
    except DuplicateKey as e:
        raise ConfigError(f"given twice (first at line {e.first}); expected each key once",
                          file=str(path), key=e.key, line=e.line) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"malformed YAML: {problem}; expected YAML mappings of keys (indented with spaces)",
                          file=str(path), line=line) from None
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping of keys at the top level, got {type(data).__name__}",
                          file=str(path))
    lines: dict[tuple[str, ...], int] = {}
    _collect_lines(node, (), lines)
    return data, lines


def _collect_lines(node: Any, prefix: tuple[str, ...], out: dict[tuple[str, ...], int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = prefix + (str(k.value),)
            out[key] = k.start_mark.line + 1
            _collect_lines(v, key, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            key = prefix + (str(i),)
            out[key] = v.start_mark.line + 1
            _collect_lines(v, key, out)
