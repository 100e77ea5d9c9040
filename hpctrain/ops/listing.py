"""``hpctrain runs``: the table of run folders, newest first."""

from __future__ import annotations

from ..record.folder import RunFolder
from .fmt import format_age, format_number, format_table


def sorted_runs(runs: list[RunFolder]) -> list[RunFolder]:
    """Newest first, by the creation time run.yaml records (the folder's mtime otherwise)."""
    def key(run: RunFolder):
        created = run.meta().get("created")
        return (str(created) if created else "", run.path.stat().st_mtime, run.id)
    return sorted(runs, key=key, reverse=True)


def format_runs(rows: list[dict]) -> str:
    headers = ["RUN", "PROFILE", "JOB", "STATE", "STEP", "LOSS", "ATTEMPTS", "LAST EVENT"]
    body = []
    for r in rows:
        state = r["state"] + (f" ({r['detail']})" if r.get("detail") and r["state"] != "STOPPED"
                              else "")
        event = f"{r['last_event']} {format_age(r.get('last_event_time'))}" if r.get("last_event") else None
        body.append([r["run"], r.get("profile"), r.get("job_id"), state, r.get("step"),
                     format_number(r["loss"]) if r.get("loss") is not None else None,
                     r.get("attempts") or None, event])
    return format_table(headers, body)
