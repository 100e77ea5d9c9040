"""``hpctrain runs rm`` and ``hpctrain runs prune``: removing run folders nobody needs.

``prune`` removes the folders of dry runs (``submit --dry-run``: a run folder and a script,
never a job); ``rm`` removes the run folders named by their exact id or path (a destructive
command does not guess from a job name or a prefix). Neither ever removes a run with a pending
or running job, whatever the scheduler says about it cannot be read, and neither touches
anything outside the run folder: checkpoints kept elsewhere (``checkpoint.dir``, the profile's
``checkpoint_root``) stay, and their place is said.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..file_door import show
from ..record.files import (RUN_FILE, RunFileError, abandoned_removals, finish_removal,
                            remove_run_folder)
from ..record.folder import RunFolder, expanded, is_run_folder, iter_runs


@dataclass
class Removal:
    run: RunFolder
    checkpoints_kept: Path | None    # a checkpoint folder outside the run folder, left as it is


def not_removable(path: Path) -> str | None:
    """Why ``path`` is not a folder ``runs rm``/``prune`` may delete; None when it is. The
    one door of both commands: a listing takes any folder holding a ``run.yaml`` for a run (a
    damaged run is still listed), but removing one deletes everything under it, so it must be
    a run hpctrain made, itself, not through a link: a real folder (a link in the runs folder
    would have its target deleted, wherever that is), whose ``run.yaml`` is a regular file
    that records the run's id (another tool's folder with a ``run.yaml`` of its own is not a
    run)."""
    if os.path.islink(path):
        return (f"is a symbolic link (to {show(os.readlink(path))}); hpctrain removes run "
                "folders, never what a link points at: remove the link itself with rm")
    try:
        st = os.lstat(path / RUN_FILE)
    except OSError as e:
        return f"has no readable {RUN_FILE} ({e.strerror}); it is not a run folder"
    if not stat.S_ISREG(st.st_mode):
        return f"holds a {RUN_FILE} that is not a regular file; it is not a run folder"
    try:
        run_id = RunFolder(path).meta().get("run_id")
    except RunFileError as e:
        return f"has a {RUN_FILE} that cannot be read ({e}); remove it by hand if it is a run"
    if not isinstance(run_id, str) or not run_id:
        return (f"has a {RUN_FILE} that records no run_id: it is not a folder hpctrain made; "
                "remove it by hand if it is one")
    nested = _run_inside(path)
    if nested:
        return (f"holds another run's folder ({show(nested)}), which removing it would delete "
                "too; move that run out first")
    return None


def _run_inside(path: Path) -> Path | None:
    """A run folder in ``path`` or one level below (``RUN/x``, ``RUN/logs/x``: where a runs
    root given as a run folder put them before runs roots were refused there)."""
    for child in _folders(path):
        if is_run_folder(child):
            return child
        for grandchild in _folders(child):
            if is_run_folder(grandchild):
                return grandchild
    return None


def _folders(path: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def dry_run_folders(root: Path) -> list[RunFolder]:
    """Run folders a dry run prepared: no job was ever submitted from them. A folder that is
    not removable (:func:`not_removable`: a link, another tool's folder, a damaged run) is
    left alone, whatever its record says."""
    found = []
    for run in iter_runs(root):
        if not_removable(run.path):
            continue
        meta = run.meta()
        if meta.get("dry_run") and not meta.get("jobs"):
            found.append(run)
    return sorted(found, key=lambda r: r.id)


def exact_runs(refs: list[str], root: Path) -> list[RunFolder]:
    """The runs named by exact id (under ``root``) or folder path, each once; a folder that
    is not removable (:func:`not_removable`) is refused, and nothing is removed."""
    out: dict[Path, RunFolder] = {}
    for ref in refs:
        p = expanded(ref)
        if is_run_folder(p):
            path = p
        elif is_run_folder(root / ref) and "/" not in ref and ref not in (".", ".."):
            path = root / ref
        else:
            raise UsageError(f"runs rm: no run {ref!r} under {root}: give a run's full id or "
                             "folder (`hpctrain runs` lists them; a job name or prefix is not "
                             "enough to remove a run)")
        path = Path(os.path.abspath(path))
        why = not_removable(path)
        if why:
            raise UsageError(f"runs rm: {show(path)} {why}; nothing was removed")
        run = RunFolder(path.parent.resolve() / path.name)
        out.setdefault(run.path, run)
    return list(out.values())


def plan_removal(runs: list[RunFolder]) -> list[Removal]:
    """What removing ``runs`` would do; refused (nothing removed) if any has a live job."""
    from ..scheduler.state import job_states_of_runs
    states = job_states_of_runs(runs, kind=None)
    live = [f"{r.id} (job {', '.join(j.job_id for j in states[r.path] if j.active)})"
            for r in runs if any(j.active for j in states[r.path])]
    if live:
        raise UsageError(f"runs rm: {', '.join(live)} still pending or running; cancel first "
                         "(`hpctrain cancel RUN`); nothing was removed")
    return [Removal(r, _checkpoints_outside(r)) for r in runs]


def remove(removals: list[Removal]) -> list[bool]:
    """Remove each run folder; for each, False when another command removed it meanwhile."""
    return [remove_run_folder(item.run.path) for item in removals]


def abandoned(root: Path) -> list[Path]:
    """What removals stopped half-way (Ctrl-C, a kill) left under ``root``: run folders
    already renamed to be deleted, whose remover is gone. ``runs prune`` finishes them."""
    return abandoned_removals(root)


def finish(folder: Path) -> None:
    finish_removal(folder)


def _checkpoints_outside(run: RunFolder) -> Path | None:
    recorded = run.meta().get("checkpoint_dir")
    if not recorded:
        return None
    path = Path(recorded)
    inside = path == run.path or run.path in path.parents
    return None if inside or not path.exists() else path
