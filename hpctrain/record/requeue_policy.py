"""Whether an attempt that just ended should be requeued: a pure function of the ledger.

Requeue loops that never make progress burn allocations, so a requeue needs all of:
  * a reason to come back: preempted (signal or deadline), a preflight gate that excluded bad
    nodes, a hung rank or a straggler node (excluded), or a crash when the profile asks for
    ``requeue_on_failure``;
  * budget: fewer requeues so far than ``preemption.max_requeues``;
  * progress: this attempt got further than the one before it. How far an attempt got is the
    step of the checkpoint it published, or its end step if it published none: an attempt that
    hung or crashed after its last checkpoint lost the steps after it, and the next attempt,
    resuming from that checkpoint, advances when it saves past it even if it stops short of
    where the lost steps ended. An attempt that saved nothing is measured by its end step, so
    a crash that retrains the same steps gets one more try, and the next identical one stops.
    A preflight-gate requeue is exempt (no training ran) but still spends budget.
The batch shell (Slurm) and rank 0 (local executor) both call this, so the two behave alike.
"""

from __future__ import annotations

import re
from pathlib import PurePath

from ..exit_codes import EXCLUDING_REASONS, REQUEUE_REASONS, ExitReason
from .attempt_records import AttemptRecord, Decision

_CHECKPOINT = re.compile(r"step-(\d+)")


def reached(record: AttemptRecord) -> int | None:
    """How far an attempt got for good: the step of the checkpoint it published (a path or
    name ``step-N``), else its end step."""
    saved = record.checkpoint_saved
    m = _CHECKPOINT.fullmatch(PurePath(saved).name) if isinstance(saved, str) and saved else None
    return int(m.group(1)) if m else record.end_step


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
        end = reached(current) if current.end_step is not None else None
        previous = next((reached(r) for r in reversed(ledger) if reached(r) is not None), None)
        baseline = previous if previous is not None else current.start_step
        if end is None or (baseline is not None and end <= baseline):
            return Decision(False, f"no progress: step {end} did not advance past {baseline} in this "
                                   "attempt; stopping instead of looping")
    return Decision(True, f"{why}; requeue {used + 1} of {max_requeues}")
