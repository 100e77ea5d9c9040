"""In-job restarts on the real dev Slurm cluster, with the real runtime: a job that holds a spare
node loses a rank (killed outright) or a whole node (its slurmd and its rank stop answering),
restarts on the spare inside its allocation instead of going through the queue, and ends with
the same losses and the same final weights as a run nobody interrupted.

Their own Slurm cluster and their own uninterrupted run (the same job as
test_preemption_acceptance.py's): these drills wait for Slurm by design (``KillWait``, and
``SlurmdTimeout`` before a silent node is DOWN), so they run beside the other drills, not after
them (tests/conftest.py's CLUSTER_OF_FILE; tools/test starts this cluster with a shorter
``SlurmdTimeout``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from hpctrain.config import yamlio
from hpctrain.health.heartbeat import read_beats
from hpctrain.record.attempt_end import read_restart
from hpctrain.record.folder import RunFolder
from tests.conftest import REPO, hpctrain, wait_until
from tests.ops.helpers import wait_stopped
from tests.resilience.test_preemption_acceptance import (JOB, assert_same_training, describe,
                                                         held, profile_file, submit,
                                                         uninterrupted_run)

pytestmark = [pytest.mark.slurm, pytest.mark.megatron]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("spare-drills") / "runs"


@pytest.fixture(scope="module")
def reference(slurm_cluster, root) -> RunFolder:
    """The same job, uninterrupted."""
    return uninterrupted_run(root)


def held_rank(run: RunFolder, attempt: int, rank: int, step: int):
    """``rank``'s heartbeat in ``attempt`` once it holds after ``step`` (see ``held``)."""
    return wait_until(lambda: next((b for r, b in read_beats(run.attempt_dir(attempt)).items()
                                    if r == rank and b.step == step
                                    and b.phase.startswith("held")), None),
                      900, what=f"rank {rank} of attempt {attempt} held at step {step}")


