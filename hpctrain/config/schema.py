"""A small typed-schema loader: YAML mappings -> keyword-only dataclasses, every error at once.

Why not pydantic: it is a heavy import on the CLI's hot path and its messages are not the
one-line ``field.path: expected X, got Y (did you mean 'Z'?)`` our users want. The schema is
the dataclass itself: field types drive the checks, ``field(metadata=...)`` carries the doc
string shown in the README reference and ``choices`` for closed sets.

Supported field types: ``int``, ``float``, ``bool``, ``str``, ``X | None``, ``list[str]``,
``list[int]``, ``dict[str, str]`` and nested dataclasses.

Every value is bounded here, once, whatever the field: a number has a range (the field's
``at_least``/``above``/``at_most``/``below``, shown in the README reference, or a generic one)
and is finite (NaN and infinities are refused), and a string is one line of printable text of
at most ``safety.MAX_TEXT`` characters. So no later code (the planner's loops, the script
template, file names) ever sees 10**30 layers, a NaN learning rate or a newline in a name.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import math
import numbers
import operator
import typing
from typing import Any

from . import safety, yamlio
from .problems import Problems

# Ranges for numbers whose field names none: wide, but finite and small enough that no loop,
# allocation or file name built from them can run away.
DEFAULT_INT_RANGE = (-(2**31), 2**31 - 1)
DEFAULT_FLOAT_LIMIT = 1e12


def doc(text: str, *, choices: tuple | None = None, default: Any = dataclasses.MISSING,
        default_factory: Any = dataclasses.MISSING, at_least=None, above=None, at_most=None,
        below=None):
    """A dataclass field with a user-facing description, an optional closed set of values and,
    for numbers (or lists of numbers), its range: ``at_least``/``above`` (inclusive/exclusive
    lower bound) and ``at_most``/``below`` (inclusive/exclusive upper bound)."""
    meta: dict[str, Any] = {"doc": text}
    if choices is not None:
        meta["choices"] = tuple(choices)
    bounds = {k: v for k, v in (("at_least", at_least), ("above", above), ("at_most", at_most),
                                ("below", below)) if v is not None}
    if bounds:
        meta["bounds"] = bounds
    kwargs: dict[str, Any] = {"metadata": meta}
    if default is not dataclasses.MISSING:
        kwargs["default"] = default
    if default_factory is not dataclasses.MISSING:
        kwargs["default_factory"] = default_factory
    return dataclasses.field(**kwargs)


def did_you_mean(word: str, options) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _describe(value: Any) -> str:
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return safety.short(value)
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return safety.short(value)


def key_text(key: Any) -> str:
    """How an error names a mapping key that is not text. YAML reads ``~:``, ``null:``,
    ``true:``, ``1.5:`` and ``0x10:`` as null, a boolean and numbers, which no field is named:
    the key is named as written (a number keeps its text) and as what YAML made of it, never as
    Python's ``None`` or ``True``. Every non-text key of a profile or job is named here."""
    if key is None:
        return "a null key (~ or null)"
    written = _written(key)
    if isinstance(key, bool):
        return f"the key {written} (a boolean)"
    if written is not None:
        return f"the key {written} (a number)"
    if isinstance(key, str):
        return f"the key {safety.short(key, 40)}"
    return f"a key that is {_describe(key)}"


def _written(key: Any) -> str | None:
    """A null, boolean or number key as YAML text (a number as it was written), or None."""
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, (int, float)):
        written = yamlio.source_text(key)
        if written is not None:
            return written
        return str(key) if isinstance(key, float) or abs(key) < 10**18 else None
    return None


def _unknown_key(key: Any, fields, path: str, problems: Problems) -> None:
    """A key of a section that is not one of its fields: a name gets its own path and a
    did-you-mean; a key that is not text (null, a boolean, a number) is named by ``key_text``
    on the section's path, with the fix."""
    if isinstance(key, str):
        name = key if key.isidentifier() and len(key) <= 64 else safety.short(key, 40)
        hint = did_you_mean(key, fields) if len(key) <= 64 else ""
        problems.add(_join(path, name), "unknown key" + hint)
        return
    problems.add(path, f"unknown key: {key_text(key)} is not a field name; remove it or write "
                       "the field's name")


