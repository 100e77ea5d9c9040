"""``hpctrain status``: the ledger joined with the scheduler's live view, as data and as text.

``status_data`` builds one JSON-ready dict (what ``--json`` prints); ``format_status`` renders
it for people. Keeping the two apart lets the tests check the numbers and the layout separately.
"""

from __future__ import annotations

from ..exit_codes import ExitReason
from ..file_door import printable, show
from ..record.folder import RunFolder
from ..view.runview import RunView, build_view
from .checkpoints import (CheckpointFolder, checkpoint_step, describe_checkpoint_ref,
                          inspect_checkpoints)
from .fmt import format_bytes, format_duration, format_gpu_hours, format_number, format_table


def _times(view: RunView) -> dict:
    """Elapsed, limit and remaining seconds of the current job (None where unknown)."""
    job = view.current_job
    if job is None or not job.active:
        return {"elapsed_s": None, "time_limit_s": None, "remaining_s": None}
    elapsed, limit = view.backend.elapsed_and_limit(view.run, job, view.events)
    remaining = max(0, limit - elapsed) if limit is not None and elapsed is not None else None
    return {"elapsed_s": elapsed, "time_limit_s": limit, "remaining_s": remaining}


def attempt_rows(view: RunView) -> list[dict]:
    """One row per ledger record, plus the attempt in progress (started, not yet recorded)."""
    rows = [dict(r) for r in view.ledger]
    recorded = {int(r.get("attempt") or 0) for r in view.ledger}
    for n in view.attempts_started:
        if n in recorded:
            continue
        index = next((i for i, e in enumerate(view.events)
                      if e.get("event") == "attempt_start" and e.get("attempt") == n), None)
        start = view.events[index] if index is not None else {}
        live = bool(view.active_jobs) and n == max(view.attempts_started)
        cancelled = index is not None and any(e.get("event") == "cancel"
                                              for e in view.events[index:])
        rows.append({"attempt": n, "job_id": start.get("job_id"),
                     "restart_count": start.get("restart_count"),
                     "nodes": start.get("nodes"), "start_step": _expected_start(view, n),
                     "end_step": view.step if live else _last_metric_step(view, n),
                     "exit_reason": "running" if live else
                     "cancelled (killed before its record)" if cancelled else "no record",
                     "in_progress": live, "started": start.get("time")})
    return sorted(rows, key=lambda r: int(r.get("attempt") or 0))


def _last_metric_step(view: RunView, attempt: int) -> int | None:
    m = view.last_metric or {}
    return m.get("step") if m.get("attempt") == attempt else None


def _expected_start(view: RunView, attempt: int) -> int | None:
    """Where an unrecorded attempt began: 0 for a first attempt, else the step the previous
    attempt saved at its end (what the runtime resumes from); None when unknown."""
    before = [r for r in view.ledger if int(r.get("attempt") or 0) < attempt]
    if not before:
        return 0 if attempt == 1 else None
    last = before[-1]
    saved = checkpoint_step(last.get("checkpoint_saved"))
    return saved if saved is not None and saved == last.get("end_step") else None


def stragglers(view: RunView) -> list[dict]:
    """The straggler nodes the runtime named in this run (its ``straggler`` events), each with
    whether a requeue then left it out or kept it in (the record's ``exclusion_note`` says why)."""
    def after(key: str) -> dict[str, int]:
        return {n: int(r.get("attempt") or 0) for r in view.ledger
                if r.get("exit_reason") == ExitReason.STRAGGLER for n in r.get(key) or []}
    excluded, kept = after("excluded_nodes"), after("not_excluded_nodes")
    out = []
    for e in view.events:
        if e.get("event") == "straggler":
            row = {k: e.get(k) for k in ("node", "ranks", "ratio", "seconds", "median_s",
                                         "intervals", "step", "attempt")}
            row["excluded_after_attempt"] = excluded.get(row["node"])
            if row["node"] in kept:
                row["not_excluded_after_attempt"] = kept[row["node"]]
            out.append(row)
    return out


def run_status(run: RunFolder) -> dict:
    """What ``hpctrain status RUN --json`` prints (and ``Run.status()`` returns): the run's
    view joined with the scheduler's, and its checkpoint folder."""
    return status_data(build_view(run), inspect_checkpoints(run))


