"""The training loop: one optimizer step at a time, and the decisions taken between steps.

Per step:
  forward/backward over this rank's microbatches (megatron-core's pipeline schedule;
  gradients reduced bucket by bucket during the backward pass, ``comm_overlap``)
  -> ONE all-reduce, started asynchronously, that carries the step loss (still on the device)
     and every flag the ranks must agree on (a preemption signal seen by any rank; rank 0's
     deadline and periodic-save clocks)
  -> global gradient norm (collective, inside megatron; megatron reads it on the host: the
     step's one host synchronisation, as in Megatron-LM) -> the agreement is read: by now a
     copy of five numbers, no wait
  -> the stability guard judges the agreed loss and the norm: update, or skip
  -> metrics, then: stop-and-save (signal, deadline), stop (guard), or a periodic save.
Because every decision is made from agreed values, all ranks take the same branch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

from .. import exit_codes
from ..exit_codes import ExitReason
from . import collectives
from .batches import BatchFeeder, step_loss
from .checkpoint.manager import Checkpointer, Loaded
from .comm_overlap import ParamGatherHooks
from .context import RankContext
from .evaluation import Evaluator
from .faults import TestHooks
from .guard import StabilityGuard
from .log import logger
from .lr_schedule import LRSchedule
from .manual_gc import ManualGC
from .metrics import MetricsWriter
from .model import ModelAndOptimizer
from .preemption import DeadlinePolicy, PeriodicSaves, PreemptionFlag, SaveEstimate
from .save_interval import AutoInterval
from .straggler_timing import StragglerWatch
from .watchdog import Watchdog


@dataclass
class Outcome:
    exit_reason: ExitReason    # finished | preempted | deadline | unstable
    exit_code: int
    start_step: int
    end_step: int
    last_loss: float | None
    message: str
    checkpoint_saved: str | None


def set_learning_rate(optimizer, lr: float, weight_decay: float) -> None:
    """Apply this step's LR (and weight decay, which megatron's groups scale by ``wd_mult``:
    0 for biases and norms)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_mult", 1.0)
        group["weight_decay"] = weight_decay * group.get("wd_mult", 1.0)


def clip_gradients(optimizer, max_norm: float, total_norm: float) -> None:
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32
    if max_norm <= 0:
        return
    for o in getattr(optimizer, "chained_optimizers", [optimizer]):
        if getattr(o, "is_stub_optimizer", False):
            continue
        params = o.get_parameters()
        if params:
            clip_grad_by_total_norm_fp32(
                params, max_norm=max_norm, total_norm=total_norm,
                use_decoupled_grad=o.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8)


def checkpoint_bytes_guess(mo) -> int:
    """What this rank writes per checkpoint, at most: fp32 weights plus Adam's fp32 master
    copy and two moments (16 bytes per local parameter; less under the distributed optimizer)."""
    return 16 * sum(p.numel() for m in mo.modules for p in m.parameters())


