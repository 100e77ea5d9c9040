"""Does the job's own layout fit the profile's GPUs? The question ``hpctrain submit`` asks.

``check_fits`` prices the job's layout; when it does not fit it also finds the fastest layout
that does, so the refusal can say what to change. The message is ready to print.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.job import JobConfig
from ..config.loader import resolve
from ..config.profile import ClusterProfile
from .layouts import GiB, LayoutPlan, Target, plan_layout, plan_layouts
from .render import save_fix
from .save_memory import HOST_SAVE_FRACTION


@dataclass(frozen=True)
class FitCheck:
    fits: bool | None          # None: the profile does not say how much memory a GPU has
    message: str
    plan: LayoutPlan           # the job's own layout
    best: LayoutPlan | None    # the fastest layout that fits, when the job's does not


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def breakdown_line(plan: LayoutPlan) -> str:
    m = plan.memory
    stage = (f" on pipeline stage {m.pipeline_rank}"
             if plan.layout.pipeline_model_parallel_size > 1 else "")
    transient = (f"activations {_gib(m.activations)}" if m.activations >= m.optimizer_step else
                 f"optimizer step {_gib(m.optimizer_step)} (more than the activations)")
    line = (f"{_gib(m.total)} per GPU{stage} = weights {_gib(m.weights)} + gradients "
            f"{_gib(m.gradients)} + optimizer {_gib(m.optimizer)} + {transient} + buffers "
            f"{_gib(m.buffers)} + allowance {_gib(m.allowance)}")
    return line + "; " + save_line(plan) if plan.save else line


def save_line(plan: LayoutPlan) -> str:
    """The checkpoint save in one clause: the GPU at save, and host memory per node."""
    sv = plan.save
    host = f"{_gib(sv.host_per_node)} of host memory per node"
    if sv.host_limit:
        host += f" (a save may use {HOST_SAVE_FRACTION:.0%} of {sv.host_limit / GiB:g} GiB)"
    gpu = f"{_gib(sv.gpu_at_save)} per GPU at save" + (
        f" ({_gib(sv.gpu_transient)} of it gathered)" if sv.gpu_transient else "")
    return f"a checkpoint save ({sv.optimizer_format}) needs {gpu} and {host}"


def layout_settings(plan: LayoutPlan) -> str:
    """The job-file settings that select ``plan``'s layout."""
    lay = plan.layout
    parts = [f"parallel.tensor_model_parallel_size: {lay.tensor_model_parallel_size}",
             f"parallel.pipeline_model_parallel_size: {lay.pipeline_model_parallel_size}"]
    if lay.virtual_pipeline_model_parallel_size:
        parts.append("parallel.virtual_pipeline_model_parallel_size: "
                     f"{lay.virtual_pipeline_model_parallel_size}")
    parts += [f"parallel.sequence_parallel: {str(plan.sequence_parallel).lower()}",
              f"batch.micro_batch_size: {lay.micro_batch_size}",
              f"train.recompute_granularity: {plan.recompute or 'null'}"]
    return ", ".join(parts)


def check_fits(job: JobConfig, profile: ClusterProfile) -> FitCheck:
    """Price the job's layout on ``profile`` (with its node count) against the GPU memory.

    Raises ``ConfigError`` when the layout itself is invalid on this profile.
    """
    resolved = resolve(job, profile)
    target = Target.from_profile(profile)
    plan = plan_layout(job, resolved.layout, target,
                       sequence_parallel=job.parallel.sequence_parallel,
                       recompute=job.train.recompute_granularity)
    head = f"{plan.describe()}: {breakdown_line(plan)}"
    if plan.training_fits is None and plan.save is not None and plan.save.fits is False:
        # no GPU memory to check the step against (the CPU rehearsal), but the save's host
        # memory is known not to fit
        return FitCheck(False, f"{head}; the checkpoint save does NOT fit: {save_fix(plan)}",
                        plan, None)
    if plan.fits is None:
        return FitCheck(None, f"{head}; the profile {profile.name!r} does not set "
                              "node.gpu_memory_gb, so whether it fits is unknown", plan, None)
    limit = f"{target.gpu_memory_bytes / GiB:g} GiB"
    if plan.fits:
        return FitCheck(True, f"{head}; fits in {limit}", plan, None)
    if plan.training_fits:
        return FitCheck(False, f"{head}; the training step fits in {limit} per GPU but the "
                               f"checkpoint save does NOT fit: {save_fix(plan)} "
                               "(`hpctrain plan` shows the save's memory)", plan, None)
    result = plan_layouts(job, target)
    best = result.best
    if best is None:
        advice = (f"no layout of this job fits {target.world_size} GPUs of {limit}; use more "
                  "nodes, a shorter seq_length or a smaller model")
    else:
        speed = f", about {best.step_time_s:.2f} s/step" if best.step_time_s else ""
        advice = (f"the fastest layout that fits is {best.describe()} ({_gib(best.memory.total)}"
                  f"{speed}): set {layout_settings(best)}")
    return FitCheck(False, f"{head}; does NOT fit in {limit} per GPU. {advice} "
                           "(`hpctrain plan` lists every option)",
                    plan, best)
