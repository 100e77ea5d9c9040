"""The end of one attempt: merge what the ranks and the scheduler know, decide, record.

Rank 0 writes ``logs/attempt-N/result.json`` (steps, exit reason, checkpoints) just before it
exits. Whoever outlives the ranks — the batch shell on Slurm, rank 0 itself under the local
executor — then calls :func:`finish_attempt`, which adds the scheduler's facts (job id, restart
count, nodes, the step's exit code), asks :mod:`.requeue_policy` whether to requeue,
and appends one ledger record. When the ranks died without a result (SIGKILL, node failure),
the record still gets written, from the exit code alone.

Every rank that fails also leaves ``logs/attempt-N/failure-rank-R.json`` (when, where, what).
One crash makes every peer fail a moment later ("connection closed by peer"), and a rank killed
outright (SIGKILL, the OOM killer, a dead node) writes nothing at all, so the record names the
rank that died first on its own — the cause — from the ranks' records and what the scheduler
saw (:mod:`.culprit`), not a peer's echo of it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .. import exit_codes
from ..exit_codes import ExitReason
from . import reader
from .attempt_records import AttemptRecord, AttemptResult, Decision, FailureRecord
from .culprit import culprit
from .files import now_iso
from .folder import REOPEN_EVENTS, RunFolder
from .requeue_policy import decide

RESULT_FILE = "result.json"
FAILURE_GLOB = "failure-rank-*.json"


def result_path(run: RunFolder, attempt: int) -> Path:
    return run.attempt_dir(attempt) / RESULT_FILE


def write_result(run: RunFolder, attempt: int, result: AttemptResult) -> None:
    """Rank 0: record what this attempt did (atomic write)."""
    from ..config import yamlio
    yamlio.write_atomic(result_path(run, attempt), json.dumps(result.to_dict(), indent=1))


def read_result(run: RunFolder, attempt: int) -> AttemptResult:
    """The attempt's result; an empty one when rank 0 wrote none (killed, or never started)."""
    try:
        data = reader.read_json(result_path(run, attempt), check=reader.ledger_problem) or {}
    except reader.DamagedFile:
        data = {}
    return AttemptResult.from_dict(data)


def write_failure(run: RunFolder, attempt: int, rank: int, node: str, at: float, message: str) -> None:
    """Any rank, as it fails: what went wrong there and when (atomic write)."""
    from ..config import yamlio
    folder = run.attempt_dir(attempt)
    folder.mkdir(parents=True, exist_ok=True)
    failure = FailureRecord(rank=rank, node=node, time=at, message=message)
    yamlio.write_atomic(folder / f"failure-rank-{rank}.json", json.dumps(failure.to_dict()))


def failures(run: RunFolder, attempt: int) -> list[FailureRecord]:
    """Every failure the ranks recorded in ``attempt`` (with a time)."""
    found = []
    for path in run.attempt_dir(attempt).glob(FAILURE_GLOB):
        try:
            data = reader.read_json(path, check=reader.checker(
                {"rank": reader.INT, "node": reader.TEXT, "time": reader.NUMBER,
                 "message": reader.TEXT}))
        except reader.DamagedFile:
            continue
        if data is not None:
            found.append(FailureRecord.from_dict(data))
    return [f for f in found if isinstance(f.time, (int, float))]


def first_failure(run: RunFolder, attempt: int, *, task_exits: list[dict] | None = None,
                  last_beats: dict | None = None,
                  silent_nodes: dict[str, str] | None = None) -> FailureRecord | None:
    """The failure that caused ``attempt``'s end (:mod:`.culprit`): the rank that died first on
    its own (a signal in srun's ``task_exits``, its node among ``silent_nodes``, its own error)
    over the peers that noticed; None when nothing failed."""
    found = culprit(failures(run, attempt), task_exits or [], last_beats or {}, silent_nodes)
    return found.failure() if found else None


def published_during(run: RunFolder, attempt: int) -> str | None:
    """The newest checkpoint ``attempt`` published, from its ``checkpoint_saved`` events: for
    an attempt whose rank 0 wrote no result (a hang), so its record still says how far it got
    for good (the requeue policy's progress check)."""
    saved = [e for e in run.events() if isinstance(e, dict) and e.get("event") == "checkpoint_saved"
             and e.get("attempt") == attempt and isinstance(e.get("step"), int)]
    if not saved:
        return None
    newest = max(saved, key=lambda e: e["step"])
    path = newest.get("path")
    return path if isinstance(path, str) and path else None


