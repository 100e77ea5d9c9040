"""Run folders a submission creates: a training run's, a preflight job's, a sweep's.

A run folder is created only after every check passed, and holds the resolved job and profile
every attempt reads (``hpctrain.record.folder`` describes the layout). Nothing is submitted here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..config import ClusterProfile, Resolved, yamlio
from ..config.schema import to_dict
from ..errors import HpcTrainError, UsageError
from ..record.files import RUN_FILE, now_iso, remove_run_folder
from ..record.sweeps import SWEEP_FILE, read_sweep
from ..record.folder import (RunFolder, checkpoint_location, checkpoint_root_folder,
                             create_run, default_runs_root, folder_mode, usable_root)
from ..view.summary_cache import CACHE_FILE
from .checks import decided
from .sweep_values import SweepPoint, new_sweep_dir


def runs_root_for(runs_dir: str | Path | None, profile: ClusterProfile) -> Path:
    """``runs_dir`` if given, else ``$HPCTRAIN_RUNS_DIR``, the profile's ``storage.runs_root``,
    or ``./runs`` (absolute: the batch script and the ranks read these paths elsewhere)."""
    if runs_dir:
        return usable_root(runs_dir, "--runs-dir")
    return default_runs_root(profile.storage.runs_root)


def check_checkpoint_dir(job, runs_root: Path | None, own_checkpoint_folder: bool,
                         profile: ClusterProfile | None = None) -> None:
    """The checks of the run's checkpoint folder that :func:`prepare_run` makes before it
    creates anything (a sweep makes them for every point before its folder exists; ``validate``
    makes them too): ``job``'s ``checkpoint.dir``, else ``profile``'s
    ``storage.checkpoint_root``, whichever decides it (:func:`checkpoint_location`). Under a
    ``checkpoint_root`` each run keeps ``<root>/<run id>``, a folder new and its own as a
    sweep's point's is, so only the root's place is checked: not inside another run's folder,
    not a folder of run folders, not a file or a symlink loop."""
    from ..record import checkpoint_store as store
    if not job.checkpoint.dir:
        root = profile.storage.checkpoint_root if profile is not None else None
        if root:
            store.check_location(checkpoint_root_path(root), None, runs_root,
                                 field="storage.checkpoint_root")
        return
    if not own_checkpoint_folder:
        store.check_owner(Path(job.checkpoint.dir), "")
    store.check_location(Path(job.checkpoint.dir), None, runs_root)
    if not own_checkpoint_folder:
        store.check_entries(Path(job.checkpoint.dir))


def checkpoint_root_path(root: str) -> Path:
    """The profile's ``storage.checkpoint_root`` as :func:`checkpoint_location` reads it
    (``~`` expanded); a ``~user`` of no such user is a UsageError naming the field."""
    try:
        return checkpoint_root_folder(root)
    except RuntimeError:
        raise UsageError(f"storage.checkpoint_root: {root.split('/')[0]} is no user's home "
                         f"folder here; name a folder (or set it to null: each run keeps its "
                         f"checkpoints in its own folder)") from None


def prepare_run(resolved: Resolved, runs_root: Path, *, source: str = "",
                own_checkpoint_folder: bool = False) -> RunFolder:
    """A new run folder holding the resolved job and profile (what every attempt reads).

    A ``checkpoint.dir`` that holds another run's checkpoints, or lies inside another run's
    folder or holds run folders, or whose ``latest`` no save could rewrite (a FIFO, a link), is
    refused before anything is created; so is a profile's ``storage.checkpoint_root`` (when no
    ``checkpoint.dir`` is set) in such a place. ``own_checkpoint_folder`` (sweeps): the run
    keeps its
    checkpoints in ``<checkpoint.dir>/<run id>``, so runs of one job file never share a folder;
    that folder is new and empty, and no save writes the parent's ``latest``, so neither its
    owner nor its entries are the run's to check.
    """
    job, profile = resolved.job, resolved.profile
    check_checkpoint_dir(job, runs_root, own_checkpoint_folder, profile)
    run = create_run(runs_root, job.name, folder_mode(profile.storage.group_readable))
    if job.checkpoint.dir and own_checkpoint_folder:
        job.checkpoint.dir = str(Path(job.checkpoint.dir) / run.id)
    job = decided(resolved).job           # the run records the format every attempt uses
    try:
        yamlio.write_atomic(run.job_file, yamlio.dump(to_dict(job)))
        yamlio.write_atomic(run.profile_file, yamlio.dump(to_dict(profile)))
        run.update_meta(run_id=run.id, name=job.name, profile=profile.name,
                        scheduler=profile.scheduler, created=now_iso(),
                        hpctrain_version=__version__, job_source=source,
                        layout=resolved.layout.describe(), world_size=profile.world_size,
                        total_steps=job.train.steps,
                        checkpoint_dir=str(checkpoint_location(run, job, profile)), jobs=[])
        run.logs_dir.mkdir(parents=True, exist_ok=True)
    except BaseException:
        # the storage refused it (full, read-only), a value was refused on its way to a file,
        # or the command was interrupted (Ctrl-C, SIGTERM): no half run is left, in particular
        # no folder without its run.yaml, which `hpctrain runs` would not list nor `runs rm`
        # and `runs prune` remove
        remove_refused_run(run)
        raise
    return run


# What a submission writes into a run folder, and into a sweep's folder, before its first job
# is queued (``logs`` and ``checkpoints`` stay empty until a job runs). A refused submission
# removes a folder it created only while it holds nothing else.
PREPARED_RUN = frozenset({RUN_FILE, "job.yaml", "profile.yaml", ".lock", "sbatch.sh", "submitit",
                          "logs", "checkpoints", CACHE_FILE})
PREPARED_SWEEP = frozenset({SWEEP_FILE, ".lock", "sbatch.sh", "submitit", "logs"})
_EMPTY_UNTIL_A_JOB_RUNS = ("logs", "checkpoints")


def remove_refused_run(run: RunFolder) -> bool:
    """Remove the run folder that ``prepare_run`` created in this same submission when its
    first job never reached the scheduler: sbatch refused it, another submission claimed
    ``checkpoint.dir`` between this one's check and its claim, or the storage refused the
    folder's files (full, read-only). A run that never reached the scheduler has nothing to
    show in ``hpctrain runs`` but clutter, and the refusal is what the user is told.

    Only a folder that records no job and holds nothing but what a submission writes before
    its first job (``PREPARED_RUN``, with ``logs`` and ``checkpoints`` empty) is removed: never
    another run's files, nothing a job wrote. True when it was removed; if that fails, the
    refusal is still what the user sees, and the empty run can be removed with ``runs rm``."""
    if not _only_what_a_submission_wrote(run):
        return False
    try:
        remove_run_folder(run.path)
        return True
    except (OSError, HpcTrainError):
        return False


def _only_what_a_submission_wrote(run: RunFolder) -> bool:
    """Whether ``run`` records no job and holds nothing but ``PREPARED_RUN`` (False when that
    cannot be read: a damaged ``run.yaml``, a folder that cannot be listed)."""
    try:
        return not run.job_ids(kind=None) and holds_only(run.path, PREPARED_RUN)
    except (OSError, HpcTrainError):
        return False


def holds_only(folder: Path, names: frozenset) -> bool:
    """Whether ``folder`` holds no entry but ``names``, its ``logs`` and ``checkpoints`` (if
    any) being empty folders. Nothing is followed or opened but the folder itself."""
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name not in names:
                return False
            if entry.name in _EMPTY_UNTIL_A_JOB_RUNS:
                if not entry.is_dir(follow_symlinks=False):
                    return False
                with os.scandir(entry.path) as inside:
                    if next(inside, None) is not None:
                        return False
    return True


def prepare_preflight_run(profile: ClusterProfile, runs_root: Path) -> RunFolder:
    """A run folder for one preflight job over ``profile``'s allocation (its report and logs
    land in ``RUN/preflight``)."""
    run = create_run(runs_root, f"preflight-{profile.name}")
    yamlio.write_atomic(run.profile_file, yamlio.dump(to_dict(profile)))
    run.update_meta(run_id=run.id, name=run.id, kind="preflight", profile=profile.name,
                    scheduler=profile.scheduler, created=now_iso(), hpctrain_version=__version__,
                    world_size=profile.world_size, jobs=[])
    run.logs_dir.mkdir(parents=True, exist_ok=True)  # the batch script logs there
    return run                      # RUN/preflight is made by the job (preflight_main)


# ---- sweeps ----------------------------------------------------------------------------------


@dataclass
class SweepRun:
    point: SweepPoint
    run: RunFolder
    job_id: str | None = None
    outcome: str | None = None     # local sweeps: how the run ended


def prepare_sweep(points: list[SweepPoint], runs_root: Path, *,
                  source: str) -> tuple[Path, list[SweepRun]]:
    """The sweep folder and one prepared run folder per combination (nothing submitted)."""
    profile = points[0].resolved.profile
    for p in points:            # every point's refusal before the sweep's folder exists
        check_checkpoint_dir(p.resolved.job, runs_root, own_checkpoint_folder=True,
                             profile=p.resolved.profile)
    sweep_dir = new_sweep_dir(runs_root, points[0].resolved.job.name,
                              folder_mode(profile.storage.group_readable))
    runs: list[SweepRun] = []
    try:
        for p in points:
            run = prepare_run(p.resolved, runs_root, source=source, own_checkpoint_folder=True)
            runs.append(SweepRun(p, run))
            run.update_meta(sweep={"id": sweep_dir.name, "dir": str(sweep_dir),
                                   "index": p.index, "values": p.values})
        write_sweep_file(sweep_dir, runs, source=source, profile=profile.name)
    except BaseException:
        # refused or interrupted half-way: neither the runs prepared so far nor the sweep's
        # folder (without its sweep.yaml) are left behind
        remove_refused_sweep(sweep_dir, runs)
        raise
    return sweep_dir, runs


def remove_refused_sweep(sweep_dir: Path, runs: list[SweepRun]) -> bool:
    """Remove a sweep whose job array sbatch refused: each run folder as
    :func:`remove_refused_run` would, then the sweep's folder if it holds nothing but what the
    submission wrote (``PREPARED_SWEEP``). True when all of it was removed."""
    try:        # all or nothing, so that what the refusal says of them is true of each
        if not (holds_only(sweep_dir, PREPARED_SWEEP)
                and all(_only_what_a_submission_wrote(r.run) for r in runs)):
            return False
    except OSError:
        return False
    if not all([remove_refused_run(r.run) for r in runs]):
        return False
    try:
        remove_run_folder(sweep_dir)
        return True
    except OSError:
        return False


def write_sweep_file(sweep_dir: Path, runs: list[SweepRun], **info) -> None:
    """Read-modify-write ``sweep.yaml`` under the sweep folder's lock (a damaged file is an
    error, never replaced)."""
    path = sweep_dir / SWEEP_FILE
    with RunFolder(sweep_dir).lock():
        # read through the one door of sweep folders (a link, a FIFO or a mistyped field is
        # an error naming it, and nothing is written)
        data = read_sweep(sweep_dir).data if os.path.lexists(path) else {
            "id": sweep_dir.name, "created": now_iso()}
        data.update(info)
        data["runs"] = [{"index": r.point.index, "run": r.run.id, "run_dir": str(r.run.path),
                         "values": r.point.values, "job_id": r.job_id, "outcome": r.outcome}
                        for r in runs]
        yamlio.write_atomic(path, yamlio.dump(data))
