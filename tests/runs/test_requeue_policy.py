"""The requeue decision: a reason to come back, budget left, and progress made."""

import pytest

from hpctrain.record.attempt_records import AttemptRecord
from hpctrain.record.requeue_policy import decide


def rec(reason, start, end, requeued=None):
    r = {"exit_reason": reason, "start_step": start, "end_step": end}
    if requeued is not None:
        r["decision"] = {"requeue": requeued}
    return AttemptRecord.from_dict(r)


def test_preempted_with_progress_is_requeued():
    d = decide([], rec("preempted", 0, 12), max_requeues=3)
    assert d.requeue and "requeue 1 of 3" in d.reason


@pytest.mark.parametrize("reason", ["finished", "unstable", "cancelled"])
def test_terminal_reasons_are_not_requeued(reason):
    assert not decide([], rec(reason, 0, 5), max_requeues=3).requeue


def test_failures_need_requeue_on_failure():
    assert not decide([], rec("failed", 0, 5), max_requeues=3).requeue
    assert decide([], rec("failed", 0, 5), max_requeues=3, requeue_on_failure=True).requeue
    assert decide([], rec("killed", 0, 5), max_requeues=3, requeue_on_failure=True).requeue


def test_budget_is_counted_over_the_ledger():
    ledger = [rec("preempted", 0, 5, True), rec("deadline", 5, 9, True)]
    d = decide(ledger, rec("preempted", 9, 14), max_requeues=2)
    assert not d.requeue and "budget spent (2 of preemption.max_requeues=2)" in d.reason


def test_no_progress_stops_the_loop():
    ledger = [rec("failed", 0, 3, True)]
    d = decide(ledger, rec("failed", 0, 3), max_requeues=5, requeue_on_failure=True)
    assert not d.requeue and d.reason.startswith("no progress")
    # an attempt that never reported a step made no progress either
    assert not decide([], rec("preempted", 0, None), max_requeues=5).requeue


def test_progress_is_measured_against_the_previous_attempt():
    ledger = [rec("preempted", 0, 20, True)]
    assert not decide(ledger, rec("preempted", 10, 20), max_requeues=5).requeue
    assert decide(ledger, rec("preempted", 10, 21), max_requeues=5).requeue


def test_preflight_gate_requeue_needs_no_progress_but_spends_budget():
    assert decide([], rec("preflight_failed", None, None), max_requeues=1).requeue
    ledger = [rec("preflight_failed", None, None, True)]
    assert not decide(ledger, rec("preflight_failed", None, None), max_requeues=1).requeue


def test_a_hung_or_straggler_attempt_is_requeued_without_requeue_on_failure_while_it_advances():
    assert decide([], rec("hung", 0, 10), max_requeues=3).requeue
    assert decide([], rec("straggler", 0, 4), max_requeues=3).requeue
    # a hang at the same step every attempt is a bug, not a node: stop instead of excluding
    # one node after the other
    ledger = [rec("hung", 0, 10, True)]
    d = decide(ledger, rec("hung", 8, 10), max_requeues=5)
    assert not d.requeue and d.reason.startswith("no progress")


def test_progress_is_measured_against_the_latest_of_several_attempts():
    """A run preempted three times, each attempt advancing 10 steps: the fourth attempt that
    reached step 30 again (resumed from 30 and saved nothing new) made no progress, though it is
    well past where the first and second attempts ended."""
    ledger = [rec("preempted", 0, 10, True), rec("preempted", 10, 20, True),
              rec("preempted", 20, 30, True)]
    d = decide(ledger, rec("preempted", 30, 30), max_requeues=10)
    assert not d.requeue and "did not advance past 30" in d.reason
    d = decide(ledger, rec("preempted", 30, 31), max_requeues=10)
    assert d.requeue and d.reason == "preempted; requeue 4 of 10"


