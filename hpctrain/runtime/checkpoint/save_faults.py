"""A checkpoint save that fails on the storage or loses a peer, said in one line.

A full disk, a quota, a permission, a read-only or vanished file system reach the ranks as a
wall of exceptions: torch's ``CheckpointException`` holding every rank's error and traceback,
megatron-core's wrappers, ``inline_container.cc: unexpected pos`` from the zip writer. The
cause is one ``OSError`` somewhere in that chain. A peer rank that dies or stops answering
while the ranks are inside the save's collectives (megatron-core's metadata exchange, the
gather of the write results, the async save's completion agreement) reaches the others as a
gloo or NCCL error from that collective ("Connection closed by peer", "Timed out waiting
...ms for recv"). :func:`save_fault` finds either and says, in one line, what failed, where,
that the newest complete checkpoint is intact (a partial save is never published, so it is
what the run resumes from) and how to continue. The rank logs keep the full traceback; the
line is the attempt's message (``result.json``, the ledger, ``hpctrain status``, ``submit
--wait``).

Pure Python (no torch), so it is tested with real ``OSError``s made on any machine.
"""

from __future__ import annotations

import contextlib
import errno
import re
import traceback
from typing import Callable, Iterator

from ...errors import HpcTrainError, NotRegularFileError

FAULTS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "the file system is read-only",
    errno.ENOENT: "a file or folder vanished under the save (the checkpoint folder was removed?)",
    errno.ENOTDIR: "a part of the path is not a folder",
    errno.EEXIST: "a file is in the way",
    errno.EFBIG: "a file grew past the size this process may write (ulimit -f?)",
    errno.EIO: "I/O error (the storage is failing)",
    errno.ESTALE: "stale file handle (the network file system went away)",
    errno.ENOTCONN: "the file system is no longer connected",
    errno.ENODEV: "the file system is gone",
}
# what to do about each fault (then the run continues with `hpctrain resume`)
FIXES = {
    errno.ENOSPC: "free space on that file system (or set storage.checkpoint_root to another one)",
    errno.EDQUOT: "free space within your quota (or set storage.checkpoint_root elsewhere)",
    errno.EACCES: "let the job's user write that folder (chmod/chown), or set "
                  "storage.checkpoint_root to a folder it can write",
    errno.EPERM: "let the job's user write that folder (chmod/chown), or set "
                 "storage.checkpoint_root to a folder it can write",
    errno.EROFS: "remount the file system writable, or set storage.checkpoint_root to a "
                 "writable one",
}
DEFAULT_FIX = "fix the storage (free space, permissions)"
PEER_FIX = ("find why that rank ended (`hpctrain status` names the first rank that failed, its "
            "log says why)")

# what a collective says when a peer rank died or stopped answering: gloo ("Connection closed
# by peer", "Connection reset by peer", "Broken pipe", "Timed out waiting 1800000ms for recv
# operation to complete", "Application timeout caused pair closure"), NCCL ("NCCL
# communicator was aborted", "remote process exited or there was a network error"), torch's
# watchdog ("Watchdog caught collective operation timeout").
PEER_LOST = re.compile(
    r"connection (closed|reset|refused) by peer|closed by peer|reset by peer|broken pipe|"
    r"timed out waiting|application timeout|pair closure|collective operation timeout|"
    r"communicator was aborted|remote process exited|socket timeout", re.I)
# torch's exceptions for a failed collective or its network (torch.distributed.DistError's
# subclasses); matched by name so this module needs no torch
PEER_ERROR_TYPES = ("DistBackendError", "DistNetworkError")
# gloo and NCCL put where in their sources the error was raised first: "[../gloo/pair.cc:534] "
SOURCE_PREFIX = re.compile(r"^\s*(\[[^\]]*\.(cc|cpp|h|hpp):\d+\]\s*)+")
DETAIL_CHARS = 160

# what the zip writer of torch.save says when a write fails under it (the errno is lost)
TEXT_HINTS = (("unexpected pos", "a write failed part-way (the file system is full or failing?)"),
              ("file write failed", "a write failed (the file system is full or failing?)"),
              ("No space left on device", FAULTS[errno.ENOSPC]),
              ("Disk quota exceeded", FAULTS[errno.EDQUOT]))


# The line before a save fault's traceback in a rank log; following a run (``submit --wait``,
# ``view.follow``) shows the fault's one line and hides the indented traceback under this one.
TRACEBACK_HEADER = "the traceback (kept in this rank's log):"


class SaveFault(HpcTrainError):
    """A checkpoint save failed on the storage or lost a peer; the message is the one line to
    show."""


