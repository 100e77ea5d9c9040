"""Read and write YAML documents with errors a user can act on.

A YAML syntax error becomes one ConfigError line with the file, line and column; a document
that is not a mapping is refused by name. Only a regular file of at most ``MAX_CONFIG_BYTES``
of UTF-8 text is read: a FIFO, a device (``/dev/zero``), a huge or binary file, or a document
nested thousands deep is refused with a one-line error, never a hang, a MemoryError or a
traceback. Writing is atomic (temporary file + rename) so a run
folder never holds half a file.
"""

from __future__ import annotations

import copy
import math
import os
import re
import threading
from pathlib import Path
from typing import Any

import yaml

from .. import file_door
from ..errors import ConfigError, UsageError
from ..outputs import write_atomic  # noqa: F401 (the write door; run-folder writers call it here)


MAX_CONFIG_BYTES = 1 << 20   # profiles and jobs are a few KB; 1 MiB leaves room for comments


def read_text_file(path: str | os.PathLike, what: str = "file",
                   limit: int = MAX_CONFIG_BYTES, kind: str = "YAML") -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes, links followed; UsageError
    otherwise. Read through :mod:`hpctrain.file_door`: opened non-blocking (a FIFO with no
    writer would block a plain open forever) and checked with fstat on the open descriptor
    before a byte is read."""
    p = Path(path)
    head = f"{what} {_show(p)}"
    try:
        raw = file_door.read_file(p, limit, follow_links=True)
        if raw is None:
            raise UsageError(f"{head} does not exist")
        return file_door.decode_utf8(raw)
    except file_door.Refused as e:
        if e.kind == "a folder":
            raise UsageError(f"{head} is a folder, expected a {kind} file") from None
        if e.kind is not None:
            raise UsageError(f"{head} {e.why}; give the path of a {kind} file") from None
        if isinstance(e, file_door.TooBig):
            raise UsageError(f"{head} is over {limit:,} bytes; a {kind} {what} may have at "
                             f"most {limit:,}") from None
        if isinstance(e, file_door.NotText):
            raise UsageError(f"{head} {e.why}; save it as UTF-8") from None
        raise UsageError(f"{head} {e.why}") from None


def _show(p: Path) -> str:
    return file_door.show(p, 200)


def read_mapping(path: str | os.PathLike, what: str = "file") -> dict:
    """Load a YAML file that must hold a mapping at the top."""
    p = Path(path)
    return parse_mapping(read_text_file(p, what), _show(p))


def parse_mapping(text: str, source: str) -> dict:
    """``text`` as a mapping, read by the one strict loader every YAML file of hpctrain goes
    through; one ConfigError line naming the line otherwise."""
    data = parse(text, source)
    if data is None:
        raise ConfigError(source, [("", "the file is empty; expected a mapping of settings")])
    if not isinstance(data, dict):
        raise ConfigError(source, [("", f"expected a mapping at the top, got a {type(data).__name__}")])
    return data


# Documents already read by this process, by their text: a command reads the same profile and
# job several times (loading, resolving, checking), the Python API and the test suite hundreds
# of times, and the strict loader is pure Python (about 30 ms for a profile). Each caller gets a
# copy of its own to change; only texts that read without error, and small ones, are kept.
_PARSED: dict[str, Any] = {}
_PARSED_KEEP = 64
_PARSED_MAX_CHARS = 64 * 1024
_parsed_lock = threading.Lock()


def parse(text: str, source: str) -> Any:
    """Any YAML document (a mapping, a list or a scalar such as a ``--sweep`` value), read the
    strict way: duplicate keys refused, YAML 1.2 core types only, numbers keeping their text."""
    with _parsed_lock:
        known = _PARSED.get(text, _PARSED)
    if known is not _PARSED:
        return copy.deepcopy(known)
    data = _parse(text, source)
    if len(text) <= _PARSED_MAX_CHARS:
        kept = copy.deepcopy(data)
        with _parsed_lock:
            if len(_PARSED) >= _PARSED_KEEP:
                _PARSED.pop(next(iter(_PARSED)))   # the oldest
            _PARSED[text] = kept
    return data


def _parse(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=StrictLoader)
    except yaml.reader.ReaderError as e:   # a character YAML does not take (NUL, BEL, U+FFFE)
        # PyYAML's own text has no line ("at unacceptable character #x0000: ..."): say where
        at = min(e.position, len(text))
        line, column = text.count("\n", 0, at) + 1, at - (text.rfind("\n", 0, at) + 1) + 1
        char = e.character if isinstance(e.character, int) else ord(e.character)
        raise ConfigError(source, [("", f"invalid YAML at line {line}, column {column}: the "
                                        f"character U+{char:04X} is not allowed in YAML; "
                                        "remove it")]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(source, [("", f"invalid YAML at {where}{problem}")]) from None
    except RecursionError:
        raise ConfigError(source, [("", "the YAML is nested too deeply to be a profile or job "
                                        "(thousands of levels of brackets or indentation)")]) from None
    except ValueError as e:  # an integer literal of thousands of digits (int_max_str_digits)
        raise ConfigError(source, [("", f"invalid YAML: {str(e).splitlines()[0][:120]}")]) from None


# ---------------------------------------------------------------------------------------------
# The strict loader.
#
# PyYAML implements YAML 1.1, whose implicit types rewrite what people write as text: 0x10 is
# 16, 010 is 8, 1:30 is 90 (base 60), yes/on are true, 2024-01-01 a date, and a later duplicate
# key silently replaces the earlier one. The loader below keeps PyYAML's parser (the pure-Python
# one on purpose: nesting thousands deep raises RecursionError there, while libyaml's
# CSafeLoader recurses in C and crashes the process) and replaces the rest:
#
# * implicit types are YAML 1.2's core schema and nothing else (null, true/false, decimal,
#   0o and 0x integers, decimal floats, .inf, .nan); every other plain scalar is a string;
# * a number remembers the text it was written as (``TextInt``/``TextFloat``.source), so a field
#   the schema types as a string gets exactly what was written (``name: 0x10`` names the run
#   "0x10", ``env: {V: 2.20}`` exports "2.20");
# * only the core tags construct anything: !!timestamp, !!binary, !!set, !!omap, merge keys
#   (``<<``) and Python tags are refused as unknown tags;
# * a key given twice in one mapping is an error naming both lines;
# * aliases may not expand a document past ``MAX_NODES`` nodes (a "billion laughs" document).
# ---------------------------------------------------------------------------------------------

MAX_NODES = 100_000   # nodes of a document, alias expansions counted: a job has a few hundred


class _KeepsText:
    """A number read from YAML, with the text it was written as (``source``)."""

    source: str
    _plain: type

    def __new__(cls, value, source: str):
        obj = super().__new__(cls, value)
        obj.source = source
        return obj

    def __reduce__(self):   # pickle and deepcopy keep the text (a plain number has no slot for it)
        return (type(self), (self._plain(self), self.source))


class TextInt(_KeepsText, int):
    """An integer read from YAML, with the text it was written as."""

    _plain = int


class TextFloat(_KeepsText, float):
    """A float read from YAML, with the text it was written as."""

    _plain = float


def source_text(value: Any) -> str | None:
    """The text a number was written as in YAML, or None for anything else."""
    return getattr(value, "source", None) if isinstance(value, (TextInt, TextFloat)) else None


_CORE = [
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", list("~nN") + [""]),
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
    ("tag:yaml.org,2002:float",
     r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
     r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$", list("-+.0123456789")),
]


class DuplicateKeyError(yaml.MarkedYAMLError):
    pass


class StrictLoader(yaml.SafeLoader):
    """YAML 1.2 core schema, numbers with their text, no duplicate keys, bounded aliases."""

    yaml_implicit_resolvers: dict = {}
    yaml_constructors: dict = {}
    yaml_multi_constructors: dict = {}

    def __init__(self, stream):
        super().__init__(stream)
        self._nodes = 0

    # -- bounded size, aliases included ------------------------------------------------------
    def compose_node(self, parent, index):
        alias = self.check_event(yaml.AliasEvent)
        node = super().compose_node(parent, index)
        self._nodes += _node_count(node) if alias else 1
        if self._nodes > MAX_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"the document expands to over {MAX_NODES:,} values (through "
                            "aliases?); a profile or job has a few hundred", node.start_mark)
        return node

    # -- duplicate keys ----------------------------------------------------------------------
    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(_key_identity(key), key_node)
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping", node.start_mark,
                        "a key must be a single value, not a list or mapping",
                        key_node.start_mark) from None
                if first is not key_node:
                    lines = f"line {first.start_mark.line + 1} and line {key_node.start_mark.line + 1}"
                    same = (f"the key {_short_key(key)} is given twice ({lines})"
                            if first.value == key_node.value else
                            f"the keys {first.value!r} and {key_node.value!r} are the same key "
                            f"({lines})")
                    raise DuplicateKeyError(None, None, f"{same}; keep one", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    # -- core types with their text ----------------------------------------------------------
    def construct_text_int(self, node):
        text = self.construct_scalar(node)
        if text.startswith("0o"):
            value = int(text[2:], 8)
        elif text.startswith("0x"):
            value = int(text[2:], 16)
        else:
            value = int(text, 10)
        return TextInt(value, text)

    def construct_text_float(self, node):
        text = self.construct_scalar(node)
        low = text.lower()
        if low.endswith(".inf"):
            value = -math.inf if low.startswith("-") else math.inf
        elif low == ".nan":
            value = math.nan
        else:
            value = float(text)
        return TextFloat(value, text)

    def construct_core_bool(self, node):
        return self.construct_scalar(node).lower() == "true"


def _node_count(node) -> int:
    """Nodes under ``node`` (itself included), following what aliases share."""
    count, stack = 0, [node]
    while stack:
        n = stack.pop()
        count += 1
        if count > MAX_NODES:
            return count
        if isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
        elif isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                stack.extend((k, v))
    return count


def _key_identity(key: Any):
    """What makes two keys one key of the mapping that is built: a string is never a number,
    while numbers and booleans are one key when Python holds them equal (1, 0x1, 1.0 and true
    would otherwise collapse into one entry silently)."""
    return ("text", key) if isinstance(key, str) else ("value", key)


def _short_key(key: Any) -> str:
    text = repr(key if not isinstance(key, (TextInt, TextFloat)) else key.source)
    return text if len(text) <= 60 else text[:50] + "..."


for _tag, _pattern, _first in _CORE:
    StrictLoader.add_implicit_resolver(_tag, re.compile(_pattern), _first)
StrictLoader.add_constructor("tag:yaml.org,2002:null", yaml.SafeLoader.construct_yaml_null)
StrictLoader.add_constructor("tag:yaml.org,2002:bool", StrictLoader.construct_core_bool)
StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_text_int)
StrictLoader.add_constructor("tag:yaml.org,2002:float", StrictLoader.construct_text_float)
StrictLoader.add_constructor("tag:yaml.org,2002:str", yaml.SafeLoader.construct_yaml_str)
StrictLoader.add_constructor("tag:yaml.org,2002:seq", yaml.SafeLoader.construct_yaml_seq)
StrictLoader.add_constructor("tag:yaml.org,2002:map", yaml.SafeLoader.construct_yaml_map)
StrictLoader.add_constructor(None, yaml.SafeLoader.construct_undefined)


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, quoting every string that YAML 1.1 *or* the 1.2 core schema would
    read as something else (``1e3``, ``0o17``), and writing ``TextInt``/``TextFloat`` as the
    numbers they are, so what is written loads back unchanged with ``StrictLoader`` (and with
    any other YAML reader)."""


