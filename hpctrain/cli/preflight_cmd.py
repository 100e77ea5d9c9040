"""``hpctrain preflight``: check nodes before training burns the allocation.

``--here`` runs the node checks on this machine (no torch import). Without it, a preflight job
runs over the profile's allocation (Slurm, or the local machine for a local profile) and its
report is printed when rank 0 has written it; progress lines follow on a terminal.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from ..errors import HpcTrainError, UsageError
from .common import echo_json, interactive, json_option, nodes_option, profile_option, runs_dir_option


@click.command()
@click.option("--here", is_flag=True, help="Run the node checks on this machine only (no job).")
@profile_option
@nodes_option
@json_option
@runs_dir_option
@click.option("--wait", "wait_s", type=click.IntRange(min=1), default=None, metavar="SECONDS",
              help="Give up waiting for the preflight job after this long (default: the "
                   "profile's time limit).")
def preflight(here, profile_name, nodes, as_json, runs_dir, wait_s):
    """Check GPUs, InfiniBand, NCCL settings, storage and collective bandwidth.

    Exit code 0 when every check passed (warnings allowed), 1 when one failed, 2 for bad input.

    \b
    Example:
      hpctrain preflight --here --profile h100-ib-pyxis
      hpctrain preflight --profile dev-slurm --nodes 2
      hpctrain preflight --profile local --json
    """
    from ..config import load_profile
    profile = load_profile(profile_name).with_nodes(nodes)
    if here:
        report = _here(profile, as_json)
    else:
        report = _job(profile, runs_dir, wait_s, as_json)
    if as_json:
        echo_json(report)
    else:
        from ..preflight.report import format_table
        click.echo(format_table(report))
    if not report["passed"]:
        raise click.exceptions.Exit(1)


def _say(msg: str) -> None:
    click.echo(f"preflight: {msg}", err=True)


def _here(profile, as_json: bool) -> dict:
    from ..identity import node_name
    from ..preflight.node import run_node_checks
    from ..preflight.report import build_report
    from ..preflight.results import Check
    node = node_name()
    progress = (lambda m: _say(f"checking {m}")) if interactive() and not as_json else None
    t0 = time.monotonic()
    result = run_node_checks(profile, node=node, nodes=profile.slurm.nodes, strict=False,
                             progress=progress)
    rows = [Check.from_dict(d) for d in result["rows"]]
    return build_report(rows, profile=profile.name, mode="here", nodes=[node],
                        world_size=None, versions=result["versions"],
                        duration_s=round(time.monotonic() - t0, 2))


def _new_run(profile, runs_dir):
    from .. import __version__
    from ..config import yamlio
    from ..config.schema import to_dict
    from ..runs import create_run, default_runs_root, now_iso
    root = Path(runs_dir).expanduser().resolve() if runs_dir else \
        default_runs_root(profile.storage.runs_root)
    run = create_run(root, f"preflight-{profile.name}")
    yamlio.write_atomic(run.profile_file, yamlio.dump(to_dict(profile)))
    run.update_meta(run_id=run.id, name=run.id, kind="preflight", profile=profile.name,
                    scheduler=profile.scheduler, created=now_iso(), hpctrain_version=__version__,
                    world_size=profile.world_size, jobs=[])
    run.logs_dir.mkdir(parents=True, exist_ok=True)  # the batch script logs there
    return run


def _job(profile, runs_dir, wait_s, as_json: bool) -> dict:
    from ..config import time_limit_seconds
    run = _new_run(profile, runs_dir)
    pdir = run.path / "preflight"
    pdir.mkdir(parents=True, exist_ok=True)
    watch = interactive() and not as_json
    if watch:
        _say(f"run folder {run.path}")
    job = _submit(run, profile)
    if watch and getattr(job, "job_id", None):
        _say(f"job {job.job_id} submitted ({profile.slurm.nodes} node(s) x "
             f"{profile.slurm.gpus_per_node} rank(s))")
    limit = wait_s or time_limit_seconds(profile) or 3600
    report = _wait_for_report(pdir, job, limit, watch)
    if report is None:
        _cancel(job)
        raise HpcTrainError(f"the preflight job wrote no report within {limit} s; its logs are in "
                            f"{run.path} (raise --wait if the queue is slow)")
    return report


def _submit(run, profile):
    """Slurm and local profiles go through hpctrain.slurm.submit; its job object comes back."""
    from ..preflight.job import preflight_main
    try:
        from ..slurm.submit import submit_function
    except ImportError:  # an installation without the submit machinery: run ranks here
        if profile.scheduler != "local":
            raise UsageError("this installation cannot submit to Slurm (hpctrain.slurm.submit is "
                             "missing); run `srun python -m hpctrain.preflight.gate RUN_DIR` "
                             "inside an allocation instead") from None
        from ..local_launch import start_preflight
        return start_preflight(run.path, 1, profile.slurm.gpus_per_node)
    return submit_function(run, profile, preflight_main, (str(run.path),), kind="preflight").job


def _job_done(job) -> bool:
    if hasattr(job, "procs"):  # a local launch
        return job.procs[0].poll() is not None
    try:
        return job.done()
    except Exception:
        return False


def _wait_for_report(pdir: Path, job, limit: float, watch: bool) -> dict | None:
    deadline = time.monotonic() + limit
    shown = 0
    progress = pdir / "progress.jsonl"
    seen_done_at = None
    while time.monotonic() < deadline:
        if watch and progress.exists():
            lines = progress.read_text().splitlines()
            for line in lines[shown:]:
                try:
                    _say(json.loads(line)["msg"])
                except (ValueError, KeyError):
                    pass
            shown = len(lines)
        reports = sorted(pdir.glob("report-*.json"))
        if reports:
            try:
                report = json.loads(reports[-1].read_text())
            except ValueError:
                report = None
            if report is not None:
                _stop_local(job)
                return report
        if _job_done(job):
            seen_done_at = seen_done_at or time.monotonic()
            if time.monotonic() - seen_done_at > 5:  # ended without a report
                return None
        time.sleep(0.5)
    return None


def _stop_local(job) -> None:
    if hasattr(job, "procs"):
        job.wait(timeout=30)


def _cancel(job) -> None:
    try:
        if hasattr(job, "procs"):
            job.stop()
        else:
            job.cancel(check=False)
    except Exception:  # best effort: the job may be gone already
        print("warning: could not cancel the preflight job", file=sys.stderr)
