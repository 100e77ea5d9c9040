"""Live state of a run's jobs: Slurm's view (squeue, then sacct) or the local controller's.

A run may own several jobs (a chain, a resume, preflight jobs); ``live_jobs`` says which are
still pending or running. For the local executor the "job id" is the controller's pid, alive
while ``/proc/<pid>/cmdline`` still names submitit's local controller and this run's folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..record.folder import RunFolder
from .local.jobs import local_alive
from .slurm import commands

ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "COMPLETING",
          "CONFIGURING", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "PREEMPTED"}


@dataclass
class JobState:
    job_id: str
    state: str            # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ... (Slurm's words)
    reason: str = ""
    nodes: str = ""
    elapsed: str = ""
    time_limit: str = ""
    end_time: str = ""
    kind: str = "train"
    start_time: str = ""  # actual start, or Slurm's expected start while pending
    partition: str = ""

    @property
    def active(self) -> bool:
        return self.state.split()[0] in ACTIVE


def job_states(run: RunFolder, kind: str | None = "train") -> list[JobState]:
    """States of the run's jobs of ``kind`` (None: all), oldest first."""
    return job_states_of_runs([run], kind)[run.path]


def job_states_of_runs(runs: list[RunFolder], kind: str | None = "train") -> dict[Path, list[JobState]]:
    """``job_states`` of many runs with one squeue and one sacct call for all of them."""
    wanted: dict[Path, list[dict]] = {}
    for run in runs:
        meta = run.meta()
        wanted[run.path] = [dict(j, scheduler=meta.get("scheduler"))
                            for j in meta.get("jobs", []) if kind is None or j.get("kind") == kind]
    slurm_ids = [j["job_id"] for jobs in wanted.values() for j in jobs if j["scheduler"] != "local"]
    kinds = {j["job_id"]: j.get("kind", "train") for jobs in wanted.values() for j in jobs}
    states = _slurm_states(slurm_ids, kinds)
    out: dict[Path, list[JobState]] = {}
    for run in runs:
        out[run.path] = [
            (JobState(j["job_id"], "RUNNING" if local_alive(j["job_id"], run) else "ENDED",
                      kind=j.get("kind", "train")) if j["scheduler"] == "local" else
             states.get(j["job_id"], JobState(j["job_id"], "UNKNOWN", kind=j.get("kind", "train"))))
            for j in wanted[run.path]]
    return out


def _slurm_states(ids: list[str], kinds: dict[str, str]) -> dict[str, JobState]:
    if not ids:
        return {}
    states: dict[str, JobState] = {}
    for q in commands.squeue(ids):
        states[q.job_id] = JobState(q.job_id, q.state, q.reason, q.nodes, q.time_used, q.time_limit,
                                    q.end_time, kinds.get(q.job_id, "train"), q.start_time,
                                    q.partition)
    missing = [i for i in ids if i not in states]
    for row in commands.sacct(missing):
        jid = row.get("JobID", "")
        if jid in missing and jid not in states:
            states[jid] = JobState(jid, row.get("State", "UNKNOWN"), row.get("Reason", ""),
                                   row.get("NodeList", ""), row.get("Elapsed", ""), "",
                                   row.get("End", ""), kinds.get(jid, "train"),
                                   row.get("Start", ""), row.get("Partition", ""))
    return states


def live_jobs(run: RunFolder, kind: str | None = "train") -> list[JobState]:
    return [s for s in job_states(run, kind) if s.active]
