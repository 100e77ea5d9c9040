"""Health in flight on the real dev Slurm cluster, with the real runtime: 4 ranks on 2 nodes
(2 per node; the cluster has 3, so a node can be left out).

* A rank stopped with SIGSTOP mid-run, and a rank that blocks forever inside one of
  megatron-core's collectives: the attempt ends within hang_timeout_s + a minute, the ledger
  names the rank and its node, every rank's stacks are in logs/attempt-1/, the job is requeued
  on the other nodes and finishes with the losses of an uninterrupted run.
* A rank slowed on purpose: its node is named (metrics, events, status, report), and with
  health.exclude_stragglers the job saves, requeues without it and finishes the same.

One uninterrupted run serves as the reference for all of them: it is also the "named only"
straggler drill (a slow rank changes no number, only the time).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from hpctrain.config import yamlio
from hpctrain.health.heartbeat import read_beats
from hpctrain.record.folder import RunFolder, find_run
from tests.conftest import REPO, hpctrain, wait_until
from tests.ops.helpers import wait_ledger, wait_step, wait_stopped

# a native frame in py-spy's output: a shared library's function (libc's, whatever the
# Python build: a static one has no libpython)
NATIVE_FRAME = re.compile(r"\(lib[\w.+-]*\.so[\d.]*\)")

pytestmark = [pytest.mark.slurm, pytest.mark.megatron]
HANG_TIMEOUT_S = 30
SLOW = {"HPCTRAIN_TEST_SLOW_RANK": "3:0.5"}


def profile_file(folder: Path, name: str, env: dict | None = None) -> str:
    data = yamlio.read_mapping(REPO / "cluster_profiles" / "dev-slurm.yaml")
    data["name"] = name
    data["slurm"].update(nodes=2, gpus_per_node=2)
    data["env"] = {**data.get("env", {}), **(env or {})}
    if any(k.startswith("HPCTRAIN_TEST_") for k in data["env"]):
        data["env"]["HPCTRAIN_TEST_HOOKS"] = "1"
    path = folder / f"{name}-profile.yaml"
    yamlio.write_atomic(path, yamlio.dump(data))
    return str(path)


def job_file(folder: Path, name: str, **health) -> Path:
    """tests/resilience/drill.yaml (DP4 with ZeRO-1 here, a checkpoint every 8 steps) with
    ``health`` settings; stragglers only named well above this shared machine's noise."""
    data = yamlio.read_mapping(REPO / "tests" / "resilience" / "drill.yaml")
    data["health"] = {"hang_timeout_s": HANG_TIMEOUT_S, "straggler_factor": 3.0, **health}
    data["data"]["path"] = str(REPO / "examples" / "data" / "kjv_byte")
    data["data"]["prepare_from"] = [str(REPO / "examples" / "corpus" / "kjv.txt.gz")]
    path = folder / f"{name}-job.yaml"
    yamlio.write_atomic(path, yamlio.dump(data))
    return path


def submit(root: Path, name: str, env: dict | None = None, **health) -> tuple[RunFolder, str]:
    proc = hpctrain("submit", str(job_file(root.parent, name, **health)), "-p",
                    profile_file(root.parent, name, env), "--json",
                    env={"HPCTRAIN_RUNS_DIR": str(root)}, check=True)
    out = json.loads(proc.stdout)
    return find_run(out["run"], root), out["job_id"]


def losses(run: RunFolder) -> dict[int, float]:
    out: dict[int, float] = {}
    for m in run.metrics():
        if m.get("loss") is not None:
            assert m["step"] not in out or out[m["step"]] == m["loss"], f"step {m['step']} differs"
            out[m["step"]] = m["loss"]
    return out


def describe(run: RunFolder) -> str:
    return "ledger:\n  " + "\n  ".join(
        f"{r['attempt']}: {r['exit_reason']} {r['start_step']}->{r['end_step']} on {r['nodes']} "
        f"({r['decision']['reason']}) {r.get('message') or ''}" for r in run.ledger())


def stacks(run: RunFolder, attempt: int) -> dict[int, str]:
    folder = run.attempt_dir(attempt)
    return {r: (folder / f"stacks-rank-{r}.txt").read_text(errors="replace")
            for r in range(4) if (folder / f"stacks-rank-{r}.txt").exists()}


def status_json(root: Path, run: RunFolder) -> dict:
    return json.loads(hpctrain("status", run.id, "--json", env={"HPCTRAIN_RUNS_DIR": str(root)},
                               check=True).stdout)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("health") / "runs"


@pytest.fixture(scope="module")
def reference(slurm_cluster, root) -> RunFolder:
    """Uninterrupted, with rank 3 slowed: its node is named, nothing else changes."""
    run, _ = submit(root, "health-ref", env=SLOW, straggler_window=2)
    wait_ledger(run, 1, timeout=900)
    wait_stopped(run)
    (rec,) = run.ledger()
    assert rec["exit_reason"] == "finished" and rec["end_step"] == 24, describe(run)
    return run


