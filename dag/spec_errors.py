"""Turn pydantic's validation errors into hetrun ``SpecError`` messages.

A user sees: file:line:column, the key path, what was wrong with which value,
what was expected, and the closest valid key or value for a misspelling.
Errors caused by a command-line override name the override instead of a line.
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from hetrun.dag.yaml_source import KeyPath, SourceDoc, format_path
from pydantic import BaseModel, ValidationError

from hetrun.errors import GraphError, SpecError, closest

_NUMBER_RE = re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9]*)?([eE][-+]?[0-9]+)?$")


class SpecIssue(ValueError):
    """A semantic problem found inside a model validator, carrying its absolute key path."""

    def __init__(self, message: str, *, path: KeyPath, hint: str | None = None) -> None:
        super().__init__(message)
        self.path = tuple(path)
        self.hint = hint


@dataclass
class _Problem:
    path: KeyPath
    message: str
    hint: str | None
    value: Any


_TYPE_NAMES = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _unwrap(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _valid_keys(model: type[BaseModel], path: KeyPath) -> list[str] | None:
    """Keys allowed at ``path`` (a mapping location) by walking the model's annotations."""
    current: Any = model
    for part in path:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
            continue
        origin = typing.get_origin(current)
        if origin in (dict, list):
            current = typing.get_args(current)[-1]
            continue
        return None
    current = _unwrap(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return None


def _expected_literals(ctx: dict[str, Any] | None) -> list[str]:
    expected = (ctx or {}).get("expected", "")
    return re.findall(r"'([^']*)'", str(expected))


def _problem(err: Any, model: type[BaseModel]) -> _Problem:
    loc: KeyPath = tuple(p for p in err["loc"] if p != "[key]")
    etype: str = err["type"]
    ctx = err.get("ctx") or {}
    value = err.get("input")
    inner = ctx.get("error")
    if isinstance(inner, SpecIssue):
        return _Problem(inner.path, str(inner), inner.hint, value)
    if etype == "extra_forbidden":
        key = str(loc[-1])
        valid = _valid_keys(model, loc[:-1]) or []
        near = closest(key, valid)
        hint = f"did you mean {near!r}?" if near else None
        return _Problem(loc, f"unknown key {key!r}; valid keys: {', '.join(valid)}", hint, value)
    if etype == "missing":
        return _Problem(loc, f"missing required key {loc[-1]!r}", f"add {loc[-1]}: to {format_path(loc[:-1]) or 'the top level'}", None)
    if etype == "literal_error":
        options = _expected_literals(ctx)
        is_key = "[key]" in err["loc"]
        near = closest(str(value), options) if isinstance(value, str) else None
        what = "key" if is_key else "value"
        hint = f"did you mean {near!r}?" if near else None
        return _Problem(loc, f"{what} {value!r} is not one of: {', '.join(options)}", hint, value)
    if isinstance(inner, ValueError):
        return _Problem(loc, str(inner), None, value)
    if etype in _TYPE_NAMES:
        hint = None
        if isinstance(value, str) and etype in ("int_type", "float_type") and _NUMBER_RE.match(value.strip()):
            hint = "write the number without quotes"
        return _Problem(loc, f"expected {_TYPE_NAMES[etype]}, got {_describe(value)}", hint, value)
    if etype in ("greater_than_equal", "less_than_equal", "greater_than", "less_than", "too_short", "too_long"):
        return _Problem(loc, f"{err['msg'].lower()}, got {_describe(value)}", None, value)
    return _Problem(loc, f"{err['msg']} (got {_describe(value)})", None, value)


def _override_for(path: KeyPath, override_paths: dict[KeyPath, str]) -> str | None:
    """The override that set ``path`` or one of its ancestors (the longest match)."""
    best: tuple[int, str] | None = None
    for opath, label in override_paths.items():
        n = len(opath)
        if path[:n] == opath and (best is None or n > best[0]):
            best = (n, label)
    return best[1] if best else None


def translate_validation_error(
    exc: ValidationError,
    model: type[BaseModel],
    doc: SourceDoc | None,
    override_paths: dict[KeyPath, str],
    prefix: KeyPath = (),
) -> SpecError:
    """``exc`` as one SpecError; ``prefix`` is where ``model`` sits in the document
    (``("workload_args",)`` for a workload's arguments model)."""
    problems = [_problem(err, model) for err in exc.errors()]
    if prefix:
        problems = [_Problem((*prefix, *p.path), p.message, p.hint, p.value) for p in problems]
    # One problem per key path: unions report the same bad value once per branch.
    seen: set[KeyPath] = set()
    unique = []
    for p in problems:
        if p.path not in seen:
            seen.add(p.path)
            unique.append(p)

    def where(p: _Problem) -> tuple[str | None, int | None, int | None]:
        label = _override_for(p.path, override_paths)
        if label is not None:
            return f"override {label}", None, None
        if doc is None:
            return None, None, None
        line, col = doc.mark_for(p.path)
        return doc.file, line, col

    first = unique[0]
    file, line, col = where(first)
    message = first.message
    for extra in unique[1:6]:
        f, ln, c = where(extra)
        pos = (f or "<job spec>") + (f":{ln}:{c}" if ln is not None else "")
        message += f"\n  also {pos}: {format_path(extra.path)}: {extra.message}"
        if extra.hint:
            message += f" ({extra.hint})"
    if len(unique) > 6:
        message += f"\n  ... and {len(unique) - 6} more"
    return SpecError(message, file=file, key_path=format_path(first.path) or None, line=line,
                     column=col, value=first.value, hint=first.hint)


# Where a loaded spec came from, kept on the JobSpec instance (outside its
# fields, so equality and dumps ignore it) for errors found after validation.
_SOURCE_ATTR = "_hetrun_source"


def attach_source(spec: BaseModel, doc: SourceDoc, override_paths: dict[KeyPath, str]) -> None:
    object.__setattr__(spec, _SOURCE_ATTR, (doc, dict(override_paths)))


def locate_graph_error(err: GraphError, spec: BaseModel) -> GraphError:
    """``err`` with the file:line:col (or the override) of its ``key_path``, when known."""
    source = getattr(spec, _SOURCE_ATTR, None)
    if source is None or err.key_path is None or err.file is not None:
        return err
    doc, override_paths = source
    path: KeyPath = tuple(err.key_path.split("."))
    label = _override_for(path, override_paths)
    if label is not None:
        return GraphError(err.bare_message, hint=err.hint, key_path=err.key_path, file=f"override {label}")
    line, column = doc.mark_for(path)
    return GraphError(err.bare_message, hint=err.hint, key_path=err.key_path, file=doc.file,
                      line=line, column=column)
