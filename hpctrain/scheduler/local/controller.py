"""submitit's local controller, doing what the batch shell does under Slurm before each start of
the ranks.

submitit's controller starts the ranks again when one exits with the requeue code (144), with
a fresh timer but the environment it was given at submission. Two things must be new at every
start, so the controller sets them itself, as ``batch_steps.cmd_begin`` does for a Slurm job:

* the attempt's number, claimed in the run folder (``RunFolder.begin_attempt``: the highest
  of the log folders and the ledger, plus one, by an atomic ``mkdir``). Every rank gets the same
  number, and an attempt whose rank 0 was killed before it wrote the ledger record (an
  out-of-memory kill, a ``kill -9``) is recorded by the next start, never reused: its
  ``hang.json`` or ``failure-rank-*.json`` would be read as the new attempt's;
* the attempt's deadline, this start plus the time limit the controller enforces: the
  submission's would already be past after a requeue for the time limit, and the ranks would
  stop after one step, again and again.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from submitit.local.local import Controller

from .jobs import CONTROLLER_MODULE


def begin_local_attempt(run_dir: Path, timeout_s: float, job_id: str) -> dict[str, str]:
    """Claim the next attempt of the run at ``run_dir``, record the attempts before it that
    have no ledger record, and return the variables its ranks get."""
    from ...record.attempt_end import record_lost_attempts
    from ...record.folder import RunFolder
    run = RunFolder(run_dir)
    attempt = run.begin_attempt()
    for lost in record_lost_attempts(run, attempt, scheduler="local"):
        print(f"[hpctrain] attempt {lost} of run {run.id} ended without its ledger record "
              f"(rank 0 was killed first): recorded now", file=sys.stderr, flush=True)
    run.event("attempt_start", attempt=attempt, job_id=job_id, restart_count=0,
              nodes="localhost")
    return {"HPCTRAIN_ATTEMPT": str(attempt),
            "HPCTRAIN_DEADLINE": str(int(time.time() + timeout_s))}


class AttemptController(Controller):
    """submitit's controller; each start of the ranks is a new attempt of the run."""

    def start_tasks(self) -> None:
        os.environ.update(begin_local_attempt(Path(os.environ["HPCTRAIN_RUN_DIR"]),
                                              self.timeout_s, self.pid))
        super().start_tasks()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python -m {CONTROLLER_MODULE} SUBMITIT_FOLDER")
    AttemptController(Path(sys.argv[1])).run()
