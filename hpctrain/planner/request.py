"""What a person asks ``hpctrain plan`` (and ``hpctrain.plan()``): a job on a target — a
profile, maybe resized with ``nodes``, or a bare GPU count — either ranked over every layout or
with part of the layout pinned. The answers are the planner's objects; ``plan_data`` is the
JSON form ``hpctrain plan --json`` prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import DEFAULT_PROFILE, ClusterProfile, JobConfig, load_job, load_profile
from ..config.profile import MAX_WORLD_SIZE
from ..errors import UsageError
from .layouts import LayoutPlan, PlanResult, Rejected, Target, explain_layout, plan_layouts


def plan_target(profile: str | Path | ClusterProfile | None, nodes: int | None = None,
                gpus: int | None = None) -> tuple[Target, str]:
    """The target to plan for and a line describing it. ``gpus`` without a profile plans for a
    bare GPU count (memory unknown); otherwise the profile (default: the local one), resized
    to ``nodes`` or cut to ``gpus``."""
    if nodes is not None and gpus is not None:
        raise UsageError("--nodes and --gpus both given; use one (--gpus N counts GPUs, "
                         "--nodes N counts nodes of the profile)")
    if gpus is not None and profile is None:
        return Target.from_profile(None, gpus), f"{gpus} GPUs (no profile: GPU memory unknown)"
    if not isinstance(profile, ClusterProfile):
        profile = load_profile(str(profile) if profile is not None else DEFAULT_PROFILE)
    profile = profile.with_nodes(nodes)
    gpn = profile.slurm.gpus_per_node
    if gpus is None and profile.world_size > MAX_WORLD_SIZE:
        raise UsageError(f"--nodes: {profile.slurm.nodes} nodes × {gpn} GPUs = "
                         f"{profile.world_size:,}; hpctrain plans at most {MAX_WORLD_SIZE:,} GPUs")
    if gpus is not None and gpus > gpn and gpus % gpn:
        raise UsageError(f"--gpus: {gpus} is not a whole number of nodes of {gpn} GPUs "
                         f"(profile {profile.name!r}, slurm.gpus_per_node); use a multiple of {gpn}")
    target = Target.from_profile(profile, gpus)
    nodes_used = max(1, target.world_size // gpn)
    mem = f"{profile.node.gpu_memory_gb:g} GiB" if profile.node.gpu_memory_gb else "memory unknown"
    peak = f", {profile.node.peak_tflops:g} TFLOP/s" if profile.node.peak_tflops else ""
    what = "CPU ranks" if target.device == "cpu" else "GPUs"
    return target, (f"{target.world_size} {what} ({nodes_used} node(s) × {target.gpus_per_node}) "
                    f"of profile {profile.name!r}: {mem}{peak} per GPU")


@dataclass
class Pinned:
    """The job's layout with part of it pinned: its plan, or why it is not a valid layout."""

    name: str                         # e.g. TP2×PP2×VPP2
    plan: LayoutPlan | None
    reasons: list[str]                # "field: why", when plan is None


def plan_pinned(job: JobConfig, target: Target, *, tp: int | None = None, pp: int | None = None,
                vpp: int | None = None, mbs: int | None = None, sp: bool | None = None,
                recompute: str | None = None) -> Pinned:
    """Explain one layout: ``None`` keeps the job's value; ``vpp`` 0 is no interleaving,
    ``recompute`` "none" no recomputation."""
    vpp_arg = "job" if vpp is None else (vpp or None)
    rec_arg = "job" if recompute is None else (None if recompute == "none" else recompute)
    plan, problems = explain_layout(job, target, tp=tp, pp=pp, vpp=vpp_arg, mbs=mbs,
                                    sequence_parallel=sp, recompute=rec_arg)
    par = job.parallel
    vpp_used = vpp_arg if vpp_arg != "job" else par.virtual_pipeline_model_parallel_size
    name = (f"TP{tp or par.tensor_model_parallel_size}×PP{pp or par.pipeline_model_parallel_size}"
            + (f"×VPP{vpp_used}" if vpp_used else ""))
    return Pinned(name, plan, [f"{path}: {msg}" for path, msg in problems])


def plan_data(job: str | Path | JobConfig, profile: str | Path | ClusterProfile | None = None, *,
              nodes: int | None = None, gpus: int | None = None, tp: int | None = None,
              pp: int | None = None, vpp: int | None = None, mbs: int | None = None,
              sp: bool | None = None, recompute: str | None = None) -> dict:
    """What ``hpctrain plan --json`` prints: every valid layout ranked (with why each candidate
    was rejected), or, with any of ``tp``..``recompute`` pinned, that one layout."""
    from .render import plan_json
    job = job if isinstance(job, JobConfig) else load_job(str(job))
    target, _ = plan_target(profile, nodes, gpus)
    if any(x is not None for x in (tp, pp, vpp, mbs, sp, recompute)):
        pinned = plan_pinned(job, target, tp=tp, pp=pp, vpp=vpp, mbs=mbs, sp=sp,
                             recompute=recompute)
        if pinned.plan is None:
            return plan_json(job, PlanResult(target, (), ()), [],
                             [Rejected(pinned.name, tuple(pinned.reasons))])
        return with_cost(plan_json(job, PlanResult(target, (pinned.plan,), ()), [pinned.plan], []),
                         job)
    return with_cost(plan_json(job, plan_layouts(job, target)), job)


def with_cost(data: dict, job: JobConfig) -> dict:
    """Each layout of ``plan --json`` with what training the job's ``train.steps`` costs on
    it: ``cost.time_to_train_s`` and ``cost.gpu_hours`` (``hpctrain.planner.cost``)."""
    from .cost import training_cost
    for layout in data["layouts"]:
        layout["cost"] = training_cost(layout.get("step_time_s"), job.train.steps,
                                       data["world_size"]).to_json()
    return data
