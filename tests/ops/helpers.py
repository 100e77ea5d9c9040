"""Shared helpers of the operations tests: a profile and job that fit the dev cluster with one
node, run folders that run tests/ops/trainer.py, and waits on a run's files and jobs."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from hpctrain.config import load_job, load_profile, resolve
from hpctrain.ops.launch import submit_run_job
from hpctrain.runs import Run, read_last_jsonl
from hpctrain.slurm.state import live_jobs
from hpctrain.slurm.submit import prepare_run
from tests.conftest import REPO, wait_until

FAKE_JOB = REPO / "tests" / "ops" / "fake-job.yaml"
FAKE_ENTRY = "tests.ops.trainer:fake_train"


def fake_profile(*, nodes: int = 1, ranks_per_node: int = 2, step_s: float = 0.2,
                 max_requeues: int = 5, **slurm):
    p = load_profile("dev-slurm")
    return dataclasses.replace(
        p, env={**p.env, "FAKE_STEP_S": str(step_s)},
        slurm=dataclasses.replace(p.slurm, nodes=nodes, gpus_per_node=ranks_per_node, **slurm),
        preemption=dataclasses.replace(p.preemption, max_requeues=max_requeues))


def fake_resolved(profile, steps: int | None = None, job_file: Path = FAKE_JOB):
    job = load_job(job_file)
    if steps is not None:
        job.train.steps = steps
    return resolve(job, profile, source=str(job_file))


def fake_run(root: Path, resolved) -> Run:
    """A prepared run folder whose jobs run the stand-in trainer."""
    run = prepare_run(resolved, root, source=str(FAKE_JOB))
    run.update_meta(entry=FAKE_ENTRY)
    return run


def start_fake_run(root: Path, resolved):
    run = fake_run(root, resolved)
    return run, submit_run_job(resolved, run)


def step_of(run: Run) -> int:
    m = read_last_jsonl(run.metrics_file)
    return m["step"] if m else 0


def wait_step(run: Run, step: int, timeout: float = 90) -> int:
    return wait_until(lambda: step_of(run) >= step and step_of(run), timeout,
                      what=f"run {run.id} to reach step {step}")


def wait_stopped(run: Run, timeout: float = 120) -> None:
    """Until the run has no pending or running job (the batch shell's end hook has run)."""
    time.sleep(0.5)
    wait_until(lambda: not live_jobs(run, kind=None), timeout, interval=1,
               what=f"run {run.id}'s jobs to end")


def wait_ledger(run: Run, n: int, timeout: float = 120) -> list[dict]:
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


def crafted_run(root: Path, *, ledger=(), metrics=(), events=(), checkpoints=(), steps=30) -> Run:
    """A run folder written by hand (no job): what a run looks like after its attempts."""
    from hpctrain.runs import append_jsonl
    from tests.ops.trainer import _save
    run = fake_run(root, fake_resolved(fake_profile(), steps=steps))
    for r in ledger:
        run.append_ledger(r)
    for m in metrics:
        append_jsonl(run.metrics_file, m)
    for e in events:
        append_jsonl(run.events_file, e)
    for step in checkpoints:
        _save(run.checkpoint_dir(), step, attempt=1)
    return run


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
