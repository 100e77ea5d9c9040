"""Submitting a sweep: one run folder per combination.

On Slurm the runs go out as ONE job array (``--array=0-(N-1)%P``): the array's script lives in
``<runs root>/sweeps/<sweep id>/`` with its batch logs and ``sweep.yaml`` (the combinations and
their run folders); task i picks run folder i and is from then on an ordinary job of that run
(recorded as job ``<array id>_<i>``: status, cancel, requeue and resume work on it as on any
run). On a local profile the runs train one after another on this machine, each followed to its
end, and one failed run does not stop the others.

A checkpoint folder belongs to one run, so with ``checkpoint.dir`` set each run of a sweep keeps
its checkpoints in ``<checkpoint.dir>/<run id>``.
"""

from __future__ import annotations

import contextlib
import functools
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import yamlio
from ..errors import HpcTrainError, SubmissionError, UsageError
from ..runs import Run, folder_mode, now_iso
from ..slurm.render import ScriptInputs, render_sbatch
from ..slurm.submit import (Submitted, claim_checkpoints, node_python, prepare_run,
                            release_checkpoints, step_python, submit_training)
from .sweep import SweepPoint, new_sweep_dir


@dataclass
class SweepRun:
    point: SweepPoint
    run: Run
    job_id: str | None = None
    outcome: str | None = None     # local sweeps: how the run ended


@dataclass
class SweepSubmission:
    sweep_dir: Path
    array_job_id: str | None
    runs: list[SweepRun]


def prepare_sweep(points: list[SweepPoint], runs_root: Path, *,
                  source: str) -> tuple[Path, list[SweepRun]]:
    """The sweep folder and one prepared run folder per combination (nothing submitted)."""
    profile = points[0].resolved.profile
    sweep_dir = new_sweep_dir(runs_root, points[0].resolved.job.name,
                              folder_mode(profile.storage.group_readable))
    runs = []
    for p in points:
        run = prepare_run(p.resolved, runs_root, source=source, own_checkpoint_folder=True)
        run.update_meta(sweep={"id": sweep_dir.name, "dir": str(sweep_dir), "index": p.index,
                               "values": p.values})
        runs.append(SweepRun(p, run))
    _write_sweep_file(sweep_dir, runs, source=source, profile=points[0].resolved.profile.name)
    return sweep_dir, runs


def _write_sweep_file(sweep_dir: Path, runs: list[SweepRun], **info) -> None:
    """Read-modify-write ``sweep.yaml`` under the sweep folder's lock (a damaged file is an
    error, never replaced)."""
    path = sweep_dir / "sweep.yaml"
    with Run(sweep_dir).lock():
        data = yamlio.read_mapping(path, "sweep file") if path.exists() else {
            "id": sweep_dir.name, "created": now_iso()}
        data.update(info)
        data["runs"] = [{"index": r.point.index, "run": r.run.id, "run_dir": str(r.run.path),
                         "values": r.point.values, "job_id": r.job_id, "outcome": r.outcome}
                        for r in runs]
        yamlio.write_atomic(path, yamlio.dump(data))


def submit_sweep_array(sweep_dir: Path, runs: list[SweepRun], *,
                       max_parallel: int | None = None) -> SweepSubmission:
    """All runs as one Slurm job array through submitit; at most ``max_parallel`` at once."""
    from submitit.core.utils import FailedJobError

    from ..slurm.executors import RenderedSlurmArrayExecutor
    first = runs[0].point.resolved
    profile = first.profile
    inputs = ScriptInputs(run_dir=str(sweep_dir), python=node_python(profile),
                          step_python=step_python(profile), submitit_dir=str(sweep_dir / "submitit"),
                          array_run_dirs=[str(r.run.path) for r in runs],
                          array_parallelism=max_parallel)
    script = render_sbatch(first, inputs)
    yamlio.write_atomic(sweep_dir / "sbatch.sh", script)
    (sweep_dir / "logs").mkdir(exist_ok=True)
    for r in runs:
        yamlio.write_atomic(r.run.script_file, script)
        r.run.submitit_dir.mkdir(parents=True, exist_ok=True)
    try:
        executor = RenderedSlurmArrayExecutor(sweep_dir / "submitit", script, profile.world_size,
                                              node_python(profile),
                                              [r.run.submitit_dir for r in runs])
    except RuntimeError as e:
        raise HpcTrainError(f"cannot submit to Slurm from here: {e}") from None
    from ..runtime.entry import train_main
    calls = [functools.partial(train_main, str(r.run.path)) for r in runs]
    said = io.StringIO()
    claimed = []
    try:
        for r in runs:
            if claim_checkpoints(r.run, profile):
                claimed.append(r.run)
        with contextlib.redirect_stderr(said):
            jobs = executor.submit_array(calls)
    except BaseException as e:
        for run in claimed:
            release_checkpoints(run)
        if isinstance(e, FailedJobError):
            raise SubmissionError(f"sbatch refused the sweep's job array: "
                                  f"{str(e).strip() or said.getvalue().strip()}") from None
        raise
    array_id = jobs[0].job_id.split("_")[0]
    for r, job in zip(runs, jobs):
        r.job_id = job.job_id
        r.run.add_job_id(job.job_id, kind="train")
        r.run.event("submitted", job_id=job.job_id, job_kind="train", scheduler="slurm",
                    array_job_id=array_id, sweep=sweep_dir.name)
    _write_sweep_file(sweep_dir, runs, profile=profile.name, array_job_id=array_id,
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
    _write_sweep_file(sweep_dir, runs, profile=runs[0].point.resolved.profile.name)
    return SweepSubmission(sweep_dir, None, runs)


def check_max_parallel(max_parallel: int | None, scheduler: str) -> None:
    if max_parallel is not None and max_parallel < 1:
        raise UsageError(f"--max-parallel: expected at least 1, got {max_parallel}")
    if max_parallel is not None and scheduler != "slurm":
        raise UsageError("--max-parallel: a local profile runs a sweep's runs one after another; "
                         "drop --max-parallel or use a Slurm profile")
