"""``hpctrain validate`` and ``hpctrain render``: check a job on a profile, print its script."""

from __future__ import annotations

from pathlib import Path

import click

from .. import file_door
from ..errors import UsageError
from .common import CheckedPath, echo_json, job_options, json_option, parsed_overrides, \
    runs_dir_option, warning_line


def load_resolved(job_file: str, profile_name: str, nodes: int | None, overrides=()):
    """The job (with its ``--set`` values) on its profile (``hpctrain.submission``), warnings
    about its layers printed."""
    from ..submission import launch_warnings
    from ..submission import load_resolved as load
    resolved = load(job_file, profile_name, nodes, parsed_overrides(overrides))
    for warning in launch_warnings(resolved):
        warning_line(warning)
    return resolved


@click.command()
@job_options
@runs_dir_option
@json_option
def validate(job_file, profile_name, nodes, overrides, runs_dir, as_json):
    """Check a job file on a profile: schema, layout (TP × PP × DP = world size), safety, and
    every other check `submit` makes that needs no cluster (memory fit, data and vocabulary).
    Data this machine cannot see is a warning, not an error.

    \b
    Example:
      hpctrain validate examples/tiny.yaml --profile dev-slurm
      hpctrain validate examples/tiny.yaml --set train.steps=500
    """
    from ..submission import check_offline
    from ..submission.folders import check_checkpoint_dir
    r = load_resolved(job_file, profile_name, nodes, overrides)
    check_offline(r, prepare=False, warn=warning_line)
    # where the checkpoints go (checkpoint.dir, or the profile's storage.checkpoint_root),
    # checked as submit checks it against the runs root it would use (--runs-dir, else its
    # default)
    check_checkpoint_dir(r.job, _runs_root_of_submit(runs_dir, r.profile), False, r.profile)
    if as_json:
        lay = r.layout
        echo_json({"valid": True, "profile": r.profile.name, "world_size": r.profile.world_size,
                   "layout": {"tensor_model_parallel_size": lay.tensor_model_parallel_size,
                              "pipeline_model_parallel_size": lay.pipeline_model_parallel_size,
                              "virtual_pipeline_model_parallel_size":
                                  lay.virtual_pipeline_model_parallel_size,
                              "data_parallel_size": lay.data_parallel_size,
                              "num_microbatches": lay.num_microbatches}})
        return
    click.echo(f"{job_file}: ok on {r.profile.name} ({r.profile.slurm.nodes} node(s) × "
               f"{r.profile.slurm.gpus_per_node}): {r.layout.describe()}, "
               f"{r.layout.num_microbatches} microbatches per step")


def _runs_root_of_submit(runs_dir, profile):
    """The runs root ``submit`` would use: ``--runs-dir`` (an unusable one is refused, as
    submit refuses it), else the default, which is None when it is unusable (submit says why;
    ``validate`` checks the job and profile)."""
    from ..submission import runs_root_for
    if runs_dir is not None:
        return runs_root_for(runs_dir, profile)
    try:
        return runs_root_for(None, profile)
    except UsageError:
        return None


@click.command()
@job_options
@runs_dir_option
@click.option("--run-dir", type=CheckedPath(file_okay=False, path_type=Path), default=None,
              help="Run folder to render for (default: a new run id under the runs dir, "
                   "<job name>-<date>-<time>-<hex>, named as `submit` names it).")
def render(job_file, profile_name, nodes, overrides, runs_dir, run_dir):
    """Print the sbatch script a submission would use (nothing is written or submitted).

    The script is a pure function of the profile, the job and the run folder, rendered from
    sbatch_templates/train.sbatch.j2 with every value validated and shell-quoted.

    \b
    Example:
      hpctrain render examples/tiny.yaml --profile dev-slurm > tiny.sbatch
      sbatch --test-only tiny.sbatch
    """
    from ..record.folder import RunFolder, new_run_id
    from ..scheduler.choose import backend_for
    from ..submission import render_script, runs_root_for, script_inputs
    r = load_resolved(job_file, profile_name, nodes, overrides)
    if not backend_for(r.profile).batch_script:
        raise UsageError(f"profile {r.profile.name!r} runs without Slurm (scheduler: "
                         f"{r.profile.scheduler}); render a Slurm profile, e.g. --profile dev-slurm")
    if run_dir is None:
        run_dir = runs_root_for(runs_dir, r.profile) / new_run_id(r.job.name)  # as submit names it
    try:
        run = RunFolder(file_door.resolve(run_dir))
    except file_door.Refused as e:   # a symlink loop: one line, not Python's RuntimeError
        raise UsageError(f"--run-dir {file_door.show(run_dir)} {e.why}; name another folder") \
            from None
    click.echo(render_script(script_inputs(run, r.profile), resolved=r), nl=False)