def status_data(view: RunView, checkpoints: CheckpointFolder | None) -> dict:
    job = view.current_job
    metric = view.last_metric or {}
    newest = checkpoints.newest_complete if checkpoints else None
    return {
        "run": view.run.id, "run_dir": str(view.run.path), "name": view.meta.get("name"),
        "profile": view.meta.get("profile"), "scheduler": view.meta.get("scheduler"),
        "layout": view.meta.get("layout"), "world_size": view.meta.get("world_size"),
        "state": view.state, "reason": view.state_detail,
        "job_id": job.job_id if job else None,
        "nodes": view.backend.node_list(job) if job else None,
        "partition": job.partition if job else None,
        "expected_start": job.start_time if job and job.state.startswith("PENDING") else None,
        **_times(view),
        "step": view.step, "total_steps": view.total_steps, "loss": view.loss,
        **view.gpu_usage.to_json(),
        "validation_loss": view.val_loss,
        "validation_step": (view.last_validation or {}).get("step"),
        "tokens_per_s": metric.get("tokens_per_s"), "mfu": metric.get("mfu"),
        "attempts": attempt_rows(view),
        "jobs": [{"job_id": j.job_id, "state": j.state, "reason": j.reason, "nodes": j.nodes,
                  "elapsed": j.elapsed} for j in view.jobs],
        "checkpoint": newest.to_dict() if newest else None,
        "checkpoints": checkpoints.to_dict() if checkpoints else None,
        "sweep": view.meta.get("sweep"),
        "stragglers": stragglers(view),
        "last_event": view.last_event,
    }


def _nodes(value) -> str | None:
    if isinstance(value, list):
        return ",".join(value) if value else None
    return value or None


def _steps(row: dict) -> str:
    a, b = row.get("start_step"), row.get("end_step")
    if a is None and b is None:
        return "-"
    return f"{'?' if a is None else a}→{'…' if row.get('in_progress') and b is None else b if b is not None else '?'}"


def _decision(row: dict) -> str:
    d = row.get("decision")
    if not d:
        return "-"
    verb = "requeue" if d.get("requeue") else "restart in job" if d.get("in_job") else "stop"
    return verb + (f": {d['reason']}" if d.get("reason") else "")


def restart_line(row: dict) -> str | None:
    """How an attempt restarted inside its job's allocation, for the lines under the table."""
    from .report import after_attempt, restart_text
    r = row.get("in_job_restart")
    if not isinstance(r, dict):
        return None
    after = after_attempt(r, " after attempt ")
    return f"  attempt {row.get('attempt')}: restarted inside the job{after}: {restart_text(r)}"


def attempts_table(rows: list[dict]) -> str:
    headers = ["#", "JOB", "RESTART", "NODES", "STEPS", "EXIT", "LOADED", "SAVED", "DURATION",
               "DECISION"]
    body = []
    for r in rows:
        exit_ = r.get("exit_reason") or "-"
        if r.get("exit_code") not in (None, 0) and exit_ not in ("running",):
            exit_ += f" ({r['exit_code']})"
        body.append([r.get("attempt"), r.get("job_id"), r.get("restart_count"), _nodes(r.get("nodes")),
                     _steps(r), exit_, describe_checkpoint_ref(r.get("checkpoint_loaded")),
                     describe_checkpoint_ref(r.get("checkpoint_saved")),
                     format_duration(r.get("duration_s")) if r.get("duration_s") is not None else None,
                     _decision(r)])
    return format_table(headers, body, indent="  ")


def format_status(data: dict) -> str:
    """``status``' text. Its lines hold what the run folder says (a failure's message, a node
    name, a checkpoint's path, a note): the whole text goes through ``file_door.printable``,
    so nothing a record holds acts on the terminal."""
    return printable(_format_status(data))


