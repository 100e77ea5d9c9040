"""What ``hpctrain plan`` prints: a ranked table, one layout explained, and the JSON contract."""

from __future__ import annotations

from ..config.job import JobConfig
from .activations import ACTIVATION_NOTE
from .layouts import Execution, GiB, LayoutPlan, PlanResult, Rejected, Target
from .memory import RUNTIME_BUFFER_BYTES, grad_bytes, optimizer_bytes_per_element
from .save_memory import HOST_SAVE_FRACTION, UNKNOWN_HOST_BYTES
from ..model_shape import PRECISION_BYTES, ModelShape, ParameterCount, count_parameters
from .save_time import DEFAULT_WRITE_GBS, HOST_COPY_GBS, SAVE_OVERHEAD_S
from .timing import MATMUL_EFFICIENCY
from ..checkpoint_interval import minutes, percent


def _dp_overlap(job: JobConfig) -> str:
    p = job.parallel
    hidden = [what for what, on in (("gradient reduction behind the last microbatch's backward",
                                     p.overlap_grad_reduce),
                                    ("parameter gather behind the first forward",
                                     p.overlap_param_gather and p.use_distributed_optimizer))
              if on]
    return "overlaps " + " and ".join(hidden) if hidden else "communication not overlapped"


def assumptions(job: JobConfig, target: Target) -> list[str]:
    m = job.model
    run = Execution.of(job, target)
    shape, precision, fp32_grads = run.shape, run.precision, run.grad_reduce_in_fp32
    opt = optimizer_bytes_per_element(precision, fp32_grads)
    local_layers = target.device == "cpu" or m.transformer_impl == "local"
    backend = m.attention_backend + (" (torch's fused attention in the local spec)"
                                     if local_layers and not shape.attention_stores_scores
                                     else "")
    attention = ("keeps the a·s² softmax scores" if shape.attention_stores_scores
                 else "stores no attention scores (flash/fused; auto is taken to resolve to them)")
    if shape.attention_stores_scores and not run.kernels.fused_softmax and precision != "fp32":
        attention += (" in fp32 beside their 16-bit cast (megatron's torch softmax: the local "
                      "spec without apex's kernels)")
    out = []
    if target.device == "cpu":
        out.append("CPU profile: the rehearsal runs fp32 with torch's kernels, the local spec and "
                   "no sequence parallelism, and so does this plan")
    out += [
        f"precision {precision}: weights {PRECISION_BYTES[precision]} B/param, gradient "
        f"buffer {grad_bytes(precision, fp32_grads)} B/param, Adam state "
        f"{opt.total} B/param ({'distributed over DP' if job.parallel.use_distributed_optimizer else 'on every DP rank'})"
        + (f"; fp32 main gradients {opt.main_grads} B/param only in the optimizer step (made "
           "from the 16-bit buffer, freed by the next step's zero_grad)" if opt.main_grads else ""),
        f"attention backend {backend}: "
        f"{attention}",
        ACTIVATION_NOTE,
    ]
    if target.device == "cuda":
        out.append(f"runtime buffers {RUNTIME_BUFFER_BYTES / GiB:.2f} GiB beyond the state "
                   "(measured after the first step on an H100: cuBLAS workspaces, batch, loss "
                   "and norm buffers)")
    out.append(target.allowance.describe() if target.device == "cuda" else
               f"allowance {target.allowance.slack_fraction:.0%} of the itemized memory "
               "(host memory of the CPU rehearsal)")
    hw = target.hardware
    if hw.table is not None:
        p2p = "overlapped" if job.parallel.overlap_p2p_comm else "blocking"
        out.append(f"step time from the kernel table {hw.table.describe()}: GEMMs per shape, "
                   f"attention by kernel, element-wise work at "
                   f"{f'{hw.table.bandwidth_gbs:.0f}' if hw.table.bandwidth_gbs else '?'} GB/s; "
                   f"only exposed communication (TP beside "
                   f"the backward GEMMs, PP {p2p} in the interleaved "
                   f"schedule, DP {_dp_overlap(job)}); bus bandwidth intra-node "
                   f"{hw.intra_node_busbw_gbs or '?'} GB/s, inter-node "
                   f"{hw.inter_node_busbw_gbs or '?'} GB/s")
    elif hw.peak_tflops:
        out.append(f"step time assumed (no measured kernel table: node.kernel_table): GEMMs and "
                   f"attention at {MATMUL_EFFICIENCY:.0%} of {hw.peak_tflops:g} TFLOP/s per GPU, "
                   f"element-wise work not counted; only exposed communication (TP beside the "
                   f"backward GEMMs, DP {_dp_overlap(job)}); bus bandwidth intra-node "
                   f"{hw.intra_node_busbw_gbs or '?'} GB/s, inter-node "
                   f"{hw.inter_node_busbw_gbs or '?'} GB/s")
    else:
        out.append("no peak TFLOP/s known (profile node.peak_tflops) and no kernel table: step "
                   "time and MFU are not estimated; layouts are ranked by memory per GPU")
    if target.gpu_memory_bytes is None:
        out.append("GPU memory unknown (no profile, or node.gpu_memory_gb unset): fits is null")
    fmt = job.checkpoint.optimizer_format
    host = (f"{target.host_memory_bytes / GiB:g} GiB per node" if target.host_memory_bytes else
            f"unknown (slurm.mem / node.host_memory_gb; auto assumes {UNKNOWN_HOST_BYTES / GiB:g} GiB)")
    out.append(f"checkpoint save: optimizer_format {fmt}"
               + ((" (dp_reshardable on GPUs, Megatron-LM's default)" if target.device == "cuda"
                   else " (per layout: fully_reshardable when its save fits, else dp_reshardable)")
                  if fmt == "auto" else "")
               + "; at save the activations are freed and the save's own buffers are counted; "
               f"host memory {host}, a save may use {HOST_SAVE_FRACTION:.0%} of it; "
               "fits counts the save")
    bandwidth = (f"{target.storage_write_gbs:g} GB/s" if target.storage_write_gbs else
                 f"{DEFAULT_WRITE_GBS:g} GB/s assumed (storage.write_bandwidth_gbs unset)")
    per_node = (f"nodes of {target.gpus_per_node}" if target.gpus_per_node else
                "nodes of 8 GPUs assumed")
    out.append(f"checkpoint time: {SAVE_OVERHEAD_S:g} s + each node's share written at "
               f"{bandwidth} per node; a background save (checkpoint.async_save) blocks only for "
               f"the copy to host memory at {HOST_COPY_GBS:g} GB/s per GPU; interval from "
               f"Young/Daly with a node MTBF of {target.node_mtbf_hours:g} h "
               f"(reliability.node_mtbf_hours), {per_node}")
    return out


