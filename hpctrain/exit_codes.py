"""How an attempt ends: the exit codes shared by the ranks, the batch shell and the CLI, and the
exit reasons the run's records give.

The batch shell decides whether to requeue from the training step's exit code, so the codes
are a contract: change them only together with ``sbatch_templates/train.sbatch.j2``.
"""

from __future__ import annotations

import enum

FINISHED = 0          # training reached train.steps
FAILED = 1            # a crash; requeued only when preemption.requeue_on_failure is set
USAGE = 2             # bad input (CLI)
UNSTABLE = 3          # the loss-spike/NaN guard stopped the run: a human must look
PREFLIGHT_FAILED = 4  # preflight gate found bad nodes (they are excluded on requeue)
HUNG = 5              # a rank made no progress for health.hang_timeout_s (its node is excluded)
PREEMPTED = 75        # signal or deadline: an emergency checkpoint was saved; requeue me
LOCAL_REQUEUE = 144   # submitit's local executor restarts the tasks on this code

# Exits every rank of a step makes together, on purpose: one rank exiting so does not take the
# others down (a local launcher's ``--kill-on-bad-exit``), they are about to do the same.
NOT_A_CRASH = (FINISHED, UNSTABLE, PREEMPTED, LOCAL_REQUEUE)


class ExitReason(enum.StrEnum):
    """Why an attempt ended, as ``result.json`` and the ledger say it (the JSON holds the
    string value)."""

    FINISHED = "finished"              # reached train.steps
    PREEMPTED = "preempted"            # a signal: emergency checkpoint, requeue
    DEADLINE = "deadline"              # the time limit was near: checkpoint, requeue
    UNSTABLE = "unstable"              # the stability guard stopped the run
    FAILED = "failed"                  # a crash
    KILLED = "killed"                  # ended by a signal without a word (SIGKILL, OOM killer)
    CANCELLED = "cancelled"            # a person cancelled the run
    PREFLIGHT_FAILED = "preflight_failed"  # the preflight gate found bad nodes
    HUNG = "hung"                      # a rank stopped making progress: its node is excluded
    STRAGGLER = "straggler"            # a node ran slow: checkpoint, requeue without it
    UNKNOWN = "unknown"                # no exit code and no result


# Reasons that saved a checkpoint and want the job back.
REQUEUE_REASONS = (ExitReason.PREEMPTED, ExitReason.DEADLINE, ExitReason.STRAGGLER)

# Reasons whose requeue leaves a node out (the record's ``excluded_nodes``).
EXCLUDING_REASONS = (ExitReason.PREFLIGHT_FAILED, ExitReason.HUNG, ExitReason.STRAGGLER)

REASONS = {
    FINISHED: ExitReason.FINISHED,
    FAILED: ExitReason.FAILED,
    UNSTABLE: ExitReason.UNSTABLE,
    PREFLIGHT_FAILED: ExitReason.PREFLIGHT_FAILED,
    HUNG: ExitReason.HUNG,
    PREEMPTED: ExitReason.PREEMPTED,
    LOCAL_REQUEUE: ExitReason.PREEMPTED,
}


def reason_for(code: int | None) -> ExitReason:
    """The reason an exit code gives: the codes above first (submitit's local restart code,
    144, is above 128 but no signal), then a signal's (negative from Python's ``subprocess``,
    128 + the signal from a shell), else a failure."""
    if code is None:
        return ExitReason.UNKNOWN
    if code in REASONS:
        return REASONS[code]
    if code > 128 or code < 0:
        return ExitReason.KILLED
    return ExitReason.FAILED
