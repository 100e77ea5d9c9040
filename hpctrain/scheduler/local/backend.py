"""The local backend: a job is submitit's local controller on this machine, starting one process
per rank; its "job id" is the controller's pid, running while ``/proc/<pid>/cmdline`` still
names submitit's local controller and the run's folder. One node, no chains, no job arrays, no
requeue in place (a run requeues itself: its ranks exit for the controller to start them
again)."""

from __future__ import annotations

import time
from typing import Any, Callable

from ...config import ClusterProfile, time_limit_seconds
from ...config.durations import parse_iso
from ...record.folder import RunFolder
from ..backend import Backend, JobRef, JobState
from .jobs import cancel_local, local_alive
from .submit import submit_locally


class LocalBackend(Backend):
    name = "local"
    on_this_machine = True
    max_nodes = 1

    def submit(self, run: RunFolder, profile: ClusterProfile, function: Callable, args: tuple,
               *, script: str | None = None, env: dict | None = None) -> Any:
        return submit_locally(run.path, run.submitit_dir, profile, function, args, env or {})

    def job_states(self, jobs: list[JobRef]) -> dict[str, JobState]:
        return {j.job_id: JobState(j.job_id, "RUNNING" if local_alive(j.job_id, j.run) else "ENDED",
                                   kind=j.kind) for j in jobs}

    def cancel(self, run: RunFolder, job_ids: list[str]) -> None:
        for job_id in job_ids:
            cancel_local(job_id, run)

    def elapsed_and_limit(self, run: RunFolder, job: JobState,
                          events: list[dict]) -> tuple[float | None, float | None]:
        """Since the newest attempt start (or submission) the run recorded; the profile's
        ``slurm.time_limit``, which the local controller enforces too."""
        started = next((parse_iso(e.get("time")) for e in reversed(events)
                        if e.get("event") in ("attempt_start", "submitted")), None)
        elapsed = time.time() - started.timestamp() if started else None
        try:
            limit = time_limit_seconds(run.resolved_profile()) or None
        except Exception:
            limit = None
        return elapsed, limit

    def node_list(self, job: JobState) -> str | None:
        return job.nodes or None

