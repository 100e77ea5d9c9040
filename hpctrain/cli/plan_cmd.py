"""``hpctrain plan``: which layouts fit, how much memory each GPU needs and why, which is fastest."""

from __future__ import annotations

import click

from .. import limits
from ..config import DEFAULT_PROFILE
from ..config.job import MAX_LAYERS
from ..config.profile import MAX_GPUS_PER_NODE, MAX_NODES, MAX_WORLD_SIZE
from ..errors import UsageError
from .common import complete_profiles, echo_json, json_option, parsed_overrides, set_option


def cost_lines(ranked, job, gpus: int) -> list[str]:
    """Time to train the job's ``train.steps`` and GPU-hours, for each ``(rank, layout)``."""
    from ..ops.fmt import format_duration, format_gpu_hours
    from ..planner.cost import training_cost
    costs = [training_cost(p.step_time_s, job.train.steps, gpus) for _, p in ranked]
    if all(c.time_s is None for c in costs):
        return []
    width = max(len(p.describe()) for _, p in ranked)
    lines = [f"Cost of train.steps = {job.train.steps:,} on {gpus} GPUs (step time × steps; "
             "no saves, restarts or queueing):",
             f"{'#':>4}  {'layout':<{width}} {'time to train':>13} {'GPU-hours':>10}"]
    for (i, p), c in zip(ranked, costs):
        lines.append(f"{i:>3}{'*' if p.is_job_layout else ' '}  {p.describe():<{width}} "
                     f"{format_duration(c.time_s):>13} {format_gpu_hours(c.gpu_hours):>10}")
    return lines + [""]


def _pinned(job, target, tp, pp, vpp, mbs, sp, recompute) -> None:
    from ..planner import plan_layouts
    from ..planner.render import assumptions, explain
    from ..planner.request import plan_pinned
    pinned = plan_pinned(job, target, tp=tp, pp=pp, vpp=vpp, mbs=mbs, sp=sp, recompute=recompute)
    plan = pinned.plan
    if plan is None:
        raise UsageError(f"{pinned.name} is not a valid layout on {target.world_size} GPUs: "
                         + "; ".join(pinned.reasons))
    for line in explain(plan, target, job):
        click.echo(line)
    for line in cost_lines([(1, plan)], job, target.world_size)[:-1]:
        click.echo(f"  {line}")
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
@click.option("--profile", "-p", "profile_name", shell_complete=complete_profiles,
              default=None, metavar="NAME|FILE",
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
@click.option("--top", type=limits.click_range("plan_top"), default=10, show_default=True,
              help="Rows of the ranked table.")
@set_option
@json_option
def plan(job_file, profile_name, nodes, gpus, tp, pp, vpp, mbs, sp, recompute, top, overrides,
         as_json):
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
    from ..planner import plan_layouts
    from ..planner.render import assumptions, explain, reference_parameters, table, unit_for
    from ..planner.request import plan_data, plan_target
    from ..submission import load_job_input
    job, _ = load_job_input(job_file, parsed_overrides(overrides))
    pinned = any(x is not None for x in (tp, pp, vpp, mbs, sp, recompute))
    if as_json:
        data = plan_data(job, profile_name, nodes=nodes, gpus=gpus, tp=tp, pp=pp, vpp=vpp,
                         mbs=mbs, sp=sp, recompute=recompute)
        echo_json(data)
        if pinned and not data["layouts"]:   # the pinned layout is not valid: a usage error
            raise click.exceptions.Exit(2)
        return
    target, where = plan_target(profile_name, nodes, gpus)
    if pinned:
        _pinned(job, target, tp, pp, vpp, mbs, sp, recompute)
        return
    result = plan_layouts(job, target)
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
    ranked = list(enumerate(shown, 1)) + ([(result.layouts.index(job_plan) + 1, job_plan)]
                                          if job_plan is not None and job_plan not in shown else [])
    for line in cost_lines(ranked, job, target.world_size):
        click.echo(line)
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
