"""submitit's Slurm executors, submitting hpctrain's rendered batch scripts.

* ``RenderedSlurmExecutor`` is submitit's Slurm executor with one change: the batch script it
  submits is the one hpctrain rendered from ``sbatch_templates/`` (our directives, signal trap,
  attempt bookkeeping, requeue), whose training step runs submitit's own task runner. So the user
  gets submitit's job object (sacct polling, pickled results and errors) and our script.
* ``RenderedSlurmArrayExecutor`` submits many calls as one job array through our rendered array
  script (``hpctrain submit --sweep``), each call's pickle in its own run folder.
"""

from __future__ import annotations

import shlex
import uuid
from pathlib import Path

import submitit
from submitit.core.utils import JobPaths
from submitit.slurm.slurm import SlurmJob


class RenderedSlurmExecutor(submitit.SlurmExecutor):
    """Submits a pre-rendered batch script; the pickled callable runs in every srun task."""

    def __init__(self, folder: Path, script_text: str, num_tasks: int, python: str) -> None:
        super().__init__(folder, python=shlex.quote(python))
        self._script_text = script_text
        self._tasks = num_tasks

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self._script_text

    def _num_tasks(self) -> int:
        return self._tasks


class RenderedSlurmArrayExecutor(RenderedSlurmExecutor):
    """One Slurm job array for N calls, submitted with our rendered array script.

    submitit's own array path builds a fresh plain ``SlurmExecutor`` (its own script) and keeps
    every pickle in one folder. Here the script is ours (its ``--array`` directive and the
    run-folder table indexed by ``SLURM_ARRAY_TASK_ID``), and the pickle of call i goes to
    ``task_folders[i]`` (run i's ``submitit/``), where task i of the array looks for it.
    """

    def __init__(self, folder: Path, script_text: str, num_tasks: int, python: str,
                 task_folders: list[Path]) -> None:
        super().__init__(folder, script_text, num_tasks, python)
        self._task_folders = [Path(f) for f in task_folders]

    def _internal_process_submissions(self, delayed_submissions):
        if len(delayed_submissions) != len(self._task_folders):
            raise ValueError(f"{len(delayed_submissions)} calls for {len(self._task_folders)} "
                             "array task folders")
        staging = JobPaths.get_first_id_independent_folder(self.folder)
        staging.mkdir(parents=True, exist_ok=True)
        pickles = []
        for delayed in delayed_submissions:
            path = staging / f"{uuid.uuid4().hex}.pkl"
            delayed.set_timeout(self.parameters.get("time", 5), self.max_num_timeout)
            delayed.dump(path)
            pickles.append(path)
        self._throttle()
        array = self._submit_command(self._submitit_command_str)
        jobs = []
        for i, (folder, pickle) in enumerate(zip(self._task_folders, pickles)):
            job = SlurmJob(folder=folder, job_id=f"{array.job_id}_{i}", tasks=list(range(self._tasks)))
            job.paths.move_temporary_file(pickle, "submitted_pickle")
            jobs.append(job)
        return jobs
