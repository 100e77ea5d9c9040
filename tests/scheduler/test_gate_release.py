"""The preflight gate's requeue (hold -> exclude the bad nodes -> release) on the real dev
cluster, with a `scontrol` on PATH that fails one subcommand the way a busy or restricted
slurmctld does: the job is released in every outcome, and the run's events say what happened.
A bad node the job cannot do without (it needs every node of the partition) stays in, and the
attempt's ledger record and `hpctrain status` say which and why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from hpctrain.config import load_job, load_profile, resolve
from hpctrain.scheduler.slurm.commands import job_info
from hpctrain.submission import prepare_run
from tests.conftest import REPO, hpctrain, job_gone, wait_until

pytestmark = pytest.mark.slurm


def _scontrol_failing(tmp_path, subcommand: str) -> str:
    """A folder whose `scontrol` fails ``subcommand`` and runs the real one otherwise."""
    real = shutil.which("scontrol")
    folder = tmp_path / f"bin-{subcommand}"
    folder.mkdir()
    fake = folder / "scontrol"
    fake.write_text("#!/bin/bash\n"
                    f'if [ "$1" = {subcommand} ]; then\n'
                    f'  echo "{subcommand}: Access/permission denied for JobId=$3" >&2; exit 1\n'
                    "fi\n"
                    f'exec {real} "$@"\n')
    fake.chmod(0o755)
    return str(folder)


@pytest.fixture
def running_job(slurm_cluster, tmp_path):
    """A real, requeueable one-node batch job, running."""
    yield from _running_job(tmp_path, nodes=1)


@pytest.fixture
def running_job_on_every_node(slurm_cluster, tmp_path):
    """A real, requeueable batch job that needs all 3 nodes of the dev cluster, running."""
    yield from _running_job(tmp_path, nodes=3)


def _running_job(tmp_path, nodes: int):
    out = subprocess.run(["sbatch", "--parsable", "--requeue", f"-N{nodes}", "-J", "gate-release",
                          "-o", str(tmp_path / "job.out"), "--wrap", "sleep 600"],
                         capture_output=True, text=True, check=True, timeout=60)
    job_id = out.stdout.strip().split(";")[0]
    try:
        wait_until(lambda: job_info(job_id).get("JobState") == "RUNNING", 120,
                   what=f"job {job_id} to run")
        yield job_id
    finally:
        subprocess.run(["scontrol", "release", job_id], capture_output=True, timeout=60)
        subprocess.run(["scancel", job_id], capture_output=True, timeout=60)
        wait_until(lambda: job_gone(job_id), 120, what=f"job {job_id} to leave the queue")


def _gate_failed(tmp_path, job_id: str, path_first: str | None = None):
    """`batch_steps gate-failed` as the batch script runs it, after preflight blamed node n3."""
    resolved = resolve(load_job(REPO / "examples" / "tiny.yaml"), load_profile("dev-slurm"))
    run = prepare_run(resolved, tmp_path / "runs")
    attempt = run.begin_attempt()
    report = run.path / "preflight" / f"attempt-{attempt}.json"
    report.parent.mkdir()
    report.write_text(json.dumps({"passed": False, "bad_nodes": ["n3"]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_JOB")}
    path = f"{path_first}:{os.environ['PATH']}" if path_first else os.environ["PATH"]
    env.update(SLURM_JOB_ID=job_id, PATH=path,
               SLURM_CONF=os.environ["SLURM_CONF"])
    proc = subprocess.run([sys.executable, "-m", "hpctrain.scheduler.slurm.batch_steps", "gate-failed",
                           str(run.path), "--attempt", str(attempt), "--exit-code", "4"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    return run, proc


def _held(job_id: str) -> bool:
    info = job_info(job_id)
    return info.get("Priority") == "0" or "Held" in info.get("Reason", "")


def test_a_failing_exclude_still_releases_the_held_job(running_job, tmp_path):
    run, proc = _gate_failed(tmp_path, running_job, _scontrol_failing(tmp_path, "update"))
    assert proc.returncode == 0, proc.stderr
    assert "excluding n3 failed" in proc.stderr and "Access/permission denied" in proc.stderr
    info = job_info(running_job)
    assert info.get("Restarts") == "1"                     # it was requeued...
    assert not _held(running_job), info                    # ...and is not held
    event = run.events()[-1]
    assert event["event"] == "requeue" and event["excluded"] == []
    assert "excluding n3 failed" in event["problem"]
    (record,) = run.ledger()
    assert record["exit_reason"] == "preflight_failed" and record["decision"]["requeue"]
    assert record["excluded_nodes"] == [] and record["not_excluded_nodes"] == ["n3"]
    assert record["exclusion_note"].startswith("excluding n3 failed")
    assert "released without the exclusion" in record["exclusion_note"]


def test_a_failing_release_is_retried_then_reported_not_hidden(running_job, tmp_path):
    run, proc = _gate_failed(tmp_path, running_job, _scontrol_failing(tmp_path, "release"))
    assert proc.returncode == 1
    assert f"scontrol release {running_job} failed 5 times" in proc.stderr
    assert f"`scontrol release {running_job}`" in proc.stderr
    assert _held(running_job)                              # what the message says
    event = run.events()[-1]
    assert event["event"] == "requeue_failed" and event["excluded"] == ["n3"]
    assert "release failed" in event["error"]
    assert "n3" in job_info(running_job).get("ExcNodeList", "")
    (record,) = run.ledger()                               # excluded, though still held
    assert record["excluded_nodes"] == ["n3"] and "not_excluded_nodes" not in record


def test_a_node_is_not_excluded_when_the_job_could_no_longer_start(running_job_on_every_node,
                                                                   tmp_path):
    job_id = running_job_on_every_node
    run, proc = _gate_failed(tmp_path, job_id)
    assert proc.returncode == 0, proc.stderr
    why = "not excluding n3: the partition debug would have 2 usable nodes and the job needs 3"
    assert why in proc.stderr
    info = job_info(job_id)
    assert info.get("Restarts") == "1" and not _held(job_id), info     # requeued and released
    assert info.get("ExcNodeList") == "(null)", info                   # ...without the exclusion
    event = run.events()[-1]
    assert event["event"] == "requeue" and event["excluded"] == []
    assert event["not_excluded"] == ["n3"] and event["note"] == why
    # the attempt's record says what happened, not what the gate asked for
    (record,) = run.ledger()
    assert record["exit_reason"] == "preflight_failed" and record["decision"]["requeue"]
    assert record["excluded_nodes"] == [] and record["not_excluded_nodes"] == ["n3"]
    assert record["exclusion_note"] == why
    env = {"HPCTRAIN_RUNS_DIR": str(tmp_path / "runs")}
    data = json.loads(hpctrain("status", run.id, "--json", env=env, check=True).stdout)
    (row,) = data["attempts"]
    assert (row["excluded_nodes"], row["not_excluded_nodes"], row["exclusion_note"]) == \
        ([], ["n3"], why)
    text = hpctrain("status", run.id, env=env, check=True).stdout
    assert f"  attempt 1: {why}" in text, text
