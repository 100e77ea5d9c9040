"""GPU-hours a run has used: every attempt, every node.

Where Slurm accounts for the run's jobs (``sacct``), its own numbers are used: each
incarnation of each job (a requeued job is one job id run several times: ``--duplicates``)
for ``ElapsedRaw`` seconds on the GPUs ``AllocTRES`` says it held (``gres/gpu=N``; a cluster
that allocates no GPU resource counts the job's tasks). Pending incarnations count nothing;
a running one counts up to now. Without accounting (the local profile, a cluster without
``sacct``, an old job purged from it) the run's ledger is the measure: each attempt's duration
times the ranks it ran. One ``sacct`` call serves any number of runs, so ``hpctrain runs``
stays one call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import HpcTrainError
from ..record.folder import RunFolder

ACCOUNTING = "slurm accounting"
LEDGER = "attempt times"
_TRES_GPU = re.compile(r"(?:^|,)gres/gpu=(\d+)")


@dataclass(frozen=True)
class GpuHours:
    hours: float | None
    source: str | None          # ACCOUNTING, LEDGER, or None when nothing ran

    def to_json(self) -> dict:
        return {"gpu_hours": None if self.hours is None else round(self.hours, 4),
                "gpu_hours_source": self.source}


def gpus_of_tres(alloc_tres: str, tasks: int | None = None) -> int | None:
    """GPUs held by an allocation (``AllocTRES`` of ``sacct``): its ``gres/gpu`` count (Slurm
    may list typed GPUs beside it, ``gres/gpu:h100=8``: the same GPUs), else ``tasks`` (a rank
    per GPU; CPU rehearsal clusters allocate no GPU resource)."""
    m = _TRES_GPU.search(alloc_tres or "")
    return int(m.group(1)) if m else tasks


def accounted_seconds(rows: list[dict], ranks_of_job: dict[str, int]) -> dict[str, float]:
    """GPU-seconds per job id from ``sacct -X --duplicates`` rows (allocations only)."""
    out: dict[str, float] = {}
    for row in rows:
        job_id = row.get("JobID", "")
        if job_id not in ranks_of_job:
            continue
        try:
            elapsed = float(row.get("ElapsedRaw") or 0)
        except ValueError:
            continue
        gpus = gpus_of_tres(row.get("AllocTRES", ""), ranks_of_job[job_id])
        out[job_id] = out.get(job_id, 0.0) + elapsed * (gpus or 0)
    return out


def ledger_gpu_seconds(ledger: list[dict], world_size: int) -> float | None:
    """Each attempt's duration times its ranks (the run's world size when not recorded)."""
    total, any_attempt = 0.0, False
    for rec in ledger:
        duration = rec.get("duration_s")
        if not isinstance(duration, (int, float)):
            start, end = rec.get("start_time"), rec.get("end_time")
            if not (isinstance(start, (int, float)) and isinstance(end, (int, float))):
                continue
            duration = end - start
        ranks = rec.get("world_size") if isinstance(rec.get("world_size"), int) else world_size
        total += max(0.0, float(duration)) * ranks
        any_attempt = True
    return total if any_attempt else None


def gpu_hours_of_runs(runs: list[RunFolder], metas: dict[Path, dict] | None = None,
                      ledgers: dict[Path, list[dict]] | None = None) -> dict[Path, GpuHours]:
    """GPU-hours of each run, Slurm's accounting first (one ``sacct`` call for all)."""
    from ..scheduler.slurm import commands
    metas = metas or {}
    ledgers = ledgers or {}
    meta_of = {r.path: metas.get(r.path) or r.meta() for r in runs}
    ranks_of_job: dict[str, int] = {}
    jobs_of_run: dict[Path, list[str]] = {}
    for run in runs:
        meta = meta_of[run.path]
        if meta.get("scheduler") != "slurm":
            continue
        ids = [j["job_id"] for j in meta.get("jobs", []) if j.get("kind", "train") == "train"]
        jobs_of_run[run.path] = ids
        for job_id in ids:
            ranks_of_job[job_id] = int(meta.get("world_size") or 0)
    try:
        rows = commands.sacct_usage(list(ranks_of_job)) if ranks_of_job else []
    except HpcTrainError:      # no sacct here: the ledger is the measure
        rows = []
    seconds = accounted_seconds(rows, ranks_of_job)
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
