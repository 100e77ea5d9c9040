"""The local controller (submitit's, run as ``python -m hpctrain.scheduler.local.controller``):
every start of the ranks is a new attempt of the run, with its own number and deadline, as
the batch shell makes each start of a Slurm job one (real controller, real processes)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from hpctrain import exit_codes
from hpctrain.config import load_job, load_profile, resolve
from hpctrain.scheduler.local.jobs import CONTROLLER_MODULE
from hpctrain.submission import prepare_run
from tests.conftest import REPO

TIME_LIMIT_S = 3600
# each task writes what it was given; the first attempt stays 2 s, then asks to be requeued
TASK = """
import json, os, sys, time
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"task": os.environ["SUBMITIT_LOCAL_LOCALID"], "at": time.time(),
                        "attempt": os.environ.get("HPCTRAIN_ATTEMPT"),
                        "deadline": os.environ.get("HPCTRAIN_DEADLINE")}) + "\\n")
if os.environ.get("HPCTRAIN_ATTEMPT") == sys.argv[2]:
    time.sleep(2)
    sys.exit(int(sys.argv[3]))
"""


def _run(tmp_path: Path):
    resolved = resolve(load_job(REPO / "examples" / "tiny.yaml"), load_profile("local"))
    return prepare_run(resolved, tmp_path / "runs")


def _control(run, out: Path, requeue_attempt: str) -> tuple[subprocess.CompletedProcess, list]:
    """Run the controller over two tasks of ``TASK`` to its end; what the tasks saw."""
    command = shlex.join([sys.executable, "-c", TASK, str(out), requeue_attempt,
                          str(exit_codes.LOCAL_REQUEUE)])
    env = {**os.environ, "HPCTRAIN_RUN_DIR": str(run.path), "SUBMITIT_LOCAL_NTASKS": "2",
           "SUBMITIT_LOCAL_COMMAND": command, "SUBMITIT_LOCAL_TIMEOUT_S": str(TIME_LIMIT_S),
           "SUBMITIT_LOCAL_SIGNAL_DELAY_S": "30", "SUBMITIT_STDERR_TO_STDOUT": "1",
           "SUBMITIT_LOCAL_WITH_SHELL": ""}
    done = subprocess.run([sys.executable, "-m", CONTROLLER_MODULE, str(run.submitit_dir)],
                          env=env, capture_output=True, text=True, timeout=300)
    seen = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return done, seen


def test_a_requeue_starts_a_new_attempt_with_its_own_deadline(tmp_path):
    run = _run(tmp_path)
    done, seen = _control(run, tmp_path / "seen.jsonl", requeue_attempt="1")
    assert done.returncode == 0, done.stderr
    by_attempt: dict[str, list] = {}
    for s in seen:
        by_attempt.setdefault(s["attempt"], []).append(s)
    assert sorted(by_attempt) == ["1", "2"]
    assert all(len(tasks) == 2 for tasks in by_attempt.values())  # both ranks, one number
    deadlines = {a: {int(s["deadline"]) for s in tasks} for a, tasks in by_attempt.items()}
    assert all(len(d) == 1 for d in deadlines.values())            # one deadline per attempt
    (first,), (second,) = deadlines["1"], deadlines["2"]
    # the controller's timer starts again at each start: the second attempt started at least
    # 2 s after the first (its tasks stayed 2 s), so its deadline is at least 2 s later
    assert second - first >= 2
    for s in seen:                 # a deadline counts from a start that came before the task
        assert int(s["deadline"]) - TIME_LIMIT_S <= s["at"]
    starts = [e for e in run.events() if e.get("event") == "attempt_start"]
    assert [e["attempt"] for e in starts] == [1, 2]
    assert run.attempts_started() == [1, 2]


def test_an_attempt_without_its_record_is_recorded_and_never_reused(tmp_path):
    """Rank 0 of attempt 1 was killed before it wrote the ledger record, leaving its folder
    (with a hang report the watchdog of a reused attempt 1 would act on): the next start
    records attempt 1 and runs attempt 2."""
    run = _run(tmp_path)
    stale = run.attempt_dir(1)
    stale.mkdir(parents=True)
    (stale / "hang.json").write_text(json.dumps({"rank": 1}))
    assert run.ledger() == []
    done, seen = _control(run, tmp_path / "seen.jsonl", requeue_attempt="none")
    assert done.returncode == 0, done.stderr
    assert {s["attempt"] for s in seen} == {"2"}
    (lost,) = run.ledger()
    assert lost["attempt"] == 1 and lost["scheduler"] == "local"
    assert "rank 0, which would have written this record, was killed first" in lost["note"]
    assert f"attempt 1 of run {run.id} ended without its ledger record" in done.stderr
