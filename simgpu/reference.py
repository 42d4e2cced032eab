"""``python -m simgpu.reference docs/reference``: the reference of every input file's keys.

The pages are written from the pydantic models the loaders validate against, so they cannot drift
from what the loaders accept: one page per kind of file (workload, platform, serving, study), one
section per mapping, one row per key with its dotted path, type, default, constraints and
description. A key of a list item is written with ``<i>`` for the index
(``model.tables.<i>.rows``), a key under a mapping of sections with ``<key>``
(``parallelism.sharding.tables.<key>.type``), as ``--set`` addresses them with the index or key
itself. ``tests/test_docs.py`` checks the committed pages against what this module writes.
"""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from .cli import ArgParser, check_out_dir, entry, run_command

#: The command that writes the pages, named at the top of each.
COMMAND = "python -m simgpu.reference docs/reference"

LIST_ITEM = "<i>"
MAP_KEY = "<key>"


@dataclass(frozen=True)
class Part:
    """One kind of file on a page: its top-level model and where it is defined."""

    title: str
    model: Callable[[], type[BaseModel]]
    source: str
    anchor: str = ""


@dataclass(frozen=True)
class Page:
    """One reference page: its file name, title, introduction and the file kinds it covers."""

    name: str
    title: str
    intro: str
    parts: tuple[Part, ...]


def _workload() -> type[BaseModel]:
    from .config.workload import WorkloadSpec

    return WorkloadSpec


def _platform() -> type[BaseModel]:
    from .config.platform import PlatformSpec

    return PlatformSpec


def _mixed_platform() -> type[BaseModel]:
    from .config.mixed import MixFile

    return MixFile


def _serving() -> type[BaseModel]:
    from .serve.spec import ServingSpec

    return ServingSpec


def _dlrm_serving() -> type[BaseModel]:
    from .serve.dlrm import DlrmServingSpec

    return DlrmServingSpec


def _goodput() -> type[BaseModel]:
    from .goodput.spec import GoodputSpec

    return GoodputSpec


def _cluster() -> type[BaseModel]:
    from .cluster.spec import ClusterSpec

    return ClusterSpec


def _study() -> type[BaseModel]:
    from .whatif.study import StudySpec

    return StudySpec


PAGES: tuple[Page, ...] = (
    Page("workload", "Workload file",
         "A workload file (`workloads/*.yaml`) says which model runs, how it is trained or served and "
         "parallelised, on which platform and how many nodes. `simgpu run` reads it, and so do studies, "
         "searches and serving files through their base workloads. `--set key.path=value` overrides any "
         "key below by its dotted path (a list item by its index: `model.tables.0.rows`).",
         (Part("Workload file", _workload, "simgpu/config/workload.py"),)),
    Page("platform", "Platform file",
         "A platform file (`platforms/*.yaml`) describes one node of the hardware and the network "
         "between nodes; a workload names it by `platform`. `--set platform.key.path=value` overrides a "
         "key below from the command line (`simgpu comm` and `simgpu calibrate` take the key without "
         "`platform.`).",
         (Part("Platform file", _platform, "simgpu/config/platform.py"),
          Part("Mixed platform file", _mixed_platform, "simgpu/config/mixed.py", "mixed"))),
    Page("serving", "Serving file",
         "A serving file (`workloads/serving/*.yaml`) is what `simgpu serve` reads: the deployment(s), "
         "named by inference workload files, the requests that arrive and how they are batched. "
         "An LLM deployment (a `transformer_inference` workload) is served by the request-level "
         "scheduler; a DLRM deployment (a `dlrm_inference` workload) by the dynamic batcher, whose file "
         "has keys of its own. `--set key.path=value` overrides a key of either.",
         (Part("LLM serving file", _serving, "simgpu/serve/spec.py", "llm"),
          Part("DLRM serving file", _dlrm_serving, "simgpu/serve/dlrm.py", "dlrm"))),
    Page("study", "Study file",
         "A study file (`workloads/studies/*.yaml`) is what `simgpu whatif` reads: a base workload (or "
         "serving file) and its variants, an explicit list or a grid over any of the base's keys. Each "
         "override is written as `--set` writes it (`platform.network.nic_gbps`, `nodes`, ...) and "
         "checked against the base before anything runs.",
         (Part("Study file", _study, "simgpu/whatif/study.py"),)),
    Page("goodput", "Goodput file",
         "A goodput file (`workloads/goodput/*.yaml`) is what `simgpu goodput` reads: the job (a workload "
         "file simulated once, or its iteration time, GPUs and checkpoint state given), its failures, the "
         "cost of a checkpoint and of a restart, and the checkpoint interval. See [Goodput](../goodput.md).",
         (Part("Goodput file", _goodput, "simgpu/goodput/spec.py"),)),
    Page("cluster", "Cluster file",
         "A cluster file (`workloads/clusters/*.yaml`) is what `simgpu cluster` reads: one platform, the "
         "cluster's node count, and the jobs that share it, each a workload file placed on explicit node ids "
         "or on a count of nodes by the placement. See [Several jobs on one cluster](../cluster.md).",
         (Part("Cluster file", _cluster, "simgpu/cluster/spec.py"),)),
)


