"""`submit --chain`: K jobs of one run, each waiting for the previous one (afterany). The first
is stopped with no requeue budget left; the second resumes from its checkpoint and finishes; the
third finds the run finished and exits at once."""

from __future__ import annotations

import json
import subprocess

import pytest

from hpctrain.submission import submit_chain
from tests.conftest import wait_until
from tests.ops.helpers import cli, ops_profile, ops_resolved, ops_run, wait_ledger, wait_step, wait_stopped

pytestmark = [pytest.mark.slurm, pytest.mark.megatron]


def test_a_chain_of_jobs_continues_one_run(slurm_cluster, tmp_path):
    root = tmp_path / "runs"
    resolved = ops_resolved(ops_profile(step_s=0.1, hold_after=4, max_requeues=0), steps=24)
    run = ops_run(root, resolved)
    first, second, third = [s.job_id for s in submit_chain(resolved, run, 3)]
    assert run.job_ids() == [first, second, third] and run.meta()["chain"] == [first, second, third]
    wait_step(run, 4)
    data = json.loads(cli(root, "status", run.id, "--json").stdout)
    assert [(j["job_id"], j["state"], j["reason"]) for j in data["jobs"]][1:] == \
        [(second, "PENDING", "Dependency"), (third, "PENDING", "Dependency")]
    assert data["state"] == "RUNNING" and data["job_id"] == first
    subprocess.run(["scancel", "--full", "-s", "USR1", first], check=True)
    ledger = wait_ledger(run, 2, timeout=300)
    wait_stopped(run, timeout=180)
    one, two = run.ledger()
    assert (one["job_id"], one["exit_reason"], one["decision"]["requeue"]) == (first, "preempted", False)
    assert "requeue budget spent" in one["decision"]["reason"]
    assert (two["job_id"], two["exit_reason"], two["end_step"]) == (second, "finished", 24)
    assert two["start_step"] == one["end_step"] > 0
    # the third job started after the second and exited at once: no attempt, no ledger record
    assert len(ledger) == 2 and len(run.ledger()) == 2 and run.attempts_started() == [1, 2]
    log = run.path / "logs" / f"slurm-{third}.log"
    wait_until(lambda: log.exists() and "already finished" in log.read_text(), 30,
               what="the third job's log")
    text = cli(root, "status", run.id).stdout
    assert "State       FINISHED" in text and f"job {third}" in text
