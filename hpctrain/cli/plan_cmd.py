"""``hpctrain plan``: which layouts fit, how much memory each GPU needs and why, which is fastest."""

from __future__ import annotations

import click

from ..config import DEFAULT_PROFILE, load_job, load_profile
from ..config.job import MAX_LAYERS
from ..config.profile import MAX_GPUS_PER_NODE, MAX_NODES, MAX_WORLD_SIZE
from ..errors import UsageError
from .common import echo_json, json_option


def _target(profile_name: str | None, nodes: int | None, gpus: int | None):
    from ..plan import Target
    if nodes is not None and gpus is not None:
        raise UsageError("--nodes and --gpus both given; use one (--gpus N counts GPUs, "
                         "--nodes N counts nodes of the profile)")
    if gpus is not None and profile_name is None:
        return Target.from_profile(None, gpus), f"{gpus} GPUs (no profile: GPU memory unknown)"
    profile = load_profile(profile_name or DEFAULT_PROFILE).with_nodes(nodes)
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


def _pinned(job, target, as_json, tp, pp, vpp, mbs, sp, recompute) -> None:
    from ..plan import explain_layout, plan_layouts
    from ..plan.layouts import PlanResult, Rejected
    from ..plan.render import assumptions, explain, plan_json
    vpp_arg = "job" if vpp is None else (vpp or None)
    rec_arg = "job" if recompute is None else (None if recompute == "none" else recompute)
    plan, problems = explain_layout(job, target, tp=tp, pp=pp, vpp=vpp_arg, mbs=mbs,
                                    sequence_parallel=sp, recompute=rec_arg)
    par = job.parallel
    name = (f"TP{tp or par.tensor_model_parallel_size}×PP{pp or par.pipeline_model_parallel_size}"
            + (f"×VPP{vpp_arg if vpp_arg != 'job' else par.virtual_pipeline_model_parallel_size}"
               if (vpp_arg if vpp_arg != "job" else par.virtual_pipeline_model_parallel_size)
               else ""))
    if plan is None:
        reasons = [f"{path}: {msg}" for path, msg in problems]
        if as_json:
            empty = PlanResult(target, (), ())
            echo_json(plan_json(job, empty, [], [Rejected(name, tuple(reasons))]))
            raise click.exceptions.Exit(2)
        raise UsageError(f"{name} is not a valid layout on {target.world_size} GPUs:\n"
                         + "\n".join(f"  - {r}" for r in reasons))
    if as_json:
        echo_json(plan_json(job, PlanResult(target, (plan,), ()), [plan], []))
        return
    for line in explain(plan, target, job):
        click.echo(line)
    if plan.fits is False:
        best = plan_layouts(job, target).best
        if best is not None:
            click.echo(f"  the fastest layout that fits: {best.describe()} "
                       f"(`hpctrain plan` without pinning lists them all)")
    click.echo("Assumptions:")
    for a in assumptions(job, target):
        click.echo(f"  - {a}")


@click.command()
@click.argument("job_file", metavar="JOB", type=click.Path(dir_okay=False))
@click.option("--profile", "-p", "profile_name", default=None, metavar="NAME|FILE",
              help=f"Cluster profile: GPU memory, peak TFLOP/s, bandwidths, node size "
                   f"(default: {DEFAULT_PROFILE}; none with --gpus alone).")
@click.option("--nodes", "-N", type=click.IntRange(min=1, max=MAX_NODES), default=None,
              help="Override the profile's node count.")
@click.option("--gpus", type=click.IntRange(min=1, max=MAX_WORLD_SIZE), default=None,
              help="Plan for this many GPUs (works without a profile: fits is then unknown).")
@click.option("--tensor-model-parallel-size", "--tp", "tp",
              type=click.IntRange(min=1, max=MAX_GPUS_PER_NODE),
              default=None, help="Pin TP and explain that one layout.")
@click.option("--pipeline-model-parallel-size", "--pp", "pp",
              type=click.IntRange(min=1, max=MAX_LAYERS),
              default=None, help="Pin PP and explain that one layout.")
