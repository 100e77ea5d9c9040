"""Plan one layout, or every valid layout of a job on a number of GPUs, ranked.

A layout here is TP × PP (× VPP) × DP plus the knobs that trade memory for time: micro batch
size, sequence parallelism and activation recomputation. ``config.layout.layout_problems``
decides validity (the same check the runtime makes); this module prices each valid layout
(memory per GPU on its most loaded rank, bubble, FLOPs, step time) and ranks them: layouts
that fit first, fastest first.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..checkpoint_interval import DEFAULT_NODE_MTBF_HOURS
from ..config.job import JobConfig
from ..config.layout import Layout, layout_problems
from ..config.problems import Problems
from ..config.profile import ClusterProfile, host_memory_bytes
from ..flops import mfu, model_flops_per_step
from ..model_shape import PRECISION_BYTES, ModelShape, ParameterCount, count_parameters
from .activations import (CPU_KERNELS, GPU_KERNELS, GPU_LOCAL_SPEC_KERNELS, Kernels,
                          StageActivations, stage_activations)
from .grad_buffer import DEFAULT_BUCKET_ELEMENTS
from .memory import (ASSUMED_GPU_ALLOWANCE, CPU_ALLOWANCE, RUNTIME_BUFFER_BYTES, Allowance,
                     grad_bytes, optimizer_step_bytes, state_bytes_per_pipeline_rank)
from .save_memory import SaveMemory, choose_format, save_memory
from .save_time import Checkpointing, checkpointing
from .timing import Hardware, StepTime, estimate_step_time
from ..config.kernel_table import load_table

GiB = 2**30
RECOMPUTE_CHOICES = (None, "selective", "full")
MICRO_BATCH_CHOICES = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class MemoryBreakdown:
    pipeline_rank: int
    weights: int
    gradients: int
    optimizer: int
    activations: int
    allowance: int
    optimizer_step: int = 0   # only in the optimizer step; activations are freed by then
    buffers: int = 0          # the runtime's own allocations (measured: RUNTIME_BUFFER_BYTES)
    main_grads: int = 0       # fp32 main gradients (part of optimizer_step; alive at a save)

    @property
    def itemized(self) -> int:
        """The predicted peak of ``torch.cuda.max_memory_allocated``: every term has a reason
        (docs/planner.md); the allowance is not in it."""
        return (self.weights + self.gradients + self.optimizer
                + max(self.activations, self.optimizer_step) + self.buffers)

    @property
    def total(self) -> int:
        return self.itemized + self.allowance

    def to_json(self) -> dict:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "optimizer_step": self.optimizer_step,
                "buffers": self.buffers, "main_grads": self.main_grads,
                "itemized": self.itemized,
                "allowance": self.allowance, "total": self.total}


@dataclass(frozen=True)
class LayoutPlan:
    layout: Layout
    sequence_parallel: bool
    recompute: str | None
    parameters: ParameterCount
    memory: MemoryBreakdown                 # the most loaded pipeline rank
    per_stage: tuple[MemoryBreakdown, ...]
    activations: StageActivations           # of the most loaded pipeline rank
    pipeline_bubble_fraction: float
    model_flops_per_step: float
    step: StepTime | None
    mfu: float | None
    fits: bool | None                       # training AND the checkpoint save fit
    is_job_layout: bool = False
    save: SaveMemory | None = None          # a checkpoint save in the job's optimizer format
    format_reason: str = ""                 # why checkpoint.optimizer_format: auto chose it
    training_fits: bool | None = None       # the training step alone
    checkpointing: Checkpointing | None = None  # save time and checkpoint interval

    def describe(self) -> str:
        rec = self.recompute or "no"
        return (f"{self.layout.describe()} mbs {self.layout.micro_batch_size}"
                f"{' SP' if self.sequence_parallel else ''} {rec} recompute")

    @property
    def step_time_s(self) -> float | None:
        return self.step.total_s if self.step else None

    def to_json(self) -> dict:
        lay = self.layout
        step = self.step
        return {
            "tensor_model_parallel_size": lay.tensor_model_parallel_size,
            "pipeline_model_parallel_size": lay.pipeline_model_parallel_size,
            "virtual_pipeline_model_parallel_size": lay.virtual_pipeline_model_parallel_size,
            "data_parallel_size": lay.data_parallel_size,
            "micro_batch_size": lay.micro_batch_size,
            "num_microbatches": lay.num_microbatches,
            "sequence_parallel": self.sequence_parallel,
            "recompute": self.recompute,
            "memory_bytes_per_gpu": self.memory.to_json(),
            "activation_bytes": self.activations.to_json(),
            "checkpoint_save": None if self.save is None else {
                **self.save.to_json(), "format_reason": self.format_reason},
            "training_fits": self.training_fits,
            "pipeline_bubble_fraction": self.pipeline_bubble_fraction,
            "model_flops_per_step": self.model_flops_per_step,
            "step_time_s": self.step_time_s,
            "mfu": self.mfu,
            "fits": self.fits,
            "job_layout": self.is_job_layout,
            "most_loaded_pipeline_rank": self.memory.pipeline_rank,
            "parameters_on_most_loaded_rank": self.parameters.most_loaded_rank,
            "memory_bytes_per_pipeline_rank": [m.to_json() for m in self.per_stage],
            "step_time_breakdown_s": None if step is None else {
                "compute_with_bubble": step.compute_s, "tensor_parallel_comm": step.tp_comm_s,
                "pipeline_parallel_comm": step.pp_comm_s, "data_parallel_comm": step.dp_comm_s,
                "optimizer_step": step.optimizer_s, "microbatch_slots": step.slots,
                "host_issue_exposed": step.host_s,
                "one_microbatch": None if step.microbatch is None else {
                    **step.microbatch.to_json(), "host_issue": step.host_microbatch_s},
                "source": step.source, "notes": list(step.notes)},
            "checkpoint_interval": None if self.checkpointing is None else
            self.checkpointing.to_json(),
        }


@dataclass(frozen=True)
class Target:
    """Where the job would run: GPUs, node size, and what each GPU offers (None: unknown)."""

    world_size: int
    gpus_per_node: int | None
    gpu_memory_bytes: int | None
    hardware: Hardware
    device: str = "cuda"   # cpu: the rehearsal runs fp32, torch kernels, local attention, no SP
    host_memory_bytes: int | None = None   # per node (checkpoint saves' host copies)
    node_mtbf_hours: float = DEFAULT_NODE_MTBF_HOURS   # reliability.node_mtbf_hours
    storage_write_gbs: float | None = None             # storage.write_bandwidth_gbs

    @property
    def allowance(self) -> Allowance:
        """What a fit adds to the itemized memory: measured for this GPU kind (its kernel
        table's memory overheads) or the stated assumption."""
        if self.device != "cuda":
            return CPU_ALLOWANCE
        table = self.hardware.table
        if table is not None and table.memory is not None:
            return Allowance(table.memory.outside_allocator_bytes,
                             table.memory.allocator_slack_fraction, table.describe())
        return ASSUMED_GPU_ALLOWANCE

    @property
    def buffers(self) -> int:
        return RUNTIME_BUFFER_BYTES if self.device == "cuda" else 0

    @classmethod
    def from_profile(cls, profile: ClusterProfile | None, gpus: int | None = None) -> "Target":
        if profile is None:
            if not gpus:
                raise ValueError("a target needs a profile or a GPU count")
            return cls(gpus, None, None, Hardware(None, None, None, None))
        gpn = profile.slurm.gpus_per_node
        world = gpus if gpus else profile.world_size
        if gpus and gpus < gpn:
            gpn = gpus
        mem = profile.node.gpu_memory_gb
        ic = profile.interconnect
        host = host_memory_bytes(profile)
        from ..scheduler.choose import backend_for
        if host is None and backend_for(profile).on_this_machine:   # this machine: ask it
            import psutil
            host = psutil.virtual_memory().total
        table = load_table(profile.node.kernel_table) if profile.node.kernel_table else None
        return cls(world, gpn, int(mem * GiB) if mem else None,
                   Hardware(profile.node.peak_tflops, ic.intra_node_busbw_gbs,
                            ic.inter_node_busbw_gbs, gpn, table), profile.node.device, host,
                   profile.reliability.node_mtbf_hours, profile.storage.write_bandwidth_gbs)


@dataclass(frozen=True)
class Execution:
    """How the runtime will run the job on the target's device (hpctrain.runtime.model)."""

    shape: ModelShape
    precision: str
    grad_reduce_in_fp32: bool
    kernels: Kernels
    sequence_parallel_possible: bool
    attention_backend: str = "local"   # the attention kernel that runs (the step-time model)

    @classmethod
    def of(cls, job: JobConfig, target: Target) -> "Execution":
        shape = ModelShape.from_job(job)
        if target.device == "cpu":
            # torch's CPU flash kernel has no dropout: with attention dropout the math kernel
            # runs, which keeps scores as the unfused attention does
            scores = shape.attention_stores_scores or shape.attention_dropout > 0
            return cls(dataclasses.replace(shape, attention_stores_scores=scores), "fp32", True,
                       CPU_KERNELS, False, "local" if scores else "torch-flash")
        # the local spec's softmax is megatron's torch fallback unless apex is there: assume not
        local = job.model.transformer_impl == "local"
        kernels = GPU_LOCAL_SPEC_KERNELS if local else GPU_KERNELS
        if kernels.foreach_adam and getattr(job.train, "fused_adam", False):
            # torch's fused AdamW (the runtime's default without TE) updates in place
            kernels = dataclasses.replace(kernels, foreach_adam=False)
        if local and getattr(job.model, "apply_rope_fusion", True):
            # the local spec's RoPE in one compiled kernel (runtime/rope.py, on CUDA)
            kernels = dataclasses.replace(kernels, compiled_rope=True)
        # the local spec runs torch's fused attention unless the job keeps megatron's own: the
        # kernel table's torch-* rows (TE's own kernels are its flash/fused/unfused rows)
        backend = job.model.attention_backend
        if (local and shape.attention_stores_scores) or backend == "local":
            backend = "local"
        elif local:
            backend = "torch-" + backend
        return cls(shape, job.train.precision, job.train.grad_reduce_in_fp32, kernels, True,
                   backend)


def _recompute_knobs(job: JobConfig, recompute: str | None) -> tuple[str, int]:
    t = job.train
    if recompute == "full" and t.recompute_granularity == "full":
        return t.recompute_method, t.recompute_num_layers
    return "uniform", 1


def plan_layout(job: JobConfig, layout: Layout, target: Target, *, sequence_parallel: bool,
                recompute: str | None) -> LayoutPlan:
    """Price one valid layout: memory on every pipeline rank, bubble, FLOPs, step time."""
    run = Execution.of(job, target)
    shape = run.shape
    sequence_parallel = sequence_parallel and run.sequence_parallel_possible
    tp, pp = layout.tensor_model_parallel_size, layout.pipeline_model_parallel_size
    vpp, dp = layout.virtual_pipeline_model_parallel_size, layout.data_parallel_size
    act_bytes = PRECISION_BYTES[run.precision]
    dist_opt = job.parallel.use_distributed_optimizer
    buckets = _buckets(job)
    states = state_bytes_per_pipeline_rank(
        shape, tp=tp, pp=pp, vpp=vpp, dp=dp, precision=run.precision,
        grad_reduce_in_fp32=run.grad_reduce_in_fp32, distributed_optimizer=dist_opt, **buckets)
    method, num_layers = _recompute_knobs(job, recompute)
    stages, acts = [], []
    for rank, st in enumerate(states):
        act = stage_activations(shape, tp=tp, pp=pp, vpp=vpp, pp_rank=rank,
                                micro_batch_size=layout.micro_batch_size,
                                num_microbatches=layout.num_microbatches,
                                sequence_parallel=sequence_parallel, recompute=recompute,
                                recompute_method=method, recompute_num_layers=num_layers,
                                act_bytes=act_bytes, kernels=run.kernels)
        step_bytes = optimizer_step_bytes(st, run.kernels)
        itemized = st.total + max(act.total, step_bytes) + target.buffers
        stages.append(MemoryBreakdown(rank, st.weights, st.gradients, st.optimizer, act.total,
                                      target.allowance.bytes(itemized), step_bytes,
                                      target.buffers, st.main_grads))
        acts.append(act)
    worst = max(range(pp), key=lambda r: stages[r].total)
    flops = model_flops_per_step(shape, layout.global_batch_size, tp)
    bubble = (pp - 1) / ((vpp or 1) * layout.num_microbatches)
    g_bytes = grad_bytes(run.precision, run.grad_reduce_in_fp32)
    bucket = buckets["bucket_size"] or max(DEFAULT_BUCKET_ELEMENTS, 1_000_000 * dp)
    step = estimate_step_time(
        shape, target.hardware, tp=tp, pp=pp, vpp=vpp, dp=dp,
        micro_batch_size=layout.micro_batch_size, num_microbatches=layout.num_microbatches,
        sequence_parallel=sequence_parallel, recompute=recompute, act_bytes=act_bytes,
        grad_buffer_bytes=max(s.gradients for s in states),
        weight_bytes=max(s.weights for s in states), distributed_optimizer=dist_opt,
        overlap_grad_reduce=job.parallel.overlap_grad_reduce,
        # the runtime's rules (runtime/comm_overlap.py): the gather overlaps only beside the
        # overlapped reduction, p2p only in the interleaved schedule
        overlap_param_gather=job.parallel.overlap_param_gather and job.parallel.overlap_grad_reduce,
        overlap_p2p=bool(job.parallel.overlap_p2p_comm and vpp),
        attention_backend=run.attention_backend,
        optimizer_elements=max(s.optimizer_elements for s in states),
        bucket_bytes=bucket * g_bytes if buckets["overlap_grad_reduce"] else None,
        grad_bytes_per_element=g_bytes,
        fused_wgrad_accumulation=run.kernels.fused_wgrad_accumulation)
    training_fits = None if target.gpu_memory_bytes is None else \
        stages[worst].total <= target.gpu_memory_bytes
    save, reason = plan_save(job, layout, target, states, run.precision, buckets)
    fits = False if False in (training_fits, save.fits) else training_fits
    interval = _checkpointing(job, layout, target, save, step)
    return LayoutPlan(
        layout=layout, sequence_parallel=sequence_parallel, recompute=recompute,
        parameters=count_parameters(shape, tp, pp, vpp), memory=stages[worst],
        per_stage=tuple(stages), activations=acts[worst], pipeline_bubble_fraction=bubble,
        model_flops_per_step=flops, step=step,
        mfu=mfu(flops, step.total_s, layout.world_size, target.hardware.peak_tflops) if step else None,
        fits=fits, is_job_layout=_is_job_layout(job, layout, sequence_parallel, recompute),
        save=save, format_reason=reason, training_fits=training_fits, checkpointing=interval)


# Without a profile the node size is unknown: the checkpoint interval assumes nodes of 8 GPUs.
ASSUMED_GPUS_PER_NODE = 8


def nodes_of(layout: Layout, target: Target) -> int:
    return -(-layout.world_size // (target.gpus_per_node or ASSUMED_GPUS_PER_NODE))


def _checkpointing(job: JobConfig, layout: Layout, target: Target, save: SaveMemory,
                   step: StepTime | None) -> Checkpointing:
    """The layout's save time and checkpoint interval (``plan.save_time``)."""
    tp, dp = layout.tensor_model_parallel_size, layout.data_parallel_size
    hw, gpn = target.hardware, target.gpus_per_node
    link = hw.intra_node_busbw_gbs if gpn is not None and tp * dp <= gpn else \
        hw.inter_node_busbw_gbs
    ck = job.checkpoint
    return checkpointing(save, dp=dp, dp_link_gbs=link, write_gbs=target.storage_write_gbs,
                         background=ck.async_save, node_mtbf_hours=target.node_mtbf_hours,
                         nodes=nodes_of(layout, target), interval_minutes=ck.interval_minutes,
                         interval_steps=ck.interval_steps, step_s=step.total_s if step else None,
                         ranks_per_node=gpn or ASSUMED_GPUS_PER_NODE)


def _buckets(job: JobConfig) -> dict:
    """The gradient buckets the runtime builds (``parallel.overlap_grad_reduce``,
    ``parallel.ddp_bucket_size``; absent from older job schemas: one bucket per chunk)."""
    par = job.parallel
    return {"overlap_grad_reduce": bool(getattr(par, "overlap_grad_reduce", False)),
            "bucket_size": getattr(par, "ddp_bucket_size", None)}


def plan_save(job: JobConfig, layout: Layout, target: Target, states, precision: str,
              buckets: dict | None = None) -> tuple[SaveMemory, str]:
    """A checkpoint save of ``layout`` in the job's ``checkpoint.optimizer_format`` (``auto``
    resolved for this layout, with the reason), on its most loaded ranks."""
    buckets = _buckets(job) if buckets is None else buckets
    dist_opt = bool(job.parallel.use_distributed_optimizer)
    shape = Execution.of(job, target).shape

    def price(fmt: str) -> SaveMemory:
        return save_memory(
            shape, fmt, tp=layout.tensor_model_parallel_size,
            pp=layout.pipeline_model_parallel_size, vpp=layout.virtual_pipeline_model_parallel_size,
            dp=layout.data_parallel_size, precision=precision, states=states,
            allowance=target.allowance.bytes, device=target.device,
            runtime_buffers=target.buffers,
            ranks_per_node=target.gpus_per_node or 1, gpu_limit=target.gpu_memory_bytes,
            host_limit=target.host_memory_bytes,
            owned_per_stage=tuple(st.optimizer_elements for st in states),
            distributed_optimizer=dist_opt, **buckets)

    fmt = job.checkpoint.optimizer_format
    if fmt == "auto":
        fully = price("fully_reshardable")
        fmt, reason = choose_format(fully, dist_opt, target.device)
        return (fully if fmt == "fully_reshardable" else price(fmt)), reason
    return price(fmt), ""


def with_optimizer_format(job: JobConfig, profile: ClusterProfile, layout: Layout) -> JobConfig:
    """``checkpoint.optimizer_format: auto`` replaced by what it resolves to on this layout (a
    copy; the job as given when it names a format), so a run's job.yaml records the format."""
    if job.checkpoint.optimizer_format != "auto":
        return job
    fmt, _ = resolve_optimizer_format(job, profile, layout)
    return dataclasses.replace(job, checkpoint=dataclasses.replace(job.checkpoint,
                                                                   optimizer_format=fmt))


def resolve_optimizer_format(job: JobConfig, profile: ClusterProfile, layout: Layout) -> tuple[str, str]:
    """``checkpoint.optimizer_format`` of ``job`` on ``profile``'s ``layout``: the job's own
    value, or what ``auto`` resolves to there, with the reason."""
    if job.checkpoint.optimizer_format != "auto":
        return job.checkpoint.optimizer_format, ""
    target = Target.from_profile(profile)
    run = Execution.of(job, target)
    states = state_bytes_per_pipeline_rank(
        run.shape, tp=layout.tensor_model_parallel_size, pp=layout.pipeline_model_parallel_size,
        vpp=layout.virtual_pipeline_model_parallel_size, dp=layout.data_parallel_size,
        precision=run.precision, grad_reduce_in_fp32=run.grad_reduce_in_fp32,
        distributed_optimizer=job.parallel.use_distributed_optimizer, **_buckets(job))
    save, reason = plan_save(job, layout, target, states, run.precision)
    return save.optimizer_format, reason


def _is_job_layout(job: JobConfig, layout: Layout, sp: bool, recompute: str | None) -> bool:
    par = job.parallel
    return (layout.tensor_model_parallel_size == par.tensor_model_parallel_size
            and layout.pipeline_model_parallel_size == par.pipeline_model_parallel_size
            and layout.virtual_pipeline_model_parallel_size == par.virtual_pipeline_model_parallel_size
            and layout.micro_batch_size == job.batch.micro_batch_size
            and sp == par.sequence_parallel and recompute == job.train.recompute_granularity)


@dataclass(frozen=True)
class Rejected:
    layout: str
    reasons: tuple[str, ...]

    def to_json(self) -> dict:
        return {"layout": self.layout, "reasons": list(self.reasons)}


@dataclass(frozen=True)
class PlanResult:
    target: Target
    layouts: tuple[LayoutPlan, ...]       # ranked: fitting first, fastest first
    rejected: tuple[Rejected, ...]

    @property
    def best(self) -> LayoutPlan | None:
        return self.layouts[0] if self.layouts and self.layouts[0].fits is not False else None

    @property
    def job_layout(self) -> LayoutPlan | None:
        return next((p for p in self.layouts if p.is_job_layout), None)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _describe(tp: int, pp: int, vpp: int | None, mbs: int, sp: bool) -> str:
    return (f"TP{tp}×PP{pp}" + (f"×VPP{vpp}" if vpp else "")
            + f" mbs {mbs}" + (" SP" if sp else ""))


def _rank_key(plan: LayoutPlan):
    fit_order = {True: 0, None: 1, False: 2}[plan.fits]
    if plan.fits is False or plan.step is None:
        return (fit_order, plan.memory.total, 0.0)
    return (fit_order, plan.step.total_s, plan.memory.total)


def plan_layouts(job: JobConfig, target: Target, *, tp: int | None = None, pp: int | None = None,
                 vpp: int | None | str = "any") -> PlanResult:
    """Every layout of ``job`` on ``target`` (or only those with the pinned TP/PP/VPP).

    The job's own ``parallel.data_parallel_size`` (if set) is not a constraint here: DP follows
    from the world size and the layout being considered."""
    job = dataclasses.replace(job, parallel=dataclasses.replace(job.parallel,
                                                                data_parallel_size=None))
    world, gpn = target.world_size, target.gpus_per_node
    tp_max = gpn or min(world, 8)
    tps = [tp] if tp else [d for d in _divisors(tp_max) if world % d == 0]
    layouts: list[LayoutPlan] = []
    rejected: list[Rejected] = []
    mbs_choices = sorted(set(MICRO_BATCH_CHOICES) | {job.batch.micro_batch_size})
    for t in tps:
        pps = [pp] if pp else [d for d in _divisors(world // t)] if world % t == 0 else [1]
        for p in pps:
            if vpp != "any":
                vpps = [vpp]
            elif p > 1:
                per_stage = job.model.num_layers // p if job.model.num_layers % p == 0 else 0
                vpps = [None] + [v for v in _divisors(per_stage) if v > 1]
            else:
                vpps = [None]
            for v in vpps:
                for mbs in mbs_choices:
                    for sp in ([False, True] if t > 1 and target.device != "cpu" else [False]):
                        problems = Problems()
                        lay = layout_problems(job, world, gpn, problems, tp=t, pp=p, vpp=v,
                                              mbs=mbs, sequence_parallel=sp)
                        if lay is None:
                            rejected.append(Rejected(_describe(t, p, v, mbs, sp), tuple(
                                f"{path}: {msg}" for path, msg in problems.items)))
                            continue
                        for rec in RECOMPUTE_CHOICES:
                            layouts.append(plan_layout(job, lay, target, sequence_parallel=sp,
                                                       recompute=rec))
    layouts.sort(key=_rank_key)
    return PlanResult(target, tuple(layouts), tuple(rejected))


def explain_layout(job: JobConfig, target: Target, *, tp: int | None = None,
                   pp: int | None = None, vpp: int | None | str = "job",
                   mbs: int | None = None, sequence_parallel: bool | None = None,
                   recompute: str | None = "job") -> tuple[LayoutPlan | None, list[tuple[str, str]]]:
    """The job's layout with some of it pinned: its plan, or every reason it is invalid."""
    problems = Problems()
    sp = job.parallel.sequence_parallel if sequence_parallel is None else sequence_parallel
    lay = layout_problems(job, target.world_size, target.gpus_per_node, problems, tp=tp, pp=pp,
                          vpp=vpp, mbs=mbs, sequence_parallel=sp)
    if lay is None:
        return None, problems.items
    rec = job.train.recompute_granularity if recompute == "job" else recompute
    return plan_layout(job, lay, target, sequence_parallel=sp, recompute=rec), []
