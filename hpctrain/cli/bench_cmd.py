"""``hpctrain bench``: benchmarks that submit real jobs (``bench scaling``)."""

from __future__ import annotations

import os

import click

from .. import limits
from ..config import DEFAULT_PROFILE
from .common import complete_profiles, echo_json, json_option, runs_dir_option


@click.group()
def bench():
    """Benchmarks that submit real jobs and measure them.

    \b
    Example:
      hpctrain bench scaling examples/llama2-7b.yaml -p h100-ib-pyxis --nodes 1,2,4,8
    """


@bench.command()
@click.argument("job_file", metavar="JOB", type=click.Path(dir_okay=False))
@click.option("--profile", "-p", "profile_name", shell_complete=complete_profiles,
              default=DEFAULT_PROFILE, show_default=True,
              metavar="NAME|FILE", help="Cluster profile to submit to.")
@click.option("--nodes", "-N", "nodes_text", required=True, metavar="N1,N2,...",
              help="Node counts to run at, e.g. 1,2,4,8 (efficiency is against the smallest).")
@click.option("--steps", type=click.IntRange(min=2, max=100000), default=None,
              help="Steps per run (default 30).")
@click.option("--warmup", type=click.IntRange(min=0, max=100000), default=None,
              help="First steps left out of the measurement (default 10, at most a third of --steps).")
@click.option("--strong", is_flag=True,
              help="Strong scaling: keep the job's global batch (default: weak scaling, the "
                   "micro batch and microbatches per rank kept, the global batch growing with DP).")
@runs_dir_option
@json_option
def scaling(job_file, profile_name, nodes_text, steps, warmup, strong, runs_dir, as_json):
    """Run the same job at several node counts for a few steps each, one after the other, and
    print tokens/s and the efficiency against the smallest size (target: more than 85%), beside
    what the planner predicts for each size; writes scaling.json and a PNG.

    \b
    Example:
      hpctrain bench scaling examples/llama2-7b.yaml -p h100-ib-pyxis --nodes 1,2,4,8
      hpctrain bench scaling examples/tiny.yaml -p dev-slurm --nodes 1,2 --steps 20 --warmup 5
      hpctrain bench scaling job.yaml -p h100-ib-pyxis --nodes 2,4,8,16 --strong --json
    """
    from ..bench import scaling as sc
    from ..bench.scaling_report import new_result_folder, save, table
    from ..config import load_job, load_profile
    from ..record.folder import default_runs_root, folder_mode
    sizes = sc.parse_sizes(nodes_text)
    job = load_job(job_file)
    profile = load_profile(profile_name)
    steps = steps or sc.DEFAULT_STEPS
    warmup = min(sc.DEFAULT_WARMUP, steps // 3) if warmup is None else warmup
    root = runs_dir or default_runs_root(profile.storage.runs_root)
    echo = (lambda text: None) if as_json else click.echo
    result = sc.run_scaling(job, profile, sizes, runs_root=root, steps=steps, warmup=warmup,
                            strong=strong, source=str(job_file), on_event=echo)
    save(result, new_result_folder(root, job.name, folder_mode(profile.storage.group_readable)))
    if as_json:
        echo_json(result.to_json())
        return
    click.echo("")
    for line in table(result):
        click.echo(line)
    click.echo(f"Written: {result.folder / 'scaling.json'}"
               + (f", {result.png}" if result.png else ""))


@bench.command()
@click.option("--output", "-o", "output", required=True, type=click.Path(dir_okay=False),
              help="Where to write the table (JSON); an existing file is not overwritten.")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]),
              default="bfloat16", show_default=True, help="The training precision to time.")
@click.option("--budget", "budget_s", type=limits.click_float_range("kernel_budget_s"),
              default=240.0, show_default=True,
              help="Stop measuring after this many seconds (an error).")
def kernels(output, dtype, budget_s):
    """Measure this GPU kind's kernel table (GEMMs per shape, attention by backend, memory
    bandwidth, the host's time to issue a layer) on the GPU this runs on, for a profile's
    node.kernel_table: the planner then prices steps from it. Run it once per GPU kind and
    node type, on one GPU of a node, e.g. in a job.

    \b
    Example:
      srun -N1 --gpus 1 hpctrain bench kernels -o cluster_profiles/h100-kernels.json
    """
    from pathlib import Path

    from ..errors import UsageError
    path = Path(output)
    if os.path.lexists(path):      # a link, even one pointing nowhere, is there too
        raise UsageError(f"--output: {output} exists; give a new file name (nothing was "
                         "measured or overwritten)")
    if not path.parent.is_dir():
        raise UsageError(f"--output: folder {path.parent} does not exist")
    import torch

    from ..bench.kernels import measure_table, write_table
    if not torch.cuda.is_available():
        raise UsageError("bench kernels: no CUDA GPU visible here; run it on a GPU node "
                         "(e.g. srun -N1 --gpus 1 hpctrain bench kernels -o FILE)")
    table = measure_table(device="cuda", dtype=dtype, budget_s=budget_s)
    write_table(table, path)
    click.echo(f"wrote {path}: {len(table['gemm'])} GEMMs, {len(table['attention'])} attention "
               f"points, {table['bandwidth_gbs']:.0f} GB/s, "
               f"{'the host measured' if table.get('host') else 'no host measurement'} "
               f"({table['device']}); set the "
               f"profile's node.kernel_table: {path}")