def test_a_killed_rank_restarts_on_the_spare_then_a_second_failure_requeues(reference, root):
    """One node trains (the reference's two ranks, on one node: the same world, the same
    weights), one is held as a spare. Rank 1 is SIGKILLed at step 10 (as the OOM
    killer or a dying node would): the batch shell blames it, not rank 0 that lost its
    connection a moment later, leaves its node out and restarts the step on the spare inside the same
    allocation (no trip through the queue), from the step-8 checkpoint, once the spare passed
    the node check. Killed again at step 12, with no spare left: the job is requeued through
    Slurm excluding both nodes (it gives its spare up: the 3-node cluster has one node
    besides them), and the run finishes there with the uninterrupted run's weights."""
    profile = profile_file(root.parent, "drill-spare", env=held(10, 12),
                           slurm={"nodes": 1, "gpus_per_node": 2},
                           preemption={"requeue_on_failure": True},
                           resilience={"spare_nodes": 1, "max_in_job_restarts": 2})
    # the hang watcher stays out of it: on a loaded machine srun's teardown of the survivors
    # (KillWait) can outlast a short hang limit, and the attempt would end as hung
    job = root.parent / "spare.yaml"
    data = yamlio.read_mapping(JOB)
    data["health"] = {"hang_timeout_s": 900}
    data["data"]["path"] = str(REPO / "examples" / "data" / "kjv_byte")
    data["data"]["prepare_from"] = [str(REPO / "examples" / "corpus" / "kjv.txt.gz")]
    yamlio.write_atomic(job, yamlio.dump(data))
    run, job_id = submit(root, profile, job=job)
    first_kill = held_rank(run, 1, rank=1, step=10)
    os.kill(first_kill.pid, signal.SIGKILL)      # the dev cluster's "nodes" share this host
    (run.path / "hold-release").write_text("10")  # rank 0 goes on, into the next collective
    second_kill = held_rank(run, 2, rank=1, step=12)
    os.kill(second_kill.pid, signal.SIGKILL)
    (run.path / "hold-release").write_text("12")
    wait_until(lambda: len(run.ledger()) >= 3 and run.ledger()[-1]["exit_reason"] == "finished"
               or (run.ledger() and not run.ledger()[-1]["decision"]["requeue"]
                   and "restart" not in run.ledger()[-1]["decision"]["reason"]),
               timeout=1800, interval=2, what="the run to finish")
    wait_stopped(run)
    first, second, third, *more = run.ledger()
    # 1: the killed rank is blamed, not the peer that noticed (the killed rank wrote nothing,
    # rank 0 blamed the lost connection) ...
    peers = {json.loads(p.read_text())["rank"]
             for p in run.attempt_dir(1).glob("failure-rank-*.json")}
    assert peers == {0}, peers
    assert first["exit_reason"] == "failed" and not first["decision"]["requeue"], describe(run)
    culprit = first["first_failure"]
    assert (culprit["rank"], culprit["node"]) == (1, first_kill.node), describe(run)
    assert culprit["cause"] == "signal" and "Killed" in culprit["message"], culprit
    # ... and its node left out: the spare takes its place in the same job
    assert "restart in the allocation" in first["decision"]["reason"], describe(run)
    restart = second["in_job_restart"]
    spare = restart["spares"][0]
    assert restart["excluded"] == [first_kill.node] and spare not in first["nodes"], restart
    assert sorted(second["nodes"]) == sorted([n for n in first["nodes"]
                                              if n != first_kill.node] + [spare])
    assert second["job_id"] == first["job_id"] == job_id
    checked = [e for e in run.events() if e.get("event") == "node_check"]
    assert [(e["attempt"], e["nodes"], e["passed"]) for e in checked] == [(1, [spare], True)]
    assert second["restart_count"] == first["restart_count"] == 0   # not through the queue
    assert second["checkpoint_loaded"].endswith("step-00000008"), describe(run)
    assert second["start_step"] == 8 and restart["steps_lost"] == 2, restart
    assert restart["recovery_s"] is not None and restart["recovery_s"] > 0, restart
    # 2: killed again on the spare's step, no spare left: requeued through Slurm
    assert second["first_failure"]["node"] == second_kill.node, describe(run)
    assert second_kill.node in second["nodes"]
    assert second["exit_reason"] == "failed" and second["decision"]["requeue"], describe(run)
    # both blamed nodes are left out: the job gives its spare up (1 training node + the
    # 0 spares the cluster has besides them) rather than keep a blamed node in
    assert sorted(second["excluded_nodes"]) == sorted({first_kill.node, second_kill.node}), \
        describe(run)
    assert not second.get("not_excluded_nodes"), describe(run)
    requeues = [e for e in run.events() if e.get("event") == "requeue"]
    assert (requeues[0]["attempt"], requeues[0]["nodes"]) == (2, 1), requeues
    # 3: the requeued job finishes with the weights of the uninterrupted run (on a loaded
    # machine its allocation may recover once more on its own: any further attempt is of it)
    assert third["job_id"] == job_id and third["restart_count"] == 1, describe(run)
    assert not {first_kill.node, second_kill.node} & set(third["nodes"]), describe(run)
    assert all(r["job_id"] == job_id and r["restart_count"] >= 1 for r in more), describe(run)
    last = (more or [third])[-1]
    assert (last["exit_reason"], last["end_step"]) == ("finished", 24), describe(run)
    assert_same_training(run, reference)
    status = hpctrain("status", run.id, env={"HPCTRAIN_RUNS_DIR": str(root)}, check=True).stdout
    assert f"{first_kill.node} -> {spare}" in status, status
    assert "restart in job" in status, status
    as_json = hpctrain("status", run.id, "--json", env={"HPCTRAIN_RUNS_DIR": str(root)},
                       check=True).stdout
    assert f"rank 1 on {first_kill.node} failed first" in as_json, as_json
    report = hpctrain("report", run.id, env={"HPCTRAIN_RUNS_DIR": str(root)},
                      check=True).stdout
    assert f"attempt 2 after 1: {first_kill.node} -> {spare}" in report, report
    events = [e for e in run.events() if e.get("event") == "in_job_restart"]
    assert [(e["attempt"], e["excluded"], e["spares"], e["steps_lost"]) for e in events] == \
        [(2, [first_kill.node], [spare], 2)], events


def slurmd_pid(node: str) -> int:
    """The pid of ``node``'s slurmd in this test's dev cluster (its slurm.conf's
    SlurmdPidFile: tools/dev_cluster runs one slurmd per node, each with its own pid file)."""
    conf = Path(os.environ["SLURM_CONF"]).read_text()
    (pattern,) = [line.split("=", 1)[1].strip() for line in conf.splitlines()
                  if line.startswith("SlurmdPidFile=")]
    return int(Path(pattern.replace("%n", node)).read_text().strip())


def node_state(node: str) -> str:
    return subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"], capture_output=True,
                          text=True, timeout=30).stdout.split("\n")[0].strip()


