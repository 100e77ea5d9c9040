"""Hand a job to the scheduler through submitit: Slurm with hpctrain's rendered script, or the
ranks on this machine through submitit's local executor.

This is the scheduler's side only: it knows submitit's executors and what sbatch says when it
refuses, and nothing of run folders' contents. Deciding what to submit (checks, run folders,
scripts, chains, sweeps) is ``hpctrain.submission``'s. Submission failures surface as
``SubmissionError`` with what sbatch said.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ..config import ClusterProfile, time_limit_seconds
from ..errors import HpcTrainError, SubmissionError
from ..identity import free_port


def node_python(profile: ClusterProfile) -> str:
    """The Python on the batch host (runs the batch steps, and submitit's task runner locally)."""
    return profile.python or sys.executable


def step_python(profile: ClusterProfile) -> str:
    """The Python inside the training step: the container's, if the profile names an image."""
    return profile.container.python if profile.container.image else node_python(profile)


@contextlib.contextmanager
def _sbatch_refusals(what: str):
    """A refusal by sbatch becomes one SubmissionError with what it said."""
    from submitit.core.utils import FailedJobError
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            yield
    except FailedJobError as e:
        raise SubmissionError(f"sbatch refused {what}: {str(e).strip() or said.getvalue().strip()}") \
            from None


def submit_to_slurm(submitit_dir: Path, profile: ClusterProfile, script: str, function: Callable,
                    args: tuple) -> Any:
    """``function(*args)`` in every task of ``script`` (already rendered); submitit's job."""
    from .executors import RenderedSlurmExecutor
    submitit_dir.mkdir(parents=True, exist_ok=True)
    try:
        executor = RenderedSlurmExecutor(submitit_dir, script, profile.world_size,
                                         node_python(profile))
    except RuntimeError as e:
        raise HpcTrainError(f"cannot submit to Slurm from here: {e} (use --profile local on a "
                            "machine without Slurm)") from None
    with _sbatch_refusals("the job"):
        return executor.submit(function, *args)


def submit_array_to_slurm(submitit_dir: Path, profile: ClusterProfile, script: str,
                          calls: list[Callable], task_folders: list[Path]) -> list[Any]:
    """One job array (``script`` holds its ``--array``); call i's pickle in ``task_folders[i]``."""
    from .executors import RenderedSlurmArrayExecutor
    try:
        executor = RenderedSlurmArrayExecutor(submitit_dir, script, profile.world_size,
                                              node_python(profile), task_folders)
    except RuntimeError as e:
        raise HpcTrainError(f"cannot submit to Slurm from here: {e}") from None
    with _sbatch_refusals("the sweep's job array"):
        return executor.submit_array(calls)


def submit_locally(run_dir: Path, submitit_dir: Path, profile: ClusterProfile,
                   function: Callable, args: tuple, env: dict) -> Any:
    """``function(*args)`` in one process per rank on this machine, under a controller that
    outlives the caller; the run's environment as the batch script would set it."""
    from .executors import DetachedLocalExecutor
    submitit_dir.mkdir(parents=True, exist_ok=True)
    limit_s = time_limit_seconds(profile) or 24 * 3600
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port("127.0.0.1")),
           "HPCTRAIN_RUN_DIR": str(run_dir), "HPCTRAIN_LOG_TO_FILE": "1",
           "HPCTRAIN_PREEMPT_SIGNAL": profile.preemption.signal,
           "SUBMITIT_PREEMPT_SIGNAL": profile.preemption.signal,
           "HPCTRAIN_DEADLINE": str(int(time.time() + limit_s)),
           **{k: str(v) for k, v in profile.env.items()}, **env}
    executor = DetachedLocalExecutor(submitit_dir, env, python=node_python(profile))
    executor.update_parameters(tasks_per_node=profile.slurm.gpus_per_node,
                               timeout_min=limit_s / 60,
                               signal_delay_s=profile.preemption.lead_time_s)
    return executor.submit(function, *args)
