"""``hpctrain runs``: the table of run folders, newest first."""

from __future__ import annotations

import os
import re
from datetime import datetime, timezone
from pathlib import Path

from ..errors import HpcTrainError
from ..record.files import REMOVING_PREFIX
from ..record.folder import RunFolder, is_run_folder
from .fmt import format_age, format_number, format_table, parse_iso


_STAMP = re.compile(r"-(\d{8}-\d{6})-[0-9a-f]{4}$")


def newest_runs(root: Path, limit: int | None = None) -> list[RunFolder]:
    """The run folders under ``root``, newest first, at most ``limit``: only the folder names
    are ordered (no file is read or stat'ed for that) and ``run.yaml`` is looked for from the
    newest down until ``limit`` runs are found."""
    found = []
    for entry in newest_folders(root):
        if len(found) == limit:
            break
        if is_run_folder(Path(entry.path)):
            found.append(RunFolder(Path(entry.path)))
    return found


def newest_folders(root: Path) -> list[os.DirEntry]:
    """The folders under ``root`` (run folders or not), newest first, by creation time: the
    one a run id carries (``<name>-<YYYYMMDD-HHMMSS>-<hex>``, the local time ``run.yaml``'s
    ``created`` also records), so ordering reads no file; ``run.yaml``'s ``created`` for a
    folder named otherwise; ties by name. A folder being removed (``REMOVING_PREFIX``, still
    holding its ``run.yaml`` while ``runs rm`` deletes it, or left by a removal stopped
    half-way) is none of them."""
    try:
        entries = [e for e in os.scandir(root)
                   if e.is_dir() and not e.name.startswith(REMOVING_PREFIX)]
    except OSError:
        return []
    # the path is made a Path only for a folder whose name carries no time (10,000 Path
    # objects cost more than the sort itself)
    return sorted(entries, key=lambda e: (_stamp(e.name, None, e.path), e.name), reverse=True)


def _stamp(name: str, run: RunFolder | None, path: str | Path | None = None) -> str:
    m = _STAMP.search(name)
    if m:
        return m.group(1)
    run = run or RunFolder(Path(path))
    try:
        return _stamp_of(run.meta().get("created"))
    except HpcTrainError:          # not a run folder (or a damaged one): last
        return ""


def _stamp_of(created) -> str:
    """``created`` (ISO, with offset) as the run id's ``YYYYMMDD-HHMMSS`` in local time."""
    when = parse_iso(str(created)) if created else None
    return when.astimezone().strftime("%Y%m%d-%H%M%S") if when else ""


def format_runs(rows: list[dict]) -> str:
    headers = ["RUN", "PROFILE", "JOB", "STATE", "STEP", "LOSS", "ATTEMPTS", "LAST EVENT"]
    body = []
    now = datetime.now(timezone.utc)
    for r in rows:
        state = r["state"] + (f" ({r['detail']})" if r.get("detail") and r["state"] != "STOPPED"
                              else "")
        event = (f"{r['last_event']} {format_age(r.get('last_event_time'), now)}"
                 if r.get("last_event") else None)
        body.append([r["run"], r.get("profile"), r.get("job_id"), state, r.get("step"),
                     format_number(r["loss"]) if r.get("loss") is not None else None,
                     r.get("attempts") or None, event])
    return format_table(headers, body)
