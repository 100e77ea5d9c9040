"""Rank 0's trackers for one attempt: built from the run's resolved job and profile."""

from __future__ import annotations

from ..config.schema import to_dict
from ..config.tracking import effective
from .backends import RunInfo, backends_for, sweep_folder_for
from .sender import TrackerThread


def start_tracking(ctx, resume_step: int, log) -> TrackerThread | None:
    """The started tracker thread, or None when the run names no tracker."""
    section = effective(ctx.job.tracking, ctx.profile.tracking)
    backends = backends_for(section)
    if not backends:
        return None
    try:
        sweep = ctx.run.meta().get("sweep")
    except Exception:  # noqa: BLE001 - a sweep's grouping is not worth failing the attempt
        sweep = None
    sweep = sweep if isinstance(sweep, dict) else None
    try:
        sweep_dir = sweep_folder_for(backends, ctx.run.path, sweep, log)
    except Exception as e:  # noqa: BLE001 - nor is its parent run
        log(f"tracking: the sweep's folder could not be checked ({e}); no parent run")
        sweep_dir = None
    info = RunInfo(run_id=ctx.run.id, run_path=ctx.run.path, job_name=ctx.job.name,
                   attempt=ctx.attempt, sweep=sweep, sweep_dir=sweep_dir,
                   config={"job": to_dict(ctx.job), "profile": to_dict(ctx.profile)})
    return TrackerThread(backends, info, resume_step=resume_step,
                         metrics_file=ctx.run.metrics_file, events_file=ctx.run.events_file,
                         flush_timeout_s=section.flush_timeout_s, log=log).start()
