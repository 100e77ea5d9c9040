"""The file primitives of run folders: locks and JSONL records.

JSONL files are appended with one ``write`` under an exclusive lock, so concurrent writers
(the batch shell, rank 0, a user's ``hpctrain cancel``) never interleave partial lines; a line
torn by a writer killed mid-write is skipped on reading and closed before the next append.
Read-modify-writes of a run's files hold ``folder_lock`` (``flock``), reentrant per thread and
never inherited by a forked child. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import threading
from pathlib import Path
from typing import Iterator

from ..errors import UsageError


class RunFileError(UsageError):
    """A run folder's file exists but cannot be read or written (damaged, no permission)."""


# Run locks held by this process: (thread, run folder) -> [fd, depth, pid]. Reentrant per thread;
# a forked child holds none (its inherited descriptors are closed: they would keep the
# parent's lock alive for as long as the child lives).
_held: dict[tuple[int, str], list] = {}


def _forget_locks_in_child() -> None:
    for fd, *_ in _held.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


os.register_at_fork(after_in_child=_forget_locks_in_child)


@contextlib.contextmanager
def folder_lock(lock_file: Path, what: str) -> Iterator[None]:
    """Hold ``flock`` on ``lock_file`` (created 0600). Reentrant within a thread; other threads
    and processes wait."""
    key = (threading.get_ident(), str(lock_file))
    entry = _held.get(key)
    if entry is not None:
        entry[1] += 1
        try:
            yield
        finally:
            entry[1] -= 1
        return
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise RunFileError(f"cannot lock {what} ({lock_file.name}): {e.strerror}") from None
    entry = [fd, 1, os.getpid()]
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _held[key] = entry
        yield
    finally:
        if entry[2] == os.getpid():       # a forked child already closed its copy
            if _held.get(key) is entry:
                del _held[key]
            os.close(fd)                  # releases the lock


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")


def append_jsonl(path: Path, record: dict) -> None:
    """Append one record as one line (one ``write`` under ``flock``, fsynced). A line torn by a
    writer killed mid-write is closed first, so it never swallows the next record."""
    line = (json.dumps(record, sort_keys=False) + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as e:
        raise RunFileError(f"cannot append to {path}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and _last_byte(path, size) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
        os.fsync(fd)
    except OSError as e:
        raise RunFileError(f"cannot append to {path}: {e.strerror}") from None
    finally:
        os.close(fd)   # releases the lock


def _last_byte(path: Path, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(size - 1)
        return f.read(1)


def read_jsonl(path: Path) -> list[dict]:
    """Every complete record. A line that does not parse (torn by a writer killed mid-write)
    is skipped; a file that cannot be read at all is an error naming it."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as e:
        raise RunFileError(f"cannot read {path}: {e.strerror}; fix its permissions or move the "
                           f"run folder away") from None
    out = []
    for line in data.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def record_kind(record: dict) -> str:
    """A metrics record's kind: "train" (also the records written before kinds existed),
    "validation" or "test"."""
    return str(record.get("kind", "train"))


def read_last_jsonl(path: Path, max_bytes: int = 1 << 16, accept=None,
                    give_up_bytes: int = 1 << 24) -> dict | None:
    """The last complete record of a JSONL file (the last one ``accept(record)`` takes, when
    given), reading only its end (metrics files grow): the tail read doubles until a record
    is found, up to ``give_up_bytes``."""
    while True:
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                tail = f.read().decode("utf-8", errors="replace")
        except OSError:
            return None
        for line in reversed(tail.splitlines()):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line, or the first line cut by the seek
            if isinstance(record, dict) and (accept is None or accept(record)):
                return record
        if max_bytes >= size or max_bytes >= give_up_bytes:
            return None
        max_bytes *= 4
    for line in reversed(tail.splitlines()):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line, or the first line cut by the seek
        if isinstance(record, dict):
            return record
    return None
