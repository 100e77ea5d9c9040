"""The one way hpctrain reads a file whose contents it cannot vouch for: a profile or job YAML,
a kernel table, a tokenizer or a data sidecar a user names, and every run-folder file.

Anything can be at such a path: a FIFO (a plain ``open`` blocks forever), a link to
``/dev/zero`` (a plain ``read`` never ends), a socket, a folder, a file of gigabytes, JSON
nested 200,000 deep. So every such read goes through these few functions:

* :func:`open_regular`: opened with ``O_NONBLOCK`` and checked with ``fstat`` on the open
  descriptor, so anything but a regular file is refused before a byte is read. Files a user
  names follow symbolic links (a tokenizer in a Hugging Face cache is a link into ``blobs/``);
  run-folder files do not (``O_NOFOLLOW``: a link left in a run folder is refused, wherever it
  points).
* :func:`read_fd` / :func:`read_file`: at most a bounded number of bytes.
* :func:`json_object`: JSON text that must hold one object (deep nesting included), parsed
  by :func:`loads`, which refuses an object giving a key twice.

What is wrong is a :class:`Refused` carrying a short reason (``is a FIFO, not a regular
file``, ``cannot be read (Permission denied)``); each caller says it in its own words (a config
error, a damaged run file, a data file with its fix), but what is accepted is decided here,
once.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from pathlib import Path
from typing import Any, Iterator

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
CHUNK = 1 << 20         # bytes asked of one pread


class Refused(Exception):
    """A file that exists and may not be read as asked. ``why`` reads after the path (``is a
    FIFO, not a regular file``); ``kind`` is what the path is when it is not a regular file
    (``a FIFO``, ``a folder``, ``a symbolic link``), else None."""

    def __init__(self, why: str, kind: str | None = None) -> None:
        super().__init__(why)
        self.why = why
        self.kind = kind


class TooBig(Refused):
    """A regular file over its bound."""


class NotText(Refused):
    """Bytes that are not UTF-8 text."""


def show(text: Path | str, width: int = 300) -> str:
    """A path, a name or a value read from a file, as a message or a listing prints it: as is
    when it is one line of printable text; quoted with every character a terminal would act on
    escaped (a line feed as ``\\n``, an escape code as ``\\x1b``) when it is not; and cut in
    the middle past ``width`` characters, so that both ends (a path's folder and its run id)
    show. The one printable form of text hpctrain did not write itself: run folder names found
    on disk, sweep values and labels from ``run.yaml``, paths in errors. Reads at most
    ``2 * width`` characters of ``text``, however long it is."""
    text = str(text)
    plain = text.isprintable() if len(text) <= 2 * width else \
        (text[:width] + text[-width:]).isprintable()
    if plain and len(text) <= width:
        return text
    head = (width - 3) * 2 // 3
    tail = width - 3 - head
    if plain:
        return f"{text[:head]}...{text[len(text) - tail:]}"
    quoted = repr(text) if len(text) <= width else None
    if quoted is not None and len(quoted) <= width:
        return quoted
    return f"{repr(text[:width])[:head]}...{repr(text[-width:])[-tail:]}"


def printable(text: str, keep: str = "\n\t") -> str:
    """Text read from a file and printed as a block (a log's lines, ``status``' lines, the
    preflight table): every character a terminal would act on written as ``repr`` writes it
    (an escape code as ``\\x1b``, a bell as ``\\x07``, a bidirectional override as
    ``\\u202e``, a carriage return as ``\\r``), except the line feeds and tabs that lay the
    block out; nothing quoted, nothing cut (a log line is content, shown whole, where
    :func:`show` quotes and cuts a name). Printable text is returned as it is, at the cost of
    one ``isprintable`` a line. ``keep``: the layout characters left as they are (none, for
    text that must stay on one line)."""
    if text.isprintable():
        return text
    table = {}
    for c in set(text):
        if not c.isprintable() and c not in keep:
            table[ord(c)] = repr(c)[1:-1]
    return text.translate(table) if table else text


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISLNK, "a symbolic link"))


def kind_of(mode: int) -> str:
    """What a path that is not a regular file is, from its ``stat`` mode (``lstat``'s for the
    writers, which look at a link itself)."""
    return next((name for test, name in _KINDS if test(mode)), "a special file")


# what open(2) says when the path is a link it may not follow, or a link loop
_LINK_ERRNOS = frozenset({errno.ELOOP})
# what open(2) says for a UNIX socket, or a device file whose driver is missing
_NO_FILE_ERRNOS = frozenset({errno.ENXIO})


def resolve(path: Path | str) -> Path:
    """``path`` made absolute with its symbolic links followed (``Path.resolve``, not strict:
    a tail that does not exist yet stays as named); :class:`Refused` when it cannot be. Python
    3.11 raises RuntimeError on a symlink loop (an "internal error" wherever it was not
    caught) and later Pythons leave the loop in place for the first open to trip on: both are
    "is behind a symlink loop" here, the words :func:`open_regular` uses. The one way hpctrain
    resolves a path a user gave (a job's paths, a runs root, a run folder)."""
    try:
        resolved = Path(path).resolve()
    except RuntimeError:
        raise Refused("is behind a symlink loop") from None
    except OSError as e:
        if e.errno in _LINK_ERRNOS:
            raise Refused("is behind a symlink loop") from None
        raise Refused(f"cannot be resolved ({e.strerror})") from None
    try:
        os.stat(resolved)
    except OSError as e:
        if e.errno in _LINK_ERRNOS:
            raise Refused("is behind a symlink loop") from None
    except ValueError:        # a NUL byte: the callers' text checks name it
        pass
    return resolved


@contextlib.contextmanager
def open_regular(path: Path | str, *, follow_links: bool) -> Iterator[int | None]:
    """The descriptor of ``path`` opened for reading (blocking again once it is known to be a
    regular file), or None when it does not exist; :class:`Refused` for anything else."""
    flags = _FLAGS if follow_links else _FLAGS | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        yield None
        return
    except ValueError:                    # a NUL in the name (a path a damaged record gave)
        raise Refused("has a NUL byte in its name; no file can be named so") from None
    except OSError as e:
        if e.errno in _LINK_ERRNOS:
            kind = "behind a symlink loop" if follow_links or not os.path.islink(path) \
                else "a symbolic link"
            raise Refused(f"is {kind}", kind) from None
        if e.errno in _NO_FILE_ERRNOS:
            raise Refused("is a socket or a device without a driver, not a regular file",
                          "a socket") from None
        raise Refused(f"cannot be read ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = kind_of(st.st_mode)
            raise Refused(f"is {kind}, not a regular file", kind)
        os.set_blocking(fd, True)
        yield fd
    finally:
        os.close(fd)


def read_fd(fd: int, limit: int, offset: int = 0) -> bytes:
    """At most ``limit + 1`` bytes from ``offset``: one byte more than allowed tells the caller
    the file is over its bound without reading the rest."""
    chunks, total = [], 0
    try:
        while total <= limit:
            block = os.pread(fd, min(CHUNK, limit + 1 - total), offset + total)
            if not block:
                break
            chunks.append(block)
            total += len(block)
    except OSError as e:
        raise Refused(f"cannot be read ({e.strerror})") from None
    return b"".join(chunks)


def read_file(path: Path | str, limit: int, *, follow_links: bool) -> bytes | None:
    """The whole regular file at ``path`` (None when it does not exist); :class:`Refused` when
    it is not a regular file, cannot be read, or holds more than ``limit`` bytes."""
    with open_regular(path, follow_links=follow_links) as fd:
        if fd is None:
            return None
        if os.fstat(fd).st_size > limit:     # refused before a byte is read
            raise TooBig(f"is over {limit:,} bytes")
        data = read_fd(fd, limit)
    if len(data) > limit:                    # grew since the fstat
        raise TooBig(f"is over {limit:,} bytes")
    return data


def decode_utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise NotText(f"is not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                      f"{e.start})") from None


def json_kind(value: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null", dict: "object"}.get(type(value), type(value).__name__)


class DuplicateKey(ValueError):
    """A JSON object that gives one key twice. ``json`` keeps the last value silently, so two
    readers (or a person and hpctrain) could read one record two ways: it is refused instead."""

    def __init__(self, key: str) -> None:
        shown = repr(key)
        self.key = key
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        super().__init__(f"an object gives the key {shown} twice")


def _object(pairs: list) -> dict:
    """``object_pairs_hook``: the object, or DuplicateKey when a key is given twice."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_object)


def loads(data: str | bytes) -> Any:
    """``data`` parsed as JSON, as ``json.loads`` parses it (bytes in any JSON encoding,
    surrogates passed) except that an object giving a key twice is refused
    (:class:`DuplicateKey`, a ``ValueError``). The one place JSON from a file is parsed:
    :func:`json_object` and the run-folder reader's JSONL lines."""
    if isinstance(data, (bytes, bytearray)):
        data = bytes(data).decode(json.detect_encoding(data), "surrogatepass")
    elif data.startswith("\ufeff"):
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", data, 0)
    return _DECODER.decode(data)


def json_object(text: str) -> dict:
    """``text`` parsed as JSON holding one object; :class:`Refused` otherwise (nesting past
    Python's recursion limit and a key given twice included)."""
    try:
        data = loads(text)
    except RecursionError:
        raise Refused("is JSON nested too deeply to read") from None
    except DuplicateKey as e:
        raise Refused(f"is not valid JSON: {e}; which value is meant cannot be told") from None
    except ValueError as e:
        raise Refused(f"is not JSON ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(data, dict):
        raise Refused(f"holds a JSON {json_kind(data)}, expected an object")
    return data
