"""Run folders, the ledger, and the attempt record written when an attempt ends."""

import json
import os
import subprocess
import threading

import pytest

from hpctrain import exit_codes
from hpctrain.attempts import finish_attempt, write_failure, write_result
from hpctrain.config import load_job, load_profile, resolve
from hpctrain.errors import RunNotFoundError
from hpctrain.runs import Run, append_jsonl, create_run, find_run, read_jsonl
from hpctrain.slurm.submit import prepare_run
from tests.conftest import REPO


@pytest.fixture
def run(tmp_path):
    r = resolve(load_job(REPO / "examples" / "tiny.yaml"), load_profile("dev-slurm"))
    return prepare_run(r, tmp_path / "runs")


def test_prepare_run_writes_resolved_files(run):
    assert run.resolved_job().name == "tiny-gpt"
    assert run.resolved_profile().name == "dev-slurm"
    meta = run.meta()
    assert meta["layout"] == "TP2×PP2×VPP2×DP1" and meta["world_size"] == 4
    assert meta["checkpoint_dir"] == str(run.path / "checkpoints")


def test_jsonl_appends_are_whole_lines_and_torn_lines_are_skipped(tmp_path):
    path = tmp_path / "x.jsonl"

    def writer(k):
        for i in range(200):
            append_jsonl(path, {"writer": k, "i": i, "pad": "x" * 500})
    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    with open(path, "a") as f:
        f.write('{"torn": ')           # a writer killed mid-line
    records = read_jsonl(path)
    assert len(records) == 800 and all(len(r["pad"]) == 500 for r in records)


def test_begin_attempt_numbers_are_unique_under_concurrency(run):
    results = []
    threads = [threading.Thread(target=lambda: results.append(run.begin_attempt())) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(results) == list(range(1, 9))


def test_find_run_by_id_prefix_and_job_id(run, tmp_path):
    root = run.path.parent
    run.add_job_id("4242")
    assert find_run(run.id, root).path == run.path
    assert find_run("4242", root).path == run.path
    assert find_run(str(run.path), root).path == run.path
    other = create_run(root, "tiny-gpt")
    other.update_meta(name="tiny-gpt")
    with pytest.raises(RunNotFoundError, match="matches 2 runs"):
        find_run("tiny-gpt", root)
    with pytest.raises(RunNotFoundError, match="no run 'nope'"):
        find_run("nope", root)


def test_finish_attempt_merges_result_and_decides(run):
    n = run.begin_attempt()
    write_result(run, n, {"attempt": n, "start_step": 0, "end_step": 17, "exit_reason": "preempted",
                          "checkpoint_saved": "step-17", "last_loss": 2.5})
    rec, decision = finish_attempt(run, n, exit_codes.PREEMPTED, scheduler="slurm", job_id="7",
                                   nodes=["n1", "n2"])
    assert decision.requeue
    assert rec["end_step"] == 17 and rec["checkpoint_saved"] == "step-17"
    assert run.ledger() == [rec]
    assert run.events()[-1]["event"] == "attempt_end"


def test_finish_attempt_without_result_uses_the_exit_code(run):
    n = run.begin_attempt()
    rec, decision = finish_attempt(run, n, 137, scheduler="slurm")
    assert rec["exit_reason"] == "killed" and not decision.requeue


def test_a_kill_after_the_final_checkpoint_does_not_undo_a_finished_attempt(run):
    """Killed on the way out (a late time-limit signal) after saving the last step: finished."""
    n = run.begin_attempt()
    write_result(run, n, {"start_step": 30, "end_step": 40, "exit_reason": "finished",
                          "checkpoint_saved": "/ck/step-00000040"})
    rec, decision = finish_attempt(run, n, 138, scheduler="slurm")
    assert rec["exit_reason"] == "finished" and not decision.requeue
    assert "then ended with exit code 138 (killed)" in rec["note"]


def test_a_rank_failing_before_the_final_save_is_a_failure_even_if_rank_0_finished(run):
    n = run.begin_attempt()
    write_result(run, n, {"start_step": 30, "end_step": 40, "exit_reason": "finished",
                          "checkpoint_saved": "/ck/step-00000035"})
    rec, _ = finish_attempt(run, n, 1, scheduler="slurm")
    assert rec["exit_reason"] == "failed" and "note" not in rec


def test_a_failed_attempt_names_the_rank_that_failed_first(run):
    """Rank 0's own error is the echo (its peer vanished); the earliest failure is the cause."""
    n = run.begin_attempt()
    write_result(run, n, {"start_step": 0, "end_step": 2, "exit_reason": "failed",
                          "message": "RuntimeError: Connection closed by peer"})
    write_failure(run, n, 0, "n1", 1000.5, "RuntimeError: Connection closed by peer")
    write_failure(run, n, 3, "n2", 1000.7, "RuntimeError: Connection closed by peer")
    write_failure(run, n, 2, "n2", 1000.1, "ValueError: bad batch")
    rec, _ = finish_attempt(run, n, exit_codes.FAILED, scheduler="slurm")
    assert rec["first_failure"]["rank"] == 2
    assert rec["message"] == "rank 2 on n2 failed first: ValueError: bad batch"


def test_failure_records_do_not_rename_an_attempt_that_was_preempted(run):
    n = run.begin_attempt()
    write_result(run, n, {"start_step": 0, "end_step": 5, "exit_reason": "preempted"})
    write_failure(run, n, 1, "n1", 1.0, "RuntimeError: Connection closed by peer")
    rec, _ = finish_attempt(run, n, exit_codes.PREEMPTED, scheduler="slurm")
    assert rec["exit_reason"] == "preempted" and "first_failure" not in rec


def test_a_cancel_event_prevents_requeue(run):
    run.event("cancel", by="test")
    n = run.begin_attempt()
    write_result(run, n, {"start_step": 0, "end_step": 5, "exit_reason": "preempted"})
    rec, decision = finish_attempt(run, n, exit_codes.PREEMPTED, scheduler="slurm")
    assert rec["exit_reason"] == "cancelled" and not decision.requeue


def test_hooks_begin_output_is_safe_to_eval(tmp_path):
    """The batch shell evals `hooks begin`; a run folder with shell characters stays inert."""
    r = resolve(load_job(REPO / "examples" / "tiny.yaml"), load_profile("dev-slurm"))
    run = prepare_run(r, tmp_path / "ru$(touch pwned) n's")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    script = ('eval "$(python3 -m hpctrain.slurm.hooks begin "$1")"; '
              'printf "%s\\n%s\\n%s" "$HPCTRAIN_ATTEMPT" "$HPCTRAIN_ATTEMPT_DIR" "$MASTER_PORT"')
    out = subprocess.run(["bash", "-c", script, "x", str(run.path)], capture_output=True, text=True,
                         env=env, cwd=tmp_path, check=True).stdout.splitlines()
    assert out[0] == "1" and out[1] == str(run.attempt_dir(1)) and int(out[2]) > 0
    assert not (tmp_path / "pwned").exists()


def test_hooks_begin_skips_finished_and_cancelled_runs(run):
    run.append_ledger({"attempt": 1, "exit_reason": "finished", "end_step": 10})
    from hpctrain.slurm.hooks import cmd_begin
    assert cmd_begin(run).strip() == "HPCTRAIN_SKIP=1"
    assert run.attempts_started() == []
