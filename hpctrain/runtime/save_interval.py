"""``checkpoint.interval_minutes: auto`` in the ranks: Daly's interval, from measured saves.

Rank 0 decides when a periodic save is due (``preemption.PeriodicSaves``); this sets its time
interval from :mod:`hpctrain.checkpoint_interval` and recomputes it after every periodic save
with the time that save blocked the training loop (for a background save: planning, copying
the state to host memory and starting the writer; the write itself overlaps training).

Before this attempt has saved, δ is, in order: the blocking time of the previous attempt's
last periodic save (its ``result.json``), else what the deadline check already uses
(``SaveEstimate``: the newest checkpoint's save time, else this attempt's load time, else the
bytes this rank writes at 100 MB/s). Those are times of a whole synchronous save, longer than a
background save blocks, so until a save has been measured the interval is at most
``UNMEASURED_CAP_S`` (15 minutes, the fixed default): an overestimated δ never leaves the start
of a run without checkpoints.

The restart's cost R in the lost-work estimate is the newest recovery the ledger measured
(``recovery_s``: from a failure to the first step after it, an in-job restart on a spare or
a requeue through the queue, whichever the run last went through), else this attempt's
start-up (process start to the first step: imports, rendezvous, model, checkpoint load; the
time a requeued job then waits in Slurm's queue is not known here and not counted).
"""

from __future__ import annotations

import os
import time

from ..checkpoint_interval import IntervalEstimate, estimate, minutes
from .log import logger

UNMEASURED_CAP_S = 15 * 60.0


def previous_blocking_s(run, attempt: int) -> float | None:
    """The blocking time of the newest periodic save of an earlier attempt, if one recorded it."""
    from ..record.attempt_end import read_result
    for earlier in range(attempt - 1, 0, -1):
        result = read_result(run, earlier)
        saves = (result.get("saves") if isinstance(result, dict)
                 else getattr(result, "saves", None)) or []
        for save in reversed(saves):
            if save.get("reason") == "periodic" and isinstance(save.get("stall_seconds"),
                                                                (int, float)):
                return float(save["stall_seconds"])
    return None


def measured_restart_s(run) -> float | None:
    """The newest ``recovery_s`` of the run's ledger (None when no recovery was measured;
    ``attempt_end.newest_recovery_s``)."""
    from ..record.attempt_end import newest_recovery_s
    try:
        ledger = run.ledger()
    except Exception:   # an unreadable ledger: the start-up is used instead
        return None
    return newest_recovery_s(ledger)


def estimate_source(est) -> str:
    """Where a ``preemption.SaveEstimate`` took its number from, in words."""
    if est.measured_s is not None:
        return "measured"
    if est.previous_s is not None:
        return "newest checkpoint's save time"
    if est.load_s is not None:
        return "this attempt's load time"
    if est.guess_s is not None:
        return "bytes at 100 MB/s"
    return "default"


def process_age_s() -> float | None:
    """Seconds since this process started (the attempt's start-up so far)."""
    try:
        import psutil
        return max(0.0, time.time() - psutil.Process(os.getpid()).create_time())
    except Exception:   # no psutil, or /proc unreadable: R is then not counted
        return None


class AutoInterval:
    """Keeps ``periodic.interval_s`` at Daly's optimum for the save times seen so far."""

    def __init__(self, periodic, node_mtbf_hours: float, nodes: int, delta_s: float,
                 source: str, restart_s: float | None = None) -> None:
        self.periodic = periodic
        self.node_mtbf_hours = node_mtbf_hours
        self.nodes = max(1, nodes)
        self.delta_s = delta_s
        self.source = source
        self.measured = source.startswith("measured") or source.startswith("previous attempt")
        self.restart_s = restart_s
        self.current: IntervalEstimate | None = None

    @classmethod
    def for_trainer(cls, ctx, periodic, save_estimate) -> "AutoInterval | None":
        """The job's auto interval, or None when ``checkpoint.interval_minutes`` is a number."""
        if ctx.job.checkpoint.interval_minutes != "auto":
            return None
        previous = previous_blocking_s(ctx.run, ctx.attempt)
        if previous is not None:
            delta, source = previous, "previous attempt's periodic save"
        else:
            delta, source = save_estimate.seconds, estimate_source(save_estimate)
        nodes = -(-ctx.world_size // max(1, ctx.env.local_world_size))
        restart = measured_restart_s(ctx.run)
        return cls(periodic, ctx.profile.reliability.node_mtbf_hours, nodes, delta, source,
                   restart if restart is not None else process_age_s())

    def compute(self) -> IntervalEstimate:
        est = estimate(self.delta_s, self.node_mtbf_hours, self.nodes, delta_source=self.source,
                       restart_s=self.restart_s)
        if not self.measured and est.interval_s > UNMEASURED_CAP_S:
            est = IntervalEstimate(est.delta_s, est.delta_source, est.node_mtbf_hours, est.nodes,
                                   UNMEASURED_CAP_S, "auto", est.restart_s, est.optimum_s)
        self.current = est
        self.periodic.interval_s = est.interval_s
        return est

    def saved(self, blocking_s: float) -> IntervalEstimate:
        """A periodic save blocked the loop for ``blocking_s``: recompute (δ smoothed over this
        attempt's saves, the first of which also pays one-time planning)."""
        if blocking_s is not None and blocking_s >= 0:
            self.delta_s = blocking_s if not self.source.startswith("measured") else \
                0.5 * (self.delta_s + blocking_s)
            self.source = "measured"
            self.measured = True
        return self.compute()

    def line(self) -> str:
        est = self.current or self.compute()
        text = f"checkpoint interval: auto -> {est.describe()}"
        if est.optimum_s is not None and est.interval_s < est.optimum_s:
            text += (f"; capped at {minutes(UNMEASURED_CAP_S)} until a save is measured "
                     f"(Young/Daly with this δ: {minutes(est.optimum_s)})")
        return text

    def report(self, ctx, step: int, why: str) -> IntervalEstimate:
        """Rank 0: one log line and one ``checkpoint_interval`` event with the numbers used."""
        est = self.current or self.compute()
        if ctx.is_rank0:
            logger.info(self.line())
            ctx.run.event("checkpoint_interval", attempt=ctx.attempt, step=step, why=why,
                          **est.to_json(), mtbf_hours=round(est.mtbf_s / 3600, 2),
                          total_lost_fraction=(None if est.total_fraction is None
                                               else round(est.total_fraction, 6)))
        return est