HANG_TIMEOUT_S = 30


def test_a_node_that_stops_answering_while_its_rank_hangs_is_replaced_by_the_spare(reference, root):
    """Two nodes train, the third is a spare; the preflight gate checks all three before
    training. At step 10 the node of rank 1 stops answering: its slurmd is stopped (SIGSTOP,
    so Slurm's own timeout finds it) and so is rank 1 (a node that hangs). Rank 0 goes on
    and waits for rank 1 in the next collective. The hang watcher names rank 1, Slurm marks
    its node down and takes it out of the allocation (``--no-kill``), and the batch shell
    restarts on the surviving node and the node-checked spare, from the step-8 checkpoint:
    same job, no trip through the queue, the uninterrupted run's weights."""
    profile = profile_file(root.parent, "drill-silent-node", env=held(10),
                           preflight={"gate": True, "sizes_mb": [0.25, 1], "timeout_s": 60},
                           resilience={"spare_nodes": 1, "max_in_job_restarts": 1})
    job = root.parent / "silent-node.yaml"
    data = yamlio.read_mapping(JOB)
    data["health"] = {"hang_timeout_s": HANG_TIMEOUT_S}
    data["data"]["path"] = str(REPO / "examples" / "data" / "kjv_byte")
    data["data"]["prepare_from"] = [str(REPO / "examples" / "corpus" / "kjv.txt.gz")]
    yamlio.write_atomic(job, yamlio.dump(data))
    run, job_id = submit(root, profile, job=job)
    beat = held_rank(run, 1, rank=1, step=10)
    batch_host = read_beats(run.attempt_dir(1))[0].node
    assert beat.node != batch_host     # the batch shell runs on the first node (rank 0's)
    daemon = slurmd_pid(beat.node)
    os.kill(daemon, signal.SIGSTOP)
    try:
        os.kill(beat.pid, signal.SIGSTOP)
        (run.path / "hold-release").write_text("10")   # rank 0 goes on, into the collective
        # until the batch shell decided: restart (attempt 2 began) or not (the ledger says)
        wait_until(lambda: read_restart(run, 2) is not None or
                   (run.ledger() and not run.ledger()[-1]["decision"].get("in_job")),
                   timeout=900, interval=2, what="the batch shell's decision on the hang")
    finally:
        os.kill(daemon, signal.SIGCONT)       # the node answers again (ReturnToService=2)
        try:
            os.kill(beat.pid, signal.SIGKILL)  # what the node's death would have ended
        except ProcessLookupError:
            pass
    wait_stopped(run, timeout=900)
    wait_until(lambda: "down" not in node_state(beat.node) and "*" not in node_state(beat.node),
               timeout=180, interval=2, what=f"{beat.node} back in service")
    first, second, *more = run.ledger()
    assert not more, describe(run)
    # the spares were preflighted with the training nodes, before training
    gate = json.loads((run.path / "preflight" / "attempt-1.json").read_text())
    full = json.loads(Path(gate["report"]).read_text())
    assert gate["passed"] and len(full["nodes"]) == 3, gate
    spare = (set(full["nodes"]) - set(first["nodes"])).pop()
    # the hung rank is named, its node left out, the spare (node-checked) takes its place
    assert first["exit_reason"] == "hung" and first["decision"].get("in_job"), describe(run)
    assert (first["hang"]["rank"], first["hang"]["node"]) == (1, beat.node), first["hang"]
    restart = second["in_job_restart"]
    assert restart["excluded"] == [beat.node] and restart["spares"] == [spare], restart
    # srun gave the step up only once Slurm declared the node failed: both reasons are named
    assert restart["why"].startswith(f"hung rank; {beat.node} not responding (DOWN"), restart
    assert [e["steps"] for e in run.events() if e.get("event") == "old_step_left"], \
        "the old step, stuck on the silent node, was not left to Slurm"
    assert sorted(second["nodes"]) == sorted([batch_host, spare]), describe(run)
    checked = [e for e in run.events() if e.get("event") == "node_check"]
    assert [(e["attempt"], e["nodes"]) for e in checked] == [(1, [spare])], checked
    assert second["job_id"] == job_id and second["restart_count"] == 0, describe(run)
    assert second["checkpoint_loaded"].endswith("step-00000008") and restart["steps_lost"] == 2
    assert (second["exit_reason"], second["end_step"]) == ("finished", 24), describe(run)
    assert_same_training(run, reference)
