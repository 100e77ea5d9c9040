"""``hpctrain runs rm`` and ``hpctrain runs prune``: removing run folders nobody needs.

``prune`` removes the folders of dry runs (``submit --dry-run``: a run folder and a script,
never a job); ``rm`` removes the run folders named by their exact id or path (a destructive
command does not guess from a job name or a prefix). Neither ever removes a run with a pending
or running job, whatever the scheduler says about it cannot be read, and neither touches
anything outside the run folder: checkpoints kept elsewhere (``checkpoint.dir``, the profile's
``checkpoint_root``) stay, and their place is said.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..record.files import remove_run_folder
from ..record.folder import RunFolder, expanded, is_run_folder, iter_runs


@dataclass
class Removal:
    run: RunFolder
    checkpoints_kept: Path | None    # a checkpoint folder outside the run folder, left as it is


def dry_run_folders(root: Path) -> list[RunFolder]:
    """Run folders a dry run prepared: no job was ever submitted from them."""
    found = []
    for run in iter_runs(root):
        meta = run.meta()
        if meta.get("dry_run") and not meta.get("jobs"):
            found.append(run)
    return sorted(found, key=lambda r: r.id)


def exact_runs(refs: list[str], root: Path) -> list[RunFolder]:
    """The runs named by exact id (under ``root``) or folder path, each once."""
    out: dict[Path, RunFolder] = {}
    for ref in refs:
        p = expanded(ref)
        if is_run_folder(p):
            run = RunFolder(p.resolve())
        elif is_run_folder(root / ref) and "/" not in ref and ref not in (".", ".."):
            run = RunFolder((root / ref).resolve())
        else:
            raise UsageError(f"runs rm: no run {ref!r} under {root}: give a run's full id or "
                             "folder (`hpctrain runs` lists them; a job name or prefix is not "
                             "enough to remove a run)")
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


def remove(removals: list[Removal]) -> None:
    for item in removals:
        remove_run_folder(item.run.path)


def _checkpoints_outside(run: RunFolder) -> Path | None:
    recorded = run.meta().get("checkpoint_dir")
    if not recorded:
        return None
    path = Path(recorded)
    inside = path == run.path or run.path in path.parents
    return None if inside or not path.exists() else path
