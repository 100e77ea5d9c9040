"""`submit --sweep` on Slurm: one run folder per combination, all submitted as ONE job array with
a concurrency limit; each task trains its own run folder with its own values."""

from __future__ import annotations

import json
import subprocess

import pytest

from hpctrain.config import yamlio
from hpctrain.record import checkpoint_store as store
from hpctrain.scheduler.slurm.commands import parse_scontrol_record, sbatch_test_only
from hpctrain.submission import prepare_sweep, submit_sweep_array
from hpctrain.submission.sweep_values import expand
from tests.ops.helpers import OPS_JOB, cli, ops_job, ops_profile, wait_stopped

pytestmark = [pytest.mark.slurm, pytest.mark.megatron]


def test_sweep_runs_as_one_throttled_job_array(slurm_cluster, tmp_path):
    root = tmp_path / "runs"
    profile = ops_profile(step_s=0.0)
    points = expand(ops_job(), profile, ["train.lr=1e-3,2e-3", "train.steps=3,4"])
    for p in points:
        p.resolved.job.checkpoint.dir = str(tmp_path / "ck")   # one folder for the whole sweep
    sweep_dir, runs = prepare_sweep(points, root, source=str(OPS_JOB))
    sub = submit_sweep_array(sweep_dir, runs, max_parallel=2)
    array = sub.array_job_id
    info = parse_scontrol_record(subprocess.run(["scontrol", "show", "job", array],
                                                capture_output=True, text=True).stdout)
    assert info.get("ArrayTaskThrottle") == "2"
    script = (sweep_dir / "sbatch.sh").read_text()
    assert "#SBATCH --array=0-3%2" in script
    assert [r.run.job_ids() for r in runs] == [[f"{array}_{i}"] for i in range(4)]
    for r in runs:
        wait_stopped(r.run, timeout=300)
    for r in runs:
        (rec,) = r.run.ledger()
        job = yamlio.read_mapping(r.run.job_file)
        assert (job["train"]["lr"], job["train"]["steps"]) == \
            (r.point.values["train.lr"], r.point.values["train.steps"])
        assert (rec["exit_reason"], rec["end_step"], rec["job_id"]) == \
            ("finished", r.point.values["train.steps"], r.job_id)
        own = tmp_path / "ck" / r.run.id                    # each run: a folder of its own
        assert store.read_owner(own)["run"] == r.run.id
        assert [s for s, _ in store.complete_checkpoints(own)] == [r.point.values["train.steps"]]
    listed = json.loads(cli(root, "runs", "--json").stdout)
    assert sorted((x["job_id"], x["state"], x["sweep"]["index"]) for x in listed) == \
        [(f"{array}_{i}", "FINISHED", i) for i in range(4)]
    sweep_file = yamlio.read_mapping(sweep_dir / "sweep.yaml")
    assert sweep_file["array_job_id"] == array and len(sweep_file["runs"]) == 4


def test_sweep_dry_run_prepares_folders_and_slurm_accepts_the_array_script(slurm_cluster, tmp_path):
    data = tmp_path / "data" / "tokens"
    data.parent.mkdir()
    for ext in (".bin", ".idx"):
        data.with_name(data.name + ext).write_bytes(b"")
    job = yamlio.read_mapping(OPS_JOB)
    job["data"]["path"] = str(data)
    job["data"].pop("prepare_from")
    job["batch"]["global_batch_size"] = 8  # DP 4 on dev-slurm's 2 × 2 ranks
    job["train"]["min_lr"] = 1.0e-5  # below the swept learning rates
    job_file = tmp_path / "job.yaml"
    yamlio.write_atomic(job_file, yamlio.dump(job))
    root = tmp_path / "runs"
    out = cli(root, "submit", str(job_file), "-p", "dev-slurm", "--dry-run", "--json",
              "--sweep", "train.lr=1e-4,3e-4,1e-3", "--max-parallel", "1").stdout
    res = json.loads(out)
    assert res["dry_run"] and [r["values"]["train.lr"] for r in res["runs"]] == [1e-4, 3e-4, 1e-3]
    script = root / "sweeps" / res["sweep"] / "sbatch.sh"
    text = script.read_text()
    assert "#SBATCH --array=0-2%1" in text and 'RUN_DIR=${RUN_DIRS[$SLURM_ARRAY_TASK_ID]}' in text
    for r in res["runs"]:
        assert f"  {r['run_dir']}\n" in text
    assert "Job" in sbatch_test_only(str(script))  # Slurm's own verdict on the array script
    assert all(x["state"] == "NOT SUBMITTED" for x in json.loads(cli(root, "runs", "--json").stdout))