def reference_parameters(job: JobConfig, result: PlanResult) -> tuple[ParameterCount, str]:
    ref = result.job_layout or (result.layouts[0] if result.layouts else None)
    if ref is not None:
        return ref.parameters, ref.layout.describe()
    return count_parameters(ModelShape.from_job(job)), "TP1×PP1"


def plan_json(job: JobConfig, result: PlanResult, layouts: list[LayoutPlan] | None = None,
              rejected: list[Rejected] | None = None) -> dict:
    params, described = reference_parameters(job, result)
    layouts = list(result.layouts) if layouts is None else layouts
    rejected = list(result.rejected) if rejected is None else rejected
    t = result.target
    return {
        "parameters": {"total": params.total, "most_loaded_rank": params.most_loaded_rank,
                       "layout": described, "padded_vocab_size": params.padded_vocab_size},
        "world_size": t.world_size,
        "gpus_per_node": t.gpus_per_node,
        "gpu_memory_bytes": t.gpu_memory_bytes,
        "assumptions": assumptions(job, t),
        "layouts": [p.to_json() for p in layouts],
        "rejected": [r.to_json() for r in rejected],
    }


MiB = 2**20


def unit_for(plans: list[LayoutPlan]) -> tuple[int, str]:
    """GiB for real models; MiB when every total is below 1 GiB (tiny rehearsal models)."""
    return (GiB, "GiB") if max(p.memory.total for p in plans) >= GiB else (MiB, "MiB")


