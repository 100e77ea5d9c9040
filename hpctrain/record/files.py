"""The file primitives of run folders: locks and JSONL records.

JSONL files are appended with one ``write`` under an exclusive lock, so concurrent writers
(the batch shell, rank 0, a user's ``hpctrain cancel``) never interleave partial lines; a line
torn by a writer killed mid-write is skipped on reading (``reader``, the one reader of run
files) and closed before the next append.
Read-modify-writes of a run's files hold ``folder_lock`` (``flock``), reentrant per thread and
never inherited by a forked child. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import shutil
import stat
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

from ..errors import UsageError


RUN_FILE = "run.yaml"           # what makes a folder a run folder
# a run folder being removed is renamed to this prefix first (remove_run_folder)
REMOVING_PREFIX = ".removing-"


def is_run_folder(path: Path) -> bool:
    """A folder holding a ``run.yaml``, whatever that is (a damaged one makes a damaged run,
    listed as such, not a folder that is not a run), and not one being removed; nothing is
    opened."""
    return (not os.path.basename(path).startswith(REMOVING_PREFIX) and os.path.isdir(path)
            and os.path.lexists(os.path.join(path, RUN_FILE)))


def remove_run_folder(path: Path) -> bool:
    """Remove one run folder, also while someone lists the runs; False when it was gone
    already (another ``runs rm`` or ``runs prune`` removed it meanwhile).

    A listing keeps each run's row in the run's folder (``view.summary_cache``), so deleting
    the folder where it is could race with a row being written into it (``rmtree`` then fails
    with "Directory not empty"). The folder is first renamed beside it, to a name no listing
    takes for a run (``REMOVING_PREFIX``; one atomic step: a row being written then fails
    quietly), then deleted. A removal stopped half-way (Ctrl-C, a kill) leaves that folder,
    which :func:`abandoned_removals` finds and ``runs prune`` finishes."""
    path = Path(path)
    if os.path.islink(path):       # renamed, the link would be kept and rmtree refuse it
        raise RunFileError(f"{path} is a symbolic link, not a run folder; nothing was removed")
    doomed = path.with_name(_removing_name(path.name))
    try:
        os.rename(path, doomed)
    except FileNotFoundError:
        if os.path.lexists(path):
            raise
        return False               # of two removals at once, the other one renamed it first
    finish_removal(doomed)
    return True


def finish_removal(doomed: Path) -> None:
    """Delete a folder already renamed to ``REMOVING_PREFIX``."""
    for tries_left in range(20, -1, -1):
        try:
            shutil.rmtree(doomed)
            return
        except FileNotFoundError:
            if not os.path.lexists(doomed):   # another process finished it
                return
            if not tries_left:
                raise
        except OSError as e:
            # a row whose write began before the rename lands in the folder (the write door
            # works in its folder by descriptor): it is written once, so a retry finishes
            if e.errno != errno.ENOTEMPTY or not tries_left:
                raise
        time.sleep(0.05)


def _removing_name(name: str) -> str:
    """``.removing-<name>-<pid>@<host>``, the run's name cut to fit a file name (255 bytes: a
    run folder named near the limit is removed too): who is removing it, so a later ``runs
    prune`` can tell a removal under way from one whose process is gone."""
    suffix = f"-{os.getpid()}@{_host()}"
    room = 255 - len(REMOVING_PREFIX) - len(suffix)
    return f"{REMOVING_PREFIX}{os.fsdecode(os.fsencode(name)[:room])}{suffix}"


def _host() -> str:
    import socket
    name = socket.gethostname()
    return "".join(c for c in name if c.isascii() and (c.isalnum() or c in ".-"))[:64]


def abandoned_removals(root: Path) -> list[Path]:
    """Folders in ``root`` that a removal renamed (``REMOVING_PREFIX``) and then stopped
    deleting: the process named in the name (``-<pid>@<host>``, this host) is gone. A removal
    under way, or one from another host (whose processes cannot be seen from here), is not
    listed; neither is a symbolic link."""
    found = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.startswith(REMOVING_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        pid, _, host = entry.name.rpartition("-")[2].partition("@")
        if not pid.isdigit() or not pid.isascii() or host != _host():
            continue
        try:
            os.kill(int(pid), 0)
            continue                  # its remover is still at work
        except ProcessLookupError:
            found.append(Path(entry.path))
        except (PermissionError, OverflowError, ValueError):
            continue                  # another user's process, or not a pid at all
    return sorted(found)


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
def folder_lock(lock_file: Path, what: str,
                waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold ``flock`` on ``lock_file`` (created 0600). Reentrant within a thread; other threads
    and processes wait (``waiting`` is called first when they must: a person is told why
    nothing happens)."""
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
        if waiting is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                waiting()
                fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            fcntl.flock(fd, fcntl.LOCK_EX)
        _held[key] = entry
        yield
    finally:
        if entry[2] == os.getpid():       # a forked child already closed its copy
            if _held.get(key) is entry:
                del _held[key]
            os.close(fd)                  # releases the lock


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM held back while the block makes one change that must not be cut in
    two: a job archived, rewritten and recorded in run.yaml; a job queued and its id recorded
    (a job running that its run does not record would be deleted with the folder by `runs
    rm`). The first one is delivered when the block ends, so a command stopped there stops
    after the change, never half-way through it; a second one stops it at once, as without
    the hold. Main thread only (the one Python delivers signals to).

    Held by a handler that only notes the signal, not by the signal mask: a process started
    inside the block (sbatch, the local controller) starts with the default handling, as it
    would outside (exec resets handlers; a blocked mask would be inherited, and the child
    would not stop on Ctrl-C, `hpctrain cancel` or Slurm's SIGTERM)."""
    import signal
    wanted = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.getsignal(s) for s in wanted} \
        if threading.current_thread() is threading.main_thread() else {}
    # a handler set outside Python (None) cannot be put back; an ignored signal stays ignored
    previous = {s: h for s, h in previous.items() if h is not None and h != signal.SIG_IGN}
    arrived: list[int] = []

    def restore() -> None:
        for s, handler in previous.items():
            signal.signal(s, handler)

    def hold(signum, frame) -> None:
        arrived.append(signum)
        if len(arrived) > 1:                 # asked twice: stop now
            restore()
            signal.raise_signal(signum)

    for s in previous:
        signal.signal(s, hold)
    try:
        yield
    finally:
        restore()
        if len(arrived) == 1:
            signal.raise_signal(arrived[0])


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")


