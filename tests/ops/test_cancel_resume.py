"""`cancel` stops every job of a run and keeps its checkpoints; `resume` brings it back from the
newest checkpoint, here on another node count (the old profile is kept as history).

The scenario runs once (module fixture): resume while the run is still running (refused),
cancel, cancel again, resume on a node count the layout cannot use (refused), resume on two
nodes to the end. Each phase is checked by its own test, so a failure names the phase.
"""

from __future__ import annotations

import pytest

from hpctrain.config import yamlio
from tests.ops.helpers import (cli, ops_profile, ops_resolved, start_run, wait_ledger, wait_step,
                               wait_stopped)

pytestmark = [pytest.mark.slurm, pytest.mark.megatron]


@pytest.fixture(scope="module")
def scenario(slurm_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("cancel-resume") / "runs"
    resolved = ops_resolved(ops_profile(step_s=0.1, hold_after=4), steps=24)
    run, sub = start_run(root, resolved)
    wait_step(run, 4)
    s = {"run": run, "job_id": sub.job_id, "root": root}
    s["busy"] = cli(root, "resume", run.id, check=False)
    s["cancel"] = cli(root, "cancel", run.id, check=False)
    s["first"] = wait_ledger(run, 1, timeout=180)[0]
    wait_stopped(run)
    s["events_after_cancel"] = [e["event"] for e in run.events()]
    s["cancel_again"] = cli(root, "cancel", run.id, check=False)
    s["too_many"] = cli(root, "resume", run.id, "--nodes", "3", check=False)
    s["profile_1_after_refusal"] = (run.path / "profile.1.yaml").exists()
    s["resume"] = cli(root, "resume", run.id, "--nodes", "2", check=False)
    if s["resume"].returncode == 0:
        wait_ledger(run, 2, timeout=300)
        wait_stopped(run)
    return s


def test_resume_is_refused_while_the_run_is_running(scenario):
    busy, run = scenario["busy"], scenario["run"]
    assert busy.returncode == 2
    assert f"run {run.id} is still running (job {scenario['job_id']})" in busy.stderr


def test_cancel_stops_the_job_and_keeps_the_checkpoints(scenario):
    run, first = scenario["run"], scenario["first"]
    assert scenario["cancel"].returncode == 0, scenario["cancel"].stderr
    assert scenario["cancel"].stdout.startswith(
        f"Cancelled run {run.id}: job(s) {scenario['job_id']}. Checkpoints are kept")
    assert first["exit_reason"] == "cancelled" and first["decision"]["requeue"] is False
    saved = first["checkpoint_saved"]
    assert saved and (run.checkpoint_dir() / saved.rsplit("/", 1)[1] / "manifest.json").exists()
    kinds = scenario["events_after_cancel"]
    assert kinds.index("cancel") < kinds.index("attempt_end")  # recorded before Slurm acted
    assert scenario["cancel_again"].returncode == 0, scenario["cancel_again"].stderr
    assert scenario["cancel_again"].stdout.startswith(
        f"Run {run.id} has no pending or running job (CANCELLED)")


def test_resume_on_a_node_count_the_layout_cannot_use_is_refused(scenario):
    too_many = scenario["too_many"]
    assert too_many.returncode == 2
    assert "cannot run on 'dev-slurm' with 3 ranks" in too_many.stderr
    assert "batch.global_batch_size: 4 is not divisible" in too_many.stderr
    assert not scenario["profile_1_after_refusal"]


def test_resume_on_two_nodes_finishes_from_the_cancelled_step(scenario):
    run, root, first = scenario["run"], scenario["root"], scenario["first"]
    out = scenario["resume"]
    assert out.returncode == 0, out.stderr
    assert f"Resumed run {run.id} as job " in out.stdout
    assert f"(2 ranks), from step {first['end_step']}" in out.stdout
    old = yamlio.read_mapping(run.path / "profile.1.yaml")
    new = yamlio.read_mapping(run.profile_file)
    assert (old["slurm"]["nodes"], new["slurm"]["nodes"]) == (1, 2)
    meta = run.meta()
    assert meta["world_size"] == 2 and meta["profile_history"][0]["world_size"] == 1
    second = run.ledger()[1]
    assert (second["exit_reason"], second["start_step"], second["end_step"]) == \
        ("finished", first["end_step"], 24)
    assert len(second["nodes"]) == 2 and set(second["nodes"]) <= {"n1", "n2", "n3"}
    assert cli(root, "status", run.id).stdout.count(" finished ") == 1
