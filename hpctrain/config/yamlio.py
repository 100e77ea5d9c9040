"""Read and write YAML documents with errors a user can act on.

A YAML syntax error becomes one ConfigError line with the file, line and column; a document
that is not a mapping is refused by name. Only a regular file of at most ``MAX_CONFIG_BYTES``
of UTF-8 text is read: a FIFO, a device (``/dev/zero``), a huge or binary file, or a document
nested thousands deep is refused with a one-line error, never a hang, a MemoryError or a
traceback. Writing is atomic (temporary file + rename) so a run
folder never holds half a file.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError, UsageError


MAX_CONFIG_BYTES = 1 << 20   # profiles and jobs are a few KB; 1 MiB leaves room for comments


def read_text_file(path: str | os.PathLike, what: str = "file",
                   limit: int = MAX_CONFIG_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes; UsageError otherwise.

    The file is opened non-blocking (a FIFO with no writer would block a plain open forever)
    and checked with fstat on the open descriptor before a byte is read."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UsageError(f"{what} {_show(p)} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"{what} {_show(p)} is a folder, expected a YAML file") from None
    except OSError as e:
        raise UsageError(f"cannot read {what} {_show(p)}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{what} {_show(p)} is a folder, expected a YAML file")
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{what} {_show(p)} is not a regular file ({_kind(st.st_mode)}); "
                             "give the path of a YAML file")
        if st.st_size > limit:
            raise UsageError(f"{what} {_show(p)} is {st.st_size:,} bytes; a YAML {what} may have "
                             f"at most {limit:,}")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise UsageError(f"cannot read {what} {_show(p)}: {e.strerror}") from None
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise UsageError(f"{what} {_show(p)} is over {limit:,} bytes; a YAML {what} may have at "
                         f"most {limit:,}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{what} {_show(p)} is not UTF-8 text (byte 0x{raw[e.start]:02x} at "
                         f"offset {e.start}); save it as UTF-8") from None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def _show(p: Path) -> str:
    text = str(p)
    return text if len(text) <= 200 and text.isprintable() else repr(text[:200])


def read_mapping(path: str | os.PathLike, what: str = "file") -> dict:
    """Load a YAML file that must hold a mapping at the top."""
    p = Path(path)
    return parse_mapping(read_text_file(p, what), _show(p))


def parse_mapping(text: str, source: str) -> dict:
    try:
        data = yaml.load(text, Loader=_Loader)
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
    if data is None:
        raise ConfigError(source, [("", "the file is empty; expected a mapping of settings")])
    if not isinstance(data, dict):
        raise ConfigError(source, [("", f"expected a mapping at the top, got a {type(data).__name__}")])
    return data


# PyYAML's pure-Python loader on purpose: nesting thousands deep raises RecursionError there,
# while libyaml's CSafeLoader recurses in C and crashes the process (half a million "[" fit in
# a file of MAX_CONFIG_BYTES).
_Loader = yaml.SafeLoader


def dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old content or the new, never a part, even
    after a crash: temporary file, fsync, rename, fsync of the folder. The file gets the mode
    an ordinary write would (the umask's), not mkstemp's 0600."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:
        dfd = os.open(p.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
