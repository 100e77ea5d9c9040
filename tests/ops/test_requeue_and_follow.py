"""`requeue` of a running job (Slurm stops it, the ranks save on SIGTERM, it comes back and
resumes), watched by `logs --follow`, which keeps going across the requeue and ends with the run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.ops.helpers import cli, fake_profile, fake_resolved, start_fake_run, wait_ledger, wait_step

pytestmark = pytest.mark.slurm


def test_requeue_a_running_job_while_following_its_logs(slurm_cluster, tmp_path):
    root = tmp_path / "runs"
    resolved = fake_resolved(fake_profile(ranks_per_node=1, step_s=0.25), steps=24)
    run, sub = start_fake_run(root, resolved)
    wait_step(run, 3)
    follower = subprocess.Popen([sys.executable, "-m", "hpctrain", "logs", run.id, "--follow"],
                                cwd=REPO, env={**os.environ, "HPCTRAIN_RUNS_DIR": str(root)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = cli(root, "requeue", run.id).stdout
        assert out.startswith(f"Requeued job {sub.job_id} of run {run.id}: Slurm stops it")
        first, second = wait_ledger(run, 2, timeout=150)
        stdout, stderr = follower.communicate(timeout=60)
    finally:
        follower.kill()
    assert follower.returncode == 0, stderr
    assert first["exit_reason"] == "preempted" and first["job_id"] == second["job_id"] == sub.job_id
    assert second["start_step"] == first["end_step"] and second["exit_reason"] == "finished"
    requeues = [e for e in run.events() if e["event"] == "requeue"]
    assert requeues[0]["how"] == "scontrol requeue"
    lines = stdout.splitlines()
    stop = first["end_step"]
    # attempt 1's rank-0 lines, the batch shell's decision, attempt 2's lines, in that order
    i = lines.index(f"rank 0: signal at step {stop}; saved, exiting 75")
    j = next(k for k, ln in enumerate(lines) if ln.startswith("[hpctrain] attempt 1 ended: preempted"))
    k = lines.index(f"rank 0: attempt 2 starts at step {stop} from step-{stop:08d}")
    assert i < j < k and lines.index("rank 0: finished at step 24") > k
    assert lines.count("rank 0: attempt 1 starts at step 0") == 1  # printed once, not repeated
