"""The Slurm backend: jobs are rendered batch scripts handed to sbatch through submitit; their
state comes from squeue (then sacct, once squeue has forgotten them); cancel is scancel and
requeue ``scontrol requeue``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ...config import ClusterProfile
from ...record.folder import RunFolder
from ..backend import Backend, JobRef, JobState
from . import commands
from .submit import submit_array_to_slurm, submit_to_slurm


class SlurmBackend(Backend):
    name = "slurm"
    batch_script = True
    chains = True
    arrays = True
    requeues_in_place = True

    def accounted_gpu_seconds(self, ranks_of_job: dict[str, int]) -> dict[str, float]:
        from .accounting import gpu_seconds
        return gpu_seconds(ranks_of_job)

    def submit(self, run: RunFolder, profile: ClusterProfile, function: Callable, args: tuple,
               *, script: str | None = None, env: dict | None = None) -> Any:
        if script is None:
            raise ValueError("a Slurm job needs its batch script")
        return submit_to_slurm(run.submitit_dir, profile, script, function, args)

    def submit_array(self, folder: Path, profile: ClusterProfile, script: str,
                     calls: list[Callable], task_folders: list[Path]) -> list[Any]:
        return submit_array_to_slurm(folder, profile, script, calls, task_folders)

    def job_states(self, jobs: list[JobRef]) -> dict[str, JobState]:
        ids = [j.job_id for j in jobs]
        kinds = {j.job_id: j.kind for j in jobs}
        if not ids:
            return {}
        states: dict[str, JobState] = {}
        for q in commands.squeue(ids):
            states[q.job_id] = JobState(q.job_id, q.state, q.reason, q.nodes, q.time_used,
                                        q.time_limit, q.end_time, kinds.get(q.job_id, "train"),
                                        q.start_time, q.partition)
        missing = [i for i in ids if i not in states]
        # the last row of a job is its state now: a job whose allocation shrank (a node
        # failed under --no-kill) has a RESIZING row for the allocation it had before
        for row in commands.sacct(missing):
            jid = row.get("JobID", "")
            if jid in missing:
                states[jid] = JobState(jid, row.get("State", "UNKNOWN"), row.get("Reason", ""),
                                       row.get("NodeList", ""), row.get("Elapsed", ""), "",
                                       row.get("End", ""), kinds.get(jid, "train"),
                                       row.get("Start", ""), row.get("Partition", ""))
        return states

    def cancel(self, run: RunFolder, job_ids: list[str]) -> None:
        commands.cancel(job_ids)

    def requeue(self, job_id: str) -> None:
        commands.requeue(job_id)

    def elapsed_and_limit(self, run: RunFolder, job: JobState,
                          events: list[dict]) -> tuple[float | None, float | None]:
        return commands.parse_duration(job.elapsed), commands.parse_duration(job.time_limit)

    def node_list(self, job: JobState) -> str | None:
        return job.nodes if job.nodes not in ("", "None assigned") else None
