"""Real storage faults for tests, made without privileges beyond a user namespace.

* **ENOSPC, EROFS**: ``unshare -Urm`` (a user and mount namespace, where this user is root
  over a mount namespace of its own) mounts a small ``tmpfs`` (full after a few hundred KiB)
  and remounts it read-only; the mount vanishes with the namespace, nothing outside is touched.
* **EACCES**: ``unshare -U --map-user=OTHER`` runs a command as another uid in a user
  namespace without capabilities: a folder of mode 0555 owned by this user is then refused by
  the kernel's own permission check even when this user is root outside (root's
  ``CAP_DAC_OVERRIDE`` does not reach into the namespace), and the command can still read and
  run everything this user can (the files' owner bits apply to it).

Every fault is the kernel's, with its real errno, on a real file system; nothing is
monkeypatched. The tests need unprivileged user namespaces (``unshare -U``), which Linux has
enabled by default since 4.x and the CI machine has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 600       # a loaded 2-core machine starts Python slowly; nothing here waits on time


def run_in_namespace(script: str, *args: str, mount: bool = True, other_user: bool = False,
                     out: Path | None = None) -> subprocess.CompletedProcess:
    """Run the ``sh`` ``script`` (``$1``... are ``args``; ``$PY`` is this Python, ``$OUT`` is
    ``out``) in a user namespace: with its own mounts (``mount``), or as another uid
    (``other_user``)."""
    if other_user:
        uid = 4242 if os.getuid() != 4242 else 4243
        prefix = ["unshare", "-U", f"--map-user={uid}", f"--map-group={uid}"]
    else:
        prefix = ["unshare", "-Ur"] + (["-m"] if mount else [])
    env = {**os.environ, "PY": sys.executable, "PYTHONPATH": str(REPO), "OUT": str(out or "")}
    return subprocess.run([*prefix, "sh", "-c", script, "sh", *args], capture_output=True,
                          text=True, timeout=TIMEOUT_S, cwd=REPO, env=env)


def json_lines(proc: subprocess.CompletedProcess) -> list[dict]:
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no output (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return lines


# A shell function for the scripts above: run the hpctrain CLI, keeping its output, error and
# exit status as files NAME.out, NAME.err, NAME.rc in the folder $OUT (outside any test mount).
CLI = '''cli() { name=$1; shift; "$PY" -m hpctrain "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
             echo $? >"$OUT/$name.rc"; }
sums() { (cd "$1" && find . -type f -exec sha256sum {} + | sort) ; }
'''


def cli_result(out: Path, name: str) -> tuple[int, str, str]:
    """What ``cli NAME ...`` left in ``out``: exit status, stdout, stderr."""
    return (int((out / f"{name}.rc").read_text()), (out / f"{name}.out").read_text(),
            (out / f"{name}.err").read_text())
