"""Hand a job to Slurm through submitit, with hpctrain's rendered script.

This is the scheduler's side only: it knows submitit's executors and what sbatch says when it
refuses, and nothing of run folders' contents. Deciding what to submit (checks, run folders,
scripts, chains, sweeps) is ``hpctrain.submission``'s. Submission failures surface as
``SubmissionError`` with what sbatch said.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any, Callable

from ...config import ClusterProfile
from ...errors import HpcTrainError, SubmissionError
from ..interpreters import node_python


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
    from .executor import RenderedSlurmExecutor
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
    from .executor import RenderedSlurmArrayExecutor
    try:
        executor = RenderedSlurmArrayExecutor(submitit_dir, script, profile.world_size,
                                              node_python(profile), task_folders)
    except RuntimeError as e:
        raise HpcTrainError(f"cannot submit to Slurm from here: {e}") from None
    with _sbatch_refusals("the sweep's job array"):
        return executor.submit_array(calls)
