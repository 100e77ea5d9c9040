"""Training metrics on rank 0: a progress line, ``RUN/metrics.jsonl`` and TensorBoard events.

Every ``train.log_interval`` steps (and at every skipped step, so a skip is never hidden)
one JSON record: step, loss, grad_norm, lr, tokens_per_s, step_time_s (mean over the
interval), the straggler nodes named (``stragglers``) and the median and largest rank compute
time (``runtime.straggler_timing``), mfu (model FLOPs from ``hpctrain.flops`` over world size × the profile's
``node.peak_tflops``; null when the peak is unknown), skipped and the skip reason.
Every evaluation (``runtime.evaluation``) adds a record of its own kind: ``{"kind":
"validation"|"test", "step", "loss", "iters", "samples", "seconds", ...}``; training records
say ``"kind": "train"`` (records without a kind, from older runs, are training records).
TensorBoard event files go to ``RUN/tensorboard/`` when the ``tensorboard`` package is
installed (it is optional): ``train/*``, ``validation/loss`` and ``test/loss``; a resumed
attempt hides what earlier attempts logged past its checkpoint's step (it logs those again).
Every record also goes to the run's experiment trackers (``tracking:``, W&B and MLflow), through
:mod:`hpctrain.tracking`'s thread: sent once a checkpoint holds its step (:meth:`committed`).
"""

from __future__ import annotations

import math
import statistics
import time

import json

from ..flops import mfu, model_flops_per_step
from ..model_shape import ModelShape
from ..config.durations import format_duration
from .log import logger


def _finite(x):
    return x if x is None or math.isfinite(x) else str(x)


