"""A small typed-schema loader: YAML mappings -> keyword-only dataclasses, every error at once.

Why not pydantic: it is a heavy import on the CLI's hot path and its messages are not the
one-line ``field.path: expected X, got Y (did you mean 'Z'?)`` our users want. The schema is
the dataclass itself: field types drive the checks, ``field(metadata=...)`` carries the doc
string shown in the README reference and ``choices`` for closed sets.

Supported field types: ``int``, ``float``, ``bool``, ``str``, ``X | None``, ``list[str]``,
``list[int]``, ``dict[str, str]`` and nested dataclasses.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any


def doc(text: str, *, choices: tuple | None = None, default: Any = dataclasses.MISSING,
        default_factory: Any = dataclasses.MISSING):
    """A dataclass field with a user-facing description and optional closed set of values."""
    meta = {"doc": text}
    if choices is not None:
        meta["choices"] = tuple(choices)
    kwargs: dict[str, Any] = {"metadata": meta}
    if default is not dataclasses.MISSING:
        kwargs["default"] = default
    if default_factory is not dataclasses.MISSING:
        kwargs["default_factory"] = default_factory
    return dataclasses.field(**kwargs)


class Problems:
    """Collects ``(field_path, message)`` pairs while a whole document is checked."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def add(self, path: str, message: str) -> None:
        self.items.append((path, message))

    def __bool__(self) -> bool:
        return bool(self.items)


def did_you_mean(word: str, options) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _unwrap_optional(tp):
    """``X | None`` -> (X, True); anything else -> (tp, False)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _convert(tp, value: Any, path: str, problems: Problems, choices=None):
    """Check ``value`` against type ``tp``; return the converted value or None after a problem."""
    tp, optional = _unwrap_optional(tp)
    if value is None:
        if optional:
            return None
        problems.add(path, f"expected {_type_name(tp)}, got nothing (null)")
        return None
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            problems.add(path, f"expected a mapping, got {_describe(value)}")
            return None
        return build(tp, value, path, problems)
    origin = typing.get_origin(tp)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            problems.add(path, f"expected a list, got {_describe(value)}")
            return None
        return [_convert(item_tp, v, f"{path}[{i}]", problems, choices) for i, v in enumerate(value)]
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            problems.add(path, f"expected a mapping, got {_describe(value)}")
            return None
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                problems.add(path, f"keys must be strings, got {k!r}")
                continue
            # YAML turns 1/true into numbers/bools; environment values are strings: accept scalars.
            if val_tp is str and isinstance(v, (int, float, bool)) and not isinstance(v, bool):
                v = str(v)
            out[k] = _convert(val_tp, v, f"{path}.{k}", problems)
        return out
    if tp is bool:
        if isinstance(value, bool):
            return value
        problems.add(path, f"expected true or false, got {_describe(value)}")
        return None
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return _check_choice(value, path, problems, choices)
        problems.add(path, f"expected an integer, got {_describe(value)}")
        return None
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads 3e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        problems.add(path, f"expected a number, got {_describe(value)}")
        return None
    if tp is str:
        if isinstance(value, str):
            return _check_choice(value, path, problems, choices)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not choices:
            return str(value)
        problems.add(path, f"expected a string, got {_describe(value)}")
        return None
    raise TypeError(f"unsupported schema type {tp!r} at {path}")  # a bug in a schema, not input


def _check_choice(value, path, problems, choices):
    if choices and value not in choices:
        listed = ", ".join(str(c) for c in choices)
        hint = did_you_mean(str(value), [str(c) for c in choices]) if isinstance(value, str) else ""
        problems.add(path, f"expected one of {listed}, got {_describe(value)}{hint}")
        return None
    return value


def _type_name(tp) -> str:
    tp, _ = _unwrap_optional(tp)
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    origin = typing.get_origin(tp)
    if origin is list:
        return "a list"
    if origin is dict:
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def build(cls, data: dict, path: str, problems: Problems):
    """Build dataclass ``cls`` from ``data``; every problem goes to ``problems``.

    Missing fields without a default are problems; unknown keys are problems with a
    did-you-mean. On problems the returned object may hold ``None`` in the broken fields: callers
    must raise before using it.
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in fields:
            problems.add(_join(path, str(key)), "unknown key" + did_you_mean(str(key), fields))
    kwargs = {}
    for name, f in fields.items():
        fpath = _join(path, name)
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], fpath, problems, f.metadata.get("choices"))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            problems.add(fpath, f"missing (expected {_type_name(hints[name])}: {f.metadata.get('doc', '')})")
            kwargs[name] = None
    return cls(**kwargs)


def to_dict(obj) -> Any:
    """Dataclass tree -> plain dict/list/scalars (what gets written back as resolved YAML)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def describe_fields(cls, prefix: str = ""):
    """Yield ``(path, type name, default, doc)`` for every field: the README reference tables."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = _join(prefix, f.name)
        tp, _ = _unwrap_optional(hints[f.name])
        if dataclasses.is_dataclass(tp):
            yield from describe_fields(tp, path)
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "required"
        choices = f.metadata.get("choices")
        name = " | ".join(str(c) for c in choices) if choices else _type_name(hints[f.name])
        yield path, name, default, f.metadata.get("doc", "")