for _tag, _pattern, _first in _CORE:
    _Dumper.add_implicit_resolver(_tag, re.compile(_pattern), _first)
# PyYAML's own safe dumper writes them as the numbers they are too: a mapping hpctrain read
# (a profile, a job) stays something ``yaml.safe_dump`` can write, as it was before numbers
# kept their text.
for _dumper in (_Dumper, yaml.SafeDumper):
    _dumper.add_representer(TextInt, lambda d, v: d.represent_int(int(v)))
    _dumper.add_representer(TextFloat, lambda d, v: d.represent_float(float(v)))


def dump(data: Any) -> str:
    """``data`` as YAML that ``parse`` reads back equal to ``data``: checked on every write, so
    what submit puts into a run folder is what the ranks and ``resume`` read (a value that would
    not survive the trip is refused here, before the file exists)."""
    # allow_unicode stays off: PyYAML would then write U+0085 or U+2028 raw inside a scalar,
    # where they read back as line breaks; escaped ("\x85") every character reads back as is.
    text = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
    bad = _not_utf8(data)
    if bad:
        raise UsageError(f"{bad[0] or 'a value'}: {_show_value(bad[1])} is not UTF-8 text (a file "
                         "or folder name whose bytes are not UTF-8?); rename it to UTF-8")
    back = parse(text, "the document being written") if text.strip() else None
    if not _same(back, data):
        raise UsageError("a value would not read back as written in YAML: "
                         f"{_first_difference(data, back)}")
    return text