def _saved_at_end(result: AttemptResult) -> bool:
    """The attempt's newest published checkpoint is of its last step."""
    from .checkpoint_store import step_name
    saved, end = result.checkpoint_saved, result.end_step
    return bool(saved) and isinstance(end, int) and Path(saved).name == step_name(end)


def hang_details(verdict) -> dict:
    """The record fields of a hung attempt, from its verdict (``health.hang.Verdict``): the
    reason, the rank and node that stopped first (``first_failure``), the node to leave out,
    and the steps the heartbeats saw (no rank wrote a result)."""
    return {"reason": ExitReason.HUNG, "hang": verdict.to_dict(),
            "excluded_nodes": [verdict.node] if verdict.node else [],
            "first_failure": FailureRecord(rank=verdict.rank, node=verdict.node,
                                           time=verdict.detected_at,
                                           message=verdict.message).to_dict(),
            "steps": (verdict.start_step, verdict.end_step)}


RESTART_FILE = "restart.json"


def write_restart(run: RunFolder, attempt: int, info: dict) -> None:
    """The batch shell, beginning an attempt inside the same allocation: how it got there."""
    from ..config import yamlio
    yamlio.write_atomic(run.attempt_dir(attempt) / RESTART_FILE, json.dumps(info))


def read_restart(run: RunFolder, attempt: int) -> dict | None:
    """The attempt's ``restart.json`` (None when it did not begin by an in-job restart, or
    the file is damaged: the record then only lacks ``in_job_restart``)."""
    from .reader import RunFileError, read_json
    try:
        return read_json(run.attempt_dir(attempt) / RESTART_FILE)
    except (RunFileError, OSError):
        return None


def failure_time(record: AttemptRecord) -> float | None:
    """When ``record``'s attempt failed: its culprit's time, else when it ended."""
    t = (record.first_failure or {}).get("time")
    if isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0:
        return float(t)
    return record.end_time


def recovery_cost(run: RunFolder, attempt: int, first_step_at: float | None,
                  start_step: int | None) -> tuple[float | None, int | None]:
    """(recovery_s, steps_lost) of ``attempt`` after the attempt before it failed: the time
    from the failure (``failure_time``) to this attempt's first step, and the steps the
    failed attempt trained that this one trains again. (None, None) when nothing failed
    before it (a first attempt, or one after a finished or cancelled one)."""
    earlier = [AttemptRecord.from_dict(r) for r in run.ledger()
               if isinstance(r, dict) and r.get("attempt") != attempt]
    previous = earlier[-1] if earlier else None
    if previous is None or previous.exit_reason in (ExitReason.FINISHED, ExitReason.CANCELLED):
        return None, None
    failed_at = failure_time(previous)
    recovery_s = round(first_step_at - failed_at, 1) \
        if first_step_at is not None and failed_at is not None else None
    steps_lost = max(0, previous.end_step - start_step) \
        if isinstance(previous.end_step, int) and isinstance(start_step, int) else None
    return recovery_s, steps_lost


def newest_recovery_s(ledger: list, restarts_only: bool = False) -> float | None:
    """The newest ``recovery_s`` of ``ledger`` (records as stored) that measured something,
    or None: a negative time (the clocks of two nodes apart) is passed over.

    ``restarts_only``: of the attempts begun by an in-job restart alone. A requeue's recovery
    also holds the time the job waited in Slurm's queue, hours on a busy cluster, which a
    restart inside the allocation never waits: the in-job restart's time guard takes the
    restarts' (``scheduler.slurm.in_job_restart``), the checkpoint interval whichever way the
    run last recovered (``runtime.save_interval``)."""
    for record in reversed(ledger):
        if not isinstance(record, dict) or (
                restarts_only and not isinstance(record.get("in_job_restart"), dict)):
            continue
        value = record.get("recovery_s")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            return float(value)
    return None


def in_job_restart_event(run: RunFolder, attempt: int, first_step_at: float,
                         start_step: int) -> dict | None:
    """Rank 0, at the first step of an attempt that began by an in-job restart: the
    ``in_job_restart`` event (which node was left out and why, which spare took its place,
    the recovery's seconds and lost steps), written to ``events.jsonl`` at once so that the
    trackers show it while the attempt trains (its ledger record comes only at its end).
    None, writing nothing, for an attempt that did not begin so."""
    restart = read_restart(run, attempt)
    if not isinstance(restart, dict):
        return None
    recovery_s, steps_lost = recovery_cost(run, attempt, first_step_at, start_step)
    keep = ("after_attempt", "excluded", "why", "spares", "in_place", "nodes")
    return run.event("in_job_restart", attempt=attempt,
                     **{k: restart.get(k) for k in keep if k in restart},
                     recovery_s=recovery_s, steps_lost=steps_lost)


