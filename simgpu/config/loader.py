"""Reading YAML inputs into validated specs, with ``--set`` overrides and errors that say where.

A workload names its platform; :func:`load_job` reads both, applies overrides (``platform.x.y=v``
goes to the platform, anything else to the workload), validates each against its model and runs
the cross-field checks. Every failure is a :class:`~simgpu.errors.ConfigError` naming the file,
the dotted key, the line where known, and what was expected.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from ..errors import ConfigError
from .base import kind_error, unwrap_models
from .hf import expand as expand_config
from .mixed import check_nodes, load_mixed
from .platform import PlatformSpec
from .workload import WorkloadSpec
from .yamlio import DuplicateKey, TooManyNodes, load_yaml_value, read_yaml

M = TypeVar("M", bound=BaseModel)

#: Where platform names are looked up: $SIMGPU_PLATFORMS, ./platforms, then the repository's.
REPO_PLATFORMS = Path(__file__).resolve().parents[2] / "platforms"

#: What a YAML file is: a workload (``simgpu run``: one iteration of training or inference), an LLM
#: or DLRM serving file (``simgpu serve``), a study of variants of one of those (``simgpu whatif``), or a
#: cluster file, several workloads sharing one cluster (``simgpu cluster``).
JobKind = Literal["workload", "llm_serving", "dlrm_serving", "study", "cluster"]


@dataclass(frozen=True)
class Job:
    """A validated workload with its platform, and the ``--set`` overrides that made it."""

    workload: WorkloadSpec
    platform: PlatformSpec
    workload_file: str
    platform_file: str
    overrides: tuple[str, ...] = ()


def apply_override(data: dict[str, Any], path: str, value: Any, file: str) -> None:
    """Set ``data[a][b][c] = value`` for ``path`` ``a.b.c``; list items by index (``tables.0.rows``)."""
    parts = path.split(".")
    cur: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(cur, list):
            if not part.isdigit() or int(part) >= len(cur):
                raise ConfigError(f"--set: index {part!r} is not an item of a list of {len(cur)}; expected an index "
                                  f"below {len(cur)}",
                                  file=file, key=".".join(parts[: i + 1]))
            if last:
                cur[int(part)] = value
            else:
                cur = cur[int(part)]
        elif isinstance(cur, dict):
            if last:
                cur[part] = value
            else:
                if cur.get(part) is None:
                    cur[part] = {}
                cur = cur[part]
        else:
            raise ConfigError(f"--set: cannot set a key inside a {type(cur).__name__}; expected a path through "
                              "mappings and lists",
                              file=file, key=".".join(parts[:i]))


def parse_override(item: str) -> tuple[str, Any]:
    """``key.path=value`` with the value read as YAML (numbers, booleans, lists)."""
    if "=" not in item:
        raise ConfigError(f"--set: expected key.path=value, got {item!r}")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set: expected key.path=value, got {item!r}")
    try:
        return key, load_yaml_value(raw)
    except TooManyNodes as e:
        raise ConfigError(f"--set: {e.message()}", key=key) from None
    except (yaml.YAMLError, DuplicateKey):
        return key, raw


def platform_overrides(items: Sequence[str]) -> list[tuple[str, Any]]:
    """``--set`` items of a command whose keys are a platform's (comm, calibrate): ``network.nic_gbps=200``.
    Run's ``platform.`` prefix is refused rather than quietly dropped: here every key is a platform key."""
    out = []
    for item in items:
        key, value = parse_override(item)
        if key == "platform" or key.startswith("platform."):
            bare = key.removeprefix("platform").removeprefix(".") or "network.nic_gbps"
            raise ConfigError(f"--set: this command's keys are the platform's own; expected {bare}=..., "
                              f"without run's 'platform.' prefix", key=key)
        out.append((key, value))
    return out


def validate(model: type[M], data: dict[str, Any], file: str,
             lines: dict[tuple[str, ...], int] | None = None) -> M:
    """Validate ``data`` against ``model``, turning the first problem into one ConfigError.

    An unknown key is reported before anything else: a misspelt key also leaves the right one
    missing, and the misspelling is what the user has to fix."""
    wrong = kind_error(model, data)
    if wrong is not None:
        at, why = wrong
        raise ConfigError(why, file=file, key=".".join(str(p) for p in at),
                          line=(lines or {}).get(tuple(str(p) for p in at))) from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        errors.sort(key=lambda err: err["type"] != "extra_forbidden")
        first = errors[0]
        loc = _data_loc(first["loc"], data)
        if first["type"] in ("union_tag_not_found", "union_tag_invalid"):
            loc = [*loc, "kind"]
        key = ".".join(str(p) for p in loc) or None
        line = (lines or {}).get(tuple(str(p) for p in loc))
        if line is None and lines and loc:
            line = lines.get(tuple(str(p) for p in loc[:-1]))
        msg = _message(model, first, tuple(first["loc"]))
        if len(errors) > 1:
            msg += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
        raise ConfigError(msg, file=file, key=key, line=line) from None


