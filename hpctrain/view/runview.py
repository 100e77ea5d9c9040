"""One run as a user thinks of it: its state, current job, progress and history, in one object.

A run's state joins three sources: the scheduler's view of its jobs (pending, running, gone),
the ledger (how each attempt ended and whether it was requeued) and the events (cancel,
resume). ``build_views`` asks each backend once for many runs, so ``hpctrain runs`` stays
quick.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..record.files import RunFileError
from ..record.folder import RunFolder
from ..record.reader import describe
from ..scheduler.backend import Backend, JobState
from ..scheduler.choose import backend_of
from ..scheduler.state import job_states_of_runs
from .cost import GpuHours

NOT_SUBMITTED = "NOT SUBMITTED"
FINISHED = "FINISHED"
CANCELLED = "CANCELLED"
STOPPED = "STOPPED"
DAMAGED = "DAMAGED"


@dataclass
class RunView:
    run: RunFolder
    meta: dict
    jobs: list[JobState]
    ledger: list[dict]
    events: list[dict]
    last_metric: dict | None = None
    last_validation: dict | None = None     # the newest validation-loss record
    attempts_started: list[int] = field(default_factory=list)
    usage: GpuHours | None = None          # GPU-hours used so far (``view.cost``)

    # ---- jobs ------------------------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        """The backend the run was created on (its jobs' states, times and nodes)."""
        return backend_of(self.run, self.meta)

    @property
    def active_jobs(self) -> list[JobState]:
        return [j for j in self.jobs if j.active]

    @property
    def current_job(self) -> JobState | None:
        """The job that is running (else the first pending one), else the newest."""
        running = [j for j in self.active_jobs if j.state.split()[0] != "PENDING"]
        if running:
            return running[0]
        if self.active_jobs:
            return self.active_jobs[0]
        return self.jobs[-1] if self.jobs else None

    # ---- state ----------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.run.finished(self.ledger, self.events)

    @property
    def cancelled(self) -> bool:
        return self.run.cancelled(self.events)

    @property
    def state(self) -> str:
        """RUNNING, PENDING, ... (Slurm's word) while a job is active; else FINISHED,
        CANCELLED, STOPPED (the ledger says why), NOT SUBMITTED, or the last job's final state."""
        if self.active_jobs:
            return self.current_job.state.split()[0]
        if self.finished:
            return FINISHED
        if self.cancelled:
            return CANCELLED
        if not self.jobs:
            return NOT_SUBMITTED
        if self.ledger:
            return STOPPED
        return self.jobs[-1].state.split()[0]

    @property
    def state_detail(self) -> str:
        """Why the run is in its state: Slurm's reason while pending, the ledger's when stopped."""
        job = self.current_job
        if self.active_jobs and job is not None:
            return "" if job.reason in ("", "None") else job.reason
        if self.ledger and self.state in (STOPPED, FINISHED):
            last = self.ledger[-1]
            reason = (last.get("decision") or {}).get("reason") or ""
            return f"{last.get('exit_reason')}: {reason}" if self.state == STOPPED else ""
        return ""

    # ---- progress -------------------------------------------------------------------------
    @property
    def step(self) -> int | None:
        steps = [r.get("end_step") for r in self.ledger if isinstance(r.get("end_step"), int)]
        if self.last_metric and isinstance(self.last_metric.get("step"), int):
            steps.append(self.last_metric["step"])
        return max(steps) if steps else None

    @property
    def loss(self) -> float | None:
        if self.last_metric and self.last_metric.get("loss") is not None:
            return self.last_metric["loss"]
        for rec in reversed(self.ledger):
            if rec.get("last_loss") is not None:
                return rec["last_loss"]
        return None

    @property
    def attempts(self) -> int:
        recorded = [int(r.get("attempt") or 0) for r in self.ledger]
        return max(recorded + self.attempts_started + [0])

    @property
    def last_event(self) -> dict | None:
        return self.events[-1] if self.events else None

    @property
    def total_steps(self) -> int | None:
        """train.steps: as run.yaml records it (no job.yaml to parse), else the resolved job's."""
        if isinstance(self.meta.get("total_steps"), int):
            return self.meta["total_steps"]
        try:
            return int(self.run.resolved_job().train.steps)
        except Exception:
            return None

    @property
    def gpu_usage(self) -> GpuHours:
        """GPU-hours used so far (``view.cost``), asked for on first use."""
        if self.usage is None:
            add_usage([self])
        return self.usage

    @property
    def val_loss(self) -> float | None:
        """The newest validation loss (the last ``validation`` metrics record), if any."""
        loss = (self.last_validation or {}).get("loss")
        return loss if isinstance(loss, (int, float)) and not isinstance(loss, bool) else None

    def summary(self) -> dict:
        """The row ``hpctrain runs`` shows (and prints as JSON): enough to rank a sweep's
        runs in one line of pandas (loss, validation loss, steps, state, GPU-hours)."""
        job = self.current_job
        ev = self.last_event
        usage = self.gpu_usage.to_json()
        return {"run": self.run.id, "name": self.meta.get("name"), "profile": self.meta.get("profile"),
                "job_id": job.job_id if job else None, "state": self.state,
                "detail": self.state_detail, "step": self.step,
                "total_steps": self.total_steps, "loss": self.loss, "val_loss": self.val_loss,
                **usage,
                "attempts": self.attempts, "created": self.meta.get("created"),
                "last_event": ev.get("event") if ev else None,
                "last_event_time": ev.get("time") if ev else None,
                "sweep": self.meta.get("sweep"), "run_dir": str(self.run.path)}


class DamagedView(RunView):
    """A run whose folder holds a file that cannot be read (:mod:`hpctrain.record.reader`):
    listed as DAMAGED with the file and why, so one damaged run never hides the others."""

    def __init__(self, run: RunFolder, error: RunFileError, meta: dict | None = None) -> None:
        super().__init__(run=run, meta=meta or {}, jobs=[], ledger=[], events=[],
                         usage=GpuHours(None, None))
        self.error = error
        self.damage = describe(error)

    @property
    def state(self) -> str:
        return DAMAGED

    @property
    def state_detail(self) -> str:
        file = self.damage["file"]
        return (f"{Path(file).name}: {self.damage['why']}" if file
                else self.damage["why"])

    @property
    def total_steps(self) -> int | None:
        return None

    def summary(self) -> dict:
        return {**super().summary(), "damaged": self.damage}


def build_views(runs: list[RunFolder]) -> list[RunView]:
    """Views of ``runs``: one squeue/sacct call for their states. A run whose files cannot be
    read is a :class:`DamagedView`; the others are built as if it were not there."""
    metas, damaged = {}, {}
    for r in runs:                                   # each run.yaml read once
        try:
            metas[r.path] = r.meta()
        except RunFileError as e:
            damaged[r.path] = e
    states = job_states_of_runs([r for r in runs if r.path in metas], kind="train", metas=metas)
    views: list[RunView] = []
    for r in runs:
        if r.path in damaged:
            views.append(DamagedView(r, damaged[r.path]))
            continue
        try:
            views.append(RunView(run=r, meta=metas[r.path], jobs=states[r.path],
                                 ledger=r.ledger(), events=r.events(),
                                 last_metric=r.latest_metrics(),
                                 last_validation=r.latest_metrics("validation"),
                                 attempts_started=r.attempts_started()))
        except RunFileError as e:
            views.append(DamagedView(r, e, metas[r.path]))
    return views


def add_usage(views: list[RunView]) -> list[RunView]:
    """Fill in the views' GPU-hours with one accounting call for all of them (``hpctrain runs``;
    a single view asks on first use, and polling a run's state never asks)."""
    from .cost import gpu_hours_of_runs
    views_ok = [v for v in views if not isinstance(v, DamagedView)]
    usage = gpu_hours_of_runs([v.run for v in views_ok],
                              metas={v.run.path: v.meta for v in views_ok},
                              ledgers={v.run.path: v.ledger for v in views_ok})
    for view in views_ok:
        view.usage = usage[view.run.path]
    return views


def build_view(run: RunFolder, *, damaged_ok: bool = False) -> RunView:
    """The view of one run; a damaged run is an error naming its file (what a command that
    acts on the run needs), or with ``damaged_ok`` a :class:`DamagedView`."""
    view = build_views([run])[0]
    if isinstance(view, DamagedView) and not damaged_ok:
        raise view.error
    return view
