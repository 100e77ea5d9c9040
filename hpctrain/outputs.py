"""Where and how hpctrain writes a file: the one write door.

* :func:`write_atomic` replaces (or, ``exclusive``, creates) a file so a reader sees the old
  content or the new, never a part, even after a crash: run-folder files, checkpoint
  manifests, ``latest``, ``owner.json``, reports, data-prepare metadata, benchmark tables.
  :class:`AtomicFile` is the same door for a writer that streams (a dataset's ``.bin`` and
  ``.idx``, a PNG matplotlib saves). The temporary file is created exclusively
  under a unique name (``mkstemp``: ``O_CREAT|O_EXCL|O_NOFOLLOW``), so a symbolic link or a
  FIFO planted at a would-be temporary name is never written through or opened; the rename
  never follows the target either. An existing target that is not a regular file (a FIFO, a
  device, a socket, a folder, a symbolic link) is refused by name (:class:`NotRegularFileError`,
  an ``OSError`` so the storage-fault doors that already say ``OSError``\\ s in one line say it
  too), never replaced: as root, renaming over ``/dev/null`` would replace the device.
* :func:`probe_file` is a scratch file for measuring or testing a folder (the preflight
  storage probe): created the same way, removed afterwards.
* :func:`check_output_file` checks a path a user named (``report -o``, ``data prepare
  --output``) before any work is done, with the option's name in the error. It refuses
  what the door would refuse (a symbolic link too), so the command stops before the work.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

from . import file_door
from .errors import NotRegularFileError, UsageError

_kind = file_door.kind_of


def refuse_special(path: Path) -> None:
    """Raise :class:`NotRegularFileError` when ``path`` exists (as itself, a link not
    followed) and is not a regular file; nothing when it is one or is absent."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(errno.EEXIST, f"is {_kind(st.st_mode)}, not a regular file; "
                                                f"move it away", str(path))


