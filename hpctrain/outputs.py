"""Where hpctrain writes a file a user named (``report -o``, ``data prepare --output``): only a
regular file, which is replaced, or a new path. Anything else (a device such as /dev/null, a
FIFO, a socket, a folder) is refused by name before a byte is written, so a temporary file is
never renamed over it (as root that would replace the device)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import UsageError

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def check_output_file(path: str | os.PathLike, option: str) -> Path:
    """``path`` if it is a regular file or does not exist yet; UsageError naming ``option``
    and what is there otherwise. Filesystem errors (a parent that is a file, a symlink loop,
    a name too long) propagate as OSError, which the CLI reports with the path."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return p
    if stat.S_ISREG(st.st_mode):
        return p
    kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
    raise UsageError(f"{option} {p}: is {kind}; give the path of a regular file or a new one")
