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
@click.option("--chain", type=click.IntRange(min=1, max=1000), default=1, show_default=True,
              metavar="K",
              help="Submit K jobs of the same run, each starting when the previous one ended "
                   "(afterany): a run longer than the partition's time limit.")
@click.option("--sweep", "sweeps", multiple=True, metavar="KEY=V1,V2,...",
              help="One run per combination of values (repeatable: the cartesian product), "
                   "submitted as one Slurm job array.")
@click.option("--max-parallel", type=int, default=None, metavar="N",
              help="With --sweep: at most N runs at once (the array's %N).")
@json_option
def submit(job_file, profile_name, nodes, runs_dir, dry_run, wait, force, chain, sweeps,
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
    """
    from ..slurm.submit import prepare_run, submit_training
    resolved = load_resolved(job_file, profile_name, nodes)
    if sweeps:
        from .sweep_submit import submit_sweep
        if chain > 1:
            raise UsageError("--chain with --sweep: submit the sweep, then extend a run with "
                             "`hpctrain resume RUN`")
        return submit_sweep(job_file, resolved.profile, list(sweeps), runs_dir=runs_dir,
                            max_parallel=max_parallel, dry_run=dry_run, wait=wait, force=force,
                            as_json=as_json)
    if max_parallel is not None:
        raise UsageError("--max-parallel limits a sweep; add --sweep KEY=V1,V2 or drop it")
    if chain > 1 and resolved.profile.scheduler != "slurm":
        raise UsageError(f"--chain needs a Slurm profile; {resolved.profile.name!r} runs on this "
                         "machine, where one job already runs to the end (drop --chain)")
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
    if chain > 1:
        from ..ops.launch import submit_chain
        subs = submit_chain(resolved, run, chain)
        sub = subs[0]
    else:
        sub = submit_training(resolved, run)
        subs = [sub]
    if wait is None:
        wait = resolved.profile.scheduler == "local" and not as_json
    if as_json:
        echo_json({"run": run.id, "run_dir": str(run.path), "job_id": sub.job_id,
                   "job_ids": [s.job_id for s in subs],
                   "profile": resolved.profile.name, "layout": resolved.layout.describe()})
    else:
        jobs = (f"job {sub.job_id}" if len(subs) == 1 else
                f"a chain of {len(subs)} jobs ({', '.join(s.job_id for s in subs)}; each starts "
                "when the previous one ended)")
        click.echo(f"Submitted {run.id} as {jobs} on {resolved.profile.name} "
                   f"({resolved.layout.describe()}).")
        click.echo(f"Run folder: {run.path}")
    if wait:
        follow_to_end(sub, quiet=as_json)


def follow_to_end(sub, quiet: bool = False, from_attempt: int | None = None) -> None:
    """Print the run's progress until its jobs end (attempts before ``from_attempt`` skipped);
    raise with the reason unless it finished."""
    from ..follow import follow
    from ..ops.progress import ProgressLine
    from ..runs import read_last_jsonl
    from ..slurm.state import live_jobs
    from .common import interactive
    run = sub.run
    if run.meta().get("scheduler") == "local":
        def still_running():
            return not sub.job.done()
    else:
        def still_running():
            return bool(live_jobs(run))
    try:
        total = run.resolved_job().train.steps
    except HpcTrainError:
        total = None
    bar = ProgressLine(total, enabled=interactive() and not quiet, echo=click.echo)

    def active():
        running = still_running()
        m = read_last_jsonl(run.metrics_file) or {}
        bar.update(m.get("step"), f"loss {m['loss']:.4g}" if isinstance(m.get("loss"), float) else "")
        return running
    echo = (lambda s: None) if quiet else bar.echo
    try:
        last = follow(run, active, echo, from_attempt=from_attempt)
    finally:
        bar.close()
    reason = last.get("exit_reason")
    if reason == "finished":
        if not quiet:
            click.echo(f"Run {run.id} finished at step {last.get('end_step')} "
                       f"(loss {_loss_text(last.get('last_loss'))}).")
        return
    detail = failure_detail(sub)
    msg = (f"run {run.id} did not finish: last attempt ended with {reason or 'no record'}"
           + (f" ({last['decision']['reason']})" if last.get("decision") else "")
           + (f"; {last['message']}" if reason == "failed" and last.get("message") else "")
           + f"; see `hpctrain logs {run.id}`")
    raise HpcTrainError(msg + (f"\n{detail}" if detail else ""))


def _loss_text(loss) -> str:
    return f"{loss:.4f}" if isinstance(loss, float) else str(loss)
