"""The one reader of run-folder files: regular files only, bounded, checked, never blocking.

A run folder is written by hpctrain, but anyone who can write it (a user repairing it by hand,
a disk that filled mid-write, a tool that left a FIFO or a symlink to ``/dev/zero`` behind) can
put anything there. Every file hpctrain reads from a run folder or a checkpoint folder (run.yaml,
the ledger, events, metrics, result and failure records, heartbeats, hang verdicts, rank logs,
``checkpoints/latest``, manifests) is read here, so one set of rules holds for all of them:

* the file is opened with ``O_NONBLOCK`` (a FIFO with no writer would block a plain ``open``
  forever) and ``O_NOFOLLOW`` (a symlink is refused, wherever it points), then checked with
  ``fstat`` on the open descriptor: a FIFO, device, socket or folder is refused before a byte
  is read;
* at most a bounded number of bytes is read (``hpctrain.limits``): a bigger file is refused, or
  only its end is read where the end is what is wanted (``tail``);
* text must be UTF-8 and JSON must parse and hold the type it should; what does not is a
  :class:`DamagedFile` naming the file, the line or field, and why.

A :class:`DamagedFile` is a ``RunFileError`` (a ``UsageError``): a command that needs the file
ends with one ``Error:`` line naming it; ``hpctrain runs`` shows the run as DAMAGED and lists
the others. Nothing is ever rewritten because it could not be read. A file that does not exist
is not damage: readers return their "missing" value (None or empty).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from pathlib import Path
from typing import Any, Callable, Iterator

from .. import limits
from ..errors import HpcTrainError
from .files import RunFileError

_FLAGS = (os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW
          | getattr(os, "O_CLOEXEC", 0))


class DamagedFile(RunFileError):
    """A run-folder file that exists but is not what hpctrain writes there."""

    def __init__(self, path: Path | str, why: str, message: str | None = None) -> None:
        self.path = Path(path)
        self.why = why
        super().__init__(message or f"cannot read {_show(self.path)}: {why}")


def _show(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 300 and text.isprintable() else repr(text[:300])


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


@contextlib.contextmanager
def open_regular(path: Path | str) -> Iterator[int | None]:
    """The descriptor of ``path`` opened for reading (blocking again once it is known to be a
    regular file), or None when it does not exist; DamagedFile for anything else. ``path``
    is made a Path only for an error (10,000 Path objects are a third of listing 10,000
    runs' kept rows)."""
    p = path
    try:
        fd = os.open(p, _FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        yield None
        return
    except OSError as e:
        if e.errno == errno.ELOOP:
            kind = "a symbolic link" if os.path.islink(p) else "behind a symlink loop"
            raise DamagedFile(p, f"is {kind}; hpctrain reads only regular files in a run "
                                 "folder (replace it with the file, or move the run folder "
                                 "away)") from None
        if e.errno == errno.ENXIO:        # a socket, or a FIFO opened for writing
            raise DamagedFile(p, "is not a regular file") from None
        raise DamagedFile(p, f"cannot be read ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DamagedFile(p, f"is {_kind(st.st_mode)}, not a regular file; hpctrain "
                                 "reads only regular files in a run folder")
        os.set_blocking(fd, True)
        yield fd
    finally:
        os.close(fd)


def _read_fd(fd: int, path: Path, limit: int, offset: int = 0) -> bytes:
    chunks, total = [], 0
    try:
        while total <= limit:
            block = os.pread(fd, min(1 << 20, limit + 1 - total), offset + total)
            if not block:
                break
            chunks.append(block)
            total += len(block)
    except OSError as e:
        raise DamagedFile(path, f"cannot be read ({e.strerror})") from None
    return b"".join(chunks)


def read_bytes(path: Path | str, limit: int = limits.RUN_RECORD_BYTES) -> bytes | None:
    """The whole file (None when missing); DamagedFile past ``limit`` bytes."""
    p = path
    with open_regular(p) as fd:
        if fd is None:
            return None
        data = _read_fd(fd, p, limit)
    if len(data) > limit:
        raise DamagedFile(p, f"is over {limit:,} bytes, more than hpctrain ever writes there "
                             f"(limits.{_limit_name(limit)})")
    return data


def _limit_name(limit: int) -> str:
    for name in ("RUN_RECORD_BYTES", "RUN_METRICS_BYTES", "RUN_LOG_BYTES", "RUN_SMALL_BYTES"):
        if getattr(limits, name) == limit:
            return name
    return f"{limit:,} bytes"


def tail_bytes(path: Path | str, max_bytes: int) -> tuple[bytes, int] | None:
    """The last ``max_bytes`` of the file and its size (None when missing): for files that grow
    (metrics, logs), where the end is what is wanted."""
    p = Path(path)
    with open_regular(p) as fd:
        if fd is None:
            return None
        size = os.fstat(fd).st_size
        start = max(0, size - max_bytes)
        return _read_fd(fd, p, max_bytes - 1, start)[:max_bytes], size


def read_from(path: Path | str, offset: int, limit: int) -> bytes | None:
    """At most ``limit`` bytes from ``offset`` (following a growing log); None when missing."""
    p = Path(path)
    with open_regular(p) as fd:
        if fd is None:
            return None
        return _read_fd(fd, p, limit - 1, offset)[:limit]


def decode(data: bytes, path: Path | str, *, strict: bool = True) -> str:
    """UTF-8 text; bad bytes are damage when ``strict`` (records), replaced otherwise (logs)."""
    if not strict:
        return data.decode("utf-8", errors="replace")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DamagedFile(path, f"is not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                                f"{e.start})") from None


def read_text(path: Path | str, limit: int = limits.RUN_RECORD_BYTES, *,
              strict: bool = True) -> str | None:
    data = read_bytes(path, limit)
    return None if data is None else decode(data, path, strict=strict)


def read_json(path: Path | str, limit: int = limits.RUN_SMALL_BYTES,
              check: Callable[[dict], str | None] | None = None) -> dict | None:
    """One JSON object (a result, a heartbeat, a manifest); None when missing. Not JSON, not an
    object, or refused by ``check`` (which returns what is wrong, naming the field): damage."""
    text = read_text(path, limit)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise DamagedFile(path, f"is not JSON ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(data, dict):
        raise DamagedFile(path, f"holds a JSON {type(data).__name__}, expected an object")
    problem = check(data) if check else None
    if problem:
        raise DamagedFile(path, problem)
    return data


def parse_jsonl(data: bytes, path: Path | str,
                check: Callable[[dict], str | None] | None = None) -> list[dict]:
    """The records of JSONL bytes. A line that is not JSON (torn by a writer killed
    mid-write, or cut by a tail read) is skipped; a record that parses but is not an object,
    or that ``check`` refuses (a field of the wrong type), is damage naming the line."""
    out = []
    for number, line in enumerate(data.split(b"\n"), 1):
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(record, dict):
            raise DamagedFile(path, f"line {number} is a JSON {type(record).__name__}, "
                                    "expected an object")
        problem = check(record) if check else None
        if problem:
            raise DamagedFile(path, f"line {number}: {problem}")
        out.append(record)
    return out


def read_jsonl(path: Path | str, limit: int = limits.RUN_RECORD_BYTES,
               check: Callable[[dict], str | None] | None = None) -> list[dict]:
    """Every complete record of a JSONL file ([] when missing)."""
    data = read_bytes(path, limit)
    return [] if data is None else parse_jsonl(data, path, check)


def read_last_jsonl(path: Path | str, accept: Callable[[dict], bool] | None = None,
                    check: Callable[[dict], str | None] | None = None,
                    max_bytes: int = 1 << 16,
                    give_up_bytes: int = 1 << 24) -> dict | None:
    """The last complete record of a JSONL file that ``accept`` takes, reading only its end
    (metrics files grow): the tail read quadruples until a record is found, up to
    ``give_up_bytes``."""
    while True:
        got = tail_bytes(path, max_bytes)
        if got is None:
            return None
        tail, size = got
        lines = tail.split(b"\n")
        if size > len(tail):
            lines = lines[1:]       # the first line may be cut by the seek
        for record in reversed(parse_jsonl(b"\n".join(lines), path, check)):
            if accept is None or accept(record):
                return record
        if max_bytes >= size or max_bytes >= give_up_bytes:
            return None
        max_bytes *= 4


def read_mapping(path: Path | str, what: str) -> dict | None:
    """A YAML mapping of a run folder (run.yaml, job.yaml, profile.yaml), read through this
    door and parsed by the one YAML loader; None when missing."""
    from ..config import yamlio
    text = read_text(path, limits.RUN_SMALL_BYTES)
    if text is None:
        return None
    try:
        return yamlio.parse_mapping(text, _show(Path(path)))
    except (HpcTrainError, ValueError, RecursionError) as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DamagedFile(path, f"is not a valid {what} ({detail})") from None


# ---- field types of the records, for ``check`` -------------------------------------------------

INT = (int,)
NUMBER = (int, float)
TEXT = (str,)


def field_problem(record: dict, types: dict[str, tuple]) -> str | None:
    """The first field of ``record`` whose value is not None nor of its type (a bool is not a
    number), as ``field: expected ..., got ...``."""
    for name, kinds in types.items():
        value = record.get(name)
        if value is None:
            continue
        if isinstance(value, bool) and bool not in kinds:
            ok = False
        else:
            ok = isinstance(value, kinds)
        if not ok:
            want = " or ".join(_type_word(k) for k in kinds)
            shown = repr(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            return f"{name}: expected {want}, got {shown}"
    return None


def _type_word(kind: type) -> str:
    return {int: "an integer", float: "a number", str: "text", dict: "a mapping",
            list: "a list", bool: "true or false"}.get(kind, kind.__name__)


def checker(types: dict[str, tuple]) -> Callable[[dict], str | None]:
    return lambda record: field_problem(record, types)


def _attempt_positive(record: dict) -> str | None:
    a = record.get("attempt")
    if isinstance(a, int) and not isinstance(a, bool) and a < 0:
        return f"attempt: expected a positive integer, got {a}"
    return None


LEDGER_TYPES = {"attempt": INT, "start_step": INT, "end_step": INT, "exit_reason": TEXT,
                "exit_code": INT, "checkpoint_loaded": TEXT, "checkpoint_saved": TEXT,
                "last_loss": NUMBER, "start_time": NUMBER, "end_time": NUMBER,
                "message": TEXT, "job_id": TEXT, "restart_count": INT, "scheduler": TEXT,
                "nodes": (list,), "started": TEXT, "duration_s": NUMBER,
                "first_failure": (dict,), "decision": (dict,), "task_exits": (list,),
                "excluded_nodes": (list,), "not_excluded_nodes": (list,), "hang": (dict,),
                "straggler": (dict,)}
EVENT_TYPES = {"event": TEXT, "time": TEXT, "attempt": INT, "step": INT, "job_id": TEXT,
               "ledger_records": INT}
METRIC_TYPES = {"step": INT, "attempt": INT, "kind": TEXT, "loss": NUMBER}


def ledger_problem(record: dict) -> str | None:
    return field_problem(record, LEDGER_TYPES) or _attempt_positive(record)


def event_problem(record: dict) -> str | None:
    if not isinstance(record.get("event"), str):
        return f"event: expected text, got {record.get('event')!r:.40}"
    return field_problem(record, EVENT_TYPES)


# how metrics.jsonl holds a loss JSON cannot (the runtime writes str() of a non-finite float:
# a skipped NaN step is a record, not damage)
NON_FINITE = ("nan", "inf", "-inf")


def metric_problem(record: dict) -> str | None:
    if record.get("loss") in NON_FINITE:
        record = {**record, "loss": None}
    return field_problem(record, METRIC_TYPES)


def meta_problem(meta: dict) -> str | None:
    """What is wrong with run.yaml's fields, naming the field; None when nothing is."""
    problem = field_problem(meta, {"name": TEXT, "profile": TEXT, "created": TEXT,
                                   "scheduler": TEXT, "checkpoint_dir": TEXT,
                                   "total_steps": INT, "world_size": INT, "jobs": (list,),
                                   "run_id": TEXT, "kind": TEXT})
    if problem:
        return problem
    for i, job in enumerate(meta.get("jobs") or []):
        if not isinstance(job, dict):
            return f"jobs[{i}]: expected a mapping with job_id and kind, got {job!r:.40}"
        if not isinstance(job.get("job_id"), str) or not job["job_id"]:
            return f"jobs[{i}].job_id: expected the job id as text, got {job.get('job_id')!r:.40}"
        if not isinstance(job.get("kind"), str):
            return f"jobs[{i}].kind: expected text, got {job.get('kind')!r:.40}"
    return None


def describe(error: BaseException) -> dict[str, Any]:
    """``{"file": ..., "why": ...}`` of a damage, for listings and JSON."""
    if isinstance(error, DamagedFile):
        return {"file": str(error.path), "why": error.why}
    return {"file": None, "why": str(error).splitlines()[0] if str(error) else type(error).__name__}