def _format_status(data: dict) -> str:
    ranks = data.get("world_size")
    # the folder's name and run.yaml's words as found on disk: in their printable form
    lines = [f"Run         {show(data['run'])}  ({show(data.get('profile'), 60)}, "
             f"{show(data.get('layout'), 60)}, {ranks} rank{'' if ranks == 1 else 's'})",
             f"Folder      {show(data['run_dir'])}"]
    state = data["state"]
    where = []
    if data.get("job_id"):
        where.append(f"job {data['job_id']}")
    if data.get("nodes"):
        where.append(f"on {data['nodes']}")
    if data.get("partition"):
        where.append(f"partition {data['partition']}")
    reason = f" ({data['reason']})" if data.get("reason") else ""
    lines.append(f"State       {state}{reason}" + (f", {', '.join(where)}" if where else ""))
    if data.get("expected_start") and data["expected_start"] not in ("N/A", "Unknown"):
        lines.append(f"Starts      {data['expected_start']} (Slurm's estimate)")
    if data.get("elapsed_s") is not None or data.get("remaining_s") is not None:
        limit = data.get("time_limit_s")
        lines.append(f"Time        elapsed {format_duration(data.get('elapsed_s'))}, remaining "
                     f"{format_duration(data.get('remaining_s'))}"
                     + (f" of {format_duration(limit)}" if limit else ""))
    if data.get("step") is not None:
        total = data.get("total_steps")
        pct = f" ({100 * data['step'] / total:.0f}%)" if total else ""
        extra = []
        if data.get("loss") is not None:
            extra.append(f"loss {format_number(data['loss'])}")
        if data.get("tokens_per_s") is not None:
            extra.append(f"{format_number(data['tokens_per_s'])} tokens/s")
        if data.get("mfu") is not None:
            extra.append(f"MFU {100 * data['mfu']:.1f}%")
        lines.append(f"Progress    step {data['step']}" + (f" / {total}" if total else "") + pct
                     + (", " + ", ".join(extra) if extra else ""))
    if data.get("gpu_hours") is not None:
        lines.append(f"GPU-hours   {format_gpu_hours(data['gpu_hours'])} used, every attempt and "
                     f"node (from {data.get('gpu_hours_source')})")
    if data.get("validation_loss") is not None:
        lines.append(f"Validation  loss {format_number(data['validation_loss'])} at step "
                     f"{data.get('validation_step')}")
    ck = data.get("checkpoint")
    folder = data.get("checkpoints") or {}
    if ck:
        size = f", {format_bytes(ck['bytes'])}" if ck.get("bytes") is not None else ""
        lines.append(f"Checkpoint  step {ck['step']}{size}: {ck['path']}")
    else:
        lines.append("Checkpoint  none complete yet" + (f" (in {folder['root']})" if folder else ""))
    if folder.get("partial") or folder.get("quarantined"):
        lines.append(f"            {folder.get('partial', 0)} partial, {folder.get('quarantined', 0)} "
                     "quarantined (kept, never deleted)")
    for i, s in enumerate(data.get("stragglers") or []):
        ranks = ", ".join(str(r) for r in s.get("ranks") or [])
        left = (f"; excluded after attempt {s['excluded_after_attempt']}"
                if s.get("excluded_after_attempt") else
                f"; kept in after attempt {s['not_excluded_after_attempt']}"
                if s.get("not_excluded_after_attempt") else "")
        lines.append(f"{'Stragglers' if i == 0 else '':<12}{s.get('node')}: rank {ranks} at "
                     f"{format_number(s.get('ratio'))}× the median compute time for "
                     f"{s.get('intervals')} intervals (step {s.get('step')}, attempt "
                     f"{s.get('attempt')}){left}")
    if data.get("sweep"):
        from ..submission.sweep_values import label   # the sweep's own form (imported here:
        sw = data["sweep"]                             # ``status`` of other runs stays quick)
        lines.append(f"Sweep       {show(sw.get('id'), 60)} #{sw.get('index')}: "
                     f"{label(sw.get('values') or {})}")
    rows = data.get("attempts") or []
    lines.append("")
    if rows:
        lines.append("Attempts")
        lines.append(attempts_table(rows))
        last = rows[-1]
        for row in rows:
            if row.get("exit_reason") in (ExitReason.HUNG, ExitReason.STRAGGLER) and \
                    row.get("message"):
                lines.append(f"  attempt {row.get('attempt')}: {row['message']}")
            if restart_line(row):
                lines.append(restart_line(row))
            if row.get("exclusion_note") or row.get("not_excluded_nodes"):
                lines.append(f"  attempt {row.get('attempt')}: " + (
                    row.get("exclusion_note")
                    or f"not excluded: {_nodes(row['not_excluded_nodes'])}"))
        if last.get("exit_reason") == ExitReason.FAILED and last.get("message"):
            lines.append(f"  attempt {last.get('attempt')}: {last['message']}")
    else:
        lines.append("Attempts    none yet")
    return "\n".join(lines)
