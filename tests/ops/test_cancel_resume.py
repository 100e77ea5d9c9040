"""`cancel` stops every job of a run and keeps its checkpoints; `resume` brings it back from the
newest checkpoint, here on another node count (the old profile is kept as history)."""

from __future__ import annotations

import pytest

from hpctrain.config import yamlio
from tests.ops.helpers import (cli, ops_profile, ops_resolved, start_run, wait_ledger, wait_step,
                               wait_stopped)

pytestmark = [pytest.mark.slurm, pytest.mark.megatron]


def test_cancel_then_resume_on_two_nodes(slurm_cluster, tmp_path):
    root = tmp_path / "runs"
    resolved = ops_resolved(ops_profile(step_s=0.1, hold_after=4), steps=24)
    run, sub = start_run(root, resolved)
    wait_step(run, 4)

    busy = cli(root, "resume", run.id, check=False)
    assert busy.returncode == 2
    assert f"run {run.id} is still running (job {sub.job_id})" in busy.stderr

    out = cli(root, "cancel", run.id).stdout
    assert out.startswith(f"Cancelled run {run.id}: job(s) {sub.job_id}. Checkpoints are kept")
    (first,) = wait_ledger(run, 1, timeout=180)
    wait_stopped(run)
    assert first["exit_reason"] == "cancelled" and first["decision"]["requeue"] is False
    saved = first["checkpoint_saved"]
    assert saved and (run.checkpoint_dir() / saved.rsplit("/", 1)[1] / "manifest.json").exists()
    kinds = [e["event"] for e in run.events()]
    assert kinds.index("cancel") < kinds.index("attempt_end")  # recorded before Slurm acted
    again = cli(root, "cancel", run.id).stdout
    assert again.startswith(f"Run {run.id} has no pending or running job (CANCELLED)")

    too_many = cli(root, "resume", run.id, "--nodes", "3", check=False)
    assert too_many.returncode == 2
    assert "cannot run on 'dev-slurm' with 3 ranks" in too_many.stderr
    assert "batch.global_batch_size: 4 is not divisible" in too_many.stderr
    assert not (run.path / "profile.1.yaml").exists()

    out = cli(root, "resume", run.id, "--nodes", "2").stdout
    assert f"Resumed run {run.id} as job " in out and f"(2 ranks), from step {first['end_step']}" in out
    old = yamlio.read_mapping(run.path / "profile.1.yaml")
    new = yamlio.read_mapping(run.profile_file)
    assert (old["slurm"]["nodes"], new["slurm"]["nodes"]) == (1, 2)
    meta = run.meta()
    assert meta["world_size"] == 2 and meta["profile_history"][0]["world_size"] == 1
    wait_ledger(run, 2, timeout=300)
    wait_stopped(run)
    second = run.ledger()[1]
    assert (second["exit_reason"], second["start_step"], second["end_step"]) == \
        ("finished", first["end_step"], 24)
    assert len(second["nodes"]) == 2 and set(second["nodes"]) <= {"n1", "n2", "n3"}
    assert cli(root, "status", run.id).stdout.count(" finished ") == 1
