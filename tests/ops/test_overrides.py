"""Changing a value without editing a file: ``--set KEY=VALUE`` on validate, render, plan and
submit (the keys, values and errors of ``--sweep``), recorded in the run's resolved job;
``hpctrain.submit`` with a mapping, a loaded job and ``overrides``; and ``hpctrain resume RUN
--steps N`` extending a finished run, trained for real on this machine."""

from __future__ import annotations

import json

import pytest

import hpctrain
from hpctrain.config import load_job, yamlio
from hpctrain.errors import UsageError
from hpctrain.api import Run
from tests.conftest import REPO
from tests.ops.helpers import OPS_JOB, cli, ops_job

TINY = str(REPO / "examples" / "tiny.yaml")


@pytest.mark.parametrize("spec, message", [
    ("train.steps", "--set 'train.steps': expected KEY=VALUE (e.g. --set train.lr=3e-4)"),
    ("steps=5", "'steps' is not a dotted job-file key"),
    ("train.steps=5,6", "one value per --set"),
    ("train.stepz=5", "train.stepz: unknown key (did you mean 'steps'?)"),
    ("train.steps=-1", "[--set train.steps=-1]: train.steps: must be at least 1, got -1"),
    ("train.lr.x=1", "--set train.lr.x: train.lr is not a section of the job file"),
])
def test_bad_overrides_get_the_sweep_errors_on_every_command(spec, message, tmp_path):
    for command in (["validate", TINY], ["render", TINY, "-p", "dev-slurm"], ["plan", TINY],
                    ["submit", TINY, "-p", "dev-slurm", "--dry-run"]):
        res = cli(tmp_path / "runs", *command, "--set", spec, check=False)
        assert res.returncode == 2 and message in res.stderr, (command, res.stderr)
        assert "Traceback" not in res.stderr
    assert not (tmp_path / "runs").exists()


def test_an_override_changes_what_every_command_sees_and_is_recorded(tmp_path):
    root = tmp_path / "runs"
    sets = ["--set", "train.steps=123", "--set", "model.num_layers=8"]
    assert "ok on local" in cli(root, "validate", TINY, *sets).stdout
    before = json.loads(cli(root, "plan", TINY, "--json").stdout)
    after = json.loads(cli(root, "plan", TINY, "--json", *sets).stdout)
    assert after["parameters"]["total"] > before["parameters"]["total"]   # 8 layers, not 4
    out = json.loads(cli(root, "submit", TINY, "-p", "dev-slurm", "--dry-run", "--json",
                         *sets).stdout)
    run = Run(out["run_dir"])
    job = yamlio.read_mapping(run.job_file)
    assert (job["train"]["steps"], job["model"]["num_layers"]) == (123, 8)
    assert run.meta()["overrides"] == {"train.steps": 123, "model.num_layers": 8}
    assert load_job(TINY).train.steps == 60          # the job file is untouched


def test_set_and_sweep_of_one_key_is_refused(tmp_path):
    res = cli(tmp_path / "runs", "submit", TINY, "-p", "dev-slurm", "--dry-run",
              "--set", "train.lr=1e-3", "--sweep", "train.lr=1e-3,3e-3", check=False)
    assert res.returncode == 2 and "--set and --sweep both give train.lr" in res.stderr


def test_the_api_takes_a_mapping_a_loaded_job_and_overrides(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    monkeypatch.chdir(OPS_JOB.parent)                # a mapping's relative paths: from here
    mapping = yamlio.read_mapping(OPS_JOB)
    ops_job()                                         # its token data prepared
    run = hpctrain.submit(mapping, profile="dev-slurm", nodes=1, dry_run=True, runs_dir=root,
                          overrides={"train.steps": 12})
    assert run.resolved_job().train.steps == 12 and run.meta()["overrides"] == {"train.steps": 12}
    assert run.resolved_job().data.path == str((REPO / "examples" / "data" / "kjv_byte"))
    loaded = load_job(OPS_JOB)
    again = hpctrain.submit(loaded, profile="dev-slurm", nodes=1, dry_run=True, runs_dir=root,
                            overrides={"train.lr": 1e-3})
    assert again.resolved_job().train.lr == 1e-3 and loaded.train.lr == 3e-3   # not mutated
    swept = hpctrain.submit(loaded, profile="dev-slurm", nodes=1, dry_run=True, runs_dir=root,
                            sweep={"train.lr": [1e-3, 2e-3]}, overrides={"train.steps": 8})
    assert [(r.resolved_job().train.lr, r.resolved_job().train.steps) for r in swept] == \
        [(1e-3, 8), (2e-3, 8)]
    with pytest.raises(UsageError, match="overrides: 'steps' is not a dotted job-file key"):
        hpctrain.submit(loaded, profile="dev-slurm", dry_run=True, runs_dir=root,
                        overrides={"steps": 3})
    with pytest.raises(UsageError, match="job: expected a job file, a mapping or a JobConfig"):
        hpctrain.submit(42, profile="dev-slurm", dry_run=True, runs_dir=root)


@pytest.mark.megatron
def test_resume_steps_extends_a_finished_run(tmp_path):
    """A finished run trains on to the new train.steps from its last checkpoint; the old job is
    kept; a run with a live job is never removed by `runs rm`."""
    root = tmp_path / "runs"
    profile = tmp_path / "one-rank.yaml"
    profile.write_text((REPO / "cluster_profiles" / "local.yaml").read_text()
                       .replace("gpus_per_node: 4", "gpus_per_node: 1")
                       .replace("name: local", "name: one-rank")
                       + "env:\n  HPCTRAIN_TEST_HOOKS: '1'\n  HPCTRAIN_TEST_STEP_SLEEP_S: '0.5'\n")
    ops_job()
    first = json.loads(cli(root, "submit", str(OPS_JOB), "-p", str(profile), "--no-wait",
                           "--json", "--set", "train.steps=10").stdout)
    run = Run(first["run_dir"])
    # its job lives for at least 10 steps of 0.5 s: never removed while it does
    live = cli(root, "runs", "rm", run.id, check=False)
    assert live.returncode == 2 and "still pending or running" in live.stderr
    assert run.path.exists()
    assert run.wait(timeout_s=600) == "FINISHED"
    refused = cli(root, "resume", run.id, check=False)
    assert refused.returncode == 2 and f"hpctrain resume {run.id} --steps N" in refused.stderr
    too_few = cli(root, "resume", run.id, "--steps", "10", check=False)
    assert too_few.returncode == 2 and "already reached step 10" in too_few.stderr
    out = cli(root, "resume", run.id, "--steps", "20").stdout
    assert "from step 10." in out.splitlines()[0]
    assert out.rstrip().splitlines()[-1].startswith(f"Run {run.id} finished at step 20")
    assert [(r["start_step"], r["end_step"], r["exit_reason"]) for r in run.ledger()] == \
        [(0, 10, "finished"), (10, 20, "finished")]
    assert yamlio.read_mapping(run.path / "job.1.yaml")["train"]["steps"] == 10
    assert run.resolved_job().train.steps == 20 and run.finished()
    assert run.meta()["overrides"] == {"train.steps": 20}
