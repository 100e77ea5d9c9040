"""Real submissions to the dev Slurm cluster through hpctrain's script and submitit."""

from __future__ import annotations

import dataclasses
import socket
import threading

import pytest

from hpctrain.config import load_job, load_profile, resolve
from hpctrain.submission import prepare_run, submit_function
from tests.conftest import REPO, hpctrain, job_gone, wait_until
from tests.scheduler import tasks

pytestmark = pytest.mark.slurm


def dev_resolved(**profile_changes):
    profile = load_profile("dev-slurm")
    if profile_changes:
        profile = dataclasses.replace(profile, **profile_changes)
    return resolve(load_job(REPO / "examples" / "tiny.yaml"), profile)


@pytest.fixture
def echo_server():
    """A TCP listener on all interfaces: tasks prove MASTER_ADDR is reachable by connecting."""
    srv = socket.socket()
    srv.bind(("0.0.0.0", 0))
    srv.listen(16)
    stop = threading.Event()

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                conn.close()
            except OSError:
                continue
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    srv.close()


def test_two_nodes_two_tasks_see_their_ranks_and_gpus(slurm_cluster, tmp_path, monkeypatch,
                                                      echo_server):
    monkeypatch.setenv("TEST_ECHO_PORT", str(echo_server))
    # launcher variables in the submitting shell must not reach the tasks (sbatch exports it)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    r = dev_resolved(env={"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "1"})
    run = prepare_run(r, tmp_path / "runs")
    sub = submit_function(run, r.profile, tasks.task_environment, resolved=r)
    results = sub.job.results()
    assert [int(x["SLURM_PROCID"]) for x in results] == [0, 1, 2, 3]
    assert [int(x["SLURM_LOCALID"]) for x in results] == [0, 1, 0, 1]
    assert {x["SLURM_NTASKS"] for x in results} == {"4"}
    nodes = [results[0]["SLURMD_NODENAME"], results[2]["SLURMD_NODENAME"]]
    assert [x["SLURMD_NODENAME"] for x in results] == [nodes[0], nodes[0], nodes[1], nodes[1]]
    assert nodes[0] != nodes[1] and set(nodes) <= {"n1", "n2", "n3"}
    # two fake GPUs per node from gres, as --gpus-per-node=2 asked
    assert {x["CUDA_VISIBLE_DEVICES"] for x in results} == {"0,1"}
    # one rendezvous for all, the first node's address (NodeAddr), reachable from every task
    assert {x["MASTER_ADDR"] for x in results} == {"127.0.0.1"}
    assert len({x["MASTER_PORT"] for x in results}) == 1
    assert all(x["reached_master"] for x in results)
    assert {x["HPCTRAIN_ATTEMPT"] for x in results} == {"1"}
    assert {x["HPCTRAIN_RUN_DIR"] for x in results} == {str(run.path)}
    assert {x["NCCL_DEBUG"] for x in results} == {"WARN"}
    assert {x["RANK"] for x in results} == {None} and {x["WORLD_SIZE"] for x in results} == {None}
    deadline = int(results[0]["HPCTRAIN_DEADLINE"])
    assert deadline > 0
    # the batch shell recorded the attempt in the ledger
    wait_until(lambda: job_gone(sub.job_id), what="the batch shell to finish")
    (rec,) = run.ledger()
    assert rec["job_id"] == sub.job_id and rec["exit_reason"] == "finished"
    assert rec["nodes"] == nodes and rec["decision"]["requeue"] is False
    assert (run.attempt_dir(1) / "batch.log").read_text().count("attempt 1") >= 1


def test_failed_task_is_reported(slurm_cluster, tmp_path):
    r = dev_resolved()
    run = prepare_run(r, tmp_path / "runs")
    sub = submit_function(run, r.profile, tasks.fail_on_rank, (2,), resolved=r)
    sub.job.wait()
    exc = sub.job.task(2).exception()
    assert exc is not None and "deliberate failure on rank 2" in str(exc)
    wait_until(lambda: job_gone(sub.job_id), what="the batch shell to finish")
    (rec,) = run.ledger()
    assert rec["exit_reason"] == "failed" and rec["exit_code"] == 1
    assert rec["decision"]["requeue"] is False
    assert "requeue_on_failure is off" in rec["decision"]["reason"]


def test_sbatch_refusal_is_shown_as_sbatch_said_it(slurm_cluster, tmp_path):
    profile_file = tmp_path / "nopart.yaml"
    text = (REPO / "cluster_profiles" / "dev-slurm.yaml").read_text()
    profile_file.write_text(text.replace("partition: debug", "partition: nosuchpart"))
    proc = hpctrain("submit", "examples/tiny.yaml", "--profile", str(profile_file), "--force",
                    env={"HPCTRAIN_RUNS_DIR": str(tmp_path / "runs")})
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "sbatch refused the job" in proc.stderr and "invalid partition" in proc.stderr.lower()
    assert "Nothing was queued: the run folder prepared for it was removed" in proc.stderr
    assert list((tmp_path / "runs").glob("*/run.yaml")) == []      # no run that never was
