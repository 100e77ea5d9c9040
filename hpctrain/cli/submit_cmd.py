"""``hpctrain submit``: options in, ``hpctrain.submission.submit`` does the work, then print what
was submitted and (``--wait``) follow it to its end."""

from __future__ import annotations

import click

from .. import limits

from ..errors import HpcTrainError
from .common import (echo_json, follow_in_terminal, job_options, json_option, parsed_overrides,
                     runs_dir_option, warning_line)


@click.command()
@job_options
@runs_dir_option
@click.option("--dry-run", is_flag=True, help="Create the run folder and script, do not submit "
                                               "(data this machine cannot see is a warning).")
@click.option("--wait/--no-wait", default=None,
              help="Follow the run to its end (default: wait on the local profile, not on Slurm).")
@click.option("--force", is_flag=True, help="Submit even if the planner says it does not fit.")
@click.option("--chain", type=click.IntRange(min=1, max=1000), default=1, show_default=True,
              metavar="K",
              help="Submit K jobs of the same run, each starting when the previous one ended "
                   "(afterany): a run longer than the partition's time limit.")
@click.option("--sweep", "sweeps", multiple=True, metavar="KEY=V1,V2,...",
              help="One run per combination of values (repeatable: the cartesian product), "
                   "submitted as one Slurm job array.")
@click.option("--max-parallel", type=limits.click_range("max_parallel"), default=None, metavar="N",
              help="With --sweep: at most N runs at once (the array's %N).")
@json_option
def submit(job_file, profile_name, nodes, overrides, runs_dir, dry_run, wait, force, chain, sweeps,
           max_parallel, as_json):
    """Submit a training run: validate, plan, create a run folder, submit through submitit.

    On a Slurm profile the rendered sbatch script is submitted (its job requeues itself on
    preemption and resumes from the newest complete checkpoint). On the local profile the same
    ranks run on this machine through submitit's local executor, and the command follows them.

    \b
    Example:
      hpctrain submit examples/tiny.yaml                       # local profile, waits
      hpctrain submit examples/tiny.yaml -p dev-slurm --wait   # the dev Slurm cluster
      hpctrain submit job.yaml -p h100-ib-pyxis -N 32 --json
      hpctrain submit job.yaml -p dev-slurm --chain 3          # 3 jobs, one after another
      hpctrain submit job.yaml -p dev-slurm --sweep train.lr=1e-4,3e-4 --max-parallel 1
      hpctrain submit job.yaml -p dev-slurm --set train.steps=2000 --set train.lr=3e-4
    """
    from ..submission import submit as submit_job
    local_sweep = []

    def follow_local_run(sub) -> str:   # a local sweep's runs, one after another
        if not local_sweep:
            local_sweep.append(True)
            if not as_json:
                click.echo(f"Sweep {sub.run.meta()['sweep']['id']}: its runs train one after "
                           "another on this machine.")
        if not as_json:
            click.echo(f"--- run {sub.run.id} (job {sub.job_id}): {_values(sub.run)}")
        follow_in_terminal(sub.run, job=sub.job, quiet=as_json)
        return "finished"
    done = submit_job(job_file, profile_name, nodes=nodes, runs_dir=runs_dir, chain=chain,
                      sweep=list(sweeps), max_parallel=max_parallel, dry_run=dry_run, force=force,
                      overrides=parsed_overrides(overrides),
                      follow_local_run=follow_local_run,
                      warn=warning_line)
    if done.sweep_dir is not None:
        _report_sweep(done, as_json)
        if done.array_job_id and wait:
            from ..view.follow import wait_for_runs
            wait_for_runs(done.runs, echo=None if as_json else click.echo)
        return
    run = done.run
    if dry_run:
        if as_json:
            echo_json({"run": run.id, "run_dir": str(run.path), "job_id": None, "dry_run": True,
                       "script": str(done.script) if done.script else None})
        else:
            click.echo(f"Dry run: run folder {run.path} prepared; nothing submitted.")
        return
    subs = done.submitted
    resolved = done.resolved
    if wait is None:
        from ..scheduler.choose import backend_for
        wait = backend_for(resolved.profile).on_this_machine and not as_json
    if as_json:
        echo_json({"run": run.id, "run_dir": str(run.path), "job_id": subs[0].job_id,
                   "job_ids": done.job_ids, "profile": resolved.profile.name,
                   "layout": resolved.layout.describe()})
    else:
        jobs = (f"job {subs[0].job_id}" if len(subs) == 1 else
                f"a chain of {len(subs)} jobs ({', '.join(done.job_ids)}; each starts "
                "when the previous one ended)")
        click.echo(f"Submitted {run.id} as {jobs} on {resolved.profile.name} "
                   f"({resolved.layout.describe()}).")
        click.echo(f"Run folder: {run.path}")
    if wait:
        follow_in_terminal(run, job=subs[0].job, quiet=as_json)


def _values(run) -> str:
    from ..submission.sweep_values import label
    return label((run.meta().get("sweep") or {}).get("values") or {})


def _report_sweep(done, as_json: bool) -> None:
    """The sweep's runs: submitted as one array, prepared (dry run), or how each ended (local)."""
    sweep_dir, runs = done.sweep_dir, done.sweep_runs
    from ..scheduler.choose import backend_for
    trained = not backend_for(done.resolved.profile).arrays and not done.dry_run   # one by one
    if as_json:
        echo_json({"sweep": sweep_dir.name, "sweep_dir": str(sweep_dir),
                   "array_job_id": done.array_job_id, "dry_run": done.dry_run,
                   "runs": [{"run": r.run.id, "run_dir": str(r.run.path), "job_id": r.job_id,
                             "values": r.point.values, "outcome": r.outcome} for r in runs]})
    else:
        if done.dry_run:
            # a script only where the backend runs the sweep as a job array (Slurm)
            script = f" Script: {done.script}" if done.script else ""
            click.echo(f"Dry run: sweep {sweep_dir.name} prepared ({len(runs)} run "
                       f"folder{'s' if len(runs) != 1 else ''}); nothing submitted.{script}")
        elif done.array_job_id:
            click.echo(f"Submitted sweep {sweep_dir.name} as job array {done.array_job_id} "
                       f"({len(runs)} runs): {sweep_dir}")
        for r in runs:
            tail = f"  {r.outcome}" if trained else ""
            click.echo(f"  {r.job_id or '-':>8}  {r.run.id}  {r.point.label()}{tail}")
    failed = [r for r in runs if trained and r.outcome != "finished"]
    if failed:
        raise HpcTrainError(f"{len(failed)} of {len(runs)} sweep runs did not finish: "
                            + ", ".join(r.run.id for r in failed))
