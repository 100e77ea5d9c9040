"""A results queue for megatron-core's checkpoint writer that needs no extra process."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path


class FileResultsQueue:
    """What megatron-core's checkpoint writer needs from its results queue (``put`` in the
    writer, ``get_nowait`` in the rank), through files in a private folder.

    megatron-core serves that queue from a ``spawn``ed manager process that it starts during
    the first save and never stops: the first save waited seconds for that process to import
    torch (tens of seconds on a busy node — an emergency save cannot afford it), and a rank
    killed mid-run left the process running forever. The writer runs in the rank itself or in
    a process forked from it, so a folder both can see is all it takes.

    The results are pickles, and unpickling runs code: the folder is made by ``mkdtemp``
    (a fresh name, mode 0700, created by this rank before the writer forks) and is checked to
    be this user's, private, and not a link before anything in it is read or written. It
    exists only from the start of a save until its result is read, so a rank that is killed
    leaves at most one private folder behind.
    """

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.folder_owner = os.getpid()

    def prepare(self) -> None:
        """Before each save (in the rank, before the writer forks): a private folder."""
        import tempfile
        if self.folder is None or not self.folder.is_dir():
            self.folder = Path(tempfile.mkdtemp(prefix="hpctrain-write-results-"))
            self.folder_owner = os.getpid()
        self._check_private()

    def _check_private(self) -> None:
        """Refuse a folder that is not this user's own private one (anything else could hold
        planted pickles)."""
        try:
            st = os.lstat(self.folder)
        except (OSError, TypeError):
            raise RuntimeError(f"checkpoint writer results folder {self.folder} is gone") from None
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise RuntimeError(f"checkpoint writer results folder {self.folder} is not a private "
                               f"folder of this user (mode {stat.filemode(st.st_mode)}, uid "
                               f"{st.st_uid}); refusing to use it")

    def put(self, obj) -> None:
        import pickle
        self._check_private()
        name = f"{time.time_ns():020d}-{os.getpid()}"
        tmp = self.folder / f".{name}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            pickle.dump(obj, f)
        os.replace(tmp, self.folder / f"{name}.pkl")

    def get_nowait(self):
        import pickle
        import queue
        if self.folder is None or not self.folder.is_dir():
            raise queue.Empty
        self._check_private()
        items = sorted(self.folder.glob("*.pkl"))
        if not items:
            raise queue.Empty
        fd = os.open(items[0], os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            if os.fstat(f.fileno()).st_uid != os.geteuid():
                raise RuntimeError(f"{items[0]} is not this user's; refusing to read it")
            obj = pickle.load(f)
        items[0].unlink()
        try:
            self.folder.rmdir()
            self.folder = None    # the next save makes a fresh one
        except OSError:
            pass  # another result is waiting
        return obj

    def remove(self) -> None:
        import shutil
        if self.folder is not None and os.getpid() == self.folder_owner:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


_RESULTS: FileResultsQueue | None = None


def remove_results_queue() -> None:
    """Delete this rank's folder (also registered with atexit, which os._exit skips)."""
    if _RESULTS is not None:
        _RESULTS.remove()


def install_results_queue() -> None:
    """Give megatron-core's writer our file-backed results queue, with a private folder ready
    for this save (every rank, before each save)."""
    global _RESULTS
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    if _RESULTS is None:
        import atexit
        _RESULTS = FileResultsQueue()
        atexit.register(remove_results_queue)
    _RESULTS.prepare()
    filesystem_async._results_queue = _RESULTS
