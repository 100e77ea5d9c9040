"""How a run's state is read from its jobs, ledger and events, and how the batch hooks see a
cancel and a later resume (the contract between `hpctrain cancel/resume` and the script)."""

from __future__ import annotations

import pytest

from hpctrain.record.files import RunFileError
from hpctrain.scheduler.slurm import batch_steps
from hpctrain.scheduler.slurm.commands import parse_squeue
from hpctrain.scheduler.backend import JobState
from hpctrain.view.runview import DamagedView, RunView, build_view
from tests.conftest import REPO
from tests.ops.helpers import crafted_run, record


def view(run, jobs=()):
    return RunView(run=run, meta=run.meta(), jobs=list(jobs), ledger=run.ledger(),
                   events=run.events(), attempts_started=run.attempts_started())


def test_a_run_never_submitted(tmp_path):
    v = view(crafted_run(tmp_path))
    assert (v.state, v.step, v.attempts, v.current_job) == ("NOT SUBMITTED", None, 0, None)


def test_running_job_wins_over_the_pending_chained_one(tmp_path):
    run = crafted_run(tmp_path, ledger=[record(1, 0, 12, "preempted", True, saved=12)])
    jobs = [JobState("41", "RUNNING", "None", "n[1-2]"), JobState("42", "PENDING", "Dependency")]
    v = view(run, jobs)
    assert (v.state, v.current_job.job_id, v.state_detail) == ("RUNNING", "41", "")
    v = view(run, [JobState("41", "COMPLETED"), JobState("42", "PENDING", "Dependency")])
    assert (v.state, v.current_job.job_id, v.state_detail) == ("PENDING", "42", "Dependency")


def test_the_running_job_is_current_wherever_the_queue_lists_it(tmp_path):
    """squeue lists a pending job before a running one (its captured answer): the run is
    running, on the running job."""
    run = crafted_run(tmp_path)
    listed = parse_squeue((REPO / "tests" / "fixtures" / "slurm" /
                           "squeue_running_pending.txt").read_text())
    assert [e.state for e in listed] == ["PENDING", "RUNNING"]
    v = view(run, [JobState(e.job_id, e.state, e.reason, e.nodes) for e in listed])
    assert (v.state, v.current_job.job_id, v.state_detail) == ("RUNNING", "16", "")


def test_the_last_event_is_the_newest(tmp_path):
    run = crafted_run(tmp_path, events=[{"event": "cancel", "time": "2026-11-29T01:00:00"},
                                        {"event": "resume", "time": "2026-11-29T02:00:00"}])
    v = view(run)
    assert v.last_event["event"] == "resume"
    summary = v.summary()
    assert (summary["last_event"], summary["last_event_time"]) == ("resume",
                                                                   "2026-11-29T02:00:00")


def test_one_run_s_view_names_its_damaged_file_unless_the_damage_is_wanted(tmp_path):
    """What acts on one run (status, cancel, resume) needs its records: a damaged one is an
    error naming the file; a listing asks for the damage itself and shows the run DAMAGED."""
    run = crafted_run(tmp_path)
    assert type(build_view(run)) is RunView and type(build_view(run, damaged_ok=True)) is RunView
    run.run_file.write_text("name: [unclosed\n")
    with pytest.raises(RunFileError) as e:
        build_view(run)
    assert "run.yaml" in str(e.value)
    damaged = build_view(run, damaged_ok=True)
    assert isinstance(damaged, DamagedView) and damaged.state == "DAMAGED"
    assert damaged.state_detail.startswith("run.yaml: ")


def test_finished_stopped_and_the_step_reached(tmp_path):
    run = crafted_run(tmp_path, ledger=[record(1, 0, 12, "preempted", True, saved=12),
                                        record(2, 12, 30, "finished", False, saved=30)],
                      metrics=[{"step": 29, "loss": 2.6}, {"step": 30, "loss": 2.5}])
    v = view(run, [JobState("41", "COMPLETED")])
    assert (v.state, v.step, v.loss, v.attempts) == ("FINISHED", 30, 2.5, 2)
    stopped = crafted_run(tmp_path, ledger=[record(1, 0, 5, "failed", False,
                                                   why="attempt ended with 'failed'")])
    v = view(stopped, [JobState("43", "FAILED")])
    assert v.state == "STOPPED" and v.state_detail == "failed: attempt ended with 'failed'"


def test_cancel_is_undone_by_a_later_resume_for_the_batch_hooks(tmp_path, capsys):
    run = crafted_run(tmp_path, ledger=[record(1, 0, 7, "cancelled", False, saved=7)])
    run.event("cancel", jobs=["41"])
    assert view(run, [JobState("41", "CANCELLED by 0")]).state == "CANCELLED"
    assert run.cancelled() and batch_steps.cmd_begin(run) == "HPCTRAIN_SKIP=1\n"
    assert "was cancelled" in capsys.readouterr().err
    run.event("resume", how="resubmitted")
    assert not run.cancelled() and not batch_steps.cancelled(run)
    run.event("cancel", jobs=["44"])
    assert run.cancelled()


def test_a_finished_run_stays_finished_unless_resumed_with_force(tmp_path):
    run = crafted_run(tmp_path, ledger=[record(1, 0, 30, "finished", False)])
    run.event("attempt_end", attempt=1, exit_reason="finished")
    assert run.finished() and batch_steps.cmd_begin(run) == "HPCTRAIN_SKIP=1\n"
    run.event("resume", how="resubmitted")
    assert run.finished()
    run.event("resume", how="resubmitted", force=True)
    assert not run.finished()


def test_a_resubmission_by_a_person_starts_a_fresh_requeue_budget(tmp_path):
    from hpctrain.record.attempt_end import finish_attempt, write_result
    from hpctrain.record.attempt_records import AttemptResult
    run = crafted_run(tmp_path, ledger=[record(i, 5 * i - 5, 5 * i, "preempted", True) for i in range(1, 6)]
                      + [record(6, 25, 28, "preempted", False, why="requeue budget spent")])
    assert len(run.ledger_for_budget()) == 6
    run.event("resume", how="resubmitted", ledger_records=len(run.ledger()))
    assert run.ledger_for_budget() == []
    write_result(run, 7, AttemptResult(start_step=28, end_step=33, exit_reason="preempted"))
    rec, decision = finish_attempt(run, 7, 75, scheduler="slurm")
    assert decision.requeue and decision.reason == "preempted; requeue 1 of 5"
    write_result(run, 8, AttemptResult(start_step=33, end_step=33, exit_reason="preempted"))
    _, decision = finish_attempt(run, 8, 75, scheduler="slurm")  # progress is still required
    assert not decision.requeue and decision.reason.startswith("no progress")
