"""Jobs of the local executor: the "job id" is the controller's pid, alive while
``/proc/<pid>/cmdline`` still names the local controller and this run's folder."""

from __future__ import annotations

import os
from pathlib import Path

from ...record.folder import RunFolder

CONTROLLER_MODULE = "hpctrain.scheduler.local.controller"   # what ``python -m`` runs
# hpctrain's controller, and submitit's own (which started runs submitted by earlier versions)
CONTROLLER_MODULES = (CONTROLLER_MODULE.encode(), b"submitit.local._local")


def local_alive(pid: str, run: RunFolder) -> bool:
    try:
        cmdline = Path(f"/proc/{int(pid)}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return False
    controller = any(m in cmdline for m in CONTROLLER_MODULES)
    return controller and str(run.submitit_dir).encode() in cmdline


def cancel_local(pid: str, run: RunFolder) -> bool:
    """SIGTERM the local controller (it forwards it to the ranks); False if it was gone."""
    import signal
    if not local_alive(pid, run):
        return False
    os.kill(int(pid), signal.SIGTERM)
    return True
