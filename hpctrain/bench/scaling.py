"""``hpctrain bench scaling``: the same job at several node counts, efficiency against the smallest.

Each size is a real run submitted the way ``hpctrain submit`` submits one (``hpctrain.submission``:
the planner's fit check, data preparation, a run folder, the job), for a short number of
steps, one size after the other so no two share the machines. Tokens/s comes from each run's
``metrics.jsonl`` (one record per step; the first ``warmup`` steps are left out: they pay for
start-up, allocator growth and the first collectives).

Weak scaling (the default) keeps the work per GPU: the job's micro batch size and its number
of microbatches per rank on the profile's own node count, so the global batch grows with DP.
Strong scaling (``strong=True``) keeps the job's global batch, so each rank gets fewer
microbatches as DP grows. TP, PP and VPP stay the job's; DP follows from the world size. Either
way the efficiency of a size is its tokens/s per GPU over the smallest size's — for weak
scaling the ratio of step times, for strong scaling the speedup over the ideal one.

Beside each measurement: the planner's step time for the same layout (``plan.timing``), as
tokens/s and efficiency. Where the profile gives no ``node.peak_tflops`` (CPU profiles), the
planner's compute rate is calibrated on the smallest measured size (its predicted step time set
equal to the measured one) and the other sizes follow from its model: the prediction is then
about how the time grows with the size, not about its absolute level.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..config import ClusterProfile, Resolved, resolve
from ..config.job import JobConfig
from ..config.profile import MAX_NODES
from ..errors import ConfigError, HpcTrainError, SubmissionError, UsageError
from ..scheduler.choose import backend_for

TARGET_EFFICIENCY = 0.85      # the seeds' target: more than 85% up to 64 GPUs
DEFAULT_STEPS = 30
DEFAULT_WARMUP = 10
NOMINAL_PEAK_TFLOPS = 1.0     # the calibration's starting point (any positive number works)


def parse_sizes(text: str) -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4] (sorted, without repeats); a usage error names the option."""
    sizes = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= MAX_NODES:
            raise UsageError(f"--nodes: expected node counts like 1,2,4 (each 1-{MAX_NODES}), "
                             f"got {text!r}")
        sizes.append(int(part))
    return sorted(set(sizes))


@dataclass
class Size:
    """One node count: the job as it runs there, and what was measured and predicted."""

    nodes: int
    resolved: Resolved
    run_id: str | None = None
    job_id: str | None = None
    outcome: str = "not run"
    tokens_per_s: float | None = None
    step_time_s: float | None = None
    steps_measured: int = 0
    predicted_step_s: float | None = None
    plan_compute_s: float | None = None      # the planner's compute part at the nominal peak
    plan_comm_s: float = 0.0
    efficiency: float | None = None
    predicted_efficiency: float | None = None

    @property
    def world_size(self) -> int:
        return self.resolved.profile.world_size

    @property
    def global_batch_size(self) -> int:
        return self.resolved.job.batch.global_batch_size

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.resolved.job.model.seq_length

    @property
    def predicted_tokens_per_s(self) -> float | None:
        return self.tokens_per_step / self.predicted_step_s if self.predicted_step_s else None

    def to_json(self) -> dict:
        lay = self.resolved.layout
        return {"nodes": self.nodes, "world_size": self.world_size, "layout": lay.describe(),
                "micro_batch_size": lay.micro_batch_size,
                "num_microbatches": lay.num_microbatches,
                "global_batch_size": self.global_batch_size, "run": self.run_id,
                "job_id": self.job_id, "outcome": self.outcome,
                "tokens_per_s": _r(self.tokens_per_s), "step_time_s": _r(self.step_time_s, 4),
                "steps_measured": self.steps_measured, "efficiency": _r(self.efficiency, 4),
                "predicted_step_time_s": _r(self.predicted_step_s, 4),
                "predicted_tokens_per_s": _r(self.predicted_tokens_per_s),
                "predicted_efficiency": _r(self.predicted_efficiency, 4)}


@dataclass
class ScalingResult:
    job_name: str
    profile_name: str
    strong: bool
    steps: int
    warmup: int
    sizes: list[Size]
    prediction_basis: str = ""
    folder: Path | None = None
    png: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def mode(self) -> str:
        return "strong" if self.strong else "weak"

    def to_json(self) -> dict:
        return {"job": self.job_name, "profile": self.profile_name, "scaling": self.mode,
                "steps": self.steps, "warmup_steps": self.warmup,
                "target_efficiency": TARGET_EFFICIENCY, "prediction_basis": self.prediction_basis,
                "sizes": [s.to_json() for s in self.sizes], "notes": self.notes,
                "folder": None if self.folder is None else str(self.folder),
                "png": None if self.png is None else str(self.png)}