def _not_utf8(data: Any, path: str = ""):
    """(path, string) of the first string (key or value) that UTF-8 cannot encode, or None."""
    if isinstance(data, dict):
        items = [(f"{path}.{k}" if path else str(k), k, v) for k, v in data.items()]
        for where, k, v in items:
            found = (_not_utf8(k, where) if isinstance(k, str) else None) or _not_utf8(v, where)
            if found:
                return found
    elif isinstance(data, (list, tuple)):
        for i, v in enumerate(data):
            found = _not_utf8(v, f"{path}[{i}]")
            if found:
                return found
    elif isinstance(data, str):
        try:
            data.encode("utf-8")
        except UnicodeEncodeError:
            return path, data
    return None


def _same(a: Any, b: Any) -> bool:
    """Equal as YAML values: same structure, same kinds (a string is never a number, true is
    never 1), equal values (NaN equal to NaN)."""
    if isinstance(a, dict) or isinstance(b, dict):
        return (isinstance(a, dict) and isinstance(b, dict) and list(a) == list(b)
                and all(_same(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(_same(x, y) for x, y in zip(a, b)))
    if isinstance(a, bool) != isinstance(b, bool) or isinstance(a, str) != isinstance(b, str):
        return False
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a:
            if k not in b or not _same(a[k], b[k]):
                return _first_difference(a[k], b.get(k), f"{path}.{k}" if path else str(k))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b)):
            if not _same(x, y):
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path or 'the document'}: {_show_value(a)} would read back as {_show_value(b)}"


def _show_value(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:70] + "..."
