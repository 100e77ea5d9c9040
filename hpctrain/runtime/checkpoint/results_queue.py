"""A results queue for megatron-core's checkpoint writer that needs no extra process."""

from __future__ import annotations

import os
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
    """

    def __init__(self) -> None:
        import secrets
        import tempfile
        # The folder exists only while a result waits to be read: nothing is left behind
        # between saves, even by a rank that is killed.
        self.folder = Path(tempfile.gettempdir()) / \
            f"hpctrain-write-results-{os.getpid()}-{secrets.token_hex(4)}"
        self.folder_owner = os.getpid()

    def put(self, obj) -> None:
        import pickle
        name = f"{time.time_ns():020d}-{os.getpid()}"
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.folder / f".{name}"
        with open(tmp, "wb") as f:
            pickle.dump(obj, f)
        os.replace(tmp, self.folder / f"{name}.pkl")

    def get_nowait(self):
        import pickle
        import queue
        items = sorted(self.folder.glob("*.pkl")) if self.folder.is_dir() else []
        if not items:
            raise queue.Empty
        with open(items[0], "rb") as f:
            obj = pickle.load(f)
        items[0].unlink()
        try:
            self.folder.rmdir()
        except OSError:
            pass  # another result is waiting
        return obj

    def remove(self) -> None:
        import shutil
        if os.getpid() == self.folder_owner:
            shutil.rmtree(self.folder, ignore_errors=True)


_RESULTS: FileResultsQueue | None = None


def remove_results_queue() -> None:
    """Delete this rank's folder (also registered with atexit, which os._exit skips)."""
    if _RESULTS is not None:
        _RESULTS.remove()


def install_results_queue() -> None:
    """Give megatron-core's writer our file-backed results queue (once per rank)."""
    global _RESULTS
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    if _RESULTS is None:
        import atexit
        _RESULTS = FileResultsQueue()
        atexit.register(_RESULTS.remove)
    filesystem_async._results_queue = _RESULTS