def _g(n: int, unit: int = GiB) -> str:
    return f"{n / unit:6.1f}"


def _fits(plan: LayoutPlan) -> str:
    if plan.fits is False and plan.training_fits is not False:
        return "NO:save"          # the step fits, the checkpoint save does not
    return {True: "yes", False: "NO", None: "?"}[plan.fits]


def _ckpt(plan: LayoutPlan) -> str:
    return {"fully_reshardable": "full", "dp_reshardable": "dp"}.get(
        plan.save.optimizer_format if plan.save else "", "-")


def table(plans: list[LayoutPlan], start: int = 1, unit: tuple[int, str] | None = None) -> list[str]:
    scale, unit_name = unit or unit_for(plans)
    head = (f"{'#':>4}  {'layout':<20} {'mbs':>3} {'nmb':>4} {'SP':<2} {'recompute':<9} "
            f"{'weights':>7} {'grads':>6} {'optim':>6} {'activ':>6} {'total':>6}  "
            f"{'bubble':>6} {'step s':>7} {'MFU':>5} {'ckpt':<4}  fits")
    lines = [head, f"      (memory per GPU in {unit_name}, most loaded pipeline stage)"]
    for i, p in enumerate(plans, start):
        m, lay = p.memory, p.layout
        step = f"{p.step_time_s:7.2f}" if p.step_time_s is not None else f"{'-':>7}"
        mfu = f"{p.mfu:5.0%}" if p.mfu is not None else f"{'-':>5}"
        mark = "*" if p.is_job_layout else " "
        lines.append(
            f"{i:>3}{mark}  {lay.describe():<20} {lay.micro_batch_size:>3} {lay.num_microbatches:>4} "
            f"{'SP' if p.sequence_parallel else '':<2} {p.recompute or '-':<9} "
            f"{_g(m.weights, scale):>7} {_g(m.gradients, scale)} {_g(m.optimizer, scale)} "
            f"{_g(m.activations, scale)} {_g(m.total, scale)}  "
            f"{p.pipeline_bubble_fraction:6.1%} {step} {mfu} {_ckpt(p):<4}  {_fits(p)}")
    return lines


