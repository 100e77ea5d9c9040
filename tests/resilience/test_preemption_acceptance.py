"""Preemption, requeue and resume on the real dev Slurm cluster, with the real runtime.

These are the acceptance stories: a job is interrupted in every way a cluster interrupts jobs
(a signal, a higher-priority job, a rank killed while a checkpoint is written), requeues
itself while it makes progress, and ends with the same losses and the same final weights as a
run nobody interrupted (bitwise: CPU arithmetic is deterministic). A rank killed outright or a
node gone silent in a job that holds a spare node (restarts inside the allocation):
test_spare_drills.py. The time limit, and a job that cannot advance or has spent its requeue
budget: test_requeue_limits.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hpctrain.config import yamlio
from hpctrain.record.attempt_end import read_result
from hpctrain.record.folder import RunFolder, find_run
from tests.conftest import REPO, hpctrain
from tests.ops.helpers import wait_ledger, wait_step, wait_stopped

pytestmark = [pytest.mark.slurm, pytest.mark.megatron]
JOB = REPO / "tests" / "resilience" / "drill.yaml"


def profile_file(folder: Path, name: str, *, env: dict | None = None, **sections) -> str:
    """dev-slurm with one rank on each of the two nodes, changed by ``sections``; test hooks
    in ``env`` come with their switch."""
    data = yamlio.read_mapping(REPO / "cluster_profiles" / "dev-slurm.yaml")
    data["name"] = name
    data["slurm"].update(nodes=2, gpus_per_node=1)
    data["env"] = {**data.get("env", {}), **(env or {})}
    if any(k.startswith("HPCTRAIN_TEST_") for k in data["env"]):
        data["env"]["HPCTRAIN_TEST_HOOKS"] = "1"
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    path = folder / f"{name}.yaml"
    yamlio.write_atomic(path, yamlio.dump(data))
    return str(path)


def submit(root: Path, profile: str, *extra: str, job: Path = JOB) -> tuple[RunFolder, str]:
    proc = hpctrain("submit", str(job), "-p", profile, "--json", *extra,
                    env={"HPCTRAIN_RUNS_DIR": str(root)}, check=True)
    out = json.loads(proc.stdout)
    return find_run(out["run"], root), out["job_id"]


def held(*steps: int) -> dict:
    """Profile env that makes the ranks wait after each of ``steps`` until they are signalled:
    a drill "at step N" then happens mid-run, however fast this machine trains."""
    return {"HPCTRAIN_TEST_HOLD_AFTER_STEP": ",".join(map(str, steps))}


def drill(run: RunFolder, job_id: str, at_step: int, attempts: int, timeout: float = 300) -> list[dict]:
    """Once the run reaches ``at_step`` (where it holds: see ``held``): SIGUSR1 to the whole job
    (batch shell and ranks), as a person drilling preemption would; return the ledger once it
    holds ``attempts`` records."""
    wait_step(run, at_step, timeout=600)
    subprocess.run(["scancel", "--full", "-s", "USR1", job_id], check=True, timeout=30)
    return wait_ledger(run, attempts, timeout=timeout)


def losses(run: RunFolder) -> dict[int, float]:
    """step -> loss over all attempts (a step is trained once: attempts continue, never redo)."""
    out: dict[int, float] = {}
    for m in run.metrics():
        if m.get("loss") is not None:
            assert m["step"] not in out or out[m["step"]] == m["loss"], f"step {m['step']} twice"
            out[m["step"]] = m["loss"]
    return out


def final_digest(run: RunFolder) -> str:
    last = run.ledger()[-1]
    return read_result(run, last["attempt"]).weights_digest


def describe(run: RunFolder) -> str:
    rows = [f"{r['attempt']}: {r['exit_reason']} {r['start_step']}->{r['end_step']} "
            f"({r['decision']['reason']})" for r in run.ledger()]
    return f"ledger of {run.id}:\n  " + "\n  ".join(rows)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("resilience") / "runs"


def uninterrupted_run(root: Path) -> RunFolder:
    """The drills' job, trained by Slurm with nobody interrupting it: what every drill ends
    with (the same losses, the same final weights)."""
    run, _ = submit(root, profile_file(root.parent, "drill-ref"))
    wait_ledger(run, 1, timeout=600)
    wait_stopped(run)
    (rec,) = run.ledger()
    assert rec["exit_reason"] == "finished" and rec["end_step"] == 24, describe(run)
    return run


@pytest.fixture(scope="module")
def reference(slurm_cluster, root) -> RunFolder:
    """The same job, uninterrupted."""
    return uninterrupted_run(root)


def assert_same_training(run: RunFolder, reference: RunFolder) -> None:
    mine, ref = losses(run), losses(reference)
    assert sorted(mine) == list(range(1, 25)), f"steps trained: {sorted(mine)}"
    assert mine == ref, "losses differ from the uninterrupted run"
    assert final_digest(run) == final_digest(reference), "final weights differ"


def test_signal_drill_saves_requeues_and_resumes_bitwise(reference, root):
    run, job_id = submit(root, profile_file(root.parent, "drill-signal", env=held(7)))
    drill(run, job_id, at_step=7, attempts=2, timeout=600)
    wait_stopped(run)
    first, second = run.ledger()
    assert first["exit_reason"] == "preempted" and first["decision"]["requeue"], describe(run)
    stop = first["end_step"]
    assert 7 <= stop < 24 and first["checkpoint_saved"].endswith(f"step-{stop:08d}")
    assert (second["exit_reason"], second["start_step"], second["end_step"]) == \
        ("finished", stop, 24), describe(run)
    assert second["job_id"] == job_id and second["restart_count"] == 1
    assert second["checkpoint_loaded"] == first["checkpoint_saved"]
    assert_same_training(run, reference)


def test_real_preemption_by_a_higher_priority_job(reference, root):
    run, job_id = submit(root, profile_file(root.parent, "drill-preempted", env=held(6)))
    wait_step(run, 6, timeout=600)
    high = subprocess.run(["sbatch", "--parsable", "-p", "high", "-N", "2", "--exclusive",
                           "--time=2", "-o", "/dev/null", "--wrap", "sleep 5"],
                          capture_output=True, text=True, check=True).stdout.strip()
    wait_ledger(run, 2, timeout=900)
    wait_stopped(run, timeout=300)
    records = run.ledger()
    assert records[0]["exit_reason"] in ("preempted", "killed"), describe(run)
    assert records[-1]["exit_reason"] == "finished" and records[-1]["end_step"] == 24, describe(run)
    assert all(r["job_id"] == job_id for r in records)
    assert records[-1]["restart_count"] >= 1      # Slurm itself requeued it
    sacct = subprocess.run(["sacct", "-n", "-X", "-j", high, "-o", "State"], capture_output=True,
                           text=True).stdout
    assert "COMPLETED" in sacct                   # the high-priority job really ran
    assert_same_training(run, reference)


def test_kill_during_save_resumes_from_the_previous_complete_checkpoint(reference, root):
    profile = profile_file(root.parent, "drill-kill",
                           env={"HPCTRAIN_TEST_KILL_DURING_SAVE": "1@16"},
                           preemption={"requeue_on_failure": True})
    run, _ = submit(root, profile)
    wait_ledger(run, 2, timeout=900)
    wait_stopped(run)
    first, second = run.ledger()
    assert first["exit_reason"] in ("killed", "failed") and first["decision"]["requeue"], describe(run)
    assert second["checkpoint_loaded"].endswith("step-00000008"), describe(run)
    assert (second["exit_reason"], second["start_step"], second["end_step"]) == ("finished", 8, 24)
    ckpt = Path(run.meta()["checkpoint_dir"])
    quarantined = [p.name for p in ckpt.rglob("*") if p.is_dir() and "00000016" in p.name
                   and "quarantine" in str(p.relative_to(ckpt))]
    assert quarantined, f"the partial step-16 checkpoint was not set aside: {sorted(ckpt.rglob('*'))}"
    assert_same_training(run, reference)


def test_resume_on_a_different_layout_continues_from_the_same_step(reference, root):
    """4 ranks would not fit every CPU here; 2 ranks (DP2, ZeRO-1 shards) -> 1 rank (DP1)."""
    profile = profile_file(root.parent, "drill-shrink", env=held(10),
                           preemption={"max_requeues": 0})
    run, job_id = submit(root, profile)
    drill(run, job_id, at_step=10, attempts=1)
    wait_stopped(run)
    (first,) = run.ledger()
    assert first["exit_reason"] == "preempted" and not first["decision"]["requeue"], describe(run)
    stop = first["end_step"]
    hpctrain("resume", run.id, "--nodes", "1", env={"HPCTRAIN_RUNS_DIR": str(root)}, check=True)
    wait_ledger(run, 2, timeout=600)
    wait_stopped(run)
    second = run.ledger()[-1]
    assert (second["exit_reason"], second["start_step"], second["end_step"]) == \
        ("finished", stop, 24), describe(run)
    assert second["nodes"] == ["n1"] or len(second["nodes"]) == 1
    assert run.resolved_profile().world_size == 1
    mine, ref = losses(run), losses(reference)
    assert sorted(mine) == list(range(1, 25))
    for step in range(1, stop + 1):
        assert mine[step] == ref[step]
    for step in range(stop + 1, 25):   # DP1 sums the same microbatches in another order
        assert abs(mine[step] - ref[step]) < 1e-4, (step, mine[step], ref[step])