def open_for_append(path: Path, *, truncate: bool = False) -> int:
    """A descriptor on ``path`` for appending (or, ``truncate``, writing afresh), created 0644
    if absent; only a regular file: opened without blocking or following a symbolic link and
    checked after opening, so a FIFO left in a log's place is an error naming it, never a rank
    that hangs at its start, and a link never sends the writes out of the run folder. The
    descriptor is blocking again when returned. Raises :class:`RunFileError` naming the path
    and the fix."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        raise RunFileError(f"cannot write {path}: {_why(e)}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RunFileError(f"cannot write {path}: not a regular file; move it away")
        if truncate:
            os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
    except BaseException as e:
        os.close(fd)
        if isinstance(e, OSError):
            raise RunFileError(f"cannot write {path}: {_why(e)}") from None
        raise
    return fd


def _why(e: OSError) -> str:
    """What is wrong, and for the storage's faults what to do (errors.from_os_error's words);
    a symbolic link or a FIFO in a file's place (ELOOP from O_NOFOLLOW, ENXIO from a FIFO
    opened for writing without blocking) is said as such."""
    import errno
    if e.errno == errno.ELOOP:
        return "is a symbolic link, not a regular file; move it away"
    if e.errno == errno.ENXIO:     # O_WRONLY | O_NONBLOCK on a FIFO that nobody reads
        return "is a FIFO or a device, not a regular file; move it away"
    from ..errors import from_os_error
    text = str(from_os_error(OSError(e.errno, e.strerror)))
    return text.split(": ", 1)[1] if ": " in text else (e.strerror or str(e))


def append_jsonl(path: Path, record: dict) -> None:
    """Append one record as one line (one ``write`` under ``flock``, fsynced). A line torn by a
    writer killed mid-write is closed first, so it never swallows the next record. Only a
    regular file is appended to (opened without blocking or following a symlink, checked
    after opening): a FIFO or a link left in its place is an error naming it, never a hang."""
    line = (json.dumps(record, sort_keys=False) + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o666)
    except OSError as e:
        raise RunFileError(f"cannot append to {path}: {_why(e)}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RunFileError(f"cannot append to {path}: not a regular file; move it away")
        os.set_blocking(fd, True)
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
        os.fsync(fd)
    except OSError as e:
        raise RunFileError(f"cannot append to {path}: {_why(e)}") from None
    finally:
        os.close(fd)   # releases the lock


METRIC_KINDS = ("train", "validation", "test")    # a metrics record's "kind"
JOB_KINDS = ("train", "preflight")                # a job's "kind" in run.yaml


def record_kind(record: dict) -> str:
    """A metrics record's kind: "train" (also the records written before kinds existed),
    "validation" or "test"."""
    return str(record.get("kind", "train"))
