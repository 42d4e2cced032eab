"""Reading the YAML of input files: text that must be UTF-8, keys that must be unique, the line of
every key, and numbers written as ``1e20`` read as numbers.

Every failure is a :class:`~simgpu.errors.ConfigError` naming the file (and the line where known).
A document whose aliases would expand to more than :data:`MAX_NODES` values ("billion laughs", an
anchor repeated inside anchors) is refused before anything is built from it.
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


#: The most values (mappings, lists and scalars, each alias counted as what it expands to) an input
#: document may hold: far above any real input, far below what exhausts memory.
MAX_NODES = 1_000_000


class TooManyNodes(Exception):
    def __init__(self, nodes: int, aliases: int) -> None:
        super().__init__(nodes)
        self.nodes, self.aliases = nodes, aliases

    def message(self) -> str:
        return (f"its {self.aliases:,} aliases expand to more than {self.nodes:,} values; expected at most "
                f"{MAX_NODES:,} values once aliases are expanded (an anchor repeated inside anchors?)")


def expanded_size(node: yaml.Node | None, limit: int = MAX_NODES) -> int:
    """How many nodes ``node`` holds with every alias expanded, counted without expanding anything;
    raises :class:`TooManyNodes` past ``limit``."""
    sizes: dict[int, int] = {}
    seen: set[int] = set()
    aliases = 0

    def size(n: yaml.Node) -> int:
        nonlocal aliases
        key = id(n)
        if key in sizes:
            aliases += 1
            return sizes[key]
        if key in seen:  # a recursive alias: PyYAML builds it as a cycle; count it once
            return 1
        seen.add(key)
        total = 1
        if isinstance(n, yaml.SequenceNode):
            total += sum(size(v) for v in n.value)
        elif isinstance(n, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in n.value)
        if total > limit:
            raise TooManyNodes(total, aliases)
        sizes[key] = total
        return total

    return 0 if node is None else size(node)


def compose_yaml(text: str) -> tuple[Any, yaml.Node | None]:
    """A YAML document (a file's text or a ``--set`` value), each mapping's keys unique, with its
    node tree; raises :class:`TooManyNodes` before building a document that aliases blow up."""
    loader = _UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        expanded_size(node)
        data = None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()
    return data, node


def load_yaml_value(text: str) -> Any:
    """A YAML document (a file's text or a ``--set`` value), each mapping's keys unique."""
    return compose_yaml(text)[0]


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
        data, node = compose_yaml(text)
    except TooManyNodes as e:
        raise ConfigError(e.message(), file=str(path)) from None
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


def _collect_lines(node: Any, prefix: tuple[str, ...], out: dict[tuple[str, ...], int],
                   depth: int = 0) -> None:
    if depth > 100:  # a recursive alias
        return
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = prefix + (str(k.value),)
            out[key] = k.start_mark.line + 1
            _collect_lines(v, key, out, depth + 1)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            key = prefix + (str(i),)
            out[key] = v.start_mark.line + 1
            _collect_lines(v, key, out, depth + 1)
