"""Rank-side probe: the training loop (``runtime.loop.Trainer``) over several attempts of one
run, on a real megatron-core model (PP2 × DP2, the distributed optimizer), real batches,
evaluations, checkpoints and straggler timing, in one launch instead of one per attempt.

Each attempt assembles what an attempt's ranks assemble (``runtime.entry``): a fresh model
and optimizer, batch feeder, straggler watch, checkpointer and its resume, metrics,
evaluator and preemption flag, then ``Trainer.run()``. What can only come from outside is
injected where it comes from: a real ``SIGUSR1`` sent to one rank's own process (at the start
of a step, or in the first batch of an evaluation), a time limit that only rank 0's clock
sees, a NaN loss through the runtime's test hooks, the wall clock stepped back.

Runs (6 steps, validation every 2 steps, a test at the end, background saves every 2 steps):

* ``whole``: uninterrupted; the wall clock of every rank is stepped back an hour (as an NTP
  correction does) at the start of step 4 and in the first batch of the second validation;
* ``stopped``: attempt 1 gets the signal on rank 3 at step 3; attempt 2 resumes and trains
  step 4, and rank 0's time limit comes near in the validation after it; attempt 3 gets the
  signal on rank 1 in the validation of step 4 it does again first; attempt 4 does it, trains
  steps 5 and 6 and gets the signal on rank 1 in the validation after step 6; attempt 5
  resumes at step 6 (nothing left to train), validates and gets the signal on rank 2 in the
  test; attempt 6 validates, tests and finishes;
* ``unstable``: NaN losses at steps 2 and 3 with ``max_skipped_steps: 2``;
* ``unclipped``: ``whole`` with ``train.clip_grad: 0``, without evaluations or saves.

Each rank writes ``OUT/RUN-attempt-N-rank-R.json``: the outcome, the trainer's counters, the
weights' digest and the loss the rank reported after every step, the saves, what the
watchdog heard.

    python -m tests.runtime.loop_probe WHOLE STOPPED UNSTABLE UNCLIPPED OUT
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from hpctrain.runtime.faults import TestHooks

DEADLINE = 4_000_000_000.0      # the time limit's epoch second; rank 0's clock jumps to it
WALL_CLOCK = time.time
CLOCK_STEP_S = 3600.0           # how far the wall clock is stepped back


def step_wall_clock_back() -> None:
    """``time.time`` of this process from now on an hour further back, as after an NTP step
    (the probe cannot move the machine's clock; ``restore_wall_clock`` puts it back)."""
    shifted = time.time

    def stepped() -> float:
        return shifted() - CLOCK_STEP_S
    time.time = stepped


def restore_wall_clock() -> None:
    time.time = WALL_CLOCK


class ProbeHooks(TestHooks):
    """The runtime's test hooks, and a real signal sent to this rank's own process at the
    start of step ``signal_step``, or in the first batch of this attempt's ``eval_signal``-th
    evaluation."""

    __test__ = False

    def __init__(self, rank: int, signal_step: int | None = None,
                 eval_signal: int | None = None, clock_back_step: int | None = None,
                 clock_back_eval: int | None = None, **hooks) -> None:
        super().__init__(**hooks)
        self.rank, self.signal_step, self.eval_signal = rank, signal_step, eval_signal
        self.clock_back_step, self.clock_back_eval = clock_back_step, clock_back_eval
        self.evaluations = 0

    @property
    def active(self) -> bool:
        return True

    def at_step(self, step, rank, **kwargs):
        if step == self.signal_step:
            os.kill(os.getpid(), signal.SIGUSR1)
        if step == self.clock_back_step:
            step_wall_clock_back()
        return super().at_step(step, rank, **kwargs)

    def hold_in_evaluation(self, step, released, waiting=None):
        self.evaluations += 1
        if self.evaluations == self.eval_signal:
            os.kill(os.getpid(), signal.SIGUSR1)
        if self.evaluations == self.clock_back_eval:
            step_wall_clock_back()
        return True


class Heard:
    """The watchdog's side of the loop: what it was told, in order."""

    def __init__(self) -> None:
        self.calls: list = []

    def progress(self, step=None, phase=None) -> None:
        self.calls.append(["progress", step, phase])

    def step_done(self, step, elapsed) -> None:
        self.calls.append(["step_done", step, elapsed > 0])


@contextmanager
def reported_losses():
    """The loss this rank put into each step's agreement, step after step, for the steps run
    inside (reporting ranks only: the last stage's TP rank 0 of each DP replica; empty on
    the others)."""
    from hpctrain.runtime import loop
    real = loop.step_loss
    reported: list = []

    def step_loss(losses, microbatches):
        loss = real(losses, microbatches)
        reported.append(float(loss))
        return loss
    loop.step_loss = step_loss
    try:
        yield reported
    finally:
        loop.step_loss = real


class Probe:
    def __init__(self, out: Path) -> None:
        from hpctrain.identity import rank_env
        from hpctrain.runtime.log import setup
        self.out = out
        self.renv = rank_env()
        setup(self.renv.rank)

    def start(self) -> None:
        """The process group, once for every attempt."""
        from hpctrain.runtime import distributed
        distributed.prepare_device("cpu", self.renv)
        distributed.init_process_group(self.renv, "cpu", 600)

    def job_of(self, run):
        from hpctrain.planner.layouts import with_optimizer_format
        from hpctrain.runtime.entry import resolve_layout
        job, profile = run.resolved_job(), run.resolved_profile()
        layout = resolve_layout(job, profile, self.renv.world_size)
        return with_optimizer_format(job, profile, layout), layout

    @staticmethod
    def record_steps(ckpt, digest) -> list:
        """[step, weights digest] after every step the trainer runs (it tells the
        checkpointer each one)."""
        after_step: list = []
        step_done = ckpt.step_done

        def recorded(step: int) -> None:
            after_step.append([step, digest()])
            step_done(step)
        ckpt.step_done = recorded
        return after_step

    @staticmethod
    def time_left_after_evaluation(trainer) -> dict:
        """The trainer's answer to its evaluator with the time left half a step past what a
        save needs: another batch of no time fits; after the last batch, the next training
        step does not (the question reserves that step, as the step's own agreement does)."""
        ahead = trainer.step_time
        left = trainer.deadline.reserve(trainer.estimate.seconds, 0.0) + ahead / 2
        clock, trainer.deadline.clock = trainer.deadline.clock, lambda: DEADLINE - left
        try:
            answers = {"step_time": ahead, "next_batch_0": trainer.evaluator.deadline_near(0.0),
                       "last_batch": trainer.evaluator.deadline_near(None)}
            # a save of 100 s, half of it more than the reserve: enough time, unless a
            # background save began just now, which the stop would first wait for
            measured, trainer.estimate.measured_s = trainer.estimate.measured_s, 100.0
            left = trainer.deadline.reserve(100.0, 0.0) + 50.0
            answers["no_save_in_flight"] = trainer.out_of_time(0.0)
            trainer.ckpt.pending.append({"step": -1, "started": time.monotonic()})
            answers["save_in_flight"] = trainer.out_of_time(0.0)
            trainer.ckpt.pending.pop()
            trainer.estimate.measured_s = measured
            return answers
        finally:
            trainer.deadline.clock = clock

    def attempt(self, run, number: int, *, signal_rank: int | None = None,
                signal_step: int | None = None, eval_signal: int | None = None,
                deadline_after: int | None = None, nan_steps=(), clock_back_step=None,
                clock_back_eval=None) -> dict:
        """Attempt ``number`` of ``run``, assembled as the runtime assembles one."""
        from megatron.core import parallel_state

        from hpctrain.runtime.assembly import assemble_attempt
        from hpctrain.runtime.context import RankContext
        from hpctrain.runtime.digest import local_digest
        from hpctrain.runtime.job_env import JobEnv
        from hpctrain.runtime.model import build_model_and_optimizer, initialize_parallel
        from hpctrain.runtime.preemption import PreemptionFlag

        rank = self.renv.rank
        job, layout = self.job_of(run)
        profile = run.resolved_profile()
        # megatron's parallel state and every RNG seeded again, as in a new attempt's process
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        initialize_parallel(layout, job.train.seed)
        mine = signal_rank == rank
        hooks = ProbeHooks(rank, signal_step if mine else None, eval_signal if mine else None,
                           clock_back_step, clock_back_eval, nan_steps=set(nan_steps))
        hooks.attempt = number
        flag = PreemptionFlag(profile.preemption.signal)
        flag.install()
        jenv = JobEnv(run_dir=str(run.path), attempt=number,
                      deadline=DEADLINE if deadline_after is not None else None,
                      preempt_signal=None, signal_flag=None, log_to_file=False,
                      local_executor=False, local_job_id=None)
        ctx = RankContext(run=run, job=job, profile=profile, layout=layout, env=self.renv,
                          job_env=jenv, attempt=number, device="cpu")
        heard = Heard()
        ctx.watchdog = heard
        mo = build_model_and_optimizer(job, layout, "cpu")
        at = {}

        def clock() -> float:
            """Far from the time limit; at it once the trainer is past ``deadline_after``
            (rank 0 only: the other ranks' clocks never come near it)."""
            trainer = at.get("trainer")
            near = rank == 0 and deadline_after is not None and trainer is not None and \
                trainer.step >= deadline_after
            return DEADLINE if near else DEADLINE - 1e6

        parts = assemble_attempt(ctx, mo, hooks, flag, clock=clock)
        trainer, ckpt, loaded = parts.trainer, parts.checkpointer, parts.loaded
        at["trainer"] = trainer
        step_time_at_start = trainer.step_time
        after_step = self.record_steps(ckpt, lambda: local_digest(mo.modules))
        try:
            with reported_losses() as reported:
                outcome = trainer.run()
        finally:
            restore_wall_clock()
        after_step = [[step, digest, reported[i] if reported else None]
                      for i, (step, digest) in enumerate(after_step)]
        if deadline_after is not None and trainer.evaluator is not None:
            seen_deadline = self.time_left_after_evaluation(trainer)
        else:
            seen_deadline = None
        finished = outcome.exit_reason == "finished"
        parts.metrics.close(finished_step=trainer.step if finished else None,
                            status="finished" if finished else "stopped")
        parts.feeder.close()
        ckpt.close()
        flag.uninstall()
        seen = {"rank": rank, "loaded": loaded.step if loaded else None,
                "outcome": {"exit_reason": str(outcome.exit_reason),
                            "exit_code": outcome.exit_code, "start_step": outcome.start_step,
                            "end_step": outcome.end_step, "message": outcome.message,
                            "last_loss": outcome.last_loss,
                            "checkpoint_saved": Path(outcome.checkpoint_saved).name
                            if outcome.checkpoint_saved else None},
                "step": trainer.step, "updates": trainer.updates, "consumed": trainer.consumed,
                "evaluated_step": trainer.evaluated_step, "tested_step": trainer.tested_step,
                "skipped_total": trainer.guard.skipped_total,
                "common": trainer.common_state(), "signal": flag.received,
                "after_step": after_step, "final_weights": local_digest(mo.modules),
                "saves": [{k: s.get(k) for k in ("step", "reason", "sync")} for s in ckpt.saves],
                "published": ckpt.last_published_step,
                "heard": heard.calls, "after_evaluation": seen_deadline,
                "step_time_at_start": step_time_at_start,
                "loaded_step_time": loaded.common.get("step_time_s") if loaded else None}
        name = f"{run.path.name}-attempt-{number}-rank-{rank}.json"
        (self.out / name).write_text(json.dumps(seen, indent=1, default=str))
        return seen


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    from hpctrain.record.folder import RunFolder
    from hpctrain.runtime import cpu_shim, distributed
    cpu_shim.install()
    whole, stopped, unstable, unclipped = (RunFolder(Path(p)) for p in args[:4])
    probe = Probe(Path(args[4]))
    probe.start()
    probe.attempt(whole, 1, clock_back_step=4, clock_back_eval=2)
    probe.attempt(stopped, 1, signal_rank=3, signal_step=3)
    probe.attempt(stopped, 2, deadline_after=4)
    probe.attempt(stopped, 3, signal_rank=1, eval_signal=1)
    probe.attempt(stopped, 4, signal_rank=1, eval_signal=2)
    probe.attempt(stopped, 5, signal_rank=2, eval_signal=2)
    probe.attempt(stopped, 6)
    probe.attempt(unstable, 1, nan_steps=(2, 3))
    probe.attempt(unclipped, 1)
    distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
