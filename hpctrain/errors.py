"""Errors that hpctrain shows to users.

Every failure a user can cause (bad YAML, unknown profile, a layout that does not fit, sbatch
refusing a job) is raised as an `HpcTrainError`. The CLI turns it into ``Error: ...`` on stderr
and the error's exit code, never a traceback. Anything else escaping is a bug in hpctrain.
"""

from __future__ import annotations

from . import exit_codes


class HpcTrainError(Exception):
    """A failure the user can act on. ``str(err)`` is the complete message."""

    exit_code = exit_codes.FAILED


class UsageError(HpcTrainError):
    """Bad input: a file, a field, an option. Exit code 2, as for Click's own usage errors."""

    exit_code = exit_codes.USAGE


class ConfigError(UsageError):
    """One or more problems in a profile or job file, all reported at once.

    ``problems`` is a list of ``(field_path, message)`` pairs, e.g.
    ``("slurm.gpus_per_node", "expected an integer, got 'four'")``.
    """

    SHOWN = 5    # a file of a thousand mistakes gets one readable line: the first, then a count

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = list(problems)
        super().__init__(self._format())

    def _format(self) -> str:
        if len(self.problems) == 1:
            path, msg = self.problems[0]
            return f"{self.source}: {path}: {msg}" if path else f"{self.source}: {msg}"
        # one line, as every usage error: each problem names its field, "; " between them
        shown = [f"{p}: {m}" if p else m for p, m in self.problems[:self.SHOWN]]
        if len(self.problems) > self.SHOWN:
            shown.append(f"and {len(self.problems) - self.SHOWN} more")
        return f"{self.source} has {len(self.problems)} problems: " + "; ".join(shown)


class SubmissionError(HpcTrainError):
    """The scheduler refused a job; the message is what the scheduler said."""


class RunNotFoundError(UsageError):
    """A run name, folder or job id that matches no run folder."""


class NotRegularFileError(OSError):
    """Something other than a regular file (a FIFO, a device, a socket, a folder, a symbolic
    link) is where a file is to be written (``outputs.write_atomic``). An ``OSError``, so
    every door that says filesystem errors in one line says it; ``strerror`` is what is there
    and the fix, ``filename`` the path."""


# errno -> (what it means for the path, exit code). Paths a user gave that cannot be used are
# usage errors (2); the system failing (disk full, I/O error) is a failure (1).
_OS_ERRORS = {
    "EACCES": ("permission denied", exit_codes.USAGE),
    "EPERM": ("operation not permitted", exit_codes.USAGE),
    "EROFS": ("the file system is read-only", exit_codes.USAGE),
    "ENOTDIR": ("a part of the path is a file, not a folder", exit_codes.USAGE),
    "ELOOP": ("too many levels of symbolic links (a symlink loop?)", exit_codes.USAGE),
    "ENAMETOOLONG": ("the name is too long for the file system", exit_codes.USAGE),
    "EISDIR": ("is a folder, expected a file", exit_codes.USAGE),
    "ENOENT": ("does not exist", exit_codes.USAGE),
    "EEXIST": ("already exists", exit_codes.USAGE),
    "ENOSPC": ("no space left on the device", exit_codes.FAILED),
    "EDQUOT": ("disk quota exceeded", exit_codes.FAILED),
}
# what to do about the faults of the storage a command writes to (runs roots, run folders,
# outputs); the others name what is wrong with the path itself, which is the fix
_OS_FIXES = {
    "EACCES": "give your user access to it (chmod/chown) or choose another folder",
    "EPERM": "give your user access to it (chmod/chown) or choose another folder",
    "EROFS": "remount it writable or choose a folder on a writable file system",
    "ENOSPC": "free space on that file system or choose another one",
    "EDQUOT": "free space within your quota or choose another file system",
}


def from_os_error(e: OSError, fix: str | None = None) -> HpcTrainError:
    """One line for a filesystem error that reached the CLI: the path, what is wrong and, for
    a fault of the storage (permission, read-only, full), what to do — or ``fix``, a caller's
    own advice that knows which setting chose the path."""
    import errno as errno_names

    name = errno_names.errorcode.get(e.errno or 0, "")
    what, code = _OS_ERRORS.get(name, (e.strerror or str(e), exit_codes.FAILED))
    if isinstance(e, NotRegularFileError):
        what = e.strerror
    paths = [str(p) for p in (e.filename, e.filename2) if p is not None]
    where = " -> ".join(_short_path(p) for p in paths) if paths else "a file"
    fix = fix or _OS_FIXES.get(name)
    text = f"{where}: {what}; {fix}" if fix else f"{where}: {what}"
    return (UsageError if code == exit_codes.USAGE else HpcTrainError)(text)


def _short_path(text: str) -> str:
    return text if len(text) <= 200 and text.isprintable() else repr(text[:200])
