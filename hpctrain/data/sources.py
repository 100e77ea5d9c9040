"""Documents from text and JSONL files (optionally gzipped), with the input position for progress.

* ``.txt`` / ``.txt.gz``: a document is a paragraph, i.e. lines up to a blank line; a file
  without blank lines is one document. Very long paragraphs come in pieces (split at line
  ends) that belong to the same document, so memory stays bounded on any input.
* ``.jsonl`` / ``.jsonl.gz`` (also ``.json``): one JSON object per line, the text under
  ``json_key`` (Megatron-LM's ``--json-keys text``).

Bad input stops with one line naming the file, the line and the fix.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .. import file_door
from ..errors import UsageError
from ..config.loader import not_utf8

PIECE_CHARS = 1 << 20  # a paragraph (or a single line) longer than this arrives in pieces
# A JSONL record must be parsed whole; one longer than this is refused with the limit, so a
# single multi-GiB line cannot exhaust memory.
MAX_JSON_LINE_CHARS = 64 << 20
SUFFIXES = (".txt", ".txt.gz", ".jsonl", ".jsonl.gz", ".json", ".json.gz")


@dataclass
class Piece:
    """Text of one document (``last`` False: more of the same document follows)."""

    text: str
    last: bool


def kind_of(path: Path) -> str:
    name = path.name.lower()
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return "jsonl" if ".json" in suffix else "txt"
    raise UsageError(f"{path}: unknown input type; give .txt, .txt.gz, .jsonl or .jsonl.gz files")


def input_problem(path: Path) -> str | None:
    """Why ``path`` cannot be an input file (it does not exist, is not a file, is of no type
    this reads), or None. Reads nothing but its metadata."""
    if not path.is_file():
        return f"input file {path} does not exist" if not path.exists() \
            else f"input {path} is not a file"
    try:
        kind_of(path)
    except UsageError as e:
        return str(e)
    return None


def check_inputs(files: list[str | os.PathLike]) -> list[Path]:
    if not files:
        raise UsageError("no input files; give .txt/.jsonl files (optionally .gz) to prepare")
    paths = []
    for f in files:
        p = Path(f).expanduser()
        why = input_problem(p)
        if why:
            raise UsageError(why)
        paths.append(p)
    return paths


def source_problems(field: str, prefix: str, sources: list) -> list[str]:
    """One line per file of a corpus's ``prepare_from`` (``field`` is the corpus's ``...path``
    field, as ``splits.all_prefixes`` names it) that cannot be prepared from: each names its
    field (``data.prepare_from[0]``, ``data.blend[1].prepare_from[0]``) and the fix."""
    base = field[:-len(".path")] if field.endswith(".path") else field
    out = []
    for k, f in enumerate(sources):
        why = input_problem(Path(f).expanduser())
        if why:
            out.append(f"{base}.prepare_from[{k}]: {why}; fix the path (a relative one is "
                       f"relative to the job file's folder), or prepare {prefix} with "
                       f"`hpctrain data prepare FILES --output {prefix}`")
    return out


class _Counting:
    """The raw file under the decompressor: its position is the progress."""

    def __init__(self, path: Path) -> None:
        self.raw = open(path, "rb")

    def open_text(self, path: Path):
        stream = gzip.GzipFile(fileobj=self.raw) if path.name.lower().endswith(".gz") else self.raw
        # utf-8-sig: a byte order mark a Windows editor put first is not text (3 tokens)
        return io.TextIOWrapper(stream, encoding="utf-8-sig", errors="strict", newline=None)

    def position(self) -> int:
        try:
            return self.raw.tell()
        except (OSError, ValueError):
            return 0


def read_pieces(path: Path, json_key: str = "text",
                on_progress=None) -> Iterator[Piece]:
    """Yield the pieces of every document in ``path``; ``on_progress(bytes_read)`` as it goes."""
    kind = kind_of(path)
    counter = _Counting(path)
    lineno = 0
    try:
        with counter.open_text(path) as text:
            if kind == "jsonl":
                while True:
                    line = text.readline(MAX_JSON_LINE_CHARS + 1)
                    if not line:
                        break
                    lineno += 1
                    if len(line) > MAX_JSON_LINE_CHARS:
                        raise UsageError(
                            f"{path}:{lineno}: a JSON line longer than {MAX_JSON_LINE_CHARS:,} "
                            "characters; hpctrain reads JSONL records of at most that size (split "
                            "the document, or give it as a plain .txt file, which is streamed)")
                    if not line.strip():
                        continue
                    yield Piece(_json_text(path, lineno, line, json_key), True)
                    if on_progress and lineno % 256 == 0:
                        on_progress(counter.position())
            else:
                yield from _paragraphs(text, counter, on_progress)
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text near line {lineno + 1} ({e.reason}); convert it "
                         f"with iconv first") from None
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as e:
        raise UsageError(f"{path}: cannot read it ({e}); is the .gz file complete?") from None
    finally:
        if on_progress:
            on_progress(counter.position())
        counter.raw.close()


# what a JSON \\u escape can give that is not a character: half of a UTF-16 surrogate pair
_SURROGATE = re.compile("[\ud800-\udfff]")


def _json_text(path: Path, lineno: int, line: str, key: str) -> str:
    """The text of one JSONL record: the one door every record goes through, so a line that is
    not JSON, JSON nested past Python's recursion limit, a number past Python's digit limit or
    text that is not characters (a lone surrogate escape) is one error naming the line."""
    try:
        record = file_door.loads(line)     # the one JSON parser: a key given twice is refused
    except file_door.DuplicateKey as e:
        raise UsageError(f"{path}:{lineno}: not valid JSON: {e}; which value is meant cannot "
                         f"be told (fix the record)") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}:{lineno}: not valid JSON ({e.msg}); JSONL needs one object per "
                         f"line") from None
    except RecursionError:
        raise UsageError(f"{path}:{lineno}: JSON nested too deeply to read; a JSONL record holds "
                         f"its text as a string, flatten the record") from None
    except ValueError as e:     # e.g. an integer of more digits than Python converts
        raise UsageError(f"{path}:{lineno}: not valid JSON ({str(e).splitlines()[0][:100]}); "
                         f"JSONL needs one object per line") from None
    if not isinstance(record, dict):
        raise UsageError(f"{path}:{lineno}: expected a JSON object, got a JSON "
                         f"{file_door.json_kind(record)}; JSONL needs one object per line")
    if key not in record:
        keys = ", ".join(_shown_key(k, quote=False) for k in sorted(record)[:8]) or "none"
        raise UsageError(f"{path}:{lineno}: no {_shown_key(key)} field (fields: {keys}); pick the "
                         f"text field with --json-key")
    value = record[key]
    if not isinstance(value, str):
        raise UsageError(f"{path}:{lineno}: field {_shown_key(key)} is a JSON "
                         f"{file_door.json_kind(value)}, expected text (a string)")
    bad = _SURROGATE.search(value)
    if bad:
        raise UsageError(f"{path}:{lineno}: field {_shown_key(key)} holds a lone surrogate escape "
                         f"(\\u{ord(bad.group()):04x} at character {bad.start()}), which is not a "
                         f"character; fix the escape (a character past U+FFFF is a pair, e.g. "
                         f"\\ud83d\\ude00) or drop the record")
    return value


def _shown_key(key: str, quote: bool = True) -> str:
    """A field's name for an error line: quoted (or not) when printable, else escaped."""
    plain = key.isprintable() and not not_utf8(key)
    text = (repr(key) if quote else key) if plain else ascii(key)
    return text if len(text) <= 40 else text[:37] + "..."


def _chunks(text) -> Iterator[tuple[str, bool]]:
    """Lines of ``text``, a line longer than PIECE_CHARS in parts of at most that many
    characters (memory stays bounded on a file that is one huge line); with each, whether it
    is a whole line (a part of a long line is never a blank line)."""
    at_line_start = True
    while True:
        chunk = text.readline(PIECE_CHARS)
        if not chunk:
            return
        ends_line = chunk.endswith("\n")
        yield chunk, at_line_start and ends_line
        at_line_start = ends_line


def _paragraphs(text, counter: _Counting, on_progress) -> Iterator[Piece]:
    buf: list[str] = []
    size = 0
    open_document = False  # a piece was yielded and its document has not ended yet
    for n, (line, whole) in enumerate(_chunks(text), 1):
        if on_progress and n % 4096 == 0:
            on_progress(counter.position())
        if whole and line.strip() == "":
            if buf or open_document:
                yield Piece("".join(buf), True)
                buf, size, open_document = [], 0, False
            continue
        buf.append(line)
        size += len(line)
        if size >= PIECE_CHARS:
            yield Piece("".join(buf), False)
            buf, size, open_document = [], 0, True
    if buf or open_document:
        yield Piece("".join(buf), True)


def total_input_bytes(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths)