class Trainer:
    def __init__(self, ctx: RankContext, mo: ModelAndOptimizer, feeder: BatchFeeder,
                 checkpointer: Checkpointer, hooks: TestHooks, flag: PreemptionFlag,
                 loaded: Loaded | None = None, metrics: MetricsWriter | None = None,
                 clock: Callable[[], float] = time.time, watchdog: Watchdog | None = None,
                 stragglers: StragglerWatch | None = None,
                 evaluator: Evaluator | None = None) -> None:
        self.ctx, self.mo, self.feeder = ctx, mo, feeder
        self.ckpt, self.hooks, self.flag = checkpointer, hooks, flag
        job = ctx.job
        self.total_steps = job.train.steps
        self.schedule = LRSchedule.from_train(job.train)
        self.guard = StabilityGuard.from_stability(job.train.stability)
        self.step = 0
        self.consumed = 0
        self.updates = 0
        self.evaluated_step = self.tested_step = None   # the last step evaluated (or tested)
        previous_save = previous_step = None
        if loaded is not None:
            common = loaded.common
            self.step, self.consumed = int(common["step"]), int(common["consumed_samples"])
            self.updates = int(common["optimizer_updates"])
            self.guard.load_state_dict(common.get("guard", {}))
            self.evaluated_step = common.get("evaluated_step")
            self.tested_step = common.get("tested_step")
            previous_save = loaded.manifest.get("save_seconds")
            previous_step = common.get("step_time_s")
        self.start_step = self.step
        self.estimate = SaveEstimate(previous_s=previous_save,
                                     load_s=loaded.seconds if loaded else None,
                                     state_bytes=checkpoint_bytes_guess(mo))
        checkpointer.estimate = self.estimate
        ck = job.checkpoint
        self.deadline = DeadlinePolicy(ctx.job_env.deadline, ck.deadline_safety_factor,
                                       ck.deadline_margin_s, clock)
        auto = ck.interval_minutes == "auto"
        self.periodic = PeriodicSaves(ck.interval_steps, 0.0 if auto else ck.interval_minutes,
                                      self.step)
        # auto: rank 0's clock decides; the interval follows the measured saves
        self.auto_interval = AutoInterval.for_trainer(ctx, self.periodic, self.estimate) \
            if auto and ctx.is_rank0 else None
        self.metrics = metrics
        self.watchdog = watchdog          # progress for the hang check
        self.stragglers = stragglers
        self.evaluator = evaluator        # None: no evaluation
        if evaluator is not None:
            evaluator.deadline_near = self.out_of_time
        self.stopped_by = "signal"        # what stopped the last evaluation cut short
        self.straggler: dict | None = None   # the node this attempt stopped to exclude
        from megatron.core import parallel_state as ps
        # one rank per loss value: TP rank 0 of the last stage, in every DP replica
        self.reports_loss = ps.is_pipeline_last_stage(ignore_virtual=True) and \
            ps.get_tensor_model_parallel_rank() == 0
        self.param_gather = ParamGatherHooks(mo.model, mo.config)
        self.gc = ManualGC.from_train(job.train)
        # the smoothed step time the deadline reserves after each step; an attempt that resumes
        # starts from its checkpoint's, so its first step (the slowest: communicators, caches)
        # is not followed by a step the reserve leaves out
        self.step_time = previous_step if isinstance(previous_step, float) and \
            math.isfinite(previous_step) and previous_step > 0 else None
        self.last_loss: float | None = None
        self.first_step_started: float | None = None
        # when the last step had issued fwd+bwd (time.perf_counter: durations are measured on
        # the monotonic clock, which an NTP step of the wall clock does not move)
        self.fb_issued_at: float | None = None
        self.on_first_step = None       # called with the first step's start time
        # what the data position means, recorded with every save (checked at every resume):
        # rank 0 reads the corpora's headers, every rank records its answer
        from ..data.fingerprint import data_fingerprint
        self.data_fingerprint = collectives.broadcast_object(
            data_fingerprint(job, feeder.samples.order_kind) if ctx.is_rank0 else None)

    def common_state(self) -> dict:
        return {"step": self.step, "consumed_samples": self.consumed,
                "optimizer_updates": self.updates, "lr_schedule": self.schedule.state_dict(),
                "guard": self.guard.state_dict(), "job": self.ctx.job.name,
                "evaluated_step": self.evaluated_step, "tested_step": self.tested_step,
                "sample_order": self.feeder.samples.order_kind, "data": self.data_fingerprint,
                "step_time_s": self.step_time}

    # --------------------------------------------------------------------- one step
    def train_step(self) -> dict:
        from megatron.core.pipeline_parallel.schedules import get_forward_backward_func

        ctx, lay, mo = self.ctx, self.ctx.layout, self.mo
        number = self.step + 1
        nan = self.hooks.at_step(number, ctx.rank, released=self._hold_released,
                                 waiting=self._held, log=logger.info)
        lr = self.schedule.lr_at(self.step)
        set_learning_rate(mo.optimizer, lr, ctx.job.train.weight_decay)
        for m in mo.model:
            m.zero_grad_buffer()
        mo.optimizer.zero_grad()
        chunks = len(mo.model)
        losses = get_forward_backward_func()(
            forward_step_func=self.feeder.forward_step(nan),
            data_iterator=self.feeder.iterators(self.consumed, chunks),
            model=mo.model if chunks > 1 else mo.model[0],
            num_microbatches=lay.num_microbatches, seq_length=ctx.job.model.seq_length,
            micro_batch_size=lay.micro_batch_size, forward_only=False)
        self.fb_issued_at = time.perf_counter()
        # Started now, read after megatron's own host synchronisation (the gradient norm):
        # the agreement costs the step no wait of its own.
        agreement = self._start_agreement(
            step_loss(losses, lay.num_microbatches) if self.reports_loss else None, number)
        found_inf = mo.optimizer.prepare_grads()
        grad_norm = None if found_inf else mo.optimizer.get_grad_norm()
        agreed = agreement()
        loss = agreed[0] / agreed[1] if agreed[1] else float("nan")
        if found_inf:  # fp16 overflow: megatron lowered the loss scale; not a guard matter
            verdict_skip, reason, stop = True, "fp16 overflow (loss scale lowered)", None
        else:
            verdict = self.guard.check(loss, grad_norm)
            verdict_skip, reason, stop = verdict.skip, verdict.reason, verdict.stop
        if not verdict_skip:
            clip_gradients(mo.optimizer, ctx.job.train.clip_grad, grad_norm)
            mo.optimizer.step_with_ready_grads()
            self.updates += 1
            self.param_gather.after_update()
        self.step = number
        self.consumed += lay.global_batch_size
        if math.isfinite(loss):
            self.last_loss = loss
        return {"loss": loss, "grad_norm": grad_norm, "lr": lr, "skipped": reason if verdict_skip
                else None, "stop": stop, "preempt": agreed[2] > 0, "deadline": agreed[3] > 0,
                "save_due": agreed[4] > 0}

    def _profile_begin(self):
        """train.profile_step: the profiler around the step about to run (every rank)."""
        if self.ctx.job.train.profile_step != self.step + 1:
            return None
        from .step_profile import StepProfile
        try:
            return StepProfile(self.ctx.device)
        except Exception as e:  # noqa: BLE001 - a diagnostic never stops the training
            logger.warning(f"step {self.step + 1}: not profiled: {type(e).__name__}: {e}")
            return None

    def _profile_end(self, profiled, tick: float) -> None:
        """The profiled step's summary into the attempt's folder (rank 0's trace beside it)
        and rank 0's log; a profile that cannot be written is said, the run goes on."""
        from .step_profile import describe
        try:
            report = profiled.stop(self.fb_issued_at - tick, time.perf_counter() - tick)
            profiled.write(self.ctx.run.attempt_dir(self.ctx.attempt), self.step, self.ctx.rank,
                           trace=self.ctx.is_rank0)
        except Exception as e:  # noqa: BLE001 - a diagnostic never stops the training
            logger.warning(f"step {self.step}: the profile could not be made or written: "
                           f"{type(e).__name__}: {e}")
            return
        if self.ctx.is_rank0:
            logger.info(f"profile of step {self.step}: {describe(report)}")

    def out_of_time(self, next_s: float | None) -> bool:
        """Rank 0's clock: is the time left short of a save (with its safety factor and margin,
        after what a background save in flight may still take) after work of ``next_s``
        seconds, the next decision's distance? None: a training step, the next decision being
        the next step's agreement (after an evaluation's last batch as after a step)."""
        ahead = (self.step_time or 0.0) if next_s is None else next_s
        save = self.estimate.seconds
        # a save stops training only after the background save in flight is done (one at a
        # time): what that one may still take comes first
        return self.deadline.must_stop(save + self.ckpt.pending_left_s(save), ahead)

    def _start_agreement(self, loss, number: int):
        """Start the step's one all-reduce: [loss sum, loss reporters, signal, deadline, save
        due]. The loss (last stage, TP rank 0) stays a device tensor; the flags are host
        values known now (a signal on any rank; rank 0's clocks). A non-finite gradient norm
        needs no vote: megatron reduces the norm over the ranks that share it, so every rank
        sees the same value."""
        import torch
        ctx = self.ctx
        if ctx.is_rank0:
            deadline = self.out_of_time(None)
            due = self.periodic.due(number)
        else:
            deadline = due = False
        flags = torch.tensor([0.0, 1.0 if loss is not None else 0.0, float(self.flag.requested),
                              float(deadline), float(due)], dtype=torch.float64)
        if ctx.device == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
            flags = flags.pin_memory().to(device, non_blocking=True)
        if loss is not None:
            flags[0] += loss
        return collectives.start_sum(flags)

    def _held(self) -> None:
        if self.watchdog is not None:   # a test's hold on purpose is not a hang
            self.watchdog.progress(phase="held by a test hook")

    def _hold_released(self) -> bool:
        """A test's hold (HPCTRAIN_TEST_HOLD_AFTER_STEP) ends when this rank is told to stop,
        or when the test drops ``hold-release`` into the run folder (``faults``)."""
        from .faults import hold_release_reaches
        return self.flag.check_file() or hold_release_reaches(self.ctx.run.path, self.step)

    # --------------------------------------------------------------------- the loop
    def run(self) -> Outcome:
        if self.step >= self.total_steps:
            if not self._evaluations():      # a test loss the last attempt did not finish
                return self._preempted_in_evaluation()
            return self._outcome(ExitReason.FINISHED, exit_codes.FINISHED,
                                 f"already at step {self.step} of {self.total_steps}", None)
        if self.ctx.is_rank0:
            logger.info(f"training from step {self.step} to {self.total_steps} on "
                        f"{self.ctx.layout.describe()} ({self.ctx.device})")
            if self.auto_interval is not None:
                self.auto_interval.report(self.ctx, self.step, "start")
        self.gc.start()
        try:
            outcome = self._steps()
        finally:
            self.gc.stop()
        self.param_gather.close()   # parameters gathered: what is read next is current
        return outcome

    def _steps(self) -> Outcome:
        ck = self.ctx.job.checkpoint
        if not self._evaluations():   # an evaluation the last attempt was stopped in
            return self._preempted_in_evaluation()
        while self.step < self.total_steps:
            started = time.time()           # the epoch second, for the attempt's record
            tick = time.perf_counter()      # the step's duration: never negative, see above
            if self.first_step_started is None:
                self.first_step_started = started
                if self.on_first_step is not None:
                    self.on_first_step(started)
            timer = self.stragglers.timer if self.stragglers is not None else None
            profiled = self._profile_begin()
            if timer is not None:
                timer.step_begin()
            info = self.train_step()
            if timer is not None:
                timer.step_end()
            self.ckpt.step_done(self.step)
            if profiled is not None:
                self._profile_end(profiled, tick)
            elapsed = time.perf_counter() - tick
            # an attempt's first step (the slowest) is reserved whole after it, whatever the
            # checkpoint's smoothed time was (another layout may be slower); then smoothed
            first = self.step == self.start_step + 1
            self.step_time = max(self.step_time or 0.0, elapsed) if first else \
                0.8 * self.step_time + 0.2 * elapsed
            if self.watchdog is not None:
                self.watchdog.step_done(self.step, elapsed)
            named = exclude = None
            if self.stragglers is not None:
                self.stragglers.step_done()
                if self.metrics is not None and self.metrics.due(self.step, info["skipped"]):
                    named, exclude = self.stragglers.at_log_step(self.step)
            if self.metrics is not None:
                self.metrics.record(self.step, info["loss"], info["grad_norm"], info["lr"], elapsed,
                                    info["skipped"], self.consumed, self.guard.skipped_total,
                                    stragglers=named,
                                    compute=self.stragglers.last if named is not None else None)
            self.gc.after_step(self.step)
            if info["skipped"] and self.ctx.is_rank0:
                logger.info(f"step {self.step}: update skipped ({info['skipped']}); "
                            f"{self.guard.skipped_in_a_row} in a row")
                self.ctx.run.event("step_skipped", step=self.step, reason=info["skipped"],
                                   attempt=self.ctx.attempt)
            if info["preempt"] or info["deadline"]:
                why = ExitReason.PREEMPTED if info["preempt"] else ExitReason.DEADLINE
                cause = (f"signal {self.flag.received or 'on another rank'}" if info["preempt"]
                         else "the job's time limit is near")
                if self.ctx.is_rank0:
                    logger.info(f"step {self.step}: {cause}; saving an emergency checkpoint")
                saved = self._save("emergency" if info["preempt"] else "deadline", sync=True)
                return self._outcome(why, exit_codes.PREEMPTED,
                                     f"{cause}: saved step {self.step}, exiting to be requeued",
                                     saved)
            if info["stop"]:
                self.ckpt.wait()
                return self._outcome(ExitReason.UNSTABLE, exit_codes.UNSTABLE, info["stop"], None)
            if not self._evaluations():
                return self._preempted_in_evaluation()
            final = self.step >= self.total_steps
            if final and ck.save_at_end:
                saved = self._save("final", sync=True)
                return self._outcome(ExitReason.FINISHED, exit_codes.FINISHED,
                                     f"finished {self.total_steps} steps", saved)
            if exclude is not None:
                return self._stop_for_straggler(exclude)
            if info["save_due"]:
                self._save("periodic", sync=not ck.async_save)
                self.periodic.saved(self.step)
                last = self.ckpt.saves[-1] if self.ckpt.saves else {}
                if self.auto_interval is not None and last.get("step") == self.step:
                    self.auto_interval.saved(last.get("stall_seconds"))
                    self.auto_interval.report(self.ctx, self.step, "after a periodic save")
            self.ckpt.poll()
        self.ckpt.wait()
        return self._outcome(ExitReason.FINISHED, exit_codes.FINISHED,
                             f"finished {self.total_steps} steps", None)

    def _evaluations(self) -> bool:
        """The evaluations due after this step and not done yet (validation every
        ``train.eval_interval`` steps, test at the end); False when a signal or the time
        limit stopped one, or the time limit came near during one: save and stop."""
        ev = self.evaluator
        if ev is None:
            return True
        wanted = []
        if self.step > 0 and ev.due(self.step) and self.evaluated_step != self.step:
            wanted.append("validation")
        if ev.at_end and self.step >= self.total_steps and self.tested_step != self.step:
            wanted.append("test")
        for kind in wanted:
            self.param_gather.sync()    # overlap_param_gather: the parameters must be current
            result = ev.evaluate(kind, self.step)
            if result.loss is None:
                self.stopped_by = result.stopped_by or "signal"
                return False
            if kind == "validation":
                self.evaluated_step = self.step
            else:
                self.tested_step = self.step
            if result.stopped_by == "deadline" and self.step < self.total_steps:
                self.stopped_by = "deadline"      # done, but no time left for another step
                return False
        if wanted and self.watchdog is not None:
            self.watchdog.progress(step=self.step, phase="step")
        return True

    def _preempted_in_evaluation(self) -> Outcome:
        """A signal, or the time limit, during an evaluation: save the training step (unless
        it is the one this attempt loaded) and exit to be requeued; the next attempt
        evaluates again."""
        deadline = self.stopped_by == "deadline"
        cause = ("the job's time limit is near" if deadline else
                 f"signal {self.flag.received or 'on another rank'}")
        if self.ctx.is_rank0:
            logger.info(f"step {self.step}: {cause} during evaluation; saving an emergency "
                        f"checkpoint" if self.step != self.start_step else
                        f"step {self.step}: {cause} during evaluation; the loaded checkpoint "
                        f"holds this step")
        saved = self._save("deadline" if deadline else "emergency", sync=True) \
            if self.step != self.start_step else None
        where = "saved" if saved else "already in the checkpoint this attempt resumed from"
        return self._outcome(ExitReason.DEADLINE if deadline else ExitReason.PREEMPTED,
                             exit_codes.PREEMPTED, f"{cause} during evaluation: step "
                             f"{self.step} {where}, exiting to be requeued", saved)

    def _stop_for_straggler(self, node) -> Outcome:
        """health.exclude_stragglers: every rank reached the same decision from the same
        gathered times; save now and exit to be requeued without the node."""
        if self.ctx.is_rank0:
            logger.info(f"step {self.step}: straggler {node.describe()}; saving a checkpoint to "
                        f"requeue without {node.node}")
        saved = self._save("straggler", sync=True)
        self.straggler = node.to_dict()
        return self._outcome(ExitReason.STRAGGLER, exit_codes.PREEMPTED,
                             f"straggler {node.describe()}: saved step {self.step}, exiting to "
                             f"be requeued without {node.node}", saved)

    def _save(self, reason: str, sync: bool) -> str | None:
        self.param_gather.sync()    # overlap_param_gather: the parameters must be current
        common = self.common_state()
        # every rank's common state must be the same (megatron-core compares them at a save);
        # the step time each rank measured is its own: rank 0's, whose clock decides, is kept
        common["step_time_s"] = collectives.broadcast_object(self.step_time)
        self.ckpt.save(self.step, common, reason, sync=sync)
        if sync:
            self.ckpt.wait()
            return self.ckpt.last_published_path
        return None

    def _outcome(self, reason: ExitReason, code: int, message: str, saved) -> Outcome:
        return Outcome(exit_reason=reason, exit_code=code, start_step=self.start_step,
                       end_step=self.step, last_loss=self.last_loss, message=message,
                       checkpoint_saved=saved)
