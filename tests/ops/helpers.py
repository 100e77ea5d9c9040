"""Shared helpers of the operations tests: the smallest real job (tests/ops/tiny-ops.yaml, the
real runtime on one rank or a few), profiles that fit the dev cluster, run folders, and waits on
a run's files and jobs."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from hpctrain.config import load_job, load_profile, resolve
from hpctrain.record.reader import read_last_jsonl
from hpctrain.record.folder import RunFolder
from hpctrain.scheduler.state import live_jobs
from hpctrain.submission import prepare_run, submit_training
from tests.conftest import REPO, wait_until

OPS_JOB = REPO / "tests" / "ops" / "tiny-ops.yaml"


def slowed(profile, step_s: float, hold_after: int | None = None):
    """The profile with every training step slowed to at least ``step_s`` (the runtime's
    HPCTRAIN_TEST_STEP_SLEEP_S) and, with ``hold_after``, the ranks waiting after that step
    until the run is signalled or released (HPCTRAIN_TEST_HOLD_AFTER_STEP): a test that acts
    "mid-run" then acts mid-run whatever this machine's speed."""
    env = {**profile.env, "HPCTRAIN_TEST_HOOKS": "1", "HPCTRAIN_TEST_STEP_SLEEP_S": str(step_s)}
    if hold_after is not None:
        env["HPCTRAIN_TEST_HOLD_AFTER_STEP"] = str(hold_after)
    return dataclasses.replace(profile, env=env)


def ops_profile(*, nodes: int = 1, ranks_per_node: int = 1, step_s: float = 0.2,
                hold_after: int | None = None, max_requeues: int = 5, **slurm):
    """dev-slurm resized (``ranks_per_node`` fake GPUs = ranks on each node), steps slowed."""
    p = load_profile("dev-slurm")
    return slowed(dataclasses.replace(
        p, slurm=dataclasses.replace(p.slurm, nodes=nodes, gpus_per_node=ranks_per_node, **slurm),
        preemption=dataclasses.replace(p.preemption, max_requeues=max_requeues)), step_s,
        hold_after)


def ops_resolved(profile, steps: int | None = None, job_file: Path = OPS_JOB):
    """The job resolved on ``profile``, its token data prepared (as `hpctrain submit` does)."""
    from hpctrain.data.prepare import ensure_prepared
    job = load_job(job_file)
    if steps is not None:
        job.train.steps = steps
    ensure_prepared(job)
    return resolve(job, profile, source=str(job_file))


def ops_job() -> str:
    """tests/ops/tiny-ops.yaml with its token data prepared (for sweeps, which load it)."""
    from hpctrain.data.prepare import ensure_prepared
    ensure_prepared(load_job(OPS_JOB))
    return str(OPS_JOB)


def ops_run(root: Path, resolved) -> RunFolder:
    """A prepared run folder (not submitted)."""
    return prepare_run(resolved, root, source=str(OPS_JOB))


def start_run(root: Path, resolved):
    run = ops_run(root, resolved)
    return run, submit_training(resolved, run)


def step_of(run: RunFolder) -> int:
    m = read_last_jsonl(run.metrics_file)
    return m["step"] if m else 0


def wait_step(run: RunFolder, step: int, timeout: float = 240) -> int:
    return wait_until(lambda: step_of(run) >= step and step_of(run), timeout,
                      what=f"run {run.id} to reach step {step}")


def wait_stopped(run: RunFolder, timeout: float = 120) -> None:
    """Until the run has no pending or running job (the batch shell's end hook has run)."""
    time.sleep(0.5)
    wait_until(lambda: not live_jobs(run, kind=None), timeout, interval=1,
               what=f"run {run.id}'s jobs to end")


def wait_ledger(run: RunFolder, n: int, timeout: float = 120) -> list[dict]:
    return wait_until(lambda: len(run.ledger()) >= n and run.ledger(), timeout, interval=0.5,
                      what=f"{n} ledger records in run {run.id}")


def record(attempt: int, start: int, end: int, reason: str, requeue: bool, *, job_id="41",
           saved: int | None = None, loaded: int | None = None, why: str = "") -> dict:
    """A ledger record as the attempt recorder writes it."""
    return {"attempt": attempt, "job_id": job_id, "restart_count": attempt - 1, "scheduler": "slurm",
            "nodes": ["n1", "n2"], "start_time": 1000.0 * attempt, "end_time": 1000.0 * attempt + 65,
            "duration_s": 65.0, "start_step": start, "end_step": end, "exit_reason": reason,
            "exit_code": 75 if reason == "preempted" else 0,
            "checkpoint_loaded": f"/ck/step-{loaded:08d}" if loaded is not None else None,
            "checkpoint_saved": f"/ck/step-{saved:08d}" if saved is not None else None,
            "last_loss": 2.5, "decision": {"requeue": requeue, "reason": why or reason}}


def crafted_run(root: Path, *, ledger=(), metrics=(), events=(), checkpoints=(), steps=30,
                profile=None) -> RunFolder:
    """A run folder written by hand (no job): what a run looks like after its attempts
    (``profile``: dev-slurm's one node of 2 ranks unless given)."""
    from hpctrain.record.files import append_jsonl
    run = ops_run(root, ops_resolved(profile or ops_profile(ranks_per_node=2), steps=steps))
    for r in ledger:
        run.append_ledger(r)
    for m in metrics:
        append_jsonl(run.metrics_file, m)
    for e in events:
        append_jsonl(run.events_file, e)
    for step in checkpoints:
        write_checkpoint(run.checkpoint_dir(), step, attempt=1, run_id=run.id)
    return run


def write_checkpoint(root: Path, step: int, attempt: int, run_id: str | None = None,
                     **info) -> Path:
    """A published ``step-N`` folder (one small file, checksummed manifest naming ``run_id``)
    made with the runtime's own store functions: what listings and status read, without a
    model. ``info``: more manifest fields (``data``, ``consumed_samples``: what a training
    save records of its data position)."""
    import json
    from hpctrain.record import checkpoint_store as store
    partial = store.partial_dir(root, step, attempt)
    partial.mkdir(parents=True, exist_ok=True)
    (partial / "state.json").write_text(json.dumps({"step": step}))
    files = store.checksum_files(partial, store.list_files(partial))
    return store.publish(partial, root, step, store.build_manifest(step, files, run=run_id,
                                                                   **info))


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


class CliResult:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def cli(root: Path, *args: str, check: bool = True) -> CliResult:
    """``hpctrain ARGS`` in this process (Click's runner), with its runs folder at ``root``.
    The commands still talk to the real Slurm; only the interpreter start-up is saved."""
    from click.testing import CliRunner

    from hpctrain.cli import cli as group
    res = CliRunner().invoke(group, list(args), env={"HPCTRAIN_RUNS_DIR": str(root)},
                             catch_exceptions=False)
    out = CliResult(res.exit_code, res.stdout, res.stderr)
    if check and res.exit_code != 0:
        raise AssertionError(f"hpctrain {' '.join(args)} failed ({res.exit_code}):\n"
                             f"{res.stdout}\n{res.stderr}")
    return out