# --------------------------------------------------------------------------- walking the models


@dataclass
class Row:
    """One key: its dotted path and what the reference says of it."""

    path: str
    type: str
    default: str
    constraints: str
    description: str
    anchor: str | None = None  # the section describing the key's own keys


@dataclass
class Section:
    """The keys of one mapping at ``path`` (the file's top level when ``path`` is empty)."""

    path: str
    anchor: str
    title: str
    doc: str
    rows: list[Row] = field(default_factory=list)
    same_as: str | None = None  # a variant whose keys are those of an earlier section


def _unwrap(tp: Any) -> tuple[Any, list[Any]]:
    """An annotation without ``Annotated``, and the metadata that wrapped it."""
    meta: list[Any] = []
    while typing.get_origin(tp) is typing.Annotated:
        args = typing.get_args(tp)
        tp, meta = args[0], [*meta, *args[1:]]
    return tp, meta


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _constraints(meta: Sequence[Any]) -> list[str]:
    """Readable constraints of an annotation's metadata (annotated_types, or a FieldInfo's)."""
    out: list[str] = []
    for m in meta:
        if isinstance(m, FieldInfo):
            out += _constraints(m.metadata)
        elif isinstance(m, at.Gt):
            out.append(f"`> {m.gt}`")
        elif isinstance(m, at.Ge):
            out.append(f"`>= {m.ge}`")
        elif isinstance(m, at.Lt):
            out.append(f"`< {m.lt}`")
        elif isinstance(m, at.Le):
            out.append(f"`<= {m.le}`")
        elif isinstance(m, at.MinLen):
            out.append(f"at least {m.min_length} item{'s' if m.min_length != 1 else ''}")
        elif isinstance(m, at.MaxLen):
            out.append(f"at most {m.max_length} items")
    return out


_SCALARS = {int: "integer", float: "number", bool: "boolean", str: "string", type(None): "null"}


def _literal(values: Sequence[Any]) -> str:
    return ", ".join(f"`{json.dumps(v)}`" if not isinstance(v, str) else f"`{v}`" for v in values)


def type_text(tp: Any) -> str:
    """An annotation in words: ``integer > 0``, ``list of number``, ``one of `a`, `b```, ..."""
    tp, meta = _unwrap(tp)
    cons = _constraints(meta)
    base = _type_words(tp)
    return f"{base} {' and '.join(cons)}" if cons else base


def _type_words(tp: Any) -> str:
    if tp in _SCALARS:
        return _SCALARS[tp]
    if tp is Any:
        return "any value"
    if _is_model(tp):
        return "mapping"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return f"one of {_literal(args)}" if len(args) > 1 else _literal(args)
    if _is_union(tp):
        members = [a for a in args if a is not type(None)]
        words = " or ".join(type_text(a) for a in members)
        return f"{words} or null" if len(members) < len(args) else words
    if origin is list:
        return f"list of {type_text(args[0])}" if args else "list"
    if origin is tuple:
        return "[" + ", ".join(type_text(a) for a in args if a is not Ellipsis) + "]"
    if origin is dict:
        return f"mapping of {type_text(args[0])} to {type_text(args[1])}" if args else "mapping"
    return getattr(tp, "__name__", str(tp))


def _models_in(tp: Any) -> list[tuple[str, type[BaseModel]]]:
    """The sections an annotation leads to: (path suffix, model); a list's items get ``.<i>``, a
    mapping's values ``.<key>``."""
    tp, _ = _unwrap(tp)
    if _is_model(tp):
        return [("", tp)]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if _is_union(tp):
        return [m for a in args for m in _models_in(a)]
    if origin is list and args:
        return [(f".{LIST_ITEM}{s}", m) for s, m in _models_in(args[0])]
    if origin is dict and args:
        return [(f".{MAP_KEY}{s}", m) for s, m in _models_in(args[1])]
    return []


