"""``hpctrain sync RUN``: bring a run's trackers up to date from its own records, from a login
node (air-gapped compute nodes, a tracker that was down at the end of an attempt).

1. Every tracker is sent what it has not received (``metrics.jsonl`` from the step in
   ``tracking/state.json`` up to the newest checkpoint, or to the end of a finished run) and
   the run's events, through the same thread and tracker code as rank 0.
2. A W&B run written in offline mode is uploaded with W&B's own ``wandb sync``, one attempt's
   folder after the other (they share the run id, so they continue one W&B run).

A run with a live job is refused: its rank 0 is the one sending.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

from ..config.schema import to_dict
from ..config.tracking import effective
from ..errors import UsageError
from ..record.files import folder_lock
from ..record.folder import RunFolder
from .backends import RunInfo, backends_for, sweep_folder_for
from .sender import SYNC_VOICE, TrackerThread
from .state import TrackingState, tracking_dir


SYNC_LOCK = ".sync.lock"   # in RUN/tracking: held by a sync for its whole run


def final_step(run: RunFolder) -> int:
    """The last step no later attempt will train again: the run's end when it finished, else
    its newest published checkpoint."""
    if run.finished():
        last = run.latest_metrics()
        return int(last["step"]) if last else 0
    steps = [e.get("step") for e in run.events() if e.get("event") == "checkpoint_saved"]
    return max((s for s in steps if isinstance(s, int)), default=0)


def offline_folders(run: RunFolder) -> list[Path]:
    """W&B's offline run folders of this run, oldest first."""
    entry = TrackingState(run.path).of("wandb")
    if entry.get("mode") != "offline" or not entry.get("run_id"):
        return []
    base = Path(entry.get("dir") or run.path / "wandb") / "wandb"
    return sorted(base.glob(f"offline-run-*-{entry['run_id']}"))


def sync_run(run: RunFolder, say: Callable[[str], None], *, wandb_upload: bool = True) -> int:
    from ..scheduler.state import live_jobs
    if live_jobs(run):
        raise UsageError(f"run {run.id} has a live job: its rank 0 sends to the trackers; "
                         "sync after the job ends")
    job, profile = run.resolved_job(), run.resolved_profile()
    section = effective(job.tracking, profile.tracking)
    backends = backends_for(section)
    if not backends:
        raise UsageError(f"run {run.id} names no tracker (tracking.wandb / tracking.mlflow in "
                         "its job or profile)")
    # One sync of a run at a time: two at once both found no tracker run recorded and each
    # started one (two MLflow runs, each with every metric), or both sent the same steps.
    # The second waits, then finds what the first sent.
    tracking_dir(run.path).mkdir(exist_ok=True)    # in the run folder, never making it again
    with folder_lock(tracking_dir(run.path) / SYNC_LOCK, f"run {run.id}'s trackers",
                     waiting=lambda: say(f"waiting for another `hpctrain sync` of {run.shown} "
                                         "to end ...")):
        return _sync(run, say, job, profile, section, backends, wandb_upload)


def _sync(run: RunFolder, say: Callable[[str], None], job, profile, section, backends,
          wandb_upload: bool) -> int:
    # MLflow logs its database's setup at INFO, lines that read as sync's own: only its
    # warnings (unless the user asked for its INFO lines), whether it is imported yet or not
    if "MLFLOW_LOGGING_LEVEL" not in os.environ:
        os.environ["MLFLOW_LOGGING_LEVEL"] = "WARNING"
        logging.getLogger("mlflow").setLevel(logging.WARNING)
    upto = final_step(run)
    meta = run.meta()
    sweep = meta.get("sweep") if isinstance(meta.get("sweep"), dict) else None
    info = RunInfo(run_id=run.id, run_path=run.path, job_name=job.name, attempt=0, sweep=sweep,
                   sweep_dir=sweep_folder_for(backends, run.path, sweep, say),
                   config={"job": to_dict(job), "profile": to_dict(profile)})
    before = {b.name: TrackingState(run.path).of(b.name)["sent_step"] for b in backends}
    problems: list[str] = []
    # a person waits for sync, no next attempt does: the whole flush_timeout_s, also for a run
    # that stopped to be continued (its attempts flush for at most 10 s)
    thread = TrackerThread(backends, info, resume_step=upto, metrics_file=run.metrics_file,
                           events_file=run.events_file, flush_timeout_s=section.flush_timeout_s,
                           log=problems.append, stopping_flush_s=section.flush_timeout_s,
                           voice=SYNC_VOICE)
    thread.start()
    thread.close("finished" if run.finished() else "stopped")
    after = TrackingState(run.path)
    for b in backends:
        sent = after.of(b.name)["sent_step"]
        say(f"{b.name}: steps up to {sent} sent" + (f" (was {before[b.name]})"
                                                   if sent != before[b.name] else ""))
    for p in problems:
        say(p)
    code = 1 if any("cannot be reached" in p or "did not receive" in p for p in problems) else 0
    if wandb_upload:
        for folder in offline_folders(run):
            cmd = [sys.executable, "-m", "wandb", "sync", str(folder)]
            say("$ " + " ".join(cmd[2:]))
            if subprocess.run(cmd).returncode != 0:
                code = 1
    return code


__all__ = ["final_step", "offline_folders", "sync_run"]
