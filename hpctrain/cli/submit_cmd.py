"""``hpctrain submit``: validate, plan, prepare data, create the run folder, submit, follow."""

from __future__ import annotations

import click

from ..errors import HpcTrainError, UsageError
from ..runs import default_runs_root
from .common import echo_json, json_option, nodes_option, profile_option, runs_dir_option
from .render_cmd import load_resolved


def check_fits(resolved, force: bool) -> None:
    """Refuse a layout that does not fit the GPUs' memory (the planner says why), unless forced."""
    try:
        from ..plan import check_fits as plan_check_fits
    except ImportError:
        return
    fit = plan_check_fits(resolved.job, resolved.profile)
    if fit.fits is False and not force:
        raise UsageError(f"{fit.message}\nRefusing to submit a layout that does not fit; "
                         "pass --force to submit anyway.")


def check_data(job) -> None:
    """Prepare the example corpus on first use; refuse a job whose data is missing."""
    from pathlib import Path
    try:
        from ..data.prepare import ensure_prepared
    except ImportError:
        ensure_prepared = None
    if ensure_prepared is not None:
        ensure_prepared(job)
    prefix = Path(job.data.path)
    missing = [str(p) for p in (prefix.with_name(prefix.name + ".bin"),
                                prefix.with_name(prefix.name + ".idx")) if not p.exists()]
    if missing:
        raise UsageError(f"data.path: {missing[0]} does not exist; prepare it with `hpctrain data "
                         f"prepare FILES --output {job.data.path}` or set data.prepare_from")


def failure_detail(sub) -> str:
    """What went wrong, from submitit's error pickle (the traceback's last lines) if any."""
    try:
        exc = sub.job.exception()
    except Exception:
        return ""
    if exc is None:
        return ""
    lines = [ln for ln in str(exc).splitlines() if ln.strip() and not ln.startswith("-" * 10)]
    return "\n".join(lines[-6:])


@click.command()
@click.argument("job_file", metavar="JOB", type=click.Path(dir_okay=False))
@profile_option
@nodes_option
@runs_dir_option
@click.option("--dry-run", is_flag=True, help="Create the run folder and script, do not submit.")
@click.option("--wait/--no-wait", default=None,
              help="Follow the run to its end (default: wait on the local profile, not on Slurm).")
@click.option("--force", is_flag=True, help="Submit even if the planner says it does not fit.")
@json_option
def submit(job_file, profile_name, nodes, runs_dir, dry_run, wait, force, as_json):
    """Submit a training run: validate, plan, create a run folder, submit through submitit.

    On a Slurm profile the rendered sbatch script is submitted (its job requeues itself on
    preemption and resumes from the newest complete checkpoint). On the local profile the same
    ranks run on this machine through submitit's local executor, and the command follows them.

    \b
    Example:
      hpctrain submit examples/tiny.yaml                       # local profile, waits
      hpctrain submit examples/tiny.yaml -p dev-slurm --wait   # the dev Slurm cluster
      hpctrain submit job.yaml -p h100-ib-pyxis -N 32 --json
    """
    from ..slurm.submit import prepare_run, submit_training
    resolved = load_resolved(job_file, profile_name, nodes)
    check_fits(resolved, force)
    check_data(resolved.job)
    root = runs_dir or default_runs_root(resolved.profile.storage.runs_root)
    run = prepare_run(resolved, root, source=str(job_file))
    if dry_run:
        if resolved.profile.scheduler == "slurm":
            from ..config import yamlio
            from ..slurm.render import render_sbatch
            from ..slurm.submit import script_inputs
            yamlio.write_atomic(run.script_file,
                                render_sbatch(resolved, script_inputs(run, resolved.profile)))
        run.update_meta(dry_run=True)
        if as_json:
            echo_json({"run": run.id, "run_dir": str(run.path), "job_id": None, "dry_run": True,
                       "script": str(run.script_file) if run.script_file.exists() else None})
        else:
            click.echo(f"Dry run: run folder {run.path} prepared; nothing submitted.")
        return
    sub = submit_training(resolved, run)
    if wait is None:
        wait = resolved.profile.scheduler == "local" and not as_json
    if as_json:
        echo_json({"run": run.id, "run_dir": str(run.path), "job_id": sub.job_id,
                   "profile": resolved.profile.name, "layout": resolved.layout.describe()})
    else:
        click.echo(f"Submitted {run.id} as job {sub.job_id} on {resolved.profile.name} "
                   f"({resolved.layout.describe()}).")
        click.echo(f"Run folder: {run.path}")
    if wait:
        follow_to_end(sub, quiet=as_json)


def follow_to_end(sub, quiet: bool = False) -> None:
    from ..follow import follow
    from ..slurm.state import live_jobs
    run = sub.run
    if run.meta().get("scheduler") == "local":
        def active():
            return not sub.job.done()
    else:
        def active():
            return bool(live_jobs(run))
    echo = (lambda s: None) if quiet else click.echo
    last = follow(run, active, echo)
    reason = last.get("exit_reason")
    if reason == "finished":
        if not quiet:
            click.echo(f"Run {run.id} finished at step {last.get('end_step')} "
                       f"(loss {last.get('last_loss')}).")
        return
    detail = failure_detail(sub)
    msg = (f"run {run.id} did not finish: last attempt ended with {reason or 'no record'}"
           + (f" ({last['decision']['reason']})" if last.get("decision") else "")
           + f"; see `hpctrain logs {run.id}`")
    raise HpcTrainError(msg + (f"\n{detail}" if detail else ""))
