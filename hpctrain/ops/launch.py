"""Submitting a chain of dependent jobs of one run (each runs the training runtime).

A chain is K jobs of the same run, each ``--dependency=afterany:<previous>``: a job starts once
the one before it has ended for good (a requeued job has not ended), resumes from the newest
checkpoint, and exits at once when the run has finished or was cancelled (the batch script's
``begin`` hook).
"""

from __future__ import annotations

from ..config import Resolved
from ..errors import HpcTrainError, UsageError
from ..runs import Run
from ..slurm.submit import Submitted, submit_training


def chain_dependency(previous_job_id: str) -> str:
    return f"afterany:{previous_job_id}"


def submit_chain(resolved: Resolved, run: Run, count: int) -> list[Submitted]:
    """``count`` jobs of one run, each waiting for the previous one to end (Slurm only)."""
    if count < 1:
        raise UsageError(f"--chain: expected at least 1 job, got {count}")
    if count > 1 and resolved.profile.scheduler != "slurm":
        raise UsageError(f"--chain needs a Slurm profile; {resolved.profile.name!r} runs on this "
                         "machine, where one job already runs to the end (drop --chain)")
    subs: list[Submitted] = []
    for i in range(count):
        dep = chain_dependency(subs[-1].job_id) if subs else None
        try:
            subs.append(submit_training(resolved, run, dependency=dep))
        except HpcTrainError as e:
            if not subs:
                raise
            raise HpcTrainError(f"{e}\nchain of run {run.id} stopped at job {i + 1} of {count}; jobs "
                                f"{', '.join(s.job_id for s in subs)} are submitted "
                                f"(`hpctrain cancel {run.id}` cancels them)") from None
    if count > 1:
        run.update_meta(chain=[s.job_id for s in subs])
    return subs
