"""``hpctrain submit JOB --sweep KEY=V1,V2 ...``: validate every combination, then submit them as
one Slurm job array (or train them one after another on a local profile)."""

from __future__ import annotations

import time

import click

from ..errors import HpcTrainError
from ..runs import default_runs_root
from .common import echo_json


def submit_sweep(job_file: str, profile, specs: list[str], *, runs_dir, max_parallel, dry_run,
                 wait, force, as_json) -> None:
    from ..ops.sweep import expand
    from ..ops.sweep_launch import (check_max_parallel, prepare_sweep, run_sweep_locally,
                                    submit_sweep_array)
    from .submit_cmd import check_data, check_fits
    check_max_parallel(max_parallel, profile.scheduler)
    points = expand(job_file, profile, specs)
    for p in points:
        check_fits(p.resolved, force)
    for path in sorted({p.resolved.job.data.path for p in points}):
        check_data(next(p.resolved.job for p in points if p.resolved.job.data.path == path))
    root = runs_dir or default_runs_root(profile.storage.runs_root)
    sweep_dir, runs = prepare_sweep(points, root, source=str(job_file))
    if dry_run:
        if profile.scheduler == "slurm":
            from ..config import yamlio
            from ..slurm.render import ScriptInputs, render_sbatch
            from ..slurm.submit import node_python, step_python
            inputs = ScriptInputs(run_dir=str(sweep_dir), python=node_python(profile),
                                  step_python=step_python(profile),
                                  submitit_dir=str(sweep_dir / "submitit"),
                                  array_run_dirs=[str(r.run.path) for r in runs],
                                  array_parallelism=max_parallel)
            yamlio.write_atomic(sweep_dir / "sbatch.sh", render_sbatch(points[0].resolved, inputs))
        for r in runs:
            r.run.update_meta(dry_run=True)
        _report(sweep_dir, None, runs, as_json, dry_run=True)
        return
    if profile.scheduler == "slurm":
        sub = submit_sweep_array(sweep_dir, runs, max_parallel=max_parallel)
        _report(sweep_dir, sub.array_job_id, runs, as_json)
        if wait:
            wait_for_runs([r.run for r in runs], quiet=as_json)
        return
    if not as_json:
        click.echo(f"Sweep {sweep_dir.name}: {len(runs)} runs, one after another on this machine.")
    from .submit_cmd import follow_to_end

    def follow(sub) -> str:
        if not as_json:
            click.echo(f"--- run {sub.run.id} (job {sub.job_id}): {_values(sub.run)}")
        follow_to_end(sub, quiet=as_json)
        return "finished"
    run_sweep_locally(sweep_dir, runs, follow)
    _report(sweep_dir, None, runs, as_json, outcomes=True)
    failed = [r for r in runs if r.outcome != "finished"]
    if failed:
        raise HpcTrainError(f"{len(failed)} of {len(runs)} sweep runs did not finish: "
                            + ", ".join(r.run.id for r in failed))


def _values(run) -> str:
    values = (run.meta().get("sweep") or {}).get("values") or {}
    return ", ".join(f"{k}={v}" for k, v in values.items())


def _report(sweep_dir, array_id, runs, as_json: bool, *, dry_run=False, outcomes=False) -> None:
    if as_json:
        echo_json({"sweep": sweep_dir.name, "sweep_dir": str(sweep_dir), "array_job_id": array_id,
                   "dry_run": dry_run,
                   "runs": [{"run": r.run.id, "run_dir": str(r.run.path), "job_id": r.job_id,
                             "values": r.point.values, "outcome": r.outcome} for r in runs]})
        return
    if dry_run:
        click.echo(f"Dry run: sweep {sweep_dir.name} prepared ({len(runs)} run folders); nothing "
                   f"submitted. Script: {sweep_dir / 'sbatch.sh'}")
    elif array_id:
        click.echo(f"Submitted sweep {sweep_dir.name} as job array {array_id} "
                   f"({len(runs)} runs): {sweep_dir}")
    for r in runs:
        tail = f"  {r.outcome}" if outcomes else ""
        click.echo(f"  {r.job_id or '-':>8}  {r.run.id}  {r.point.label()}{tail}")


def wait_for_runs(runs, quiet: bool = False, poll_s: float = 2.0) -> None:
    """Wait until none of the runs has a pending or running job; say how each ended."""
    from ..ops.runview import build_views
    pending = {r.path for r in runs}
    while pending:
        for view in build_views([r for r in runs if r.path in pending]):
            if not view.active_jobs:
                pending.discard(view.run.path)
                if not quiet:
                    click.echo(f"run {view.run.id}: {view.state} at step {view.step}")
        if pending:
            time.sleep(poll_s)
