"""One attempt's parts, assembled in the one order the runtime and its tests share.

The parts depend on each other in an order that matters: the checkpointer resumes before the
metrics know their first step; a resumed run reads the sample order its checkpoint recorded
before the evaluator draws a batch; the straggler watch times the feeder's forward passes. The
runtime's entry (`entry._train`) and the training loop's multi-attempt test
(`tests/runtime/loop_probe.py`) both build an attempt here, so a test that stops and resumes
attempts runs the assembly the runtime runs, not a copy of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class AttemptParts:
    """What `assemble_attempt` built, for the caller to run and to close."""
    feeder: Any                 # batches.BatchFeeder
    checkpointer: Any           # checkpoint.manager.Checkpointer
    loaded: Any                 # checkpoint.manager.Loaded, or None on a fresh start
    metrics: Any                # metrics.MetricsWriter
    trainer: Any                # loop.Trainer


def assemble_attempt(ctx, mo, hooks, flag, clock: Callable[[], float] | None = None,
                     on_resumed: Callable[[Any], None] | None = None) -> AttemptParts:
    """Data, straggler watch, checkpointer (and its resume), metrics, evaluator and trainer
    of one attempt, for the model and optimizer ``mo`` built on ``ctx``'s layout.
    ``clock``: the trainer's clock (tests move the time limit near); the wall clock if None.
    ``on_resumed(loaded)``: called as soon as a checkpoint is loaded, so that what the attempt
    resumed from is on record even if a later part fails to build."""
    from ..data.blend import split_samples
    from ..data.order import FEISTEL, PERMUTATION
    from .batches import BatchFeeder
    from .checkpoint.manager import Checkpointer
    from .checkpoint.weights import load_model_only
    from .evaluation import build_evaluator
    from .log import logger
    from .loop import Trainer
    from .metrics import MetricsWriter

    job = ctx.job
    datasets: dict = {}
    samples = split_samples(job.data, "train", job.model.seq_length, job.train.seed,
                            job.model.vocab_size, datasets)
    feeder = BatchFeeder(samples, ctx.layout, ctx.device, job.data.num_workers)
    if ctx.is_rank0:
        logger.info(f"data: training {samples.describe()}")
    stragglers = straggler_watch(ctx, feeder, hooks)
    ckpt = Checkpointer(ctx, mo, ctx.run.checkpoint_dir(job, ctx.profile), hooks)
    loaded = ckpt.resume()
    order = FEISTEL
    if loaded is not None:
        # a run saved before the on-the-fly order goes on reading the order it started with
        order = loaded.common.get("sample_order", PERMUTATION)
        samples.use_order(order)
        if on_resumed is not None:
            on_resumed(loaded)
    elif job.train.init_from:
        folder = load_model_only(mo, job.train.init_from, ctx.is_rank0)
        if ctx.is_rank0:
            logger.info(f"initial weights from {folder}")
    metrics = MetricsWriter(ctx, job.train.steps, resume_step=loaded.step if loaded else 0)
    ckpt.on_published = metrics.committed
    evaluator = build_evaluator(ctx, mo, datasets, flag, metrics, hooks, order)
    timing = {} if clock is None else {"clock": clock}
    trainer = Trainer(ctx, mo, feeder, ckpt, hooks, flag, loaded=loaded, metrics=metrics,
                      watchdog=ctx.watchdog, stragglers=stragglers, evaluator=evaluator,
                      **timing)
    return AttemptParts(feeder=feeder, checkpointer=ckpt, loaded=loaded, metrics=metrics,
                        trainer=trainer)


def straggler_watch(ctx, feeder, hooks):
    """Times every forward pass and gathers the times at log steps (``straggler_timing``).
    Exclusion needs the batch shell, which requeues without the node."""
    from ..flops import model_flops_per_step
    from ..model_shape import ModelShape
    from .straggler_timing import ComputeTimer, StragglerWatch
    from .watchdog import WATCHER_ENV
    feeder.timer = ComputeTimer(ctx.device, hooks.forward_delay(ctx.rank))
    health = ctx.job.health
    may_exclude = health.exclude_stragglers and os.environ.get(WATCHER_ENV) == "batch"
    if health.exclude_stragglers and not may_exclude and ctx.is_rank0:
        from .log import logger
        logger.info("note: health.exclude_stragglers: only a Slurm batch script can requeue "
                    "without a node; stragglers are named only")
    # a node already stopped for once: excluded, or kept in (the job cannot start without it)
    before = {n for r in ctx.run.ledger() if r.get("exit_reason") == "straggler"
              for n in (r.get("excluded_nodes") or []) + (r.get("not_excluded_nodes") or [])}
    flops = model_flops_per_step(ModelShape.from_model(ctx.job.model),
                                 ctx.job.batch.global_batch_size,
                                 ctx.layout.tensor_model_parallel_size)
    return StragglerWatch(ctx, feeder.timer, may_exclude, before, flops)