@click.option("--virtual-pipeline-model-parallel-size", "--vpp", "vpp",
              type=click.IntRange(min=0, max=MAX_LAYERS), default=None,
              help="Pin VPP (0: no interleaving) and explain that one layout.")
@click.option("--micro-batch-size", "mbs", type=click.IntRange(min=1, max=2**16), default=None,
              help="With a pinned layout: use this micro batch size instead of the job's.")
@click.option("--sequence-parallel/--no-sequence-parallel", "sp", default=None,
              help="With a pinned layout: override parallel.sequence_parallel.")
@click.option("--recompute-granularity", "recompute",
              type=click.Choice(["none", "selective", "full"]), default=None,
              help="With a pinned layout: override train.recompute_granularity.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="Rows of the ranked table.")
@json_option
def plan(job_file, profile_name, nodes, gpus, tp, pp, vpp, mbs, sp, recompute, top, as_json):
    """Rank every valid layout of a job (TP, PP, VPP, DP, micro batch, recompute, sequence
    parallel) by estimated step time among those that fit, with each GPU's memory broken down
    into weights, gradients, optimizer state, activations and an allowance.

    \b
    Example:
      hpctrain plan examples/llama2-7b.yaml --profile h100-ib-pyxis
      hpctrain plan examples/llama2-7b.yaml --profile h100-ib-pyxis --nodes 4 --tp 4 --pp 2
      hpctrain plan examples/llama2-7b.yaml --nodes 1 --tp 1 --no-sequence-parallel
      hpctrain plan examples/llama2-7b.yaml --gpus 64 --json
    """
    from ..plan import plan_layouts
    from ..plan.render import assumptions, explain, plan_json, reference_parameters, table, unit_for
    job = load_job(job_file)
    target, where = _target(profile_name, nodes, gpus)
    if any(x is not None for x in (tp, pp, vpp, mbs, sp, recompute)):
        _pinned(job, target, as_json, tp, pp, vpp, mbs, sp, recompute)
        return
    result = plan_layouts(job, target)
    if as_json:
        echo_json(plan_json(job, result))
        return
    params, described = reference_parameters(job, result)
    click.echo(f"{job.name} on {where}")
    click.echo(f"Parameters: {params.total:,} (vocabulary padded to {params.padded_vocab_size:,}); "
               f"the most loaded GPU of {described} holds {params.most_loaded_rank:,}")
    if not result.layouts:
        click.echo(f"No valid layout on {target.world_size} GPUs; {len(result.rejected)} "
                   "candidates rejected, for example:")
        for r in result.rejected[:5]:
            click.echo(f"  {r.layout}: " + "; ".join(r.reasons))
        raise click.exceptions.Exit(1)
    n_fit = sum(1 for p in result.layouts if p.fits)
    fit_text = (f"{n_fit} fit in {target.gpu_memory_bytes / 2**30:g} GiB"
                if target.gpu_memory_bytes else "fit unknown")
    order = "estimated step time" if result.layouts[0].step else "memory per GPU"
    click.echo(f"{len(result.layouts)} valid layouts ({fit_text}), ranked by {order}; "
               f"{len(result.rejected)} candidates rejected (--json lists why)")
    click.echo("")
    shown = list(result.layouts[:top])
    job_plan = result.job_layout
    unit = unit_for(shown + ([job_plan] if job_plan else []))
    for line in table(shown, unit=unit):
        click.echo(line)
    if job_plan is not None and job_plan not in shown:
        rank = result.layouts.index(job_plan) + 1
        click.echo(table([job_plan], start=rank, unit=unit)[-1])
    click.echo("   * the job's own layout" if job_plan else
               "   (the job's own layout is not valid here: pin it with --tp/--pp to see why)")
    click.echo("")
    best = result.best
    if best is None:
        click.echo("No layout fits; the one needing the least memory:")
        best = result.layouts[0]
    else:
        click.echo("Best:")
    for line in explain(best, target, job):
        click.echo(line)
    click.echo("Assumptions:")
    for a in assumptions(job, target):
        click.echo(f"  - {a}")
