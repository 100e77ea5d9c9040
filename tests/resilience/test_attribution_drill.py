"""Who is blamed when a rank is killed outright, on the real dev Slurm cluster with the real
runtime: 4 ranks on 2 nodes, rank 3 SIGKILLed mid-run (as the OOM killer or a dying node
would). It writes nothing; its peers fail a moment later with "Connection closed by peer" and
each records that. The ledger must name rank 3 on its node, not a peer that noticed.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from hpctrain.health.heartbeat import read_beats
from tests.conftest import hpctrain, wait_until
from tests.ops.helpers import wait_ledger, wait_stopped
from tests.resilience.test_health_drills import describe, submit

pytestmark = [pytest.mark.slurm, pytest.mark.megatron]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("attribution") / "runs"


def test_a_sigkilled_rank_is_blamed_not_the_peers_that_noticed(slurm_cluster, root):
    # the hang watcher stays out of it: on a loaded machine srun's teardown of the survivors
    # (KillWait) can outlast the drills' usual 30 s hang limit, and the attempt would end as hung
    run, _ = submit(root, "blame-sigkill", env={"HPCTRAIN_TEST_HOLD_AFTER_STEP": "10"},
                    hang_timeout_s=900)
    beat = wait_until(lambda: next((b for r, b in read_beats(run.attempt_dir(1)).items()
                                    if r == 3 and b.step == 10 and b.phase.startswith("held")),
                                   None), 900, what="rank 3's heartbeat held at step 10")
    os.kill(beat.pid, signal.SIGKILL)           # the dev cluster's "nodes" share this host
    (run.path / "hold-release").touch()         # the others go on, into the next collective
    (record,) = wait_ledger(run, 1, timeout=600)
    wait_stopped(run, timeout=300)
    folder = run.attempt_dir(1)
    peers = {}
    for path in folder.glob("failure-rank-*.json"):
        data = json.loads(path.read_text())
        peers[data["rank"]] = data["message"]
    # the drill is what it claims: rank 3 left nothing, and a peer did blame the lost connection
    assert 3 not in peers, peers
    assert peers, f"no peer recorded a failure: {describe(run)}"
    assert record["exit_reason"] == "failed", describe(run)
    culprit = record["first_failure"]
    assert (culprit["rank"], culprit["node"]) == (3, beat.node), describe(run)
    assert culprit["cause"] == "signal" and "Killed" in culprit["message"], culprit
    assert record["message"].startswith(f"rank 3 on {beat.node} failed first"), record["message"]
    status = json.loads(hpctrain("status", run.id, "--json", env={"HPCTRAIN_RUNS_DIR": str(root)},
                                 check=True).stdout)
    assert f"rank 3 on {beat.node}" in json.dumps(status), status