def _data_loc(loc: Sequence[int | str], data: Any) -> list[int | str]:
    """Drop the tags pydantic inserts for discriminated unions, which are not keys of the file."""
    out: list[int | str] = []
    cur = data
    for part in loc:
        if isinstance(cur, dict) and part not in cur and cur.get("kind") == part:
            continue
        out.append(part)
        if isinstance(cur, dict):
            cur = cur.get(part)
        elif isinstance(cur, list) and isinstance(part, int) and part < len(cur):
            cur = cur[part]
        else:
            cur = None
    return out


def _message(model: type[BaseModel], err: Any, loc: tuple[int | str, ...]) -> str:
    etype = err["type"]
    owner = _model_at(model, loc[:-1])
    field = loc[-1] if loc else None
    if etype == "extra_forbidden":
        known = list(owner.model_fields) if owner else []
        close = difflib.get_close_matches(str(field), known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"unknown key; {hint}expected one of: {', '.join(known) or '?'}"
    if etype in ("union_tag_not_found", "union_tag_invalid"):
        tags = err.get("ctx", {}).get("expected_tags") or ", ".join(
            t for t in (_tag(c) for c in _unwrap_models(_annotation_at(model, loc))) if t)
        got = err.get("ctx", {}).get("tag")
        return (f"expected one of: {tags}; got {got!r}" if etype == "union_tag_invalid"
                else f"missing required key; expected which model it is, one of: {tags}")
    desc = d = ""
    if owner is not None and isinstance(field, str) and field in owner.model_fields:
        d = owner.model_fields[field].description or ""
        desc = f" ({d})" if d else ""
    if etype == "missing":
        return f"missing required key; expected {d or 'a value'}"
    if etype == "value_error":  # a rule of the section: its own words say what is expected
        return f"{str(err['msg']).removeprefix('Value error, ')}"
    got = err.get("input")
    got_s = repr(got) if not isinstance(got, dict | list) else type(got).__name__
    return f"{_expected(str(err['msg']))}{desc}; got {got_s}"


def _expected(msg: str) -> str:
    """Pydantic's "Input should be greater than 0" as "expected a value greater than 0"."""
    head = "Input should be "
    if not msg.startswith(head):
        return f"expected: {msg[0].lower()}{msg[1:]}" if msg else "expected a valid value"
    rest = msg[len(head):]
    if rest.startswith(("greater", "less")):
        rest = f"a value {rest}"
    return f"expected {rest}"


def _annotation_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> Any:
    """The annotation of the field at ``loc`` (a path of field names), or None."""
    owner = _model_at(model, loc[:-1]) if loc else None
    field = loc[-1] if loc else None
    if owner is None or not isinstance(field, str) or field not in owner.model_fields:
        return None
    return owner.model_fields[field].annotation


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The pydantic model class that owns the keys at ``loc`` (following lists, dicts, optionals,
    unions)."""
    cur: Any = model
    i = 0
    while i < len(loc):
        if typing.get_origin(cur) is dict:  # the next loc part is the dict's key
            cur = typing.get_args(cur)[1]
            i += 1
            continue
        cls = _unwrap_models(cur)
        part = loc[i]
        if isinstance(part, int):
            i += 1
            continue
        if len(cls) > 1:  # a discriminated union: the next loc part is the tag
            tagged = [c for c in cls if _tag(c) == part]
            if tagged:
                cur = tagged[0]
                i += 1
                continue
        if len(cls) != 1 or part not in cls[0].model_fields:
            return None
        cur = cls[0].model_fields[part].annotation
        i += 1
    found = _unwrap_models(cur)
    return found[0] if len(found) == 1 else None


def _unwrap_models(tp: Any) -> list[type[BaseModel]]:
    return unwrap_models(tp, containers=True)


def _tag(cls: type[BaseModel]) -> str | None:
    f = cls.model_fields.get("kind")
    if f is None:
        return None
    args = typing.get_args(f.annotation)
    return str(args[0]) if args else None


def platform_path(ref: str, relative_to: Path | None = None) -> Path:
    """Resolve a platform reference: a path to a YAML file, or a name in a platforms folder."""
    import os

    cand = Path(ref)
    if cand.suffix in (".yaml", ".yml") or "/" in ref:
        if not cand.is_absolute() and relative_to is not None and (relative_to / cand).is_file():
            return relative_to / cand
        return cand
    dirs = [Path(d) for d in os.environ.get("SIMGPU_PLATFORMS", "").split(os.pathsep) if d]
    dirs += [Path("platforms"), REPO_PLATFORMS]
    for d in dirs:
        for name in (f"{ref}.yaml", f"{ref}/platform.yaml"):
            if (d / name).is_file():
                return d / name
    return REPO_PLATFORMS / f"{ref}.yaml"


def known_platforms() -> list[str]:
    return sorted(p.stem for p in REPO_PLATFORMS.glob("*.yaml"))


def load_platform(ref: str, overrides: Sequence[tuple[str, Any]] = (), relative_to: Path | None = None,
                  ) -> tuple[PlatformSpec, str]:
    """Read and validate a platform by name or path, with ``(key, value)`` overrides applied."""
    path = platform_path(ref, relative_to)
    if path.is_dir() and not (path / "platform.yaml").is_file():
        raise ConfigError(f"platform {ref!r} is a folder; expected a platform YAML file or one of: "
                          f"{', '.join(known_platforms())}", file=str(path))
    if not path.is_file():
        raise ConfigError(f"platform {ref!r} not found; expected a YAML path or one of: "
                          f"{', '.join(known_platforms())}", file=str(path))
    data, lines = read_yaml(path, "platform")
    for k, v in overrides:
        apply_override(data, k, v, str(path))
    if "mix" in data:  # nodes of several kinds (simgpu/config/mixed.py)
        return load_mixed(data, lines, str(path), load_platform, validate), str(path)
    return validate(PlatformSpec, data, str(path), lines), str(path)


def check_name(name: str, file: str, line: int | None = None) -> None:
    """A name from a file names an output folder: refuse one that is a path, or empty."""
    if not name.strip() or "/" in name or "\\" in name or name.strip(". ") == "" or "\x00" in name:
        raise ConfigError(f"expected a short name (it names the output folder), not a path; got {name!r}",
                          file=file, key="name", line=line)


def load_job(workload: str | Path, overrides: Sequence[str] = ()) -> Job:
    """Read a workload and its platform, apply ``--set`` overrides, validate and cross-check."""
    from .checks import check_job

    wfile = str(workload)
    data, lines = read_yaml(workload, "workload")
    plat_over: list[tuple[str, Any]] = []
    for item in overrides:
        key, value = parse_override(item)
        if key.startswith("platform."):
            plat_over.append((key[len("platform."):], value))
        else:
            apply_override(data, key.removeprefix("workload."), value, wfile)
    ref = data.get("platform")
    if not isinstance(ref, str):
        raise ConfigError("missing or invalid key; expected a platform name or path to a platform YAML",
                          file=wfile, key="platform", line=lines.get(("platform",)))
    if "nodes" not in data:
        raise ConfigError("missing required key; expected the number of nodes of the platform the job uses "
                          "(nodes: 1 for one machine)", file=wfile, key="nodes")
    data = expand_config(data, wfile)
    spec = validate(WorkloadSpec, data, wfile, lines)
    check_name(spec.name, wfile, lines.get(("name",)))
    platform, pfile = load_platform(ref, plat_over, relative_to=Path(wfile).parent)
    check_nodes(platform, spec.nodes, wfile, lines.get(("nodes",)))
    job = Job(spec, platform, wfile, pfile, tuple(overrides))
    check_job(job)
    return job


def data_root() -> Path:
    """The shared measurement folder: ``$SIMGPU_DATA``, else ``../shared/data`` beside the checkout."""
    import os

    env = os.environ.get("SIMGPU_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "data"


def resolve_path(file: str, ref: str) -> Path:
    """A path named in the YAML file ``file``: relative to the file's folder, absolute, or
    ``data:<path>`` inside the shared measurement folder (:func:`data_root`)."""
    if ref.startswith("data:"):
        return data_root() / ref.removeprefix("data:")
    p = Path(ref)
    if p.is_absolute():
        return p
    rel = Path(file).parent / p
    return rel if rel.exists() or not p.exists() else p


def job_kind(path: str | Path, overrides: Sequence[str] = (), what: str = "YAML") -> JobKind:
    """What the YAML file at ``path`` is (after ``--set`` overrides), read once from its keys: a
    study names a ``base``; a serving file whose ``deployment.workload`` is a ``dlrm_inference``
    workload is a DLRM one; one with ``requests`` and a ``deployment`` (or ``prefill`` and
    ``decode`` pools) an LLM one; one with a ``jobs`` list a cluster; anything else a workload. A
    file that cannot be read raises :class:`ConfigError` saying it is not the ``what`` file the
    command expected."""
    file = str(path)
    data, _ = read_yaml(path, what)
    for item in overrides:
        key, value = parse_override(item)
        if key.startswith("platform."):  # a workload's platform, not the file's own keys
            continue
        apply_override(data, key.removeprefix("workload."), value, file)
    if "base" in data:
        return "study"
    if isinstance(data.get("jobs"), list):
        return "cluster"
    dep = data.get("deployment")
    if isinstance(dep, dict) and isinstance(dep.get("workload"), str):
        wl = resolve_path(file, dep["workload"])
        try:
            wdata = read_yaml(wl, "workload")[0] if wl.is_file() else {}
        except ConfigError:
            wdata = {}
        model = wdata.get("model")
        if isinstance(model, dict) and model.get("kind") == "dlrm_inference":
            return "dlrm_serving"
    if "requests" in data and any(k in data for k in ("deployment", "prefill", "decode")):
        return "llm_serving"
    return "workload"
