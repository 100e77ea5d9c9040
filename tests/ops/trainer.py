"""A stand-in for the training runtime that keeps its contract with the rest of hpctrain, for
tests about operations (status, logs, chains, sweeps, cancel, report) that need no model: it
"trains" by sleeping, and otherwise behaves as ``hpctrain.runtime.entry.train_main`` does.

* resumes from the newest complete checkpoint under ``Run.checkpoint_dir()`` (``step-N`` with a
  manifest, ``latest`` pointer), published through the runtime's own store functions;
* rank 0 appends one metrics.jsonl record per step and writes the attempt's result.json;
* SIGUSR1/SIGTERM (or the batch shell's signal flag) -> emergency checkpoint -> exit 75;
* under the local executor (one rank), it claims the attempt, logs to the rank log and records
  the ledger itself, as the runtime does there.

Speed comes from the profile's env: FAKE_STEP_S (seconds per step, default 0.2).
Pickled by value, so the job need not import the tests package.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from pathlib import Path

import cloudpickle

PREEMPTED = 75


def _loss(step: int) -> float:
    return round(2.0 + 3.0 * math.exp(-step / 20.0), 6)


def _save(root: Path, step: int, attempt: int) -> Path:
    from hpctrain.runtime.checkpoint import store
    partial = store.partial_dir(root, step, attempt)
    partial.mkdir(parents=True, exist_ok=True)
    (partial / "state.json").write_text(json.dumps({"step": step}))
    files = store.checksum_files(partial, store.list_files(partial))
    return store.publish(partial, root, step, store.build_manifest(step, files))


def _newest(root: Path) -> tuple[int, Path | None]:
    from hpctrain.runtime.checkpoint import store
    for step, folder in store.complete_checkpoints(root):
        if not store.manifest_problems(folder, store.read_manifest(folder)):
            return step, folder
    return 0, None


def _local_end(run, attempt: int, code: int, began: float) -> None:
    """Under the local executor (no batch shell) rank 0 records the attempt itself, as the
    runtime does, and exits 144 when the policy says requeue."""
    from hpctrain.attempts import finish_attempt
    _, decision = finish_attempt(run, attempt, code, scheduler="local", started_at=began)
    sys.stdout.flush()
    os._exit(144 if decision.requeue else code)


def fake_train(run_dir: str) -> str:
    from hpctrain.attempts import write_result
    from hpctrain.runs import Run, append_jsonl
    run = Run(Path(run_dir))
    job = run.resolved_job()
    local = "SLURM_JOB_ID" not in os.environ  # one rank only under the local executor
    rank = int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")))
    attempt = int(os.environ["HPCTRAIN_ATTEMPT"]) if not local else run.begin_attempt()
    if local and os.environ.get("HPCTRAIN_LOG_TO_FILE") == "1":
        log = open(run.rank_log(attempt, rank), "a", buffering=1)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = log
    flag = os.environ.get("HPCTRAIN_SIGNAL_FLAG")
    step_s = float(os.environ.get("FAKE_STEP_S", "0.2"))
    got = []
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda n, f: got.append(n))
    root = run.checkpoint_dir()
    start, loaded = _newest(root)
    began = time.time()
    print(f"rank {rank}: attempt {attempt} starts at step {start}"
          + (f" from {loaded.name}" if loaded else ""), flush=True)
    saved = None
    step = start
    while step < job.train.steps:
        if got or (flag and os.path.exists(flag)):
            if rank == 0:
                saved = _save(root, step, attempt)
                write_result(run, attempt, {"start_step": start, "end_step": step,
                                            "exit_reason": "preempted", "start_time": began,
                                            "checkpoint_loaded": str(loaded) if loaded else None,
                                            "checkpoint_saved": str(saved), "last_loss": _loss(step)})
            print(f"rank {rank}: signal at step {step}; saved, exiting {PREEMPTED}", flush=True)
            sys.stdout.flush()
            if local:
                _local_end(run, attempt, PREEMPTED, began)
            os._exit(PREEMPTED)
        time.sleep(step_s)
        step += 1
        if rank == 0:
            append_jsonl(run.metrics_file, {
                "step": step, "loss": _loss(step), "grad_norm": 1.0 / step, "lr": job.train.lr,
                "tokens_per_s": 1000.0 + 10 * step, "step_time_s": step_s, "mfu": 0.3 + step / 1000,
                "attempt": attempt, "time": time.time()})
            if step % job.train.log_interval == 0:
                print(f"step {step} loss {_loss(step):.4f}", flush=True)
            if job.checkpoint.interval_steps and step % job.checkpoint.interval_steps == 0 \
                    and step < job.train.steps:
                saved = _save(root, step, attempt)
    if rank == 0:
        saved = _save(root, step, attempt)
        write_result(run, attempt, {"start_step": start, "end_step": step, "exit_reason": "finished",
                                    "start_time": began,
                                    "checkpoint_loaded": str(loaded) if loaded else None,
                                    "checkpoint_saved": str(saved), "last_loss": _loss(step)})
    print(f"rank {rank}: finished at step {step}", flush=True)
    if local:
        from hpctrain.attempts import finish_attempt
        finish_attempt(run, attempt, 0, scheduler="local", started_at=began)
    return "finished"


cloudpickle.register_pickle_by_value(sys.modules[__name__])
