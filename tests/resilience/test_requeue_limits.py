"""Requeue's limits on the real dev Slurm cluster, with the real runtime: the time limit makes
every attempt save and requeue before Slurm's kill until the run is done; a job that cannot
advance, or whose requeue budget is spent, stops with the reason in its ledger instead of
looping. (The drills that compare against an uninterrupted run are in
test_preemption_acceptance.py; these need none, so they run on a cluster of their own.)
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hpctrain.config import yamlio
from tests.conftest import REPO, hpctrain, wait_until
from tests.ops.helpers import wait_ledger, wait_stopped
from tests.resilience.test_preemption_acceptance import (JOB, describe, drill, held,
                                                         profile_file, submit)

pytestmark = [pytest.mark.slurm, pytest.mark.megatron]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("requeue-limits") / "runs"


LEAD_TIME_S = 25        # preemption.lead_time_s
HOLDS = (5, 14)         # the ranks wait after these steps until they are told to stop
STEPS = 20


def test_time_limit_saves_and_requeues_before_the_kill_until_done(slurm_cluster, root):
    """A 1-minute limit (the shortest Slurm has): the signal 25 s ahead (Slurm's early warning,
    re-raised on time by the batch shell) makes every attempt but the last save and requeue
    before Slurm's kill, and the run finishes. The ranks wait after steps 5 and 14 until they
    are told to stop, so the run needs at least three windows whatever this machine's speed:
    the attempt that gets past step 5 is the one the signal released there, and it ends with
    the next step's save; so does the one that gets past 14; a third finishes. A slower
    machine, whose attempt starts too slowly to reach its hold within a window, only needs
    more windows, each ended the same way. (The runtime's own deadline, which stops at a step
    boundary when the time left is too short for a save, is the same stop-and-save path; it is
    tested without Slurm in tests/runtime.)"""
    profile = profile_file(root.parent, "drill-timelimit",
                           env={**held(*HOLDS), "HPCTRAIN_TEST_HOLD_MAX_S": "3600"},
                           slurm={"time_limit": "00:01:00"},
                           preemption={"lead_time_s": LEAD_TIME_S, "max_requeues": 30})
    job = root.parent / "timelimit.yaml"
    data = yamlio.read_mapping(JOB)
    data["train"]["steps"] = STEPS
    data["checkpoint"]["interval_steps"] = 5
    data["data"]["path"] = str(REPO / "examples" / "data" / "kjv_byte")
    data["data"]["prepare_from"] = [str(REPO / "examples" / "corpus" / "kjv.txt.gz")]
    yamlio.write_atomic(job, yamlio.dump(data))
    run, job_id = submit(root, profile, job=job)
    wait_until(lambda: run.ledger() and run.ledger()[-1]["exit_reason"] == "finished"
               or (run.ledger() and not run.ledger()[-1]["decision"]["requeue"]), timeout=2400,
               interval=2, what="the time-limited run to finish")
    wait_stopped(run)
    records = run.ledger()
    assert records[-1]["exit_reason"] == "finished" and records[-1]["end_step"] == STEPS, \
        describe(run)
    ends = [r["end_step"] for r in records]
    assert all(hold + 1 in ends for hold in HOLDS), describe(run)  # released by the signal
    assert len(records) >= 3, describe(run)          # by construction: see the docstring
    for before, after in zip(records, records[1:]):
        # every attempt but the last ended by its own save before Slurm's kill ...
        assert before["exit_reason"] in ("preempted", "deadline"), describe(run)
        assert before["checkpoint_saved"], describe(run)
        assert before["checkpoint_saved"].endswith(f"step-{before['end_step']:08d}"), describe(run)
        assert before["decision"]["requeue"], describe(run)
        # ... and the next one resumed exactly where it saved
        assert after["checkpoint_loaded"] == before["checkpoint_saved"], describe(run)
        assert after["start_step"] == before["end_step"], describe(run)
    sacct = subprocess.run(["sacct", "-n", "-X", "-D", "-j", job_id, "-o", "State"],
                           capture_output=True, text=True).stdout.split()
    assert "TIMEOUT" not in sacct, f"Slurm killed an attempt at the time limit: {sacct}"


def test_a_job_that_cannot_advance_stops_instead_of_looping(slurm_cluster, root):
    profile = profile_file(root.parent, "drill-stuck", env={"HPCTRAIN_TEST_CRASH_AT_STEP": "5"},
                           preemption={"requeue_on_failure": True, "max_requeues": 5})
    run, _ = submit(root, profile)
    wait_ledger(run, 2, timeout=600)
    wait_stopped(run)
    first, second = run.ledger()
    assert first["exit_reason"] == "failed" and first["decision"]["requeue"], describe(run)
    assert second["exit_reason"] == "failed" and not second["decision"]["requeue"]
    assert second["decision"]["reason"].startswith("no progress"), describe(run)
    status = hpctrain("status", run.id, env={"HPCTRAIN_RUNS_DIR": str(root)}, check=True).stdout
    assert "no progress" in status


def test_requeue_budget_is_respected(slurm_cluster, root):
    profile = profile_file(root.parent, "drill-budget", env=held(5, 14),
                           preemption={"max_requeues": 1})
    run, job_id = submit(root, profile)
    (one,) = drill(run, job_id, at_step=5, attempts=1)
    assert one["end_step"] < 14, describe(run)     # the second attempt reaches its hold
    drill(run, job_id, at_step=14, attempts=2)
    wait_stopped(run)
    first, second = run.ledger()
    assert first["decision"]["requeue"] and not second["decision"]["requeue"], describe(run)
    assert "requeue budget spent (1 of preemption.max_requeues=1)" in second["decision"]["reason"]
    assert second["exit_reason"] == "preempted" and second["checkpoint_saved"]
