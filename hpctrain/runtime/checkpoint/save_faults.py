"""A checkpoint save that fails on the storage, said in one line.

A full disk, a quota, a permission, a read-only or vanished file system reach the ranks as a
wall of exceptions: torch's ``CheckpointException`` holding every rank's error and traceback,
megatron-core's wrappers, ``inline_container.cc: unexpected pos`` from the zip writer. The
cause is one ``OSError`` somewhere in that chain. :func:`save_fault` finds it and says, in one
line, what failed, where, that the newest complete checkpoint is intact (a partial save is
never published, so it is what the run resumes from) and how to continue. The rank logs keep
the full traceback; the line is the attempt's message (``result.json``, the ledger, ``hpctrain
status``, ``submit --wait``).

Pure Python (no torch), so it is tested with real ``OSError``s made on any machine.
"""

from __future__ import annotations

import errno

from ...errors import HpcTrainError

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
# what the zip writer of torch.save says when a write fails under it (the errno is lost)
TEXT_HINTS = (("unexpected pos", "a write failed part-way (the file system is full or failing?)"),
              ("file write failed", "a write failed (the file system is full or failing?)"),
              ("No space left on device", FAULTS[errno.ENOSPC]),
              ("Disk quota exceeded", FAULTS[errno.EDQUOT]))


class SaveFault(HpcTrainError):
    """A checkpoint save failed on the storage; the message is the one line to show."""


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
    failure is not a storage fault (a bug, a lost peer: those keep their own message)."""
    for e in _causes(exc):
        if isinstance(e, OSError) and e.errno in FAULTS:
            where = f": {e.filename}" if e.filename else ""
            return f"{FAULTS[e.errno]} ({errno.errorcode[e.errno]}{where})"
    for e in _causes(exc):
        text = str(e) if not isinstance(e, OSError) else ""
        for hint, what in TEXT_HINTS:
            if hint in text:
                return what
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
    None when ``exc`` is not a storage fault. On a rank told only that the write failed
    elsewhere, the line says the save was aborted (the words :mod:`hpctrain.record.culprit`
    reads as a peer's failure, so the ledger names the rank that saw the fault)."""
    what = fault_of(exc)
    of = f" of step {step}" if step is not None else ""
    if what is not None:
        head = f"checkpoint save{of} to {path} failed: {what}"
    elif failed_elsewhere(exc):
        head = (f"checkpoint save{of} to {path} aborted: a write failed on another rank "
                f"(rank 0's log names the fault)")
    else:
        return None
    kept = (f"the newest complete checkpoint, {newest}, is intact and is what the run resumes "
            f"from" if newest else "no complete checkpoint was saved before it")
    return SaveFault(f"{head}; {kept}; fix the storage (free space, permissions), then "
                     f"`hpctrain resume {run_id}`")
