"""Read and write YAML documents with errors a user can act on.

A YAML syntax error becomes one ConfigError line with the file, line and column; a document
that is not a mapping is refused by name. Writing is atomic (temporary file + rename) so a run
folder never holds half a file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError, UsageError


def read_mapping(path: str | os.PathLike, what: str = "file") -> dict:
    """Load a YAML file that must hold a mapping at the top."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise UsageError(f"{what} {p} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"{what} {p} is a folder, expected a YAML file") from None
    except OSError as e:
        raise UsageError(f"cannot read {what} {p}: {e.strerror}") from None
    return parse_mapping(text, str(p))


def parse_mapping(text: str, source: str) -> dict:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(source, [("", f"invalid YAML at {where}{problem}")]) from None
    if data is None:
        raise ConfigError(source, [("", "the file is empty; expected a mapping of settings")])
    if not isinstance(data, dict):
        raise ConfigError(source, [("", f"expected a mapping at the top, got a {type(data).__name__}")])
    return data


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
