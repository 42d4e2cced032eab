"""The base of every configuration model: strict, frozen, documented pydantic models.

Numbers are read as numbers: a boolean (``nodes: true``) or a string (``seq_len: "1024"``) where a
number is expected is refused rather than converted, as is a string or a number where a boolean
is expected, and infinities and NaN are refused everywhere. A float with no fractional part is an
integer (``1e3``), so that sizes can be written in scientific notation.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict


def _kinds(tp: Any) -> set[type]:
    """The scalar kinds (int, float, bool) an annotation accepts at its top level."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _kinds(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        out: set[type] = set()
        for a in typing.get_args(tp):
            out |= _kinds(a)
        return out
    if origin is typing.Literal:
        return {type(a) for a in typing.get_args(tp)}
    return {tp} if tp in (int, float, bool, str) else set()


def _first(tp: Any, leaf: typing.Callable[[Any, tuple[Any, ...]], Any]) -> Any:
    """``leaf(origin, args)`` of the first member of ``tp`` (through ``Annotated`` and unions) for
    which it is not None, else None."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _first(typing.get_args(tp)[0], leaf)
    if origin in (typing.Union, types.UnionType):
        for a in typing.get_args(tp):
            found = _first(a, leaf)
            if found is not None:
                return found
        return None
    return leaf(origin, typing.get_args(tp))


def _items(tp: Any) -> tuple[Any, ...] | None:
    """The item annotations of a list or tuple annotation (one for a list), else None."""
    return _first(tp, lambda origin, args: tuple(a for a in args if a is not Ellipsis)
                  if origin in (list, tuple) else None)


def _dict_values(tp: Any) -> Any:
    """The value annotation of a dict annotation, else None."""
    return _first(tp, lambda origin, args: args[1] if origin is dict else None)


def check_kind(tp: Any, value: Any) -> str | None:
    """Why ``value`` is of the wrong kind for annotation ``tp`` (None when it is not)."""
    kinds = _kinds(tp)
    if kinds and value is not None and str not in kinds:
        number = int in kinds or float in kinds
        if isinstance(value, bool) and bool not in kinds:
            return f"expected a number, got a boolean ({str(value).lower()})"
        if isinstance(value, str) and (number or bool in kinds):
            if not number:
                return f"expected true or false, got a string {value!r}"
            try:
                float(value)
            except ValueError:
                return f"expected a number, got {value!r}"
            return f"expected a number, got a string {value!r} (drop the quotes)"
        if kinds == {bool} and not isinstance(value, bool):
            return f"expected true or false, got {value!r}"
    if isinstance(value, dict):
        values = _dict_values(tp)
        for k, v in value.items():
            why = check_kind(values, v) if values is not None else None
            if why:
                return f"{k}: {why}"
        return None
    items = _items(tp)
    if items and isinstance(value, list | tuple):
        for i, v in enumerate(value):
            why = check_kind(items[min(i, len(items) - 1)], v)
            if why:
                return f"item {i}: {why}"
    return None


def kind_error(model: type[BaseModel], data: Any, loc: tuple[str | int, ...] = ()
               ) -> tuple[tuple[str | int, ...], str] | None:
    """The first value of ``data`` (read for ``model``) of the wrong kind: its key path and why.

    An integer written as a float (``1e20``) is rewritten in ``data`` as the integer it is, so that
    the rules on its size, not its type, judge it."""
    if not isinstance(data, dict):
        return None
    for key, value in data.items():
        field = model.model_fields.get(str(key))
        if field is None:
            continue
        kinds = _kinds(field.annotation)
        if (isinstance(value, float) and math.isfinite(value) and value.is_integer() and int in kinds
                and float not in kinds):
            data[key] = value = int(value)
        why = check_kind(field.annotation, value)
        if why:
            return (*loc, key), why
        for sub, (sub_loc, sub_value) in _nested(field.annotation, value, (*loc, key)):
            found = kind_error(sub, sub_value, sub_loc)
            if found:
                return found
    return None


def unwrap_models(tp: Any, containers: bool = False) -> list[type[BaseModel]]:
    """The pydantic models an annotation names, through ``Annotated`` and unions (and, with
    ``containers``, the items of lists and tuples)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return unwrap_models(typing.get_args(tp)[0], containers)
    if origin in (typing.Union, types.UnionType) or (containers and origin in (list, tuple)):
        return [m for a in typing.get_args(tp) for m in unwrap_models(a, containers)]
    return []


def _models(tp: Any) -> list[type[BaseModel]]:
    return unwrap_models(tp)


def _nested(tp: Any, value: Any, loc: tuple[str | int, ...]
            ) -> list[tuple[type[BaseModel], tuple[tuple[str | int, ...], Any]]]:
    """The sub-models inside ``value`` (a mapping, or a list or dict of them) for annotation ``tp``."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _nested(typing.get_args(tp)[0], value, loc)
    if origin in (typing.Union, types.UnionType):
        models = _models(tp)
        if isinstance(value, dict) and models:
            tagged = [m for m in models if _tag_of(m) == value.get("kind")] if len(models) > 1 else models
            return [(tagged[0], (loc, value))] if tagged else []
        for a in typing.get_args(tp):
            found = _nested(a, value, loc)
            if found:
                return found
        return []
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(tp) or (None,)
        return [n for i, v in enumerate(value) for n in _nested(item, v, (*loc, i))]
    if origin is dict and isinstance(value, dict):
        item = typing.get_args(tp)[1]
        return [n for k, v in value.items() for n in _nested(item, v, (*loc, k))]
    if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(value, dict):
        return [(tp, (loc, value))]
    return []


def _tag_of(model: type[BaseModel]) -> Any:
    f = model.model_fields.get("kind")
    args = typing.get_args(f.annotation) if f is not None else ()
    return args[0] if args else None


class Spec(BaseModel):
    """A configuration section: unknown keys are rejected, infinities and NaN refused (numbers of
    the wrong kind are refused where files are read, by :func:`kind_error`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, validate_default=True,
                              allow_inf_nan=False)
