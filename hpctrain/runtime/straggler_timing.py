"""Each rank's compute time, gathered at log steps, and the straggler decision.

Not the step time: every rank's step lasts as long as the slowest rank's, because the others
wait for it in the collectives. What is compared is the time a rank spends computing:

* on the CPU rehearsal, the training thread's CPU time over the step (``time.thread_time``):
  gloo runs collectives on its own threads while the training thread sleeps in the wait, so
  waiting for a slow peer costs no CPU time, and a machine shared with other work does not
  count the time the thread was not scheduled;
* on GPUs, the forward pass of every microbatch timed with CUDA events, as Megatron-LM's
  ``--log-straggler`` does (``megatron.core.utils.StragglerDetector``): read at log steps only
  (the step's own synchronisation on the gradient norm has completed them by then), the larger
  of the event and the host time per pass. With ``overlap_param_gather`` the forward pass also
  waits for the parameter all-gather, which a slow peer delays, so there a slow node raises
  every rank's time and is named only where its compute is slower than that wait.

At every log step (``train.log_interval``) the ranks all-gather one number each — the compute
time per step over the interval — in one small collective outside the step (no per-step
synchronisation), and every rank runs ``hpctrain.health.stragglers`` on the same numbers, so
all reach the same decision: name the node in the metrics, and with
``health.exclude_stragglers`` save, exit and have the batch shell requeue without it. On GPUs
the estimated TFLOP/s per rank (the rank's share of the model FLOPs over 3 × its forward time,
Megatron-LM's estimate) is reported with it.
"""

from __future__ import annotations

import time

from ..health.stragglers import SlowNode, StragglerTracker
from . import collectives
from .log import logger


class ComputeTimer:
    """Sums this rank's compute time between :meth:`take` calls: the training thread's CPU
    time per step on the CPU (:meth:`step_begin`/:meth:`step_end`), the forward passes' CUDA
    event time on GPUs (:meth:`start`/:meth:`stop` around the model call)."""

    def __init__(self, device: str, extra_s: float = 0.0) -> None:
        self.device, self.extra_s = device, extra_s
        self._cpu = 0.0
        self._c0 = 0.0
        self._t0 = 0.0
        self._open = None
        self._pairs: list = []     # (start event, stop event, host seconds) on CUDA
        self._spare: list = []

    def step_begin(self) -> None:
        self._c0 = time.thread_time()

    def step_end(self) -> None:
        if self.device != "cuda":
            self._cpu += time.thread_time() - self._c0

    def start(self) -> None:
        if self.device == "cuda":
            import torch
            pair = self._spare.pop() if self._spare else (
                torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            pair[0].record()
            self._open = pair
        self._t0 = time.perf_counter()
        if self.extra_s:            # HPCTRAIN_TEST_SLOW_RANK: a slower device, on purpose
            burn_cpu(self.extra_s)

    def stop(self) -> None:
        if self.device == "cuda":
            self._open[1].record()
            self._pairs.append((*self._open, time.perf_counter() - self._t0))

    def take(self) -> float:
        """Compute seconds since the last call (on CUDA: the events are complete by the log
        step; the larger of device and host time per forward pass)."""
        if self.device == "cuda":
            total = 0.0
            for start, stop, host in self._pairs:
                total += max(start.elapsed_time(stop) / 1e3, host)
                self._spare.append((start, stop))
            self._pairs.clear()
            return total
        total, self._cpu = self._cpu, 0.0
        return total


def burn_cpu(seconds: float) -> None:
    """Keep this thread busy for ``seconds`` of its own CPU time (a slow device: the work takes
    longer, and counts as compute, unlike a sleep)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class StragglerWatch:
    """The log-step gather and decision. ``may_exclude``: the job can requeue without a node
    (Slurm, ``health.exclude_stragglers``); ``excluded_before``: nodes this run already stopped
    for being slow, whether the requeue left them out or kept them in (the job could not start
    without them): each node costs one stop."""

    def __init__(self, ctx, timer: ComputeTimer, may_exclude: bool, excluded_before: set[str],
                 flops_per_step: float | None = None) -> None:
        health = ctx.job.health
        self.ctx, self.timer = ctx, timer
        self.tracker = StragglerTracker(health.straggler_factor, health.straggler_window)
        self.may_exclude, self.excluded_before = may_exclude, set(excluded_before)
        self.flops_per_rank = (flops_per_step / ctx.world_size) if flops_per_step else None
        self.nodes = collectives.gather_objects(ctx.env.node)   # once, before the first step
        self.steps = 0
        self.last: dict | None = None

    def step_done(self) -> None:
        self.steps += 1

    def at_log_step(self, step: int) -> tuple[list[SlowNode], SlowNode | None]:
        """Collective (every rank, at the same log steps): the named stragglers, and the node to
        exclude now (or None)."""
        per_step = self.timer.take() / max(1, self.steps)
        self.steps = 0
        seconds = [row[0] for row in collectives.all_gather_floats([per_step], self.ctx.device)]
        _, named = self.tracker.assess(seconds, self.nodes)
        window = self.tracker.window
        if self.ctx.is_rank0:
            for node in named:
                if node.intervals == window:
                    logger.info(f"step {step}: straggler: {node.describe()}")
                    self.ctx.run.event("straggler", step=step, attempt=self.ctx.attempt,
                                       **node.to_dict())
        self.last = {"compute_s": [round(s, 6) for s in seconds]}
        if self.ctx.device == "cuda" and self.flops_per_rank:
            self.last["tflops"] = [round(self.flops_per_rank / (3 * s) / 1e12, 2) if s else None
                                   for s in seconds]
        exclude = next((n for n in named if self.may_exclude
                        and n.node not in self.excluded_before), None)
        return named, exclude
