"""`requeue` of a running job (Slurm stops it, the ranks save on SIGTERM, it comes back and
resumes), watched by `logs --follow`, which keeps going across the requeue and ends with the run."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from tests.conftest import REPO
from tests.ops.helpers import cli, ops_profile, ops_resolved, start_run, wait_ledger, wait_step

pytestmark = [pytest.mark.slurm, pytest.mark.megatron]


def _read_until(proc: subprocess.Popen, text: str, timeout: float) -> str:
    """``proc``'s stdout up to and including the first line holding ``text`` (all of it if
    the process ends first); AssertionError after ``timeout`` seconds."""
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if text in line:
                break
        found.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert found.wait(timeout), f"no {text!r} from the follower in {timeout} s: {''.join(lines)}"
    return "".join(lines)


@pytest.fixture(scope="module")
def requeued(slurm_cluster, tmp_path_factory):
    """The scenario, once: a run held at step 4, `logs --follow` started, `requeue`, both
    attempts recorded, the follower's output collected."""
    root = tmp_path_factory.mktemp("requeue-follow") / "runs"
    resolved = ops_resolved(ops_profile(step_s=0.1, hold_after=4), steps=24)
    run, sub = start_run(root, resolved)
    wait_step(run, 4)
    follower = subprocess.Popen([sys.executable, "-m", "hpctrain", "logs", run.id, "--follow"],
                                cwd=REPO, env={**os.environ, "HPCTRAIN_RUNS_DIR": str(root),
                                               "PYTHONUNBUFFERED": "1"},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # requeue only once the follower is following: it has shown the log so far (step 4),
        # and what it shows next is what came after (a follower started after the requeue
        # would rightly skip attempt 1's end, already written before it started)
        shown = _read_until(follower, "rank 0: step 4/", timeout=300)
        requeue = cli(root, "requeue", run.id, check=False)
        ledger = wait_ledger(run, 2, timeout=300) if requeue.returncode == 0 else []
        stdout, stderr = follower.communicate(timeout=120)
        stdout = shown + stdout
    finally:
        follower.kill()
    return {"run": run, "job_id": sub.job_id, "requeue": requeue, "ledger": ledger,
            "follow_code": follower.returncode, "stdout": stdout, "stderr": stderr}


def test_requeue_stops_the_job_and_it_resumes_where_it_saved(requeued):
    run, job_id, out = requeued["run"], requeued["job_id"], requeued["requeue"]
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"Requeued job {job_id} of run {run.id}: Slurm stops it")
    first, second = requeued["ledger"]
    assert first["exit_reason"] == "preempted" and first["job_id"] == second["job_id"] == job_id
    assert second["start_step"] == first["end_step"] and second["exit_reason"] == "finished"
    requeues = [e for e in run.events() if e["event"] == "requeue"]
    assert requeues[0]["how"] == "scontrol requeue"


def test_logs_follow_keeps_going_across_the_requeue_and_ends_with_the_run(requeued):
    run, stdout = requeued["run"], requeued["stdout"]
    assert requeued["follow_code"] == 0, requeued["stderr"]
    first = requeued["ledger"][0]
    lines = stdout.splitlines()
    stop = first["end_step"]

    def where(text: str) -> int:
        found = [n for n, line in enumerate(lines) if text in line]
        assert len(found) == 1, f"{text!r} {len(found)} times in:\n{stdout}"  # once, not repeated
        return found[0]

    # attempt 1's rank-0 lines, the batch shell's decision, attempt 2's lines, in that order
    i = where(f"rank 0: checkpoint: saved step {stop} (emergency")
    j = where("[hpctrain] attempt 1 ended: preempted")
    k = where(f"rank 0: checkpoint: resumed from {run.checkpoint_dir() / f'step-{stop:08d}'}")
    assert where(f"rank 0: run {run.id} attempt 1:") < i < j < k
    assert where("rank 0: attempt 2 ended: finished at step 24") > k