def _recovery(run: RunFolder, attempt: int, record: AttemptRecord, result: AttemptResult) -> None:
    """What the recovery from the previous attempt's end cost: when this attempt's first step
    started, the time from the failure to it (in-job restart or requeue alike: the benchmark
    and the checkpoint interval's restart cost read it), the steps redone, and the in-job
    restart that began it (``restart.json``)."""
    if isinstance(result.start_time, (int, float)) and isinstance(result.first_step_after_s,
                                                                  (int, float)):
        record.first_step_at = round(result.start_time + result.first_step_after_s, 3)
    restart = read_restart(run, attempt)
    record.recovery_s, record.steps_lost = recovery_cost(run, attempt, record.first_step_at,
                                                         record.start_step)
    if isinstance(restart, dict):
        record.in_job_restart = {**restart, "recovery_s": record.recovery_s,
                                 "steps_lost": record.steps_lost}


def finish_attempt(run: RunFolder, attempt: int, exit_code: int | None, *, scheduler: str,
                   job_id: str | None = None, restart_count: int = 0,
                   nodes: list[str] | None = None, started_at: float | None = None,
                   reason: ExitReason | None = None, steps: tuple | None = None,
                   refuse_requeue: str | None = None, evidence: dict | None = None,
                   restart: Decision | None = None,
                   **details) -> tuple[AttemptRecord, Decision]:
    """Append the ledger record of ``attempt`` and return it with the requeue decision.

    ``exit_code`` is the training step's exit code (srun's, or the rank's own under the local
    executor). ``reason`` (the batch shell knows the preflight gate failed, or a rank hung)
    wins, then ``result.json``'s exit reason, then one guessed from the code. ``steps``:
    (start, end) where ``result.json`` has none (a hung attempt's heartbeats);
    ``refuse_requeue``: why this attempt cannot be requeued whatever the policy says. ``details`` are further
    :class:`AttemptRecord` fields (``task_exits``, ``excluded_nodes``, ...). The run's lock is
    held from reading the ledger to appending the record, so the decision is made on the
    ledger it is appended to. ``evidence``: what the scheduler saw of the ranks' ends, for
    :func:`first_failure` (``task_exits``: all of srun's, ``last_beats``: rank -> (node, time of
    its last heartbeat), ``silent_nodes``: node -> Slurm state of the step's nodes that stopped
    responding). ``restart``: the batch shell restarts the step inside the allocation (its
    decision replaces the requeue policy's, unless the attempt finished or was cancelled).
    """
    with run.lock():
        return _finish_attempt(run, attempt, exit_code, scheduler=scheduler, job_id=job_id,
                               restart_count=restart_count, nodes=nodes, started_at=started_at,
                               reason=reason, steps=steps, refuse_requeue=refuse_requeue,
                               details=details, evidence=evidence or {}, restart=restart)


