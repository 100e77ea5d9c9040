"""Whether an attempt that just ended should be requeued: a pure function of the ledger.

Requeue loops that never make progress burn allocations, so a requeue needs all of:
  * a reason to come back: preempted (signal or deadline), a preflight gate that excluded bad
    nodes, a hung rank or a straggler node (excluded), or a crash when the profile asks for
    ``requeue_on_failure``;
  * budget: fewer requeues so far than ``preemption.max_requeues``;
  * progress: the step advanced in this attempt (end step > the previous attempt's end step).
    A preflight-gate requeue is exempt (no training ran) but still spends budget.
The batch shell (Slurm) and rank 0 (local executor) both call this, so the two behave alike.
"""

from __future__ import annotations

from ..exit_codes import EXCLUDING_REASONS, REQUEUE_REASONS, ExitReason
from .attempt_records import AttemptRecord, Decision


def requeues_so_far(ledger: list[AttemptRecord]) -> int:
    return sum(1 for r in ledger if r.requeued)


def decide(ledger: list[AttemptRecord], current: AttemptRecord, max_requeues: int,
           requeue_on_failure: bool = False) -> Decision:
    """``ledger``: earlier attempts' records; ``current``: this attempt's (not yet appended)."""
    why = current.exit_reason
    if why == ExitReason.FINISHED:
        return Decision(False, "training finished")
    if why == ExitReason.CANCELLED:
        return Decision(False, "cancelled by the user")
    if why == ExitReason.UNSTABLE:
        return Decision(False, "stopped by the stability guard (see the log); not requeued")
    wanted = why in REQUEUE_REASONS or why in EXCLUDING_REASONS or (
        requeue_on_failure and why in (ExitReason.FAILED, ExitReason.KILLED))
    if not wanted:
        hint = "" if requeue_on_failure else " (preemption.requeue_on_failure is off)"
        return Decision(False, f"attempt ended with '{why}'{hint}; not requeued")
    used = requeues_so_far(ledger)
    if used >= max_requeues:
        return Decision(False, f"requeue budget spent ({used} of preemption.max_requeues="
                               f"{max_requeues}); resubmit with `hpctrain resume` after checking why")
    if why != ExitReason.PREFLIGHT_FAILED:
        start = current.start_step
        end = current.end_step
        previous_end = next((r.end_step for r in reversed(ledger) if r.end_step is not None), None)
        baseline = previous_end if previous_end is not None else start
        if end is None or (baseline is not None and end <= baseline):
            return Decision(False, f"no progress: step {end} did not advance past {baseline} in this "
                                   "attempt; stopping instead of looping")
    return Decision(True, f"{why}; requeue {used + 1} of {max_requeues}")