def _causes(exc: BaseException):
    """``exc`` and every exception inside it: causes, contexts, the per-rank failures of a
    torch ``CheckpointException`` (``(exception, traceback)`` pairs), exceptions in ``args``."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen or len(seen) > 200:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__]
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            for value in failures.values():
                value = value[0] if isinstance(value, tuple) and value else value
                if isinstance(value, BaseException):
                    todo.append(value)
        todo += [a for a in getattr(e, "args", ()) if isinstance(a, BaseException)]
        todo += [a[0] for a in getattr(e, "args", ())
                 if isinstance(a, tuple) and a and isinstance(a[0], BaseException)]


def fault_of(exc: BaseException) -> str | None:
    """What went wrong on the storage, in words with the errno and the file; None when the
    failure is not a storage fault (a bug keeps its own message; a lost peer is
    :func:`peer_lost`'s)."""
    for e in _causes(exc):
        if isinstance(e, NotRegularFileError):      # the write door's refusal says what is there
            return f"{e.filename} {e.strerror}"
        if isinstance(e, OSError) and e.errno in FAULTS:
            where = f": {e.filename}" if e.filename else ""
            return f"{FAULTS[e.errno]} ({errno.errorcode[e.errno]}{where})"
    for e in _causes(exc):
        text = str(e) if not isinstance(e, OSError) else ""
        for hint, what in TEXT_HINTS:
            if hint in text:
                return what
    return None


def first_line(text: str) -> str:
    """The gist of a collective's error: its first line, without the source location, short."""
    line = SOURCE_PREFIX.sub("", text.strip().splitlines()[0] if text.strip() else "").strip()
    return line if len(line) <= DETAIL_CHARS else line[:DETAIL_CHARS - 3] + "..."


def peer_lost(exc: BaseException) -> str | None:
    """What the collective said when a peer rank died or stopped answering inside the save
    (one line), or None when ``exc`` is not that."""
    for e in _causes(exc):
        if isinstance(e, OSError):
            continue
        text = str(e)
        if PEER_LOST.search(text) or (type(e).__name__ in PEER_ERROR_TYPES and text.strip()):
            return first_line(text)
    return None


def storage_errno(exc: BaseException) -> int | None:
    """The errno of the storage fault inside ``exc``, if one of :data:`FAULTS`."""
    for e in _causes(exc):
        if isinstance(e, OSError) and e.errno in FAULTS:
            return e.errno
    return None


def failed_elsewhere(exc: BaseException) -> bool:
    """megatron-core's word to the ranks that are not the save's coordinator: a
    ``CheckpointException`` with no failures (the details are raised on the coordinator only,
    ``state_dict_saver.save_state_dict_async_finalize``)."""
    return any(type(e).__name__ == "CheckpointException" and not getattr(e, "failures", None)
               for e in _causes(exc))


def save_fault(exc: BaseException, *, step: int | None, path, newest: str | None,
               run_id: str) -> SaveFault | None:
    """The one-line :class:`SaveFault` for ``exc`` raised by a save of ``step`` into ``path``;
    None when ``exc`` is neither a storage fault nor a lost peer. On a rank told only that the
    write failed elsewhere, or whose peer vanished inside the save's collectives, the line says
    the save was aborted (the words :mod:`hpctrain.record.culprit` reads as a peer's failure,
    so the ledger names the rank that failed first, not the ones that noticed)."""
    what = fault_of(exc)
    of = f" of step {step}" if step is not None else ""
    fix = DEFAULT_FIX
    if what is not None:
        head = f"checkpoint save{of} to {path} failed: {what}"
        fix = FIXES.get(storage_errno(exc), DEFAULT_FIX)
    elif failed_elsewhere(exc):
        head = (f"checkpoint save{of} to {path} aborted: a write failed on another rank "
                f"(rank 0's log names the fault)")
    elif (lost := peer_lost(exc)) is not None:
        head = (f"checkpoint save{of} to {path} aborted: another rank died or stopped answering "
                f"inside the save's collectives ({lost}); the partial save is not published")
        fix = PEER_FIX
    else:
        return None
    kept = (f"the newest complete checkpoint, {newest}, is intact and is what the run resumes "
            f"from" if newest else "no complete checkpoint was saved before it")
    return SaveFault(one_line(f"{head}; {kept}; {fix}, then `hpctrain resume {run_id}`"))


def one_line(text: str) -> str:
    """``text`` with every character that could break the line (a newline in a file name or
    in a peer's error) written as its escape."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@contextlib.contextmanager
def save_faults_in_one_line(*, step: int | None, path, newest: Callable[[], str | None],
                            run_id: str, log: Callable[[str], None]) -> Iterator[None]:
    """The door: whatever a save (or the completion of a background save) raises is turned
    into its one-line :class:`SaveFault` when it is a storage fault or a lost peer; the full
    traceback goes to ``log`` (this rank's log) under :data:`TRACEBACK_HEADER`. Anything else
    goes on up unchanged. ``newest()`` is asked only when a fault is being said."""
    try:
        yield
    except (KeyboardInterrupt, SystemExit, GeneratorExit, SaveFault):
        raise
    except BaseException as e:   # torch's CheckpointException is a BaseException
        fault = save_fault(e, step=step, path=path, newest=newest(), run_id=run_id)
        if fault is None:
            raise
        detail = "".join(traceback.format_exception(e)).rstrip().replace("\n", "\n    ")
        log(f"checkpoint: {fault}\n{TRACEBACK_HEADER}\n    {detail}")
        raise fault from None
