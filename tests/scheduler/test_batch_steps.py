"""The steps the batch shell delegates to Python (``python -m hpctrain.scheduler.slurm.batch_steps``): the
begin step's shell assignments, the signal decision, the end step's record."""

import os
import subprocess
import sys

import pytest

from hpctrain.config import load_job, load_profile, resolve
from hpctrain.scheduler.slurm.batch_steps import cmd_begin, parse_slurm_time, signal_action
from hpctrain.submission import prepare_run
from tests.conftest import REPO


@pytest.fixture
def run(tmp_path):
    r = resolve(load_job(REPO / "examples" / "tiny.yaml"), load_profile("dev-slurm"))
    return prepare_run(r, tmp_path / "runs")


def test_parse_slurm_time():
    import datetime as dt
    t = parse_slurm_time("2026-11-25T22:28:51")
    assert dt.datetime.fromtimestamp(t).strftime("%H:%M:%S") == "22:28:51"
    assert parse_slurm_time("Unknown") is None and parse_slurm_time("N/A") is None


def test_signal_action_defers_only_an_early_time_limit_warning():
    end = 10_000.0
    # the warning arrives 40 s before a 25 s lead: re-raise it 15 s later
    assert signal_action(end - 40, end, 25, False, "USR1") == ("defer", 15.0)
    # at (or a few seconds from) the lead time: pass it on
    assert signal_action(end - 27, end, 25, False, "USR1") == ("now", 0.0)
    # a preemption, SIGTERM, or no known end: at once
    assert signal_action(end - 40, end, 25, True, "USR1") == ("now", 0.0)
    assert signal_action(end - 40, end, 25, False, "TERM") == ("now", 0.0)
    assert signal_action(end - 40, None, 25, False, "USR1") == ("now", 0.0)
    # far from the end it cannot be Slurm's warning (a person's drill): at once
    assert signal_action(end - 600, end, 25, False, "USR1") == ("now", 0.0)


def test_begin_output_is_safe_to_eval(tmp_path):
    """The batch shell evals `batch_steps begin`; a run folder with shell characters stays inert."""
    r = resolve(load_job(REPO / "examples" / "tiny.yaml"), load_profile("dev-slurm"))
    run = prepare_run(r, tmp_path / "ru$(touch pwned) n's")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    script = ('eval "$(python3 -m hpctrain.scheduler.slurm.batch_steps begin "$1")"; '
              'printf "%s\\n%s\\n%s" "$HPCTRAIN_ATTEMPT" "$HPCTRAIN_ATTEMPT_DIR" "$MASTER_PORT"')
    out = subprocess.run(["bash", "-c", script, "x", str(run.path)], capture_output=True, text=True,
                         env=env, cwd=tmp_path, check=True).stdout.splitlines()
    assert out[0] == "1" and out[1] == str(run.attempt_dir(1)) and int(out[2]) > 0
    assert not (tmp_path / "pwned").exists()


def test_begin_skips_finished_and_cancelled_runs(run):
    run.append_ledger({"attempt": 1, "exit_reason": "finished", "end_step": 10})
    assert cmd_begin(run).strip() == "HPCTRAIN_SKIP=1"
    assert run.attempts_started() == []


def test_end_reports_an_unreadable_ledger_and_does_not_requeue(run):
    run.ledger_file.mkdir()                    # exists, cannot be read as a file
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    end = subprocess.run([sys.executable, "-m", "hpctrain.scheduler.slurm.batch_steps", "end", str(run.path),
                          "--attempt", "1", "--exit-code", "75"], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=120)
    assert end.returncode == 2 and end.stdout == ""          # no HPCTRAIN_REQUEUE=1 to eval
    assert f"[hpctrain] Error: cannot read {run.ledger_file}" in end.stderr
    assert "Traceback" not in end.stderr and run.ledger_file.is_dir()


