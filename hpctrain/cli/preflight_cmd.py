"""``hpctrain preflight``: check nodes before training burns the allocation.

``--here`` runs the node checks on this machine (no torch import). Without it, a preflight job
runs over the profile's allocation (Slurm, or the local machine for a local profile) and its
report is printed when rank 0 has written it; progress lines follow on a terminal.
"""

from __future__ import annotations

import sys
import time

import click

from .. import limits

from ..errors import HpcTrainError
from .common import (echo_json, interactive, json_option, nodes_option, profile_option,
                     runs_dir_option)


@click.command()
@click.option("--here", is_flag=True, help="Run the node checks on this machine only (no job).")
@profile_option
@nodes_option
@json_option
@runs_dir_option
@click.option("--wait", "wait_s", type=limits.click_range("preflight_wait_s"), default=None, metavar="SECONDS",
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
    from ..submission.checks import load_profile_for
    profile = load_profile_for(profile_name, nodes)
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


def _job(profile, runs_dir, wait_s, as_json: bool) -> dict:
    from ..config import time_limit_seconds
    from ..submission import prepare_preflight_run, runs_root_for, submit_preflight
    from ..view.follow import wait_for_preflight_report
    run = prepare_preflight_run(profile, runs_root_for(runs_dir, profile))
    watch = interactive() and not as_json
    if watch:
        _say(f"run folder {run.path}")
    job = submit_preflight(run, profile).job
    if watch and getattr(job, "job_id", None):
        _say(f"job {job.job_id} submitted ({profile.slurm.nodes} node(s) x "
             f"{profile.slurm.gpus_per_node} rank(s))")
    limit = wait_s or time_limit_seconds(profile) or 3600
    report = wait_for_preflight_report(run, job, limit, on_progress=_say if watch else None)
    if report is None:
        _cancel(job)
        raise HpcTrainError(f"the preflight job wrote no report within {limit} s; its logs are in "
                            f"{run.path} (raise --wait if the queue is slow)")
    return report


def _cancel(job) -> None:
    try:
        job.cancel(check=False)
    except Exception:  # best effort: the job may be gone already
        print("warning: could not cancel the preflight job", file=sys.stderr)