def check_output_file(path: str | os.PathLike, option: str) -> Path:
    """``path`` if it is a regular file or does not exist yet; UsageError naming ``option``
    and what is there otherwise, a symbolic link included (not followed: the write would
    replace the link, never write where it points, so it is refused up front as the write
    door refuses it). Filesystem errors (a parent that is a file, a name too long) propagate
    as OSError, which the CLI reports with the path."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return p
    if stat.S_ISREG(st.st_mode):
        return p
    raise UsageError(f"{option} {p}: is {_kind(st.st_mode)}; give the path of a regular file "
                     f"or a new one")


def _named(e: OSError, path: Path) -> OSError:
    """``e`` naming ``path`` when it names no file (a write's or fsync's ENOSPC, EDQUOT, EIO),
    so the one line that reports it says where (errors.from_os_error, save_faults)."""
    if e.filename is None and e.errno is not None:
        return type(e)(e.errno, e.strerror, str(path))
    return e


def _create(folder: Path, prefix: str, mode: int) -> tuple[BinaryIO, Path]:
    """A new file in ``folder`` (``mkstemp``: exclusive, unique, never through a link) with
    ``mode``, open for writing, and its path."""
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
    f = os.fdopen(fd, "wb")
    try:
        os.fchmod(fd, mode)
    except BaseException:
        f.close()
        os.unlink(name)
        raise
    return f, Path(name)


def _remove(f: BinaryIO, tmp: Path) -> None:
    """Close ``f`` and remove its name (a name already renamed away is gone: nothing to do)."""
    with contextlib.suppress(OSError):
        f.close()
    with contextlib.suppress(OSError):
        tmp.unlink()


@contextlib.contextmanager
def _naming(path: Path) -> Iterator[None]:
    """An ``OSError`` raised in the block that names no file (a write's ENOSPC) raised again
    naming ``path``."""
    try:
        yield
    except OSError as e:
        named = _named(e, path)
        if named is e:
            raise
        raise named from e


@contextlib.contextmanager
def _temporary(folder: Path, prefix: str, mode: int) -> Iterator[tuple[BinaryIO, Path]]:
    """:func:`_create`'s file, closed and its name removed on the way out."""
    f, tmp = _create(folder, prefix, mode)
    try:
        yield f, tmp
    finally:
        _remove(f, tmp)


def fsync_folder(path: Path) -> None:
    """fsync a folder, so a rename or creation in it survives a crash; best effort (some file
    systems refuse to open or fsync a folder)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AtomicFile:
    """A file written in pieces that appears at ``path`` whole or not at all: the door
    :func:`write_atomic` is built on, for writers that stream (the dataset writer's ``.bin``,
    a figure saved by matplotlib). Write to :attr:`file`, then :meth:`commit` (fsync, rename
    over ``path`` or, ``exclusive``, link; fsync of the folder) or :meth:`discard` (the
    temporary file removed, ``path`` as it was). As a context manager it yields :attr:`file`,
    commits when the block ends and discards when it raises. The arguments, the refusals and
    the errors are :func:`write_atomic`'s."""

    def __init__(self, path: str | os.PathLike, *, durable: bool = True,
                 exclusive: bool = False, within: str | os.PathLike | None = None) -> None:
        self.path = Path(path)
        self.durable, self.exclusive = durable, exclusive
        make_folders(self.path.parent, within)
        refuse_special(self.path)
        try:
            self.file, self.tmp = _create(self.path.parent, f".{self.path.name}.",
                                          0o666 & ~_umask())
        except OSError as e:
            # mkstemp names the temporary file it could not create (``.out.bin.x1y2.tmp``):
            # the error names the file being written, which is what the user gave
            if e.errno is None:
                raise
            raise type(e)(e.errno, e.strerror, str(self.path)) from e
        self.done = False

    def write(self, data) -> int:
        """Write ``data`` to the temporary file; a fault that names no file (a write's ENOSPC,
        EDQUOT, EIO) is raised naming ``path``, the file being written. Writers that stream
        write here, not to :attr:`file`, so their one error line says where."""
        with _naming(self.path):
            return self.file.write(data)

    def commit(self) -> None:
        """Publish what was written (once; later calls do nothing)."""
        if self.done:
            return
        self.done = True
        try:
            with _naming(self.path):
                self.file.flush()
                if self.durable:
                    os.fsync(self.file.fileno())
                self.file.close()  # before the rename: a network file system sends data on close
                if self.exclusive:
                    os.link(self.tmp, self.path)
                else:
                    os.replace(self.tmp, self.path)
        finally:
            _remove(self.file, self.tmp)
        if self.durable:
            fsync_folder(self.path.parent)

    def discard(self) -> None:
        """Drop what was written; ``path`` stays as it was (after a commit: nothing to do)."""
        self.done = True
        _remove(self.file, self.tmp)

    def __enter__(self) -> BinaryIO:
        return self.file

    def __exit__(self, kind, error, trace) -> None:
        if kind is not None:
            self.discard()
            if isinstance(error, OSError) and _named(error, self.path) is not error:
                raise _named(error, self.path) from error
            return
        self.commit()


def make_folders(folder: Path, within: str | os.PathLike | None = None) -> None:
    """The missing folders up to ``folder``. ``within`` (a run folder): only those below it,
    which must exist. A run folder removed while a command still writes into it (a `report`,
    a listing's row, a tracker's state while `runs rm` deletes the run) is never made again,
    holding one file, neither a run nor anything `runs rm` could remove: the write fails with
    ENOENT naming ``within``."""
    if within is None:
        folder.mkdir(parents=True, exist_ok=True)
        return
    within = Path(within)
    if not os.path.isdir(within):
        raise FileNotFoundError(errno.ENOENT, "removed meanwhile", str(within))
    below = folder.relative_to(within)
    for part in below.parts:     # one level at a time: never the run folder itself
        within = within / part
        try:
            os.mkdir(within)
        except FileExistsError:
            pass


def write_atomic(path: str | os.PathLike, data: str | bytes, *, durable: bool = True,
                 exclusive: bool = False, within: str | os.PathLike | None = None) -> None:
    """Write ``data`` (text is UTF-8 encoded) to ``path``: temporary file, fsync, rename over
    the target, fsync of the folder. The file gets the mode an ordinary write would (the
    umask's), not mkstemp's 0600. ``durable=False`` skips the fsyncs (still never a part: the
    rename is atomic) for files that can be rebuilt, such as heartbeats. ``exclusive=True``
    publishes with ``link`` instead of ``rename``: an existing file is never replaced
    (``FileExistsError``), so of two writers one wins (claiming a folder). Raises
    :class:`NotRegularFileError` for a special file at ``path``, and an ``OSError`` naming
    ``path`` for the storage's faults; a failed write leaves the old file and no temporary
    one. ``within``: the run folder ``path`` lies in, which a write never creates again
    (:func:`make_folders`)."""
    with AtomicFile(path, durable=durable, exclusive=exclusive, within=within) as f:
        f.write(data.encode() if isinstance(data, str) else data)


@contextlib.contextmanager
def probe_file(folder: str | os.PathLike, prefix: str) -> Iterator[tuple[BinaryIO, Path]]:
    """A scratch file in ``folder`` to write into (open, and its path): created
    exclusively under a unique name (a planted link or FIFO is never opened), removed when
    the block ends, whatever happens in it. An error that names no file (a write's ENOSPC)
    is raised naming ``folder``."""
    folder = Path(folder)
    with _naming(folder), _temporary(folder, prefix, 0o600) as (f, tmp):
        yield f, tmp


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