# ----------------------------------------------------------------------------- the sizes
def bench_job(job: JobConfig, *, steps: int, global_batch_size: int) -> JobConfig:
    """The job as a benchmark runs it: ``steps`` steps, one metrics record per step, no
    checkpoints (a save is not throughput, and a folder of its own per run)."""
    t = job.train
    train = dataclasses.replace(
        t, steps=steps, log_interval=1, warmup_steps=min(t.warmup_steps, steps),
        wsd_decay_steps=None if (t.wsd_decay_steps or 0) > steps else t.wsd_decay_steps)
    ckpt = dataclasses.replace(job.checkpoint, dir=None, interval_steps=0, interval_minutes=0.0,
                               save_at_end=False)
    par = dataclasses.replace(job.parallel, data_parallel_size=None)
    batch = dataclasses.replace(job.batch, global_batch_size=global_batch_size)
    return dataclasses.replace(job, train=train, checkpoint=ckpt, parallel=par, batch=batch)


def plan_sizes(job: JobConfig, profile: ClusterProfile, nodes: list[int], *, steps: int,
               strong: bool, source: str = "job") -> list[Size]:
    """Every size resolved (layout checked) before anything is submitted; all problems at once."""
    if not nodes:
        raise UsageError("--nodes: give at least one node count, e.g. 1,2,4")
    backend = backend_for(profile)
    if backend.max_nodes is not None and (len(nodes) > 1 or not 1 <= nodes[0] <= backend.max_nodes):
        most = "one node" if backend.max_nodes == 1 else f"at most {backend.max_nodes} nodes"
        raise UsageError(f"--nodes: profile {profile.name!r} runs {backend.where()} only ({most}); "
                         "use a Slurm profile to compare node counts")
    base = _resolve(job, profile, f"{source} on its profile's {profile.slurm.nodes} node(s)")
    per_rank = base.layout.micro_batch_size * base.layout.num_microbatches
    sizes, problems = [], []
    for n in nodes:
        there = profile.with_nodes(n)
        tp_pp = base.layout.tensor_model_parallel_size * base.layout.pipeline_model_parallel_size
        dp = there.world_size // tp_pp if there.world_size % tp_pp == 0 else 0
        gbs = job.batch.global_batch_size if strong else per_rank * max(dp, 1)
        try:
            sized = bench_job(job, steps=steps, global_batch_size=gbs)
            sizes.append(Size(n, _resolve(sized, there, f"{n} node(s)")))
        except HpcTrainError as e:
            problems.append(str(e))
    if problems:
        raise UsageError(f"{len(problems)} of {len(nodes)} sizes cannot run this job; nothing was "
                         "submitted: " + "; ".join(problems))
    return sizes


def _resolve(job: JobConfig, profile: ClusterProfile, where: str) -> Resolved:
    try:
        return resolve(job, profile, source=where)
    except ConfigError as e:
        raise UsageError(str(e)) from None


# ----------------------------------------------------------------------------- prediction
def predict(sizes: list[Size]) -> str:
    """Fill each size's planner step time; returns how the prediction was made."""
    from ..planner import Target, plan_layout
    from ..planner.timing import Hardware
    peak = sizes[0].resolved.profile.node.peak_tflops
    for s in sizes:
        r = s.resolved
        target = Target.from_profile(r.profile)
        if not peak:
            hw = target.hardware
            target = dataclasses.replace(target, hardware=Hardware(
                NOMINAL_PEAK_TFLOPS, hw.intra_node_busbw_gbs, hw.inter_node_busbw_gbs,
                hw.gpus_per_node))
        plan = plan_layout(r.job, r.layout, target,
                           sequence_parallel=r.job.parallel.sequence_parallel,
                           recompute=r.job.train.recompute_granularity)
        if plan.step is not None:
            s.plan_compute_s = plan.step.compute_s
            s.plan_comm_s = plan.step.total_s - plan.step.compute_s
            s.predicted_step_s = plan.step.total_s if peak else None
    if peak:
        return f"the planner's step time with the profile's {peak:g} TFLOP/s per GPU"
    return "no node.peak_tflops in the profile: the planner calibrated on the smallest measured size"


def calibrate(sizes: list[Size]) -> None:
    """No peak in the profile: scale the planner's compute so the smallest measured size's
    predicted step time equals its measured one."""
    ref = next((s for s in sizes if s.step_time_s and s.plan_compute_s), None)
    if ref is None or ref.step_time_s <= ref.plan_comm_s:
        return
    scale = (ref.step_time_s - ref.plan_comm_s) / ref.plan_compute_s
    for s in sizes:
        if s.plan_compute_s is not None:
            s.predicted_step_s = scale * s.plan_compute_s + s.plan_comm_s


def efficiencies(sizes: list[Size]) -> None:
    """Tokens/s per GPU against the smallest size that has a value (measured; predicted)."""
    def per_gpu(s: Size, tps: float | None) -> float | None:
        return tps / s.world_size if tps else None

    base = next((per_gpu(s, s.tokens_per_s) for s in sizes if s.tokens_per_s), None)
    pbase = next((per_gpu(s, s.predicted_tokens_per_s) for s in sizes
                  if s.predicted_tokens_per_s), None)
    for s in sizes:
        mine, pred = per_gpu(s, s.tokens_per_s), per_gpu(s, s.predicted_tokens_per_s)
        s.efficiency = mine / base if mine and base else None
        s.predicted_efficiency = pred / pbase if pred and pbase else None