def explain(plan: LayoutPlan, target: Target, job: JobConfig) -> list[str]:
    """One layout in full: where each byte goes on its most loaded GPU, and the time."""
    m, lay, act = plan.memory, plan.layout, plan.activations
    run = Execution.of(job, target)
    u, un = unit_for([plan])
    pp, v = lay.pipeline_model_parallel_size, lay.virtual_pipeline_model_parallel_size or 1
    limit = f" of {target.gpu_memory_bytes / GiB:g} GiB" if target.gpu_memory_bytes else ""
    verdict = {True: f"fits in {target.gpu_memory_bytes / GiB:g} GiB per GPU" if plan.fits else "",
               False: f"does NOT fit in {(target.gpu_memory_bytes or 0) / GiB:g} GiB per GPU",
               None: "fit unknown (GPU memory not given)"}[plan.fits]
    stage = f"pipeline stage {m.pipeline_rank} (the most loaded)" if pp > 1 else "every GPU"
    opt = optimizer_bytes_per_element(run.precision, run.grad_reduce_in_fp32)
    dist = job.parallel.use_distributed_optimizer
    form = (f"{plan.recompute} recompute" if plan.recompute else "no recompute") + \
        (", sequence parallel" if plan.sequence_parallel else "")
    lines = [
        f"{plan.describe()}: {verdict}",
        f"  memory on {stage}, {plan.parameters.per_pipeline_rank[m.pipeline_rank]:,} parameters:",
        f"    weights      {_g(m.weights, u)} {un}  ({run.precision}"
        + (", in the distributed optimizer's padded buffer)" if dist else ")"),
        f"    gradients    {_g(m.gradients, u)} {un}  ({grad_bytes(run.precision, run.grad_reduce_in_fp32)}"
        "-byte gradient buffer)",
        f"    optimizer    {_g(m.optimizer, u)} {un}  ({opt.total} B per element: master "
        f"{opt.master_params}, Adam moments {opt.moments}"
        + (f"; 1/{lay.data_parallel_size} of the buffer per DP rank)" if dist else ")"),
        f"    activations  {_g(m.activations, u)} {un}  ({act.layers_per_chunk} layers × "
        f"{act.in_flight} microbatch(es) in flight × {act.per_layer / 2**20:.1f} MiB per layer "
        f"[{form}]"
        + (f" + output layer/loss {act.output_layer / 2**20:.0f} MiB" if act.output_layer else "")
        + f" + backward working set {act.backward_working_set / 2**20:.0f} MiB)",
    ]
    if m.optimizer_step:
        what = [w for w, on in (("the fp32 main gradients of the 16-bit buffer",
                                 opt.main_grads), ("torch's foreach Adam's fp32 copy of the "
                                                   "elements it updates",
                                                   run.kernels.foreach_adam)) if on]
        lines.append(
            f"    opt. step    {_g(m.optimizer_step, u)} {un}  (only in the optimizer step, "
            f"while the activations are freed: {' and '.join(what)}; the larger of the two "
            f"counts)")
    if m.buffers:
        lines.append(f"    buffers      {_g(m.buffers, u)} {un}  (the runtime's own: cuBLAS "
                     "workspaces, batch, loss and norm buffers; measured on an H100)")
    lines += [
        f"    itemized     {_g(m.itemized, u)} {un}  (the predicted torch.cuda.max_memory_allocated)",
        f"    allowance    {_g(m.allowance, u)} {un}  ({target.allowance.describe()})"
        if target.device == "cuda" else f"    allowance    {_g(m.allowance, u)} {un}",
        f"    total        {_g(m.total, u)} {un}{limit}",
    ]
    if pp > 1:
        per = ", ".join(f"{s.total / u:.1f}" for s in plan.per_stage)
        lines.append(f"  total per pipeline stage ({un}): {per}")
    lines += save_lines(plan, target, u, un)
    lines += interval_lines(plan)
    lines.append(f"  pipeline bubble (p−1)/(v·m) = {pp - 1}/({v}·{lay.num_microbatches}) = "
                 f"{plan.pipeline_bubble_fraction:.1%}")
    lines.append(f"  model FLOPs per step {plan.model_flops_per_step:.3e}")
    if plan.step:
        lines += step_lines(plan, job)
    return lines


def step_lines(plan: LayoutPlan, job: JobConfig) -> list[str]:
    """The step time, kernel by kernel, and what follows from it."""
    s = plan.step
    mb = s.microbatch
    out = [f"  step ≈ {s.total_s:.2f} s ({s.source}): {s.slots:g} microbatch slots × "
           f"{mb.total_s * 1e3:.1f} ms on the slowest pipeline rank = compute "
           f"{s.compute_s:.2f} + exposed TP {s.tp_comm_s:.2f}; exposed PP {s.pp_comm_s:.2f}, "
           f"DP {s.dp_comm_s:.2f}; optimizer step {s.optimizer_s:.2f}"
           + (f"; the host beyond the kernels {s.host_s:.2f}" if s.host_s else "")
           + f"; MFU ≈ {plan.mfu:.0%}",
           f"    one microbatch: GEMMs {mb.gemm_s * 1e3:.1f} ms, attention "
           f"{mb.attention_s * 1e3:.1f} ms, element-wise/norm/loss {mb.memory_s * 1e3:.1f} ms, "
           f"exposed TP {mb.tp_exposed_s * 1e3:.1f} ms"
           + ("" if s.host_microbatch_s is None else
              f"; the host issues it in {s.host_microbatch_s * 1e3:.1f} ms")]
    steps = job.train.steps
    hours = steps * s.total_s / 3600
    out.append(f"  train.steps {steps:,}: {hours:,.1f} h of training = "
               f"{hours * plan.layout.world_size:,.0f} GPU-hours (saves and restarts not "
               "included)")
    out += [f"  note: {n}" for n in s.notes]
    return out


