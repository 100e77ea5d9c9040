"""The main job and its Slurm twin, through the command line a user types.

* the README's main job: `hpctrain submit` of the tiny example on the default local profile
  (shortened here), following it to the end: real megatron-core on 4 CPU processes, TP2 × PP2 ×
  VPP2, on the real example corpus; the loss falls; and what it prints is what the README's
  quick start shows (run names, paths, times and numbers aside);
* the same job on the real dev Slurm cluster, 2 nodes × 2 tasks;
* a job that crashes: `submit --wait` says so, with the error, and exits 1;
* a preflight gate that finds a slow node: the node is excluded, the job requeued on others,
  the decision recorded, and training then runs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hpctrain.config import yamlio
from hpctrain.record.folder import find_run
from tests.conftest import REPO, hpctrain
from tests.docs.quick_start import problems, readme_quick_start
from tests.ops.helpers import wait_ledger, wait_stopped

pytestmark = pytest.mark.megatron


def short_tiny(folder: Path, steps: int, **checkpoint) -> Path:
    """examples/tiny.yaml with fewer steps (same model, layout and data); no periodic checkpoints
    unless ``checkpoint`` sets them."""
    data = yamlio.read_mapping(REPO / "examples" / "tiny.yaml")
    data["train"].update(steps=steps, log_interval=2, warmup_steps=2)
    data["checkpoint"].update({"interval_steps": 0, **checkpoint})
    data["train"].update(eval_interval=8)
    for entry in data["data"]["blend"]:
        entry["path"] = str(REPO / "examples" / entry["path"])
        entry["prepare_from"] = [str(REPO / "examples" / f) for f in entry["prepare_from"]]
    path = folder / "tiny-short.yaml"
    yamlio.write_atomic(path, yamlio.dump(data))
    return path


def profile_variant(folder: Path, name: str, **sections) -> str:
    data = yamlio.read_mapping(REPO / "cluster_profiles" / "dev-slurm.yaml")
    data["name"] = name
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    path = folder / f"{name}.yaml"
    yamlio.write_atomic(path, yamlio.dump(data))
    return str(path)


def falls(run) -> tuple[float, float]:
    losses = [m["loss"] for m in run.metrics() if m.get("loss") is not None]
    assert len(losses) >= 3, losses
    return losses[0], losses[-1]


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    """The main job, trained once for the tests that read it. Like the full job it saves a
    background checkpoint and prunes one (at step 8, and keep_last 1 after the final save), so
    it prints every kind of line the README's quick start shows."""
    folder = tmp_path_factory.mktemp("main-job")
    job = short_tiny(folder, steps=16, interval_steps=8, keep_last=1)
    proc = hpctrain("submit", str(job), env={"HPCTRAIN_RUNS_DIR": str(folder / "runs")},
                    timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc, folder / "runs"


def test_main_job_on_the_local_profile(main_job):
    proc, runs = main_job
    assert "on local (TP2×PP2×VPP2×DP1)" in proc.stdout
    assert "step 16/16" in proc.stdout and "finished at step 16" in proc.stdout
    run = find_run(proc.stdout.split("Submitted ")[1].split()[0], runs)
    (rec,) = run.ledger()
    assert rec["scheduler"] == "local" and rec["exit_reason"] == "finished"
    first, last = falls(run)
    assert last < first - 0.5, (first, last)
    valid = run.metrics(kind="validation")          # the two-corpus blend's validation split
    assert [v["step"] for v in valid] == [8, 16]
    # 16 steps of mostly the first corpus: the held-out second corpus is already predicted
    # better than a uniform guess over the 257 tokens (its loss need not fall step by step yet)
    assert all(v["loss"] < math.log(257) - 0.5 for v in valid), valid
    assert "validation loss" in proc.stdout
    env = {"HPCTRAIN_RUNS_DIR": str(runs)}
    status = json.loads(hpctrain("status", run.id, "--json", env=env, check=True).stdout)
    assert status["validation_loss"] == valid[1]["loss"] and status["validation_step"] == 16
    assert "Validation  loss" in hpctrain("status", run.id, env=env, check=True).stdout
    report = json.loads(hpctrain("report", str(run.path), "--json", env=env, check=True).stdout)
    assert report["last_validation_loss"] == valid[1]["loss"]


def test_readme_quick_start_output_is_what_the_main_job_prints(main_job):
    proc, _ = main_job
    found = problems(readme_quick_start(), proc.stdout)
    assert not found, "\n".join(found) + "\n\nThe job printed:\n" + proc.stdout


@pytest.mark.slurm
def test_same_job_on_two_slurm_nodes_with_two_tasks_each(slurm_cluster, tmp_path):
    job = short_tiny(tmp_path, steps=16)
    proc = hpctrain("submit", str(job), "-p", "dev-slurm", "--wait",
                    env={"HPCTRAIN_RUNS_DIR": str(tmp_path / "runs")}, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = find_run(proc.stdout.split("Submitted ")[1].split()[0], tmp_path / "runs")
    (rec,) = run.ledger()
    assert rec["scheduler"] == "slurm" and len(rec["nodes"]) == 2
    assert (rec["exit_reason"], rec["end_step"]) == ("finished", 16)
    log = (run.attempt_dir(1) / "rank-0.log").read_text()
    assert "4 ranks (slurm), TP2×PP2×VPP2×DP1" in log
    first, last = falls(run)
    assert last < first - 0.5, (first, last)


@pytest.mark.slurm
def test_a_crashing_job_is_reported_by_submit_wait(slurm_cluster, tmp_path):
    job = short_tiny(tmp_path, steps=16)
    profile = profile_variant(tmp_path, "dev-slurm-crash",
                              env={"HPCTRAIN_TEST_HOOKS": "1", "HPCTRAIN_TEST_CRASH_AT_STEP": "3@2"})
    proc = hpctrain("submit", str(job), "-p", profile, "--wait",
                    env={"HPCTRAIN_RUNS_DIR": str(tmp_path / "runs")}, timeout=900)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "did not finish: last attempt ended with failed" in proc.stderr
    assert "rank 2 on n2 failed first: InjectedCrash" in proc.stderr
    assert "injected crash in step 3 on rank 2" in proc.stderr
    run = find_run(proc.stdout.split("Submitted ")[1].split()[0], tmp_path / "runs")
    (rec,) = run.ledger()
    assert rec["first_failure"]["rank"] == 2 and rec["exit_reason"] == "failed"
    assert "attempt 1: rank 2 on n2 failed first" in hpctrain(
        "status", run.id, env={"HPCTRAIN_RUNS_DIR": str(tmp_path / "runs")}, check=True).stdout


@pytest.mark.slurm
def test_preflight_gate_excludes_a_slow_node_and_requeues(slurm_cluster, tmp_path):
    """On the 3-node dev cluster: the gate finds n2 slow, the job is requeued without it and
    trains on the other two."""
    job = short_tiny(tmp_path, steps=6)
    profile = profile_variant(tmp_path, "dev-slurm-gate",
                              env={"HPCTRAIN_TEST_HOOKS": "1",
                                   "HPCTRAIN_TEST_PREFLIGHT_DELAY": "n2:0.3"},
                              preflight={"gate": True, "sizes_mb": [0.25, 1], "timeout_s": 60})
    proc = hpctrain("submit", str(job), "-p", profile, "--json",
                    env={"HPCTRAIN_RUNS_DIR": str(tmp_path / "runs")}, check=True)
    run = find_run(json.loads(proc.stdout)["run"], tmp_path / "runs")
    wait_ledger(run, 2, timeout=900)
    wait_stopped(run, timeout=300)
    first, second = run.ledger()
    assert first["exit_reason"] == "preflight_failed" and first["decision"]["requeue"]
    assert first["excluded_nodes"] == ["n2"] and "n2" in first["nodes"]
    gate = json.loads((run.path / "preflight" / "attempt-1.json").read_text())
    assert gate["passed"] is False and gate["bad_nodes"] == ["n2"]
    assert second["exit_reason"] == "finished" and "n2" not in second["nodes"]
    assert json.loads((run.path / "preflight" / "attempt-2.json").read_text())["passed"] is True