# ----------------------------------------------------------------------------- measuring
def measured_throughput(metrics: list[dict], warmup: int) -> tuple[float | None, float | None, int]:
    """(tokens/s, seconds per step, steps counted) over the steps after ``warmup``: the last
    record of each step (a resumed attempt's replaces the lost one), skipped steps left out."""
    last: dict[int, dict] = {}
    for rec in metrics:
        if isinstance(rec.get("step"), int):
            last[rec["step"]] = rec
    tokens = seconds = 0.0
    counted = 0
    for step in sorted(last):
        rec = last[step]
        t, tps = rec.get("step_time_s"), rec.get("tokens_per_s")
        if step <= warmup or rec.get("skipped") or not t or not tps:
            continue
        tokens += tps * t
        seconds += t
        counted += 1
    if not counted:
        return None, None, 0
    return tokens / seconds, seconds / counted, counted


def _field(record, name: str):
    return record.get(name) if isinstance(record, dict) else getattr(record, name, None)


def wait_for(submitted, poll_s: float = 2.0) -> str:
    """Until the run's jobs have ended (requeues included); its last attempt's exit reason."""
    from ..view.follow import follow_run
    run = submitted.run
    follow_run(run, None, poll_s=poll_s)
    ledger = run.ledger()
    return str(_field(ledger[-1], "exit_reason") or "no record") if ledger else "no record"


def submit_size(size: Size, runs_root: Path, source: str):
    """One size through the library ``hpctrain submit`` uses: fit check, data, run folder, job.
    A job refused by sbatch, or because its checkpoint folder is another run's (claimed
    between the run folder's creation and its own claim), leaves no run folder behind, as
    with ``submit``."""
    from ..record.checkpoint_store import ForeignCheckpointsError
    from ..submission import (check_data, check_fits, prepare_run, refusal, remove_refused_run,
                              submit_training)
    r = size.resolved
    try:
        check_fits(r)
    except UsageError as e:
        raise UsageError(f"{size.nodes} node(s): {e}") from None
    check_data(r.job)
    run = prepare_run(r, runs_root, source=f"{source} [bench scaling, {size.nodes} node(s)]")
    try:
        return submit_training(r, run)
    except ForeignCheckpointsError:
        remove_refused_run(run)
        raise
    except SubmissionError as e:   # as submit says it: sbatch's words, then the folder's fate
        raise refusal(e, remove_refused_run(run), "the run folder prepared for it") from None


def run_scaling(job: JobConfig, profile: ClusterProfile, nodes: list[int], *, runs_root: Path,
                steps: int = DEFAULT_STEPS, warmup: int = DEFAULT_WARMUP, strong: bool = False,
                source: str = "job", on_event: Callable[[str], None] = lambda text: None,
                poll_s: float = 2.0) -> ScalingResult:
    """Submit ``job`` at every size in ``nodes``, one after the other, wait for each, measure."""
    if warmup >= steps:
        raise UsageError(f"--warmup: {warmup} warm-up steps leave nothing to measure in "
                         f"--steps {steps}; use fewer warm-up steps or more steps")
    sizes = plan_sizes(job, profile, nodes, steps=steps, strong=strong, source=source)
    result = ScalingResult(job.name, profile.name, strong, steps, warmup, sizes,
                           prediction_basis=predict(sizes))
    for i, s in enumerate(sizes, 1):
        lay = s.resolved.layout
        sub = submit_size(s, runs_root, source)
        s.run_id, s.job_id = sub.run.id, sub.job_id
        on_event(f"[{i}/{len(sizes)}] {s.nodes} node(s), {s.world_size} ranks "
                 f"({lay.describe()}, global batch {s.global_batch_size}): run {sub.run.id}, "
                 f"job {sub.job_id}")
        s.outcome = wait_for(sub, poll_s)
        s.tokens_per_s, s.step_time_s, s.steps_measured = measured_throughput(
            sub.run.metrics(), warmup)
        got = (f"{s.tokens_per_s:,.0f} tokens/s over {s.steps_measured} steps"
               if s.tokens_per_s else "no steps measured")
        on_event(f"[{i}/{len(sizes)}] {s.outcome}: {got}")
        if s.outcome != "finished":
            result.notes.append(f"{s.nodes} node(s): run {s.run_id} ended {s.outcome} "
                                f"(`hpctrain status {s.run_id}`)")
    if not sizes[0].resolved.profile.node.peak_tflops:
        calibrate(sizes)
    efficiencies(sizes)
    return result


def _r(x: float | None, digits: int = 1):
    return None if x is None else round(x, digits)
