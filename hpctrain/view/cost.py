"""GPU-hours a run has used: every attempt, every node.

Where the scheduler accounts for the run's jobs (Slurm's ``sacct``:
``Backend.accounted_gpu_seconds``), its own numbers are used. Without accounting (the local
profile, a cluster without ``sacct``, an old job purged from it) the run's ledger is the
measure: each attempt's duration times the ranks it ran. One ``sacct`` call serves any number of runs, so ``hpctrain runs``
stays one call.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..record.folder import RunFolder

ACCOUNTING = "slurm accounting"
LEDGER = "attempt times"


@dataclass(frozen=True)
class GpuHours:
    hours: float | None
    source: str | None          # ACCOUNTING, LEDGER, or None when nothing ran

    def to_json(self) -> dict:
        return {"gpu_hours": None if self.hours is None else round(self.hours, 4),
                "gpu_hours_source": self.source}


def ledger_gpu_seconds(ledger: list[dict], world_size: int) -> float | None:
    """Each attempt's duration times its ranks (the run's world size when not recorded; an
    attempt on ranks known nowhere is not guessed at: None when no attempt is left)."""
    total, any_attempt = 0.0, False
    for rec in ledger:
        duration = rec.get("duration_s")
        if not isinstance(duration, (int, float)):
            start, end = rec.get("start_time"), rec.get("end_time")
            if not (isinstance(start, (int, float)) and isinstance(end, (int, float))):
                continue
            duration = end - start
        ranks = rec.get("world_size") if isinstance(rec.get("world_size"), int) else world_size
        if ranks <= 0:      # how many ranks it ran on is not known (a run.yaml edited by hand)
            continue
        total += max(0.0, float(duration)) * ranks
        any_attempt = True
    return total if any_attempt else None


def gpu_hours_of_runs(runs: list[RunFolder], metas: dict[Path, dict] | None = None,
                      ledgers: dict[Path, list[dict]] | None = None) -> dict[Path, GpuHours]:
    """GPU-hours of each run, Slurm's accounting first (one ``sacct`` call for all)."""
    from ..scheduler.choose import backend_named
    metas = metas or {}
    ledgers = ledgers or {}
    meta_of = {r.path: metas.get(r.path) or r.meta() for r in runs}
    by_backend: dict[str, dict[str, int]] = {}
    jobs_of_run: dict[Path, list[str]] = {}
    for run in runs:
        meta = meta_of[run.path]
        ids = [j["job_id"] for j in meta.get("jobs", []) if j.get("kind", "train") == "train"]
        jobs_of_run[run.path] = ids
        ranks = by_backend.setdefault(backend_named(meta.get("scheduler")).name, {})
        for job_id in ids:
            ranks[job_id] = int(meta.get("world_size") or 0)
    seconds: dict[str, float] = {}
    for name, ranks in by_backend.items():
        seconds.update(backend_named(name).accounted_gpu_seconds(ranks))
    out: dict[Path, GpuHours] = {}
    for run in runs:
        ids = [i for i in jobs_of_run.get(run.path, []) if i in seconds]
        if ids:
            out[run.path] = GpuHours(sum(seconds[i] for i in ids) / 3600, ACCOUNTING)
            continue
        ledger = ledgers.get(run.path)
        used = ledger_gpu_seconds(run.ledger() if ledger is None else ledger,
                                  int(meta_of[run.path].get("world_size") or 0))
        out[run.path] = GpuHours(None, None) if used is None else GpuHours(used / 3600, LEDGER)
    return out


def gpu_hours(run: RunFolder) -> GpuHours:
    return gpu_hours_of_runs([run])[run.path]
