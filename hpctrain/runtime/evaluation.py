"""Validation and test loss: megatron-core's forward-only schedule over fixed global batches.

Every evaluation reads the same samples: global batches ``0 .. train.eval_iters − 1`` of the
validation (or test) blend, cut across data-parallel ranks exactly as training batches are,
so the loss is the same on every layout and comparable between evaluations and runs. The
models run in eval mode under ``torch.no_grad`` (no dropout, so no random numbers are drawn)
and the training reader is not touched, so a run with evaluation trains bit for bit like one
without (Megatron-LM's ``evaluate``).

Each evaluation batch ends with one all-reduce of [loss sum, loss reporters, signal,
deadline]: a preemption signal during an evaluation, or the job's time limit coming within
the emergency save's lead time (rank 0's clock, the same rule as between training steps),
stops it at once; the trainer then saves at the training step just finished and the next
attempt evaluates that step again. A long evaluation never eats the time the save needs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from . import collectives
from .batches import step_loss
from .log import logger


@dataclass
class EvalResult:
    kind: str             # "validation" or "test"
    loss: float | None    # None: stopped by a preemption signal or the deadline
    iters: int
    seconds: float
    # "signal" or "deadline": what cut it short (loss None), or, with a loss, the time limit
    # came near in its last batch: the loss counts, and the trainer saves and stops
    stopped_by: str | None = None


class Evaluator:
    def __init__(self, ctx, mo, feeders: dict, flag, watchdog=None, metrics=None, hooks=None,
                 released=None) -> None:
        """``feeders``: a ``batches.BatchFeeder`` per kind ("validation", "test") the job uses;
        ``hooks``/``released``: the test hooks' hold in an evaluation and what ends it."""
        train = ctx.job.train
        self.ctx, self.mo, self.feeders = ctx, mo, feeders
        self.interval = train.eval_interval
        self.iters = train.eval_iters
        self.at_end = train.eval_at_end
        from megatron.core import parallel_state as ps
        # one rank per loss value: TP rank 0 of the last stage, in every DP replica
        self.reports_loss = ps.is_pipeline_last_stage(ignore_virtual=True) and \
            ps.get_tensor_model_parallel_rank() == 0
        self.flag, self.watchdog, self.metrics = flag, watchdog, metrics
        self.hooks, self.released = hooks, released
        # rank 0's deadline rule, given the next batch's expected time (set by the trainer,
        # which owns the time limit and the save estimate); None: no time limit check
        self.deadline_near = None

    def due(self, step: int) -> bool:
        return bool(self.interval) and "validation" in self.feeders and step % self.interval == 0

    def evaluate(self, kind: str, step: int) -> EvalResult:
        """Every rank: ``train.eval_iters`` forward-only global batches of ``kind``."""
        import torch
        from megatron.core.pipeline_parallel.schedules import get_forward_backward_func

        ctx, lay, mo = self.ctx, self.ctx.layout, self.mo
        feeder = self.feeders[kind]
        chunks = len(mo.model)
        # durations on the monotonic clock, which an NTP step of the wall clock does not move
        started = time.perf_counter()
        total, loss, stopped_by = 0.0, None, None
        batch_s = 0.0
        for m in mo.model:
            m.eval()
        try:
            with torch.no_grad():
                for i in range(self.iters):
                    batch_started = time.perf_counter()
                    if self.watchdog is not None:
                        self.watchdog.progress(phase=f"{kind} batch {i + 1}/{self.iters}")
                    reports = get_forward_backward_func()(
                        forward_step_func=feeder.forward_step(),
                        data_iterator=feeder.iterators(i * lay.global_batch_size, chunks),
                        model=mo.model if chunks > 1 else mo.model[0],
                        num_microbatches=lay.num_microbatches,
                        seq_length=ctx.job.model.seq_length,
                        micro_batch_size=lay.micro_batch_size, forward_only=True)
                    if i == 0 and self.hooks is not None:
                        self.hooks.hold_in_evaluation(step, self.released, waiting=self._held)
                    took = time.perf_counter() - batch_started
                    batch_s = took if i == 0 else max(batch_s, took)
                    agreed = self._agree(step_loss(reports, lay.num_microbatches)
                                         if self.reports_loss else None,
                                         batch_s if i + 1 < self.iters else None)
                    signal, deadline = agreed[2] > 0, agreed[3] > 0
                    if signal or (deadline and i + 1 < self.iters):
                        stopped_by = "signal" if signal else "deadline"
                        break
                    total += agreed[0] / agreed[1]
                    if deadline:    # complete, but no time is left to train on
                        stopped_by = "deadline"
                else:
                    loss = total / self.iters
        finally:
            feeder.close()
            for m in mo.model:
                m.train()
        result = EvalResult(kind, loss, self.iters, time.perf_counter() - started, stopped_by)
        if loss is None:
            if ctx.is_rank0:
                logger.info(f"step {step}: {kind} stopped by "
                            f"{'a preemption signal' if stopped_by == 'signal' else 'the time limit'}")
        elif self.metrics is not None:
            self.metrics.record_eval(kind, step, loss, self.iters,
                                     self.iters * lay.global_batch_size, result.seconds)
        return result

    def _held(self) -> None:
        if self.watchdog is not None:   # a test's hold on purpose is not a hang
            self.watchdog.progress(phase="held by a test hook")

    def _agree(self, loss, next_batch_s: float | None):
        """[loss sum, reporters, signal, deadline] over every rank; the deadline is rank 0's
        verdict with the next batch's time in the lead (None after the last batch: the verdict
        then says whether there is time left for another training step, that step's time in
        the lead)."""
        import torch
        deadline = bool(self.ctx.is_rank0 and self.deadline_near is not None
                        and self.deadline_near(next_batch_s))
        flags = torch.tensor([0.0, 1.0 if loss is not None else 0.0, float(self.flag.requested),
                              float(deadline)], dtype=torch.float64)
        if self.ctx.device == "cuda":
            flags = flags.to(torch.device("cuda", torch.cuda.current_device()))
        if loss is not None:
            flags[0] += loss
        return collectives.start_sum(flags)()


def build_evaluator(ctx, mo, datasets, flag, metrics, hooks, order: str | None = None):
    """The validation/test readers and their evaluator (None when the job evaluates nothing);
    ``order``: the sample order of the run (:mod:`hpctrain.data.order`), as training reads."""
    from ..data.blend import split_samples
    from .batches import BatchFeeder
    job = ctx.job
    feeders = {}
    for kind, split, wanted in (("validation", "valid", job.train.eval_interval),
                                ("test", "test", job.train.eval_at_end)):
        if wanted:
            notes: list[str] = []
            samples = split_samples(job.data, split, job.model.seq_length, job.train.seed,
                                    job.model.vocab_size, datasets, notes)
            for note in notes if ctx.is_rank0 else []:
                logger.info(f"note: {note}")
            if samples is not None:
                if order is not None:
                    samples.use_order(order)
                feeders[kind] = BatchFeeder(samples, ctx.layout, ctx.device,
                                            job.data.num_workers)
                if ctx.is_rank0:
                    logger.info(f"data: {kind} {samples.describe()}")
    if not feeders:
        return None
    return Evaluator(ctx, mo, feeders, flag, watchdog=ctx.watchdog, metrics=metrics, hooks=hooks,
                     released=lambda: flag.check_file() or
                     (ctx.run.path / "hold-release").exists())
