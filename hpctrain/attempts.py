"""The end of one attempt: merge what the ranks and the scheduler know, decide, record.

Rank 0 writes ``logs/attempt-N/result.json`` (steps, exit reason, checkpoints) just before it
exits. Whoever outlives the ranks — the batch shell on Slurm, rank 0 itself under the local
executor — then calls :func:`finish_attempt`, which adds the scheduler's facts (job id, restart
count, nodes, the step's exit code), asks :mod:`hpctrain.requeue_policy` whether to requeue,
and appends one ledger record. When the ranks died without a result (SIGKILL, node failure),
the record still gets written, from the exit code alone.

Every rank that fails also leaves ``logs/attempt-N/failure-rank-R.json`` (when, where, what).
One crash makes every peer fail a moment later ("connection closed by peer"), so the record
names the *earliest* failure — the cause — not rank 0's echo of it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from . import exit_codes
from .requeue_policy import Decision, decide
from .runs import Run, now_iso

RESULT_FILE = "result.json"
FAILURE_GLOB = "failure-rank-*.json"


def result_path(run: Run, attempt: int) -> Path:
    return run.attempt_dir(attempt) / RESULT_FILE


def write_result(run: Run, attempt: int, result: dict) -> None:
    """Rank 0: record what this attempt did (atomic write)."""
    from .config import yamlio
    yamlio.write_atomic(result_path(run, attempt), json.dumps(result, indent=1))


def read_result(run: Run, attempt: int) -> dict:
    try:
        return json.loads(result_path(run, attempt).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def write_failure(run: Run, attempt: int, rank: int, node: str, at: float, message: str) -> None:
    """Any rank, as it fails: what went wrong there and when (atomic write)."""
    from .config import yamlio
    folder = run.attempt_dir(attempt)
    folder.mkdir(parents=True, exist_ok=True)
    yamlio.write_atomic(folder / f"failure-rank-{rank}.json",
                        json.dumps({"rank": rank, "node": node, "time": at, "message": message}))


def first_failure(run: Run, attempt: int) -> dict | None:
    """The earliest failure any rank recorded in ``attempt``, or None."""
    found = []
    for path in run.attempt_dir(attempt).glob(FAILURE_GLOB):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    found = [f for f in found if isinstance(f.get("time"), (int, float))]
    return min(found, key=lambda f: (f["time"], f.get("rank", 0))) if found else None


def _saved_at_end(result: dict) -> bool:
    """The attempt's newest published checkpoint is of its last step."""
    from .runtime.checkpoint.store import step_name
    saved, end = result.get("checkpoint_saved"), result.get("end_step")
    return bool(saved) and isinstance(end, int) and Path(saved).name == step_name(end)


def finish_attempt(run: Run, attempt: int, exit_code: int | None, *, scheduler: str,
                   job_id: str | None = None, restart_count: int = 0,
                   nodes: list[str] | None = None, started_at: float | None = None,
                   extra: dict | None = None) -> tuple[dict, Decision]:
    """Append the ledger record of ``attempt`` and return it with the requeue decision.

    ``exit_code`` is the training step's exit code (srun's, or the rank's own under the local
    executor). ``result.json``'s exit reason wins over one guessed from the code. The run's
    lock is held from reading the ledger to appending the record, so the decision is made on
    the ledger it is appended to.
    """
    with run.lock():
        return _finish_attempt(run, attempt, exit_code, scheduler=scheduler, job_id=job_id,
                               restart_count=restart_count, nodes=nodes, started_at=started_at,
                               extra=extra)


def _finish_attempt(run: Run, attempt: int, exit_code: int | None, *, scheduler: str,
                    job_id: str | None, restart_count: int, nodes: list[str] | None,
                    started_at: float | None, extra: dict | None) -> tuple[dict, Decision]:
    result = read_result(run, attempt)
    reason = result.get("exit_reason") or exit_codes.reason_for(exit_code)
    note = None
    if exit_code not in (None, exit_codes.FINISHED) and reason == "finished":
        if _saved_at_end(result):
            # trained to the end and published the final checkpoint: nothing left to redo
            note = (f"training finished and saved; the step then ended with exit code "
                    f"{exit_code} ({exit_codes.reason_for(exit_code)})")
        else:
            reason = exit_codes.reason_for(exit_code)  # a rank failed before the final save
    ended = time.time()
    started = started_at or result.get("start_time") or ended
    record = {
        "attempt": attempt,
        "job_id": job_id,
        "restart_count": restart_count,
        "scheduler": scheduler,
        "nodes": nodes or [],
        "start_time": started,
        "end_time": ended,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "duration_s": round(ended - started, 1),
        "start_step": result.get("start_step"),
        "end_step": result.get("end_step"),
        "exit_reason": reason,
        "exit_code": exit_code,
        "checkpoint_loaded": result.get("checkpoint_loaded"),
        "checkpoint_saved": result.get("checkpoint_saved"),
        "last_loss": result.get("last_loss"),
        "message": result.get("message"),
    }
    failure = first_failure(run, attempt) if reason == "failed" else None
    if failure:
        record["first_failure"] = failure
        record["message"] = (f"rank {failure.get('rank')} on {failure.get('node') or '?'} "
                             f"failed first: {failure.get('message')}")
    if note:
        record["note"] = note
    if extra:
        record.update(extra)
    if run.cancelled():
        record["exit_reason"] = "cancelled"
    profile = run.resolved_profile()
    decision = decide(run.ledger_for_budget(), record, profile.preemption.max_requeues,
                      profile.preemption.requeue_on_failure)
    record["decision"] = {"requeue": decision.requeue, "reason": decision.reason}
    run.append_ledger(record)
    run.event("attempt_end", attempt=attempt, job_id=job_id, exit_reason=reason,
              end_step=record["end_step"], requeue=decision.requeue, reason=decision.reason,
              recorded=now_iso())
    return record, decision