def assert_resumed_on_other_nodes(run: RunFolder, reference: RunFolder, node: str, reason: str) -> dict:
    first, second = run.ledger()
    assert first["exit_reason"] == reason and first["decision"]["requeue"], describe(run)
    assert first["excluded_nodes"] == [node], describe(run)
    assert node in first["nodes"] and node not in second["nodes"], describe(run)
    assert (second["exit_reason"], second["end_step"]) == ("finished", 24), describe(run)
    assert second["checkpoint_loaded"], describe(run)
    assert second["start_step"] == int(Path(second["checkpoint_loaded"]).name.split("-")[1])
    mine = losses(run)
    assert sorted(mine) == list(range(1, 25)) and mine == losses(reference)
    (requeue,) = [e for e in run.events() if e.get("event") == "requeue"]
    assert requeue["excluded"] == [node]
    return first


def test_a_slow_rank_is_named_in_metrics_events_status_and_report(reference, root):
    node = read_beats(reference.attempt_dir(1))[3].node
    named = [m for m in reference.metrics() if m.get("stragglers")]
    assert named and all([n["node"] for n in m["stragglers"]] == [node] for m in named)
    assert named[0]["step"] == 2 and named[0]["stragglers"][0]["ranks"] == [3]
    (event,) = [e for e in reference.events() if e.get("event") == "straggler"]
    assert (event["node"], event["ranks"], event["step"]) == (node, [3], 2)
    data = status_json(root, reference)
    assert [s["node"] for s in data["stragglers"]] == [node]
    assert data["stragglers"][0]["excluded_after_attempt"] is None
    text = hpctrain("status", reference.id, env={"HPCTRAIN_RUNS_DIR": str(root)}).stdout
    assert f"Stragglers  {node}: rank 3 at" in text, text
    from hpctrain.ops.report import build_figure, collect
    fig = build_figure(collect(reference))
    marks = [line for ax in fig.axes for line in ax.get_lines()
             if line.get_gid() == f"straggler-{node}"]
    assert marks and list(marks[0].get_xdata())[0] == 2
    report = hpctrain("report", reference.id, env={"HPCTRAIN_RUNS_DIR": str(root)}, check=True)
    assert f"Stragglers  {node} (named at step 2)" in report.stdout


def test_a_stopped_rank_is_named_its_node_excluded_and_the_run_resumes(reference, root):
    run, _ = submit(root, "health-sigstop", env={"HPCTRAIN_TEST_HOLD_AFTER_STEP": "10"})
    wait_step(run, 10, timeout=900)
    # rank 3 as the batch shell last sees it before it stops: held after step 10
    beat = wait_until(lambda: next((b for r, b in read_beats(run.attempt_dir(1)).items()
                                    if r == 3 and b.step == 10 and b.phase.startswith("held")),
                                   None), 120, what="rank 3's heartbeat at step 10")
    os.kill(beat.pid, signal.SIGSTOP)           # the dev cluster's "nodes" share this host
    stopped = time.time()
    (run.path / "hold-release").touch()         # the others go on, into the next collective
    wait_ledger(run, 2, timeout=900)
    wait_stopped(run, timeout=300)
    first = assert_resumed_on_other_nodes(run, reference, beat.node, "hung")
    hang = first["hang"]
    # judged past its limit, after the stop, and the attempt ended after the verdict (how soon
    # is a matter of speed, not of this drill's verdict)
    assert hang["idle_s"] > hang["limit_s"], describe(run)
    assert stopped <= hang["detected_at"] <= first["end_time"], describe(run)
    assert (hang["rank"], hang["node"], hang["step"]) == (3, beat.node, 10)
    assert "heartbeat stopped" in hang["why"] and hang["decided_by"] == "batch shell"
    assert first["first_failure"]["rank"] == 3
    assert first["message"].startswith(f"rank 3 on {beat.node} made no progress for ")
    dumps = stacks(run, 1)
    assert sorted(dumps) == [0, 1, 2, 3], sorted(dumps)
    assert "hold_after" in dumps[3]             # where SIGSTOP caught it
    assert all("most recent call first" in d for d in dumps.values())
    assert all("py-spy dump --native" in d and NATIVE_FRAME.search(d) for d in dumps.values())


def test_a_rank_blocked_inside_a_megatron_collective_is_named_and_its_node_excluded(reference,
                                                                                     root):
    run, _ = submit(root, "health-collective",
                    env={"HPCTRAIN_TEST_HANG_IN_COLLECTIVE": "10@3"})
    wait_ledger(run, 2, timeout=1200)
    wait_stopped(run, timeout=300)
    node = read_beats(run.attempt_dir(1))[3].node
    first = assert_resumed_on_other_nodes(run, reference, node, "hung")
    hang = first["hang"]
    assert (hang["rank"], hang["step"]) == (3, 9), describe(run)
    assert "wait in a collective it never issued" in hang["why"], hang["why"]
    dumps = stacks(run, 1)
    assert sorted(dumps) == [0, 1, 2, 3]
    assert "runtime/faults.py" in dumps[3] and "megatron/core" in dumps[3]
    assert "megatron/core" in dumps[0]


def test_a_slow_node_is_excluded_when_asked(reference, root):
    run, _ = submit(root, "health-exclude", env=SLOW, straggler_window=2,
                    exclude_stragglers=True)
    wait_ledger(run, 2, timeout=1200)
    wait_stopped(run, timeout=300)
    node = read_beats(run.attempt_dir(1))[3].node
    first = assert_resumed_on_other_nodes(run, reference, node, "straggler")
    assert first["end_step"] == 2 and first["checkpoint_saved"].endswith("step-00000002")
    assert first["straggler"]["ranks"] == [3] and first["exit_code"] == 75
    data = status_json(root, run)
    assert data["stragglers"][0]["excluded_after_attempt"] == 1
