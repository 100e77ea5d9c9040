"""A run preempted for real on the dev cluster (a job in the `high` partition takes the nodes):
it saves, Slurm requeues it, it resumes and finishes; then status, logs, runs and report tell
that story from the run folder and Slurm."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import hpctrain
from tests.ops.helpers import (cli, ops_profile, ops_resolved, png_size, start_run, wait_ledger,
                               wait_step, wait_stopped)

pytestmark = [pytest.mark.slurm, pytest.mark.megatron]


@pytest.fixture(scope="module")
def preempted_run(slurm_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("preempted") / "runs"
    resolved = ops_resolved(ops_profile(ranks_per_node=2, step_s=0.1, hold_after=6), steps=30)
    run, sub = start_run(root, resolved)
    wait_step(run, 6)
    # needs every node whole: Slurm preempts the debug job (USR1, then requeue)
    nodes = len(subprocess.run(["sinfo", "-h", "-N", "-p", "high", "-o", "%N"], capture_output=True,
                               text=True, check=True).stdout.split())
    high = subprocess.run(["sbatch", "--parsable", "-p", "high", f"--nodes={nodes}", "--exclusive",
                           "--time=1", "-o", "/dev/null", "--wrap", "sleep 1"],
                          capture_output=True, text=True).stdout.strip()
    ledger = wait_ledger(run, 2, timeout=300)
    wait_stopped(run, timeout=180)
    return {"run": run, "job_id": sub.job_id, "root": root, "high": high, "ledger": ledger}


def test_the_run_was_preempted_once_and_resumed_where_it_stopped(preempted_run):
    first, second = preempted_run["run"].ledger()
    assert first["exit_reason"] == "preempted" and first["decision"]["requeue"] is True
    assert second["exit_reason"] == "finished" and second["end_step"] == 30
    assert first["job_id"] == second["job_id"] == preempted_run["job_id"]
    assert second["restart_count"] >= 1
    assert second["start_step"] == first["end_step"] >= 6
    assert second["checkpoint_loaded"] == first["checkpoint_saved"]


def test_status_shows_both_attempts(preempted_run):
    run, root = preempted_run["run"], preempted_run["root"]
    data = json.loads(cli(root, "status", run.id, "--json").stdout)
    assert data["state"] == "FINISHED" and data["job_id"] == preempted_run["job_id"]
    assert [a["exit_reason"] for a in data["attempts"]] == ["preempted", "finished"]
    assert data["checkpoint"]["step"] == 30 and data["step"] == 30
    proc = hpctrain("status", preempted_run["job_id"], env={"HPCTRAIN_RUNS_DIR": str(root)},
                    check=True)  # by job id, through the installed entry point
    text = proc.stdout
    assert text.splitlines()[0].startswith(f"Run         {run.id}")
    assert "State       FINISHED" in text
    rows = text.split("Attempts\n", 1)[1].splitlines()
    assert rows[1].split()[:2] == ["1", preempted_run["job_id"]] and " preempted (75) " in rows[1]
    assert rows[2].split()[:2] == ["2", preempted_run["job_id"]] and " finished " in rows[2]


def test_logs_of_a_given_rank_and_attempt(preempted_run):
    run, root = preempted_run["run"], preempted_run["root"]
    stop = run.ledger()[0]["end_step"]
    out = cli(root, "logs", run.id, "--rank", "1", "--attempt", "1").stdout
    assert "global_rank=1(2)" in out and " rank 0: " not in out  # rank 1's own log, no rank 0 line
    latest = cli(root, "logs", run.id).stdout
    assert f"rank 0: run {run.id} attempt 2:" in latest and "attempt 1:" not in latest
    assert f"checkpoint: resumed from {run.checkpoint_dir() / f'step-{stop:08d}'}" in latest
    batch = cli(root, "logs", run.id, "--batch", "--attempt", "1").stdout
    assert "batch shell got SIGUSR1" in batch and "requeue" in batch
    missing = cli(root, "logs", run.id, "--rank", "7", check=False)
    assert missing.returncode == 2
    assert "no rank-7.log in attempt 2" in missing.stderr and "rank logs 0, 1" in missing.stderr
    no_such = cli(root, "logs", run.id, "--attempt", "9", check=False)
    assert no_such.returncode == 2 and no_such.stderr.strip().endswith("has attempts 1, 2")


def test_runs_lists_it_and_report_marks_the_preemption(preempted_run):
    run, root = preempted_run["run"], preempted_run["root"]
    rows = json.loads(cli(root, "runs", "--json").stdout)
    (row,) = rows
    assert (row["run"], row["state"], row["step"], row["attempts"]) == (run.id, "FINISHED", 30, 2)
    table = cli(root, "runs").stdout.splitlines()
    assert table[0].split()[:4] == ["RUN", "PROFILE", "JOB", "STATE"]
    assert table[1].split()[:5] == [run.id, "dev-slurm", preempted_run["job_id"], "FINISHED", "30"]
    proc = cli(root, "report", run.id)
    assert "Attempts    2 (1 preempted, 1 requeued)" in proc.stdout
    assert png_size(run.path / "report.png") == (1200, 900)


def test_requeue_and_resume_refuse_a_finished_run(preempted_run):
    run, root = preempted_run["run"], preempted_run["root"]
    for cmd in ("requeue", "resume"):
        proc = cli(root, cmd, run.id, check=False)
        assert proc.returncode == 2, proc.stderr
        assert f"run {run.id} finished at step 30; nothing to {cmd}" in proc.stderr
