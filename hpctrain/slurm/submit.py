"""Create a run folder and submit a job through submitit (Slurm or the local executor).

``prepare_run`` writes the resolved job and profile into a new run folder; ``submit_run``
renders the script (Slurm) and submits the runtime's entry point; ``submit_function`` is the
general form other features use (preflight jobs run their own function the same way).
Submission failures surface as ``SubmissionError`` with what sbatch said.
"""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import __version__
from ..config import ClusterProfile, Resolved, time_limit_seconds, yamlio
from ..config.schema import to_dict
from ..errors import HpcTrainError, SubmissionError
from ..identity import free_port
from ..runs import Run, checkpoint_location, create_run, folder_mode
from .render import ScriptInputs, render_sbatch, render_step_script


@dataclass
class Submitted:
    run: Run
    job_id: str
    job: Any  # a submitit Job


def node_python(profile: ClusterProfile) -> str:
    return profile.python or sys.executable


def step_python(profile: ClusterProfile) -> str:
    return profile.container.python if profile.container.image else node_python(profile)


def script_inputs(run: Run, profile: ClusterProfile, *, kind: str = "train",
                  dependency: str | None = None) -> ScriptInputs:
    return ScriptInputs(run_dir=str(run.path), python=node_python(profile),
                        step_python=step_python(profile), submitit_dir=str(run.submitit_dir),
                        kind=kind, dependency=dependency)


def prepare_run(resolved: Resolved, runs_root: Path, *, source: str = "",
                own_checkpoint_folder: bool = False) -> Run:
    """A new run folder holding the resolved job and profile (what every attempt reads).

    A ``checkpoint.dir`` that holds another run's checkpoints is refused before anything is
    created. ``own_checkpoint_folder`` (sweeps): the run keeps its checkpoints in
    ``<checkpoint.dir>/<run id>``, so runs of one job file never share a folder.
    """
    from ..runtime.checkpoint import store
    job, profile = resolved.job, resolved.profile
    if job.checkpoint.dir and not own_checkpoint_folder:
        store.check_owner(Path(job.checkpoint.dir), "")
    run = create_run(runs_root, job.name, folder_mode(profile.storage.group_readable))
    if job.checkpoint.dir and own_checkpoint_folder:
        job.checkpoint.dir = str(Path(job.checkpoint.dir) / run.id)
    yamlio.write_atomic(run.job_file, yamlio.dump(to_dict(job)))
    yamlio.write_atomic(run.profile_file, yamlio.dump(to_dict(profile)))
    run.update_meta(run_id=run.id, name=job.name, profile=profile.name, scheduler=profile.scheduler,
                    created=_now(), hpctrain_version=__version__, job_source=source,
                    layout=resolved.layout.describe(), world_size=profile.world_size,
                    checkpoint_dir=str(checkpoint_location(run, job, profile)), jobs=[])
    run.logs_dir.mkdir(parents=True, exist_ok=True)
    return run


def _now() -> str:
    from ..runs import now_iso
    return now_iso()


def _submit_slurm(run: Run, profile: ClusterProfile, script: str, function: Callable, args: tuple):
    from submitit.core.utils import FailedJobError
    from .executors import RenderedSlurmExecutor
    run.submitit_dir.mkdir(parents=True, exist_ok=True)
    try:
        executor = RenderedSlurmExecutor(run.submitit_dir, script, profile.world_size,
                                         node_python(profile))
    except RuntimeError as e:
        raise HpcTrainError(f"cannot submit to Slurm from here: {e} (use --profile local on a "
                            "machine without Slurm)") from None
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return executor.submit(function, *args)
    except FailedJobError as e:
        raise SubmissionError(f"sbatch refused the job: {str(e).strip() or said.getvalue().strip()}") \
            from None


def _submit_local(run: Run, profile: ClusterProfile, function: Callable, args: tuple, env: dict):
    import time

    from .executors import DetachedLocalExecutor
    run.submitit_dir.mkdir(parents=True, exist_ok=True)
    limit_s = time_limit_seconds(profile) or 24 * 3600
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port("127.0.0.1")),
           "HPCTRAIN_RUN_DIR": str(run.path), "HPCTRAIN_LOG_TO_FILE": "1",
           "HPCTRAIN_PREEMPT_SIGNAL": profile.preemption.signal,
           "SUBMITIT_PREEMPT_SIGNAL": profile.preemption.signal,
           "HPCTRAIN_DEADLINE": str(int(time.time() + limit_s)),
           **{k: str(v) for k, v in profile.env.items()}, **env}
    executor = DetachedLocalExecutor(run.submitit_dir, env, python=node_python(profile))
    executor.update_parameters(tasks_per_node=profile.slurm.gpus_per_node,
                               timeout_min=limit_s / 60,
                               signal_delay_s=profile.preemption.lead_time_s)
    return executor.submit(function, *args)


def claim_checkpoints(run: Run, profile: ClusterProfile) -> bool:
    """Make the run's checkpoint folder its own before a job of it is queued (refused when the
    folder holds another run's checkpoints); True when this call claimed it."""
    from ..runtime.checkpoint import store
    return store.claim(run.checkpoint_dir(), run.id, run.path,
                       folder_mode(profile.storage.group_readable))


def release_checkpoints(run: Run) -> None:
    """The submission that claimed the folder failed: leave it as it was."""
    from ..runtime.checkpoint import store
    store.release(run.checkpoint_dir(), run.id)


def submit_function(run: Run, profile: ClusterProfile, function: Callable, args: tuple = (),
                    *, kind: str = "train", resolved: Resolved | None = None,
                    dependency: str | None = None, env: dict | None = None) -> Submitted:
    """Submit ``function(*args)`` to run in every rank of ``profile``'s allocation.

    Slurm: renders the batch script for ``kind`` (train jobs get the attempt hooks, signal
    trap and requeue) and submits it through submitit. Local: submitit's local executor, one
    process per rank on this machine. The job id is recorded in the run folder.
    """
    claimed = claim_checkpoints(run, profile) if kind == "train" else False
    try:
        if profile.scheduler == "slurm":
            inputs = script_inputs(run, profile, kind=kind, dependency=dependency)
            if kind == "train":
                if resolved is None:
                    raise ValueError("a training submission needs the resolved job for its script")
                script = render_sbatch(resolved, inputs)
            else:
                script = render_step_script(profile, inputs)
            name = run.script_file if kind == "train" else run.path / f"{kind}.sbatch.sh"
            yamlio.write_atomic(name, script)
            job = _submit_slurm(run, profile, script, function, args)
        else:
            job = _submit_local(run, profile, function, args, env or {})
    except BaseException:
        if claimed:
            release_checkpoints(run)
        raise
    run.add_job_id(job.job_id, kind=kind)
    run.event("submitted", job_id=job.job_id, job_kind=kind, scheduler=profile.scheduler,
              dependency=dependency)
    return Submitted(run=run, job_id=job.job_id, job=job)


def submit_training(resolved: Resolved, run: Run, *, dependency: str | None = None) -> Submitted:
    from ..runtime.entry import train_main
    return submit_function(run, resolved.profile, train_main, (str(run.path),), kind="train",
                           resolved=resolved, dependency=dependency)
