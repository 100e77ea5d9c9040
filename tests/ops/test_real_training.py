"""The user's story with the real runtime (megatron-core on CPU ranks) on the dev cluster:
`hpctrain submit --sweep` of a small job as one job array (two runs at once), a signal drill in
the middle of one of them (it saves, requeues itself and resumes where it stopped), the other
untouched; then status, logs and report on what really happened. And `--chain` through the
command line, cancelled as a whole."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from hpctrain.config import yamlio
from hpctrain.ops.report import build_figure, collect, per_step
from hpctrain.record.folder import find_run
from hpctrain.scheduler.state import job_states
from tests.conftest import REPO, hpctrain, wait_until
from tests.ops.helpers import cli, png_size, wait_ledger, wait_step, wait_stopped

pytestmark = [pytest.mark.slurm, pytest.mark.megatron]
JOB = REPO / "tests" / "ops" / "tiny-ops.yaml"


def one_rank_profile(folder) -> str:
    """dev-slurm with one rank per job: the cheapest real runs (two fit the machine at once).
    Every run holds after step 4 until it is signalled or released (``hold-release``), so the
    drill happens mid-run whatever this machine's speed."""
    data = yamlio.read_mapping(REPO / "cluster_profiles" / "dev-slurm.yaml")
    data["name"] = "dev-slurm-1"
    data["slurm"].update(nodes=1, gpus_per_node=1)
    data["env"] = {**data.get("env", {}), "HPCTRAIN_TEST_HOOKS": "1",
                   "HPCTRAIN_TEST_HOLD_AFTER_STEP": "4"}
    path = folder / "dev-slurm-1.yaml"
    yamlio.write_atomic(path, yamlio.dump(data))
    return str(path)


@pytest.fixture(scope="module")
def sweep(slurm_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("real") / "runs"
    profile = one_rank_profile(root.parent)
    proc = hpctrain("submit", str(JOB), "-p", profile, "--json",
                    "--sweep", "train.lr=1e-3,3e-3", "--max-parallel", "2",
                    env={"HPCTRAIN_RUNS_DIR": str(root)}, check=True)
    out = json.loads(proc.stdout)
    drilled, other = (find_run(r["run"], root) for r in out["runs"])
    wait_step(drilled, 4, timeout=300)
    subprocess.run(["scancel", "--full", "-s", "USR1", out["runs"][0]["job_id"]], check=True)
    (other.path / "hold-release").touch()          # the other point trains on untouched
    wait_ledger(drilled, 2, timeout=400)
    for run in (drilled, other):
        wait_stopped(run, timeout=300)
    return {"out": out, "drilled": drilled, "other": other, "root": root}


def test_both_runs_of_the_sweep_finished_and_the_drilled_one_resumed(sweep):
    out, drilled, other = sweep["out"], sweep["drilled"], sweep["other"]
    array = out["array_job_id"]
    assert [r["job_id"] for r in out["runs"]] == [f"{array}_0", f"{array}_1"]
    assert [drilled.resolved_job().train.lr, other.resolved_job().train.lr] == [1e-3, 3e-3]
    one, two = drilled.ledger()
    assert (one["job_id"], one["exit_reason"], one["decision"]["requeue"]) == \
        (f"{array}_0", "preempted", True)
    assert (two["exit_reason"], two["end_step"], two["restart_count"]) == ("finished", 30, 1)
    assert two["start_step"] == one["end_step"] and two["checkpoint_loaded"] == one["checkpoint_saved"]
    (alone,) = other.ledger()
    assert (alone["job_id"], alone["exit_reason"], alone["end_step"]) == (f"{array}_1", "finished", 30)
    assert other.metrics()[-1]["loss"] != drilled.metrics()[-1]["loss"]  # its own learning rate


def test_status_logs_and_report_of_the_drilled_run(sweep):
    run, root = sweep["drilled"], sweep["root"]
    stop = run.ledger()[0]["end_step"]
    data = json.loads(cli(root, "status", run.id, "--json").stdout)
    assert data["state"] == "FINISHED" and data["step"] == 30 and data["loss"] is not None
    assert [(a["attempt"], a["exit_reason"]) for a in data["attempts"]] == \
        [(1, "preempted"), (2, "finished")]
    assert data["checkpoint"]["step"] == 30 and data["layout"] == "TP1×PP1×DP1"
    assert data["sweep"]["values"] == {"train.lr": 1e-3}
    text = cli(root, "status", run.id).stdout
    assert f" {stop}→30 " in text and f" 0→{stop} " in text
    latest = cli(root, "logs", run.id, "--attempt", "2").stdout
    assert f"step-{stop:08d}" in latest and "step 30/30" in latest
    batch = cli(root, "logs", run.id, "--batch", "--attempt", "1").stdout
    # `scancel --full` signals the ranks too: whichever of them and the batch shell acts first
    assert re.search(r"batch shell got SIGUSR1|SIGUSR1 at \S+: the ranks have already ended", batch)
    assert "requeueing job" in batch
    no_rank = cli(root, "logs", run.id, "--rank", "1", "--attempt", "1", check=False)
    assert no_rank.returncode == 2 and "(it has rank logs 0 and batch.log)" in no_rank.stderr
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


def test_a_chain_from_the_command_line_waits_on_dependency_and_cancels_as_a_whole(
        slurm_cluster, tmp_path):
    root = tmp_path / "runs"
    env = {"HPCTRAIN_RUNS_DIR": str(root)}
    out = json.loads(hpctrain("submit", str(JOB), "-p", "dev-slurm", "-N", "1", "--chain", "2",
                              "--json", env=env, check=True).stdout)
    first, second = out["job_ids"]
    run = find_run(out["run"], root)
    assert run.job_ids() == [first, second]
    states = {s.job_id: s for s in job_states(run)}
    assert (states[second].state, states[second].reason) == ("PENDING", "Dependency")
    text = hpctrain("cancel", run.id, env=env, check=True).stdout
    assert text.startswith(f"Cancelled run {run.id}: job(s) {first}, {second}.")
    wait_until(lambda: not any(s.active for s in job_states(run)), 60,
               what="both chained jobs to leave the queue")
    assert [e["jobs"] for e in run.events() if e["event"] == "cancel"] == [[first, second]]