def _tag(model: type[BaseModel]) -> str | None:
    f = model.model_fields.get("kind")
    if f is None:
        return None
    tp, _ = _unwrap(f.annotation)
    args = typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else ()
    return str(args[0]) if len(args) == 1 else None


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    factory = info.default_factory
    value = factory() if factory is not None else info.default  # type: ignore[call-arg]
    if value is PydanticUndefined:
        return "required"
    return _value_text(value)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _value_text(value: Any) -> str:
    if isinstance(value, BaseModel):
        return "its keys' defaults"
    value = _plain(value)
    if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
        return "its keys' defaults, for " + ", ".join(f"`{k}`" for k in value)
    text = "null" if value is None else value if isinstance(value, str) else json.dumps(value)
    return f"`{text}`" if text != "" else '`""`'


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def prose(text: str | None) -> str:
    """A docstring or description as markdown: reST literals and roles as code, one paragraph per
    blank-line-separated block."""
    if not text:
        return ""
    text = text.replace("``", "`")
    text = _ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip())]
    return "\n\n".join(p for p in paragraphs if p)


def _angles(text: str) -> str:
    """``text`` with its angle brackets outside code spans escaped (markdown would read them as HTML)."""
    parts = text.split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def _cell(text: str) -> str:
    """``text`` on one line for a table cell."""
    return _angles(" ".join(text.split()).replace("|", "\\|"))


