"""Submitting a run's jobs: one job, a chain of jobs, a preflight job.

Every job of a run goes through ``submit_function``: it claims the run's checkpoint folder
(a training job), writes the script (Slurm), hands it to the scheduler and records the job id
and a ``submitted`` event in the run folder. A chain is K jobs of the same run, each
``--dependency=afterany:<previous>``: a job starts once the one before it has ended for good (a
requeued job has not ended), resumes from the newest checkpoint, and exits at once when the run
has finished or was cancelled (the batch script's ``begin`` step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..config import ClusterProfile, Resolved
from ..errors import HpcTrainError, UsageError
from ..record.files import signals_held
from ..record.folder import RunFolder, folder_mode
from ..scheduler.choose import backend_for
from .scripts import script_inputs, write_script


@dataclass
class Submitted:
    run: RunFolder
    job_id: str
    job: Any  # a submitit Job


def claim_checkpoints(run: RunFolder, profile: ClusterProfile) -> bool:
    """Make the run's checkpoint folder its own before a job of it is queued (refused when the
    folder holds another run's checkpoints); True when this call claimed it."""
    from ..record import checkpoint_store as store
    return store.claim(run.checkpoint_dir(), run.id, run.path,
                       folder_mode(profile.storage.group_readable))


def release_checkpoints(run: RunFolder) -> None:
    """The submission that claimed the folder failed: leave it as it was."""
    from ..record import checkpoint_store as store
    store.release(run.checkpoint_dir(), run.id)


def submit_function(run: RunFolder, profile: ClusterProfile, function: Callable, args: tuple = (),
                    *, kind: str = "train", resolved: Resolved | None = None,
                    dependency: str | None = None, env: dict | None = None) -> Submitted:
    """Submit ``function(*args)`` to run in every rank of ``profile``'s allocation, through
    the profile's backend.

    A backend whose jobs are batch scripts (Slurm) gets the script written for ``kind`` (train
    jobs get the attempt steps, signal trap and requeue); the local backend starts one process
    per rank on this machine. The job id is recorded in the run folder.
    """
    backend = backend_for(profile)
    claimed = claim_checkpoints(run, profile) if kind == "train" else False
    # queued and recorded, or neither: a Ctrl-C between the two would leave a job running that
    # its run does not record (`runs rm` would delete its folder under it); the signal lands
    # once the job id is in run.yaml
    with signals_held():
        try:
            script = None
            if backend.batch_script:
                script = write_script(run, script_inputs(run, profile, kind=kind,
                                                         dependency=dependency),
                                      resolved=resolved, profile=profile)
            job = backend.submit(run, profile, function, args, script=script, env=env)
        except BaseException:
            if claimed:
                release_checkpoints(run)
            raise
        run.add_job_id(job.job_id, kind=kind)
        run.event("submitted", job_id=job.job_id, job_kind=kind, scheduler=backend.name,
                  dependency=dependency)
    return Submitted(run=run, job_id=job.job_id, job=job)


def submit_training(resolved: Resolved, run: RunFolder, *, dependency: str | None = None) -> Submitted:
    """One training job of ``run`` (its first, a chain link, a resubmission)."""
    from ..runtime.entry import train_main
    return submit_function(run, resolved.profile, train_main, (str(run.path),), kind="train",
                           resolved=resolved, dependency=dependency)


def chain_dependency(previous_job_id: str) -> str:
    return f"afterany:{previous_job_id}"


def check_chain(count: int, profile: ClusterProfile) -> None:
    """A chain of ``count`` > 1 jobs needs a backend whose jobs can wait for each other."""
    backend = backend_for(profile)
    if count > 1 and not backend.chains:
        raise UsageError(f"--chain needs a Slurm profile; {profile.name!r} runs "
                         f"{backend.where()}, where one job already runs to the end (drop --chain)")


def submit_chain(resolved: Resolved, run: RunFolder, count: int) -> list[Submitted]:
    """``count`` jobs of one run, each waiting for the previous one to end (Slurm only)."""
    if count < 1:
        raise UsageError(f"--chain: expected at least 1 job, got {count}")
    check_chain(count, resolved.profile)
    subs: list[Submitted] = []
    for i in range(count):
        dep = chain_dependency(subs[-1].job_id) if subs else None
        try:
            subs.append(submit_training(resolved, run, dependency=dep))
        except HpcTrainError as e:
            if not subs:
                raise
            raise HpcTrainError(f"{e}; chain of run {run.id} stopped at job {i + 1} of {count}; jobs "
                                f"{', '.join(s.job_id for s in subs)} are submitted "
                                f"(`hpctrain cancel {run.id}` cancels them)") from None
    if count > 1:
        run.update_meta(chain=[s.job_id for s in subs])
    return subs


def submit_preflight(run: RunFolder, profile: ClusterProfile) -> Submitted:
    """The preflight job of a run folder from ``prepare_preflight_run``: every rank runs the
    checks and rank 0 writes ``RUN/preflight/report-*.json``."""
    from ..preflight.job import preflight_main
    return submit_function(run, profile, preflight_main, (str(run.path),), kind="preflight")