class MetricsWriter:
    def __init__(self, ctx, total_steps: int, resume_step: int) -> None:
        """``resume_step``: the step the attempt resumed from (0 on a fresh start): the
        trackers are sent what earlier attempts left up to it."""
        self.ctx = ctx
        self.total_steps = total_steps
        job = ctx.job
        self.interval = job.train.log_interval
        self.flops_per_step = model_flops_per_step(ModelShape.from_model(job.model),
                                                   job.batch.global_batch_size,
                                                   ctx.layout.tensor_model_parallel_size)
        self.tokens_per_step = job.batch.global_batch_size * job.model.seq_length
        self.peak = ctx.profile.node.peak_tflops
        self._times: list[float] = []
        self.tb = self._tensorboard(resume_step) if ctx.is_rank0 else None
        # One writer (rank 0), one line per record, flushed but not fsynced: a lost last line
        # after a node crash costs nothing, an fsync per logged step costs step time.
        self._file = open(ctx.run.metrics_file, "a") if ctx.is_rank0 else None
        self.tracker = None
        if ctx.is_rank0:
            from ..tracking.runtime import start_tracking
            self.tracker = start_tracking(ctx, resume_step, logger.warning)

    def committed(self, step: int) -> None:
        """A checkpoint of step ``step`` is published: the trackers may be sent up to it."""
        if self.tracker is not None:
            self.tracker.commit(step)

    def _tensorboard(self, resume_step: int):
        """The attempt's TensorBoard writer. ``purge_step``: an earlier attempt may have
        logged steps (and evaluations) past the checkpoint this one resumed from; this attempt
        logs them again, and TensorBoard would show both. The writer's first event tells
        TensorBoard's reader to drop what earlier event files hold from ``resume_step + 1``
        on, in every tag (also from step 1 on a start without a checkpoint)."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception:  # tensorboard not installed: optional
            return None
        try:
            return SummaryWriter(log_dir=str(self.ctx.run.path / "tensorboard"),
                                 purge_step=resume_step + 1)
        except OSError:
            return None

    def due(self, step: int, skipped: str | None) -> bool:
        """Whether step ``step`` is logged (the same answer on every rank)."""
        return step % self.interval == 0 or skipped is not None or step == self.total_steps

    def record(self, step: int, loss: float, grad_norm: float | None, lr: float,
               step_time_s: float, skipped: str | None, consumed_samples: int,
               skipped_total: int, stragglers: list | None = None,
               compute: dict | None = None) -> dict | None:
        """Step ``step`` (1-based) just finished; rank 0 logs it when due. ``stragglers``: the
        nodes named at this log step (``SlowNode``s; None when not measured), ``compute``:
        every rank's forward time per step over the interval."""
        self._times.append(step_time_s)
        due = self.due(step, skipped)
        if not (self.ctx.is_rank0 and due):
            if due:
                self._times.clear()
            return None
        mean_time = sum(self._times) / len(self._times)
        self._times.clear()
        util = mfu(self.flops_per_step, mean_time, self.ctx.world_size, self.peak)
        rec = {"kind": "train", "step": step, "loss": _finite(loss), "grad_norm": _finite(grad_norm), "lr": lr,
               "tokens_per_s": round(self.tokens_per_step / mean_time, 1) if mean_time else None,
               "step_time_s": round(mean_time, 4), "mfu": None if util is None else round(util, 5),
               "skipped": skipped is not None, "skip_reason": skipped,
               "skipped_total": skipped_total, "consumed_samples": consumed_samples,
               "attempt": self.ctx.attempt, "time": round(time.time(), 3)}
        if stragglers is not None:
            rec["stragglers"] = [n.to_dict() for n in stragglers]
        if compute:
            seconds = compute["compute_s"]
            rec["compute_s_median"] = round(statistics.median(seconds), 6)
            rec["compute_s_max"] = max(seconds)
            if "tflops" in compute:
                rec["rank_tflops_min"] = min((t for t in compute["tflops"] if t), default=None)
        self._file.write(json.dumps(rec) + "\n")
        self._file.flush()
        if self.tracker is not None:
            self.tracker.add(rec)
        if self.tb is not None:
            for key in ("loss", "grad_norm", "lr", "tokens_per_s", "step_time_s", "mfu"):
                value = rec[key]
                if isinstance(value, (int, float)):
                    self.tb.add_scalar(f"train/{key}", value, step)
        logger.info(self.progress_line(rec))
        return rec

    def record_eval(self, kind: str, step: int, loss: float, iters: int, samples: int,
                    seconds: float) -> dict | None:
        """An evaluation's loss (``kind``: "validation" or "test"), on rank 0."""
        if not self.ctx.is_rank0:
            return None
        rec = {"kind": kind, "step": step, "loss": _finite(loss), "iters": iters,
               "samples": samples, "seconds": round(seconds, 3), "attempt": self.ctx.attempt,
               "time": round(time.time(), 3)}
        self._file.write(json.dumps(rec) + "\n")
        self._file.flush()
        if self.tracker is not None:
            self.tracker.add(rec)
        if self.tb is not None and isinstance(rec["loss"], float):
            self.tb.add_scalar(f"{kind}/loss", rec["loss"], step)
        shown = f"{loss:.4f}" if math.isfinite(loss) else str(loss)
        # the record's time (rounded once), so that the line and metrics.jsonl agree
        logger.info(f"step {step}/{self.total_steps} | {kind} loss {shown} | {iters} batches "
                    f"({samples} samples) in {rec['seconds']:.2f} s")
        return rec

    def progress_line(self, rec: dict) -> str:
        left = (self.total_steps - rec["step"]) * rec["step_time_s"]
        eta = format_duration(left)     # the CLI's own format: 42s, 3m05s, 2h03m, 6d10h
        gn = rec["grad_norm"]
        parts = [f"step {rec['step']}/{self.total_steps}",
                 f"loss {rec['loss']:.4f}" if isinstance(rec["loss"], float) else f"loss {rec['loss']}",
                 f"grad {gn:.3f}" if isinstance(gn, float) else f"grad {gn}",
                 f"lr {rec['lr']:.2e}",
                 "n/a tok/s" if rec["tokens_per_s"] is None else f"{rec['tokens_per_s']:.0f} tok/s",
                 f"{rec['step_time_s']:.3f} s/step",
                 "MFU " + (f"{100 * rec['mfu']:.1f}%" if rec["mfu"] is not None else "n/a"),
                 f"ETA {eta}"]
        line = " | ".join(parts)
        if rec["skipped"]:
            line += f" | SKIPPED: {rec['skip_reason']}"
        if rec.get("stragglers"):
            line += " | straggler " + ", ".join(n["node"] for n in rec["stragglers"])
        return line

    def close(self, finished_step: int | None = None, status: str = "failed") -> None:
        """``finished_step``: training finished there (every step is final; the report PNG
        goes to the trackers). ``status``: finished, stopped (to be continued) or failed."""
        if self.tracker is not None:
            if finished_step is not None:
                self.tracker.commit(finished_step)
                self.tracker.add_report()
            self.tracker.close(status)
            self.tracker = None
        if self.tb is not None:
            self.tb.close()
        if self._file is not None:
            self._file.close()
