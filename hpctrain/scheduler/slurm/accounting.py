"""GPU-seconds of jobs from Slurm's accounting (``sacct -X --duplicates``).

Each incarnation of a job (a requeued job is one job id run several times) counts its
``ElapsedRaw`` seconds times the GPUs ``AllocTRES`` says it held (``gres/gpu=N``; Slurm may
list typed GPUs beside it, ``gres/gpu:h100=N``, the same GPUs). An allocation with no GPU
resource (a CPU rehearsal cluster, or accounting that does not track ``gres/gpu``) counts the
job's ranks, one per GPU. Pending incarnations count nothing; a running one counts up to now.
"""

from __future__ import annotations

import re

from ...errors import HpcTrainError
from . import commands

_TRES_GPU = re.compile(r"(?:^|,)gres/gpu=(\d+)")


def gpus_of_tres(alloc_tres: str, tasks: int | None = None) -> int | None:
    """GPUs held by an allocation (``AllocTRES``), else ``tasks``."""
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
        if not gpus:       # no GPU resource, and the job's ranks not known: not guessed at
            continue
        out[job_id] = out.get(job_id, 0.0) + elapsed * gpus
    return out


def gpu_seconds(ranks_of_job: dict[str, int]) -> dict[str, float]:
    """One ``sacct`` call for all the jobs; {} where there is no accounting (or no sacct)."""
    if not ranks_of_job:
        return {}
    try:
        rows = commands.sacct_usage(list(ranks_of_job))
    except HpcTrainError:
        return {}
    return accounted_seconds(rows, ranks_of_job)