def test_a_preflight_attempt_between_two_training_attempts_does_not_reset_the_baseline():
    """Attempt 1 trained to step 10, attempt 2 stopped at the preflight gate (no steps), attempt
    3 lost its checkpoints and retrained from 0 to 8: not progress past step 10."""
    ledger = [rec("preempted", 0, 10, True), rec("preflight_failed", None, None, True)]
    d = decide(ledger, rec("preempted", 0, 8), max_requeues=10)
    assert not d.requeue and "did not advance past 10" in d.reason


def test_only_requeued_attempts_spend_the_budget():
    """Attempt 2 was not requeued (a crash; the user resumed the run by hand): of three earlier
    attempts two spent budget, so a third requeue of three is still allowed."""
    ledger = [rec("preempted", 0, 10, True), rec("failed", 10, 12, False),
              rec("preempted", 12, 20, True)]
    d = decide(ledger, rec("deadline", 20, 25), max_requeues=3)
    assert d.requeue and d.reason == "deadline; requeue 3 of 3"
    ledger.append(rec("deadline", 20, 25, True))
    d = decide(ledger, rec("preempted", 25, 30), max_requeues=3)
    assert not d.requeue and "budget spent (3 of preemption.max_requeues=3)" in d.reason


def test_the_decision_says_why_a_run_stops_for_good():
    """``hpctrain status`` shows the decision's reason: a cancelled or unstable run says so, and
    a crash says which setting would have requeued it (only while that setting is off)."""
    assert decide([], rec("cancelled", 0, 5), max_requeues=3).reason == "cancelled by the user"
    assert decide([], rec("unstable", 0, 5), max_requeues=3).reason.startswith(
        "stopped by the stability guard")
    assert decide([], rec("finished", 0, 5), max_requeues=3).reason == "training finished"
    off = decide([], rec("failed", 0, 5), max_requeues=3).reason
    assert off == "attempt ended with 'failed' (preemption.requeue_on_failure is off); not requeued"
    on = decide([], rec("unknown", 0, 5), max_requeues=3, requeue_on_failure=True).reason
    assert on == "attempt ended with 'unknown'; not requeued"


def test_a_straggler_requeue_that_made_no_progress_stops():
    """Each attempt a node ran slow and was excluded, but the last one did not advance: a
    different node every time is not what is wrong, stop instead of walking the partition."""
    ledger = [rec("straggler", 0, 10, True)]
    d = decide(ledger, rec("straggler", 10, 10), max_requeues=5)
    assert not d.requeue and d.reason.startswith("no progress")


def saved(reason, start, end, checkpoint_step, requeued=None):
    r = rec(reason, start, end, requeued)
    r.checkpoint_saved = f"/runs/x/checkpoints/step-{checkpoint_step:08d}"
    return r


def test_progress_counts_from_the_checkpoint_a_lost_attempt_left():
    """Attempt 1 hung at step 150; its last checkpoint was step 100, so steps 101-150 were
    lost. Attempt 2 resumed from 100 and was preempted at 140, saving step 140: it advanced
    (100 -> 140) though it stopped short of where the lost steps ended."""
    ledger = [saved("hung", 0, 150, 100, True)]
    d = decide(ledger, saved("preempted", 100, 140, 140), max_requeues=5)
    assert d.requeue and d.reason == "preempted; requeue 2 of 5"
    # resumed from 100 and saved nothing past it: no progress, whatever step it reached
    d = decide(ledger, saved("preempted", 100, 100, 100), max_requeues=5)
    assert not d.requeue and "step 100 did not advance past 100" in d.reason


def test_a_checkpoint_saved_before_a_crash_is_how_far_the_attempt_got():
    """Attempt 1 saved step 120 and crashed at 130; attempt 2 resumed from 120 and crashed at
    130 again after saving nothing new: it retrained lost steps, it did not advance."""
    ledger = [saved("failed", 100, 130, 120, True)]
    d = decide(ledger, rec("failed", 120, 130), max_requeues=5, requeue_on_failure=True)
    assert d.requeue                   # measured by its end step (130 > 120): one more try
    ledger.append(rec("failed", 120, 130, True))
    d = decide(ledger, rec("failed", 120, 130), max_requeues=5, requeue_on_failure=True)
    assert not d.requeue and "step 130 did not advance past 130" in d.reason