def _anchor(prefix: str, path: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", path.replace(LIST_ITEM, "i").replace(MAP_KEY, "key").lower()).strip("-")
    return "-".join(p for p in (prefix, slug) if p)


def walk(model: type[BaseModel], anchor_prefix: str = "") -> list[Section]:
    """The sections of ``model``'s file, top level first, then each mapping in the order it appears."""
    sections: list[Section] = []
    seen: dict[type[BaseModel], str] = {}

    def visit(m: type[BaseModel], path: str, anchor: str, title: str, stack: tuple[type[BaseModel], ...]) -> None:
        section = Section(path, anchor, title, prose(m.__doc__))
        sections.append(section)
        tag = _tag(m)
        same = next((a for b, a in seen.items() if issubclass(m, b) and _same_keys(m, b)), None)
        seen.setdefault(m, anchor)
        if same is not None and tag is not None:
            section.same_as = same
            return
        children: list[tuple[str, type[BaseModel], str, str]] = []
        for name, info in m.model_fields.items():
            key = f"{path}.{name}" if path else name
            tp, meta = _unwrap(info.annotation)
            cons = _constraints([*meta, *info.metadata])
            members = [a for a in typing.get_args(tp) if a is not type(None)] if _is_union(tp) else []
            if len(members) == 1:  # X | None: X's own constraints are the key's
                inner, inner_meta = _unwrap(members[0])
                if not _models_in(inner):
                    cons += _constraints(inner_meta)
                    tp = inner | None
            words = _type_words(tp)
            if typing.get_origin(tp) is typing.Literal or (_is_union(tp) and any(
                    typing.get_origin(_unwrap(a)[0]) is typing.Literal for a in typing.get_args(tp))):
                words, cons = _split_literal(tp, cons)
            nested = [(s, sub) for s, sub in _models_in(info.annotation) if sub not in stack]
            desc = prose(info.description)
            row = Row(key, words, _default(info), "; ".join(cons), desc)
            if nested:
                tags = [_tag(sub) for _, sub in nested]
                if len(nested) > 1 and all(tags):
                    row.type = "mapping"
                    row.constraints = "; ".join([*cons, "`kind`: one of " + _literal(tags)])
                    links = []
                    for (suffix, sub), t in zip(nested, tags, strict=True):
                        sub_anchor = _anchor(anchor_prefix, f"{key}{suffix}.kind.{t}")
                        links.append(f"[`{t}`](#{sub_anchor})")
                        children.append((key + suffix, sub, sub_anchor, f"`{key}{suffix}` with `kind: {t}`"))
                    desc = desc or "its keys depend on its `kind`"
                    row.description = f"{desc}: " + ", ".join(links)
                else:
                    for suffix, sub in nested:
                        sub_anchor = _anchor(anchor_prefix, key + suffix)
                        row.anchor = row.anchor or sub_anchor
                        children.append((key + suffix, sub, sub_anchor, f"`{key}{suffix}`"))
                if not desc:
                    row.description = prose((nested[0][1].__doc__ or "").strip().split("\n\n")[0])
            section.rows.append(row)
        for sub_path, sub, sub_anchor, sub_title in children:
            visit(sub, sub_path, sub_anchor, sub_title, (*stack, sub))

    visit(model, "", _anchor(anchor_prefix, "top-level"), "Top level", (model,))
    return sections


def _same_keys(a: type[BaseModel], b: type[BaseModel]) -> bool:
    """Whether two models take the same keys, ``kind`` aside."""
    fa, fb = a.model_fields, b.model_fields
    return set(fa) == set(fb) and all(k == "kind" or repr(fa[k]) == repr(fb[k]) for k in fa)


def _split_literal(tp: Any, cons: list[str]) -> tuple[str, list[str]]:
    """A Literal (or Literal | None) as a type word and its choices as a constraint."""
    values: list[Any] = []
    nullable = False
    for a in (typing.get_args(tp) if _is_union(tp) else (tp,)):
        a, _ = _unwrap(a)
        if a is type(None):
            nullable = True
        elif typing.get_origin(a) is typing.Literal:
            values += typing.get_args(a)
        else:
            return _type_words(tp), cons
    kinds = sorted({_SCALARS.get(type(v), "value") for v in values})
    words = " or ".join(kinds) + (" or null" if nullable else "")
    return words, [*cons, ("one of " if len(values) > 1 else "") + _literal(values)]


# --------------------------------------------------------------------------- rendering


def render(page: Page) -> str:
    """The markdown of one reference page."""
    lines = [f"# {page.title} reference", "",
             f"Written by `{COMMAND}` from the models the loaders validate against; do not edit it by "
             "hand. Every key is written as its dotted path; types, defaults and constraints are those "
             "the loader checks (a number where a boolean is expected, a quoted number, an unknown key, a "
             "value out of range: each is refused in one line naming the file, the key and what was "
             "expected). Units are in the key names: `_us` microseconds, `_ms` milliseconds, `_gbps` "
             "Gb/s, `_gbytes_per_s` GB/s (1e9 bytes), `_gib` GiB, `_mib` MiB.", "",
             page.intro, ""]
    for part in page.parts:
        model = part.model()
        level = "#"
        if len(page.parts) > 1:
            heading = f"## {part.title} {{ #{part.anchor} }}" if part.anchor else f"## {part.title}"
            lines += [heading, "",
                      f"Defined by `{model.__name__}` in `{part.source}`.", ""]
            level = "##"
        else:
            lines += [f"Defined by `{model.__name__}` in `{part.source}`.", ""]
        for section in walk(model, part.anchor):
            lines += [f"{level}# {section.title} {{ #{section.anchor} }}", ""]
            if section.doc:
                lines += [_angles(section.doc), ""]
            if section.same_as is not None:
                lines += [f"Its keys are those of [the same section above](#{section.same_as}), `kind` aside.", ""]
                continue
            lines += ["| key | type | default | constraints | description |", "|---|---|---|---|---|"]
            for row in section.rows:
                desc = row.description
                if row.anchor:
                    desc = f"{desc} ([its keys](#{row.anchor}))" if desc else f"[its keys](#{row.anchor})"
                lines.append(f"| `{row.path}` | {_cell(row.type)} | {_cell(row.default)} | "
                             f"{_cell(row.constraints) or ' '} | {_cell(desc)} |")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def pages() -> dict[str, str]:
    """File name -> markdown of every reference page."""
    return {f"{page.name}.md": render(page) for page in PAGES}


def write(out: str | Path) -> list[Path]:
    """Write every reference page into ``out``; the paths written."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in pages().items():
        path = folder / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgParser(prog="python -m simgpu.reference",
                       description="Write the reference pages of the input files (workload, platform, serving, "
                                   "study) from the models the loaders validate against.")
    parser.add_argument("out", nargs="?", default="docs/reference", help="output folder (default docs/reference)")

    def body() -> int:
        args = parser.parse_args(argv)
        out = check_out_dir(args.out, "out")
        for path in write(out):
            print(path)
        return 0

    return run_command(body)


if __name__ == "__main__":
    entry(main)