def save_lines(plan: LayoutPlan, target: Target, u: int = GiB, un: str = "GiB") -> list[str]:
    """A checkpoint save of this layout: what it adds on the GPU and in host memory."""
    sv = plan.save
    if sv is None:
        return []
    why = f"; auto: {plan.format_reason}" if plan.format_reason else ""
    verdict = {True: "fits", False: "does NOT fit", None: "fit unknown"}
    out = [f"  checkpoint save, optimizer_format {sv.optimizer_format}{why}:"]
    if target.device == "cuda":
        limit = f" of {sv.gpu_limit / GiB:g} GiB" if sv.gpu_limit else ""
        extra = (f"{sv.gpu_transient / u:.1f} {un} of all-gather buffers" if sv.gpu_transient
                 else "nothing gathered")
        main = " + fp32 main gradients" if plan.memory.main_grads else ""
        out.append(f"    GPU at save  {_g(sv.gpu_at_save, u)} {un}{limit} = weights + gradients + "
                   f"optimizer{main} + buffers + allowance + {extra} (activations are freed "
                   f"between steps) [{verdict[sv.fits_gpu]}]")
    parts = []
    if sv.gathered_per_rank:
        parts.append(f"rebuilt optimizer state {sv.gathered_per_rank / u:.1f} {un}")
    parts.append(f"async writer's copy {sv.async_copy_per_rank / u:.1f} {un}")
    limit = (f", {HOST_SAVE_FRACTION:.0%} of {sv.host_limit / GiB:g} GiB allowed"
             if sv.host_limit else " (node memory unknown)")
    out.append(f"    host         {_g(sv.host_per_rank, u)} {un} per rank at its peak ("
               + ", ".join(parts) + f"), {sv.host_per_node / u:.1f} {un} per node of "
               f"{sv.ranks_per_node} ranks{limit} [{verdict[sv.fits_host]}]")
    if sv.fits is False:
        out.append(f"    fix: {save_fix(plan)}")
    return out


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def interval_lines(plan: LayoutPlan) -> list[str]:
    """The save's time and the checkpoint interval: the job's, and Young/Daly's."""
    ck = plan.checkpointing
    if ck is None:
        return []
    st = ck.save
    where = (f"copied to host memory at {HOST_COPY_GBS:g} GB/s ({st.copy_s:.2f} s), then written "
             "in the background" if st.background else "written synchronously")
    bandwidth = (f"{st.write_gbs:g} GB/s per node"
                 + (" (assumed: storage.write_bandwidth_gbs unset)" if st.write_assumed else ""))
    gather = ""
    if st.gather_s:
        gather = (f"the optimizer state rebuilt (all-gather, copy to host) {st.gather_s:.2f} s"
                  + ("" if st.gather_link_known else
                     " without the all-gather (no bus bandwidth in the profile)") + "; ")
    out = [f"  checkpoint ({ck.setting}): {ck.job.describe()}",
           f"    save: {gather}{_size(st.bytes_per_rank)} per rank {where}: "
           f"{_size(st.bytes_per_node)} per node at {bandwidth} = {st.write_s:.1f} s; "
           f"blocks training {st.blocking_s:.2f} s (a synchronous save {st.sync_s:.1f} s)"]
    if ck.job is not ck.auto:
        auto = ck.auto
        out.append(f"    interval_minutes: auto would save every {minutes(auto.interval_s)}: "
                   f"expected time lost to saves {percent(auto.save_fraction)}, to lost work "
                   f"{percent(auto.lost_work_fraction)}")
    return out


def save_fix(plan: LayoutPlan) -> str:
    """What to change when a layout's checkpoint save does not fit."""
    if plan.save.optimizer_format == "fully_reshardable":
        return ("use checkpoint.optimizer_format: dp_reshardable (or auto), or more TP/PP "
                "(a smaller shard to gather)")
    return ("more data-parallel ranks (a smaller share of the checkpoint per rank), nodes with "
            "more host memory, or more TP/PP")
