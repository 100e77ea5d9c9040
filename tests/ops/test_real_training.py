"""The user's story with the real runtime (megatron-core on CPU ranks) on the dev cluster:
`hpctrain submit --chain 2` of a small job, a signal drill in the middle of the first job (it
saves, requeues itself and resumes), the chained job finding the run finished; then status,
logs and report on what really happened."""

from __future__ import annotations

import json
import subprocess

import pytest

from hpctrain.ops.report import build_figure, collect, per_step
from hpctrain.runs import find_run
from tests.conftest import REPO, hpctrain, wait_until
from tests.ops.helpers import cli, png_size, wait_ledger, wait_step, wait_stopped

pytestmark = [pytest.mark.slurm, pytest.mark.megatron]
JOB = REPO / "tests" / "ops" / "tiny-ops.yaml"


@pytest.fixture(scope="module")
def drilled(slurm_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("real") / "runs"
    proc = hpctrain("submit", str(JOB), "-p", "dev-slurm", "-N", "1", "--chain", "2", "--json",
                    env={"HPCTRAIN_RUNS_DIR": str(root)}, check=True)
    out = json.loads(proc.stdout)
    run = find_run(out["run"], root)
    first, second = out["job_ids"]
    wait_step(run, 4, timeout=300)
    subprocess.run(["scancel", "--full", "-s", "USR1", first], check=True)
    wait_ledger(run, 2, timeout=400)
    wait_stopped(run, timeout=120)
    return {"run": run, "root": root, "jobs": (first, second)}


def test_the_drilled_run_resumed_and_the_chained_job_skipped(drilled):
    run, (first, second) = drilled["run"], drilled["jobs"]
    one, two = run.ledger()
    assert (one["job_id"], one["exit_reason"], one["decision"]["requeue"]) == (first, "preempted", True)
    assert (two["job_id"], two["exit_reason"], two["end_step"]) == (first, "finished", 30)
    assert two["start_step"] == one["end_step"] and two["checkpoint_loaded"] == one["checkpoint_saved"]
    assert run.job_ids() == [first, second] and run.attempts_started() == [1, 2]
    log = run.path / "logs" / f"slurm-{second}.log"
    wait_until(lambda: log.exists() and "already finished" in log.read_text(), 60,
               what="the chained job to find the run finished")


def test_status_logs_and_report_of_the_real_run(drilled):
    run, root = drilled["run"], drilled["root"]
    stop = run.ledger()[0]["end_step"]
    data = json.loads(cli(root, "status", run.id, "--json").stdout)
    assert data["state"] == "FINISHED" and data["step"] == 30 and data["loss"] is not None
    assert [(a["attempt"], a["exit_reason"]) for a in data["attempts"]] == \
        [(1, "preempted"), (2, "finished")]
    assert data["checkpoint"]["step"] == 30 and data["layout"] == "TP2×PP1×DP1"
    text = cli(root, "status", run.id).stdout
    assert f" {stop}→30 " in text and " 0→" + str(stop) + " " in text
    latest = cli(root, "logs", run.id, "--attempt", "2").stdout
    assert f"step-{stop:08d}" in latest and "step 30/30" in latest
    batch = cli(root, "logs", run.id, "--batch", "--attempt", "1").stdout
    assert "batch shell got SIGUSR1" in batch and f"requeueing job {drilled['jobs'][0]}" in batch
    assert cli(root, "logs", run.id, "--rank", "1", "--attempt", "1").stdout.strip()
    out = cli(root, "report", run.id).stdout
    assert "Attempts    2 (1 preempted, 1 requeued)" in out
    assert png_size(run.path / "report.png") == (1200, 900)
    fig = build_figure(collect(run))
    loss = next(ln for ax in fig.axes for ln in ax.get_lines() if ln.get_gid() == "loss")
    metrics = per_step(run.metrics())
    assert list(loss.get_xdata()) == [m["step"] for m in metrics] and metrics[-1]["step"] == 30
    assert list(loss.get_ydata()) == [m["loss"] for m in metrics]
    marks = {ln.get_gid() for ax in fig.axes for ln in ax.get_lines()}
    assert {"preempted-1", "resumed-2", "checkpoints"} <= marks