def _unwrap_optional(tp):
    """``X | None`` -> (X, True); anything else -> (tp, False)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _convert(tp, value: Any, path: str, problems: Problems, choices=None, bounds=None):
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
        return [_convert(item_tp, v, f"{path}[{i}]", problems, choices, bounds)
                for i, v in enumerate(value)]
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            problems.add(path, f"expected a mapping, got {_describe(value)}")
            return None
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                quote = f' (\"{_written(k)}\": ...)' if _written(k) is not None else ""
                problems.add(path, f"{key_text(k)} is not text; a key here is a name: quote "
                                   f"it{quote} or remove it")
                continue
            why = safety.text_problem(k, 256)
            if why:
                problems.add(f"{path}.{safety.short(k, 40)}", f"the key {why}")
                continue
            out[k] = _convert(val_tp, v, f"{path}.{k}", problems)
        return out
    if tp is bool:
        if isinstance(value, bool):
            return value
        problems.add(path, f"expected true or false, got {_describe(value)}")
        return None
    value = _python_number(value)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            value = int(value)   # a plain int, not the loader's TextInt
            if not _in_range(value, bounds, path, problems):
                return None
            return _check_choice(value, path, problems, choices)
        problems.add(path, f"expected an integer, got {_describe(value)}")
        return None
    if tp is float:
        number = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = float(value) if abs(value) < 10**300 else math.inf
        elif isinstance(value, float):
            number = float(value)   # a plain float, not the loader's TextFloat
        elif isinstance(value, str) and len(value) <= 64:  # YAML reads 3e-4 (no dot) as a string
            number = safety.number_from_text(value)    # ASCII notation only, not float()'s
        if number is None:
            problems.add(path, f"expected a number, got {_describe(value)}")
            return None
        if not math.isfinite(number):
            problems.add(path, f"expected a finite number, got {_describe(value)}")
            return None
        return number if _in_range(number, bounds, path, problems) else None
    if tp is str:
        # YAML reads 0x10, 010, 2.20 and 1.5 as numbers where a string (a name, an environment
        # value) is meant: the field gets the text as written, never the number's re-spelling
        # ("16", "10", "2.2"). true/false stay refused: they would silently become "True".
        written = yamlio.source_text(value)
        if written is not None:
            value = written
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            # a number from Python (the API, a sweep built in code), not from YAML text
            if isinstance(value, float) and not math.isfinite(value):
                problems.add(path, f"expected a string, got {_describe(value)}")
                return None
            value = str(value) if not isinstance(value, int) or abs(value) < 10**100 else None
        if isinstance(value, str):
            why = safety.text_problem(value)
            if why:
                problems.add(path, f"{_describe(value)} {why}")
                return None
            return _check_choice(value, path, problems, choices)
        problems.add(path, f"expected a string, got {_describe(value)}")
        return None
    raise TypeError(f"unsupported schema type {tp!r} at {path}")  # a bug in a schema, not input


def _python_number(value: Any) -> Any:
    """A number built in Python that is not an ``int`` or a ``float`` (numpy's ``int64`` and
    ``float32``, a ``Fraction``: what ``np.arange`` and pandas give an API caller's job
    mapping) as the plain ``int`` or ``float`` it stands for, so it gets a number's checks and
    is written to the run's YAML as one; anything else unchanged."""
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    if isinstance(value, numbers.Integral):
        return operator.index(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


def _range(bounds) -> tuple:
    """(low, low inclusive, high, high inclusive) of a field's bounds."""
    bounds = bounds or {}
    low, low_in = (bounds["at_least"], True) if "at_least" in bounds else (bounds.get("above"), False)
    high, high_in = (bounds["at_most"], True) if "at_most" in bounds else (bounds.get("below"), False)
    return low, low_in, high, high_in


def _in_range(number, bounds, path: str, problems: Problems) -> bool:
    low, low_in, high, high_in = _range(bounds)
    if isinstance(number, float):
        limit = DEFAULT_FLOAT_LIMIT
        low = -limit if low is None else low
        high = limit if high is None else high
    else:
        low = DEFAULT_INT_RANGE[0] if low is None else low
        high = DEFAULT_INT_RANGE[1] if high is None else high
        low_in = low_in or low == DEFAULT_INT_RANGE[0]
        high_in = high_in or high == DEFAULT_INT_RANGE[1]
    if number < low or (number == low and not low_in):
        word = "at least" if low_in else "above"
        problems.add(path, f"must be {word} {_fmt_number(low)}, got {_describe(number)}")
        return False
    if number > high or (number == high and not high_in):
        word = "at most" if high_in else "below"
        problems.add(path, f"must be {word} {_fmt_number(high)}, got {_describe(number)}")
        return False
    return True


def _fmt_number(x) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e16:
        x = int(x)
    if isinstance(x, int) and abs(x) >= 10**6:
        exp = len(str(abs(x))) - 1
        if x == 10**exp:
            return f"10^{exp}"
        if x & (x - 1) == 0:
            return f"2^{x.bit_length() - 1}"
        return f"{x:,}"
    return f"{x:g}" if isinstance(x, float) else str(x)


def range_text(bounds) -> str:
    """A field's range for the reference table, e.g. ``[1, 1024]`` or ``(0, 1]``."""
    low, low_in, high, high_in = _range(bounds)
    if low is None and high is None:
        return ""
    left = "(-∞" if low is None else ("[" if low_in else "(") + _fmt_number(low)
    right = "∞)" if high is None else _fmt_number(high) + ("]" if high_in else ")")
    return f"{left}, {right}"


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


def _number_or_word(tp) -> bool:
    """``float | str``: a number, or one of the field's ``choices`` words (e.g. ``auto``)."""
    return (typing.get_origin(tp) in (typing.Union, types.UnionType)
            and set(typing.get_args(tp)) == {float, str})


def _number_or_word_value(value: Any, path: str, problems: Problems, meta: dict):
    words = meta.get("choices", ())
    if isinstance(value, str) and value in words:
        return value
    before = len(problems.items)
    number = _convert(float, value, path, problems, None, meta.get("bounds"))
    if len(problems.items) > before and problems.items[-1][1].startswith("expected a number"):
        hint = did_you_mean(value, words) if isinstance(value, str) and len(value) <= 64 else ""
        message = problems.items[-1][1].replace("expected a number",
                                                "expected a number or " + " or ".join(words), 1)
        problems.items[-1] = (path, message + hint)
    return number


@functools.cache
def _hints(cls) -> dict:
    """``cls``'s resolved field types, once per class: ``typing.get_type_hints`` evaluates every
    annotation string again on each call, and was most of a profile's load time."""
    return typing.get_type_hints(cls)


def build(cls, data: dict, path: str, problems: Problems):
    """Build dataclass ``cls`` from ``data``; every problem goes to ``problems``.

    Missing fields without a default are problems; unknown keys are problems with a
    did-you-mean. On problems the returned object may hold ``None`` in the broken fields: callers
    must raise before using it.
    """
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in fields:
            _unknown_key(key, fields, path, problems)
    kwargs = {}
    for name, f in fields.items():
        fpath = _join(path, name)
        if name in data and _number_or_word(hints[name]):
            kwargs[name] = _number_or_word_value(data[name], fpath, problems, f.metadata)
        elif name in data:
            kwargs[name] = _convert(hints[name], data[name], fpath, problems,
                                    f.metadata.get("choices"), f.metadata.get("bounds"))
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
    hints = _hints(cls)
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
        if f.metadata.get("bounds"):
            if typing.get_origin(tp) is list:
                name = "a list of " + ("integers" if typing.get_args(tp)[0] is int else "numbers")
            name += f" in {range_text(f.metadata['bounds'])}"
        if _number_or_word(hints[f.name]):
            bounds = f.metadata.get("bounds")
            name = ("a number" + (f" in {range_text(bounds)}" if bounds else "") + " or "
                    + " or ".join(str(c) for c in choices))
        yield path, name, default, f.metadata.get("doc", "")