def test_an_attempt_whose_batch_shell_was_killed_is_recorded_when_the_next_begins(run,
                                                                                 monkeypatch):
    """A preemption whose grace time ran out before the batch shell wrote the ledger: rank 0
    had saved and written result.json, then Slurm killed the whole job. The requeued job's
    begin records the lost attempt (as preempted, with its checkpoint and job id), so the ledger
    counts every attempt; an attempt that left nothing at all is recorded as unknown."""
    import time as _time

    from hpctrain.record.attempt_end import write_result
    from hpctrain.record.attempt_records import AttemptResult
    for k in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("SLURM_JOB_ID", "")
    cmd_begin(run)                                             # attempt 1 begins ...
    run.event("attempt_start", attempt=1, job_id="4242", restart_count=0, nodes="n1")
    started = _time.time() - 30
    saved = str(run.path / "checkpoints" / "step-00000007")
    write_result(run, 1, AttemptResult(attempt=1, start_step=0, end_step=7,
                                       exit_reason="preempted", checkpoint_saved=saved,
                                       start_time=started, last_loss=3.5))
    # ... and its batch shell is killed before `end`: no ledger record
    last_write = started + 12.345                  # rank 0's result, its last file
    os.utime(run.attempt_dir(1) / "result.json", (last_write, last_write))
    assert run.ledger() == []
    out = cmd_begin(run)                                       # the requeued job begins
    assert "HPCTRAIN_ATTEMPT=2" in out
    (first,) = run.ledger()
    assert first["attempt"] == 1 and first["exit_reason"] == "preempted"
    assert first["end_step"] == 7 and first["checkpoint_saved"] == saved
    assert first["job_id"] == "4242" and first["decision"]["requeue"] is True
    assert first["note"].startswith("recorded when attempt 2 began")
    assert first["restart_count"] == 0 and first["start_time"] == started
    # its end: when its last file was written (result.json), not when it was recorded
    assert first["end_time"] == pytest.approx(last_write, abs=1e-3)
    assert first["duration_s"] == 12.3
    # attempt 2, Slurm's first restart, is lost without a trace (killed before rank 0 wrote
    # anything): unknown
    run.event("attempt_start", attempt=2, job_id="4242", restart_count=1, nodes="n1")
    cmd_begin(run)
    assert [(r["attempt"], r["exit_reason"], r["restart_count"]) for r in run.ledger()] == \
        [(1, "preempted", 0), (2, "unknown", 1)]
    assert run.ledger()[0] == first                       # the earlier record is kept as it was
    assert run.attempts_started() == [1, 2, 3]


def test_a_cancelled_attempt_whose_batch_shell_was_killed_is_recorded_as_cancelled(run,
                                                                                  monkeypatch):
    """`hpctrain cancel`: the ranks save on the SIGTERM (result.json says preempted), Slurm's
    KillWait ends the batch shell before it records the attempt, and the person resumes the
    run. The resumed job's begin records the lost attempt as cancelled (what ended it), not
    requeued, though the run is no longer cancelled when it does."""
    from hpctrain.record.attempt_end import write_result
    from hpctrain.record.attempt_records import AttemptResult
    for k in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("SLURM_JOB_ID", "")
    cmd_begin(run)
    run.event("attempt_start", attempt=1, job_id="31", restart_count=0, nodes="n1")
    run.event("cancel", jobs=["31"], by="someone")
    write_result(run, 1, AttemptResult(attempt=1, start_step=0, end_step=7,
                                       exit_reason="preempted", start_time=100.0,
                                       checkpoint_saved=str(run.path / "ck" / "step-00000007")))
    run.event("resume", job_id="32", by="someone")
    assert not run.cancelled()
    cmd_begin(run)                                             # the resumed job begins
    (first,) = run.ledger()
    assert (first["attempt"], first["exit_reason"], first["end_step"]) == (1, "cancelled", 7)
    assert first["decision"]["requeue"] is False
    # a preemption that only happened to come after an earlier, reopened cancel stays one
    run.event("attempt_start", attempt=2, job_id="32", restart_count=0, nodes="n1")
    write_result(run, 2, AttemptResult(attempt=2, start_step=7, end_step=9,
                                       exit_reason="preempted", start_time=200.0))
    cmd_begin(run)
    assert run.ledger()[1]["exit_reason"] == "preempted"
