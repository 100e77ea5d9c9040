"""Submitting a sweep: one run folder per combination (``folders.prepare_sweep``), then

* on a backend with job arrays (Slurm), ONE job array (``--array=0-(N-1)%P``) whose script lives in
  ``<runs root>/sweeps/<sweep id>/`` with its batch logs and ``sweep.yaml`` (the combinations
  and their run folders); task i picks run folder i and is from then on an ordinary job of that
  run (recorded as job ``<array id>_<i>``: status, cancel, requeue and resume work on it as on
  any run);
* on one without (local), the runs train one after another, each followed to its end, and one
  failed run does not stop the others.

A checkpoint folder belongs to one run, so with ``checkpoint.dir`` set each run of a sweep keeps
its checkpoints in ``<checkpoint.dir>/<run id>``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import yamlio
from ..errors import HpcTrainError, UsageError
from ..record.files import signals_held
from ..record.folder import RunFolder
from ..scheduler.backend import Backend
from ..scheduler.choose import backend_for
from .folders import SweepRun, write_sweep_file
from .jobs import Submitted, claim_checkpoints, release_checkpoints, submit_training
from .scripts import script_inputs, write_script


@dataclass
class SweepSubmission:
    sweep_dir: Path
    array_job_id: str | None
    runs: list[SweepRun]


def check_max_parallel(max_parallel: int | None, backend: Backend) -> None:
    from ..limits import integer
    integer("max_parallel", max_parallel)
    if max_parallel is not None and not backend.arrays:
        raise UsageError("--max-parallel: a local profile runs a sweep's runs one after another; "
                         "drop --max-parallel or use a Slurm profile")


def write_array_script(sweep_dir: Path, runs: list[SweepRun], *,
                       max_parallel: int | None = None) -> str:
    """The job array's script in the sweep folder (what ``--dry-run`` shows, and submits)."""
    first = runs[0].point.resolved
    inputs = script_inputs(RunFolder(sweep_dir), first.profile, array_runs=[r.run for r in runs],
                           max_parallel=max_parallel)
    return write_script(RunFolder(sweep_dir), inputs, resolved=first)


def submit_sweep_array(sweep_dir: Path, runs: list[SweepRun], *,
                       max_parallel: int | None = None) -> SweepSubmission:
    """All runs as one job array (a backend with ``arrays``: Slurm, through submitit); at most
    ``max_parallel`` at once."""
    profile = runs[0].point.resolved.profile
    backend = backend_for(profile)
    script = write_array_script(sweep_dir, runs, max_parallel=max_parallel)
    (sweep_dir / "logs").mkdir(exist_ok=True)
    for r in runs:
        yamlio.write_atomic(r.run.script_file, script)
        r.run.submitit_dir.mkdir(parents=True, exist_ok=True)
    from ..runtime.entry import train_main
    calls = [functools.partial(train_main, str(r.run.path)) for r in runs]
    claimed = []
    with signals_held():       # queued and recorded in every run, or neither (submit_function)
        try:
            for r in runs:
                if claim_checkpoints(r.run, profile):
                    claimed.append(r.run)
            jobs = backend.submit_array(sweep_dir / "submitit", profile, script, calls,
                                        [r.run.submitit_dir for r in runs])
        except BaseException:
            for run in claimed:
                release_checkpoints(run)
            raise
        array_id = jobs[0].job_id.split("_")[0]
        for r, job in zip(runs, jobs):
            r.job_id = job.job_id
            r.run.add_job_id(job.job_id, kind="train")
            r.run.event("submitted", job_id=job.job_id, job_kind="train",
                        scheduler=backend.name, array_job_id=array_id, sweep=sweep_dir.name)
        write_sweep_file(sweep_dir, runs, profile=profile.name, array_job_id=array_id,
                         max_parallel=max_parallel)
    return SweepSubmission(sweep_dir, array_id, runs)


def run_sweep_locally(sweep_dir: Path, runs: list[SweepRun],
                      follow: Callable[[Submitted], str]) -> SweepSubmission:
    """Train the runs one after another on this machine; ``follow`` waits for one and says how
    it ended (``finished`` or the error), so one failure does not stop the sweep."""
    for r in runs:
        sub = submit_training(r.point.resolved, r.run)
        r.job_id = sub.job_id
        try:
            r.outcome = follow(sub)
        except HpcTrainError as e:
            r.outcome = str(e).splitlines()[0]
    write_sweep_file(sweep_dir, runs, profile=runs[0].point.resolved.profile.name)
    return SweepSubmission(sweep_dir, None, runs)
