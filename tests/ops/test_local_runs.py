"""The same commands on the local profile (submitit's local executor on this machine): the job
id is the controller's pid, cancel sends it SIGTERM, a running job cannot be requeued in place,
resume follows the new attempt to its end; a local sweep trains its runs one after another."""

from __future__ import annotations

import dataclasses

import pytest

from hpctrain.config import load_profile
from hpctrain.scheduler.state import live_jobs
from hpctrain.submission import prepare_sweep, run_sweep_locally
from hpctrain.submission.sweep_values import expand
from tests.conftest import wait_until
from tests.ops.helpers import OPS_JOB, cli, ops_job, ops_resolved, slowed, start_run, wait_step

pytestmark = pytest.mark.megatron


def local_profile(step_s: float, hold_after: int | None = None):
    """The local profile with one rank (tiny-ops.yaml's TP1 × PP1)."""
    p = load_profile("local")
    return slowed(dataclasses.replace(p, slurm=dataclasses.replace(p.slurm, gpus_per_node=1)),
                  step_s, hold_after)


def test_cancel_requeue_and_resume_on_the_local_profile(tmp_path):
    root = tmp_path / "runs"
    run, sub = start_run(root, ops_resolved(local_profile(0.1, hold_after=4), steps=40))
    wait_step(run, 4)
    status = cli(root, "status", run.id).stdout
    assert f"State       RUNNING, job {sub.job_id}" in status
    refused = cli(root, "requeue", run.id, check=False)
    assert refused.returncode == 2 and "cannot be requeued in place" in refused.stderr
    assert cli(root, "cancel", run.id).stdout.startswith(f"Cancelled run {run.id}: job(s) {sub.job_id}.")
    wait_until(lambda: not live_jobs(run) and run.ledger(), 90, what="the local run to stop")
    (first,) = run.ledger()
    assert first["exit_reason"] == "cancelled" and first["scheduler"] == "local"
    assert first["checkpoint_saved"] and first["end_step"] >= 4
    assert "State       CANCELLED" in cli(root, "status", run.id).stdout
    out = cli(root, "resume", run.id).stdout  # the local profile waits by default
    assert f"from step {first['end_step']}." in out.splitlines()[0]
    assert f"rank 0: run {run.id} attempt 1:" not in out  # only the new attempt is followed
    assert f"rank 0: run {run.id} attempt 2:" in out
    assert f"checkpoint: resumed from {first['checkpoint_saved']}" in out
    last = run.ledger()[-1]
    assert [r["exit_reason"] for r in run.ledger()] == ["cancelled", "finished"]
    assert (last["start_step"], last["end_step"]) == (first["end_step"], 40)
    assert out.rstrip().endswith(f"Run {run.id} finished at step 40 (loss {last['last_loss']:.4f}).")


def test_a_local_sweep_trains_its_runs_one_after_another(tmp_path):
    from hpctrain.view.follow import follow_to_end
    points = expand(ops_job(), local_profile(0.0), ["train.steps=3,5"])
    sweep_dir, runs = prepare_sweep(points, tmp_path / "runs", source=str(OPS_JOB))
    done = run_sweep_locally(sweep_dir, runs,
                             lambda sub: follow_to_end(sub.run, job=sub.job) and "finished")
    assert [r.outcome for r in done.runs] == ["finished", "finished"]
    (a,), (b,) = (r.run.ledger() for r in runs)
    assert (a["end_step"], b["end_step"]) == (3, 5)
    assert b["start_time"] >= a["end_time"] - 0.5  # the second began after the first ended