def _finish_attempt(run: RunFolder, attempt: int, exit_code: int | None, *, scheduler: str,
                    job_id: str | None, restart_count: int, nodes: list[str] | None,
                    started_at: float | None, reason: ExitReason | None, steps: tuple | None,
                    refuse_requeue: str | None, details: dict,
                    evidence: dict, restart: Decision | None) -> tuple[AttemptRecord, Decision]:
    result = read_result(run, attempt)
    if steps is not None and result.end_step is None:
        result.start_step, result.end_step = steps
    if result.straggler and "straggler" not in details:
        details = {**details, "straggler": result.straggler,
                   "excluded_nodes": [result.straggler["node"]]}
    why = result.exit_reason or exit_codes.reason_for(exit_code)
    note = None
    if exit_code not in (None, exit_codes.FINISHED) and why == ExitReason.FINISHED:
        if _saved_at_end(result):
            # trained to the end and published the final checkpoint: nothing left to redo
            note = (f"training finished and saved; the step then ended with exit code "
                    f"{exit_code} ({exit_codes.reason_for(exit_code)})")
        else:
            why = exit_codes.reason_for(exit_code)  # a rank failed before the final save
    ended = time.time()
    started = started_at or result.start_time or ended
    record = AttemptRecord(**{
        **result.outcome(), "attempt": attempt, "exit_reason": reason or why,
        "exit_code": exit_code, "start_time": started, "end_time": ended}, job_id=job_id,
        restart_count=restart_count, scheduler=scheduler, nodes=nodes or [],
        started=time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        duration_s=round(ended - started, 1), note=note, **details)
    if not record.checkpoint_saved:
        record.checkpoint_saved = published_during(run, attempt)
    _recovery(run, attempt, record, result)
    failure = first_failure(run, attempt, **evidence) \
        if record.exit_reason == ExitReason.FAILED else None
    if failure:
        record.first_failure = failure.to_dict()
        record.message = (f"rank {failure.rank} on {failure.node or '?'} failed first: "
                          f"{failure.message}")
    if record.hang:
        record.message = record.hang.get("message")
    if run.cancelled():
        record.exit_reason = ExitReason.CANCELLED
    profile = run.resolved_profile()
    decision = decide(run.ledger_for_budget(), record, profile.preemption.max_requeues,
                      profile.preemption.requeue_on_failure)
    if restart is not None and record.exit_reason not in (ExitReason.FINISHED,
                                                          ExitReason.CANCELLED):
        decision = restart
    if refuse_requeue and decision.requeue:
        decision = Decision(False, f"{record.exit_reason}; not requeued: {refuse_requeue}")
    record.decision = decision
    run.append_ledger(record.to_dict())
    run.event("attempt_end", attempt=attempt, job_id=job_id, exit_reason=str(reason or why),
              end_step=record.end_step, requeue=decision.requeue, reason=decision.reason,
              recorded=now_iso())
    return record, decision


LOST_NOTE = {
    "slurm": ("recorded when attempt {next} began: the batch shell that would have written this "
              "record was killed first (Slurm's kill at the end of a preemption's grace time, "
              "or the batch host lost)"),
    "local": ("recorded when attempt {next} began: rank 0, which would have written this record, "
              "was killed first (out of memory, or a kill by hand)")}


def _cancelled_during(events: list[dict], attempt: int) -> bool:
    """A person cancelled the run while ``attempt`` ran: a ``cancel`` event after its start and
    before the run was reopened (the cancel's SIGTERM made the ranks save as for a preemption,
    so result.json alone says preempted; by the time a resumed job records the attempt, the
    run is no longer cancelled)."""
    started = False
    for e in events:
        if e.get("event") == "attempt_start" and e.get("attempt") == attempt:
            started = True
        elif started and e.get("event") == "cancel":
            return True
        elif started and e.get("event") in REOPEN_EVENTS:
            return False
    return False


def record_lost_attempts(run: RunFolder, next_attempt: int, *, scheduler: str) -> list[int]:
    """Ledger records for the attempts before ``next_attempt`` that started but have none.

    The batch shell (rank 0 under the local executor) writes an attempt's record after its
    ranks exit; when Slurm kills the whole job first (a preemption's grace time spent by a slow exit, a lost batch host) the
    record never comes, and the ledger — which the requeue budget, the progress check,
    ``status`` and the trackers read — would skip an attempt. The next attempt writes it from
    what the lost one left (``result.json``, its ``attempt_start`` event), with a note saying
    so and the time of its last file as its end. Returns the attempts it recorded."""
    recorded = {r.get("attempt") for r in run.ledger() if isinstance(r, dict)}
    lost = [n for n in run.attempts_started() if n < next_attempt and n not in recorded]
    events = [e for e in run.events() if isinstance(e, dict)]
    starts = {e.get("attempt"): e for e in events if e.get("event") == "attempt_start"}
    for n in lost:
        start = starts.get(n, {})
        result_file = result_path(run, n)
        reason = None if result_file.is_file() else ExitReason.UNKNOWN
        if _cancelled_during(events, n):
            reason = ExitReason.CANCELLED
        record, _ = finish_attempt(run, n, None, scheduler=scheduler,
                                   job_id=start.get("job_id"),
                                   restart_count=int(start.get("restart_count") or 0),
                                   reason=reason)
        ended = _last_write(run.attempt_dir(n))
        changes = {"note": LOST_NOTE[scheduler].format(next=next_attempt)}
        if ended is not None and ended >= record.start_time:
            changes["end_time"] = ended
            changes["duration_s"] = round(ended - record.start_time, 1)
        run.update_ledger_record(n, **changes)
    return lost


def _last_write(folder: Path) -> float | None:
    """When the newest file of an attempt's log folder was last written."""
    try:
        times = [p.stat().st_mtime for p in folder.iterdir() if p.is_file()]
    except OSError:
        return None
    return max(times) if times else None
