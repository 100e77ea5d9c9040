"""``hpctrain runs|status|logs|cancel|requeue|resume``: the run folder, day to day.

Thin Click commands over ``hpctrain.ops``; every RUN argument accepts a run folder, a run id,
a unique prefix of one, or a job id the run submitted, and completes in the shell.
"""

from __future__ import annotations

import click

from .. import limits
from ..file_door import show
from .common import (complete_profiles, complete_runs, echo_json, find, follow_in_terminal,
                     json_option, parsed_overrides, run_argument, runs_dir_option, runs_root,
                     set_option, warning_line)


# ---- runs ------------------------------------------------------------------------------------


@click.group(invoke_without_command=True)
@runs_dir_option
@click.option("--limit", "-n", type=limits.click_range("runs_limit"), default=None, help="Show the newest N runs.")
@json_option
@click.pass_context
def runs(ctx, runs_dir, limit, as_json):
    """List run folders, newest first: profile, current job, state, step, attempts, last event.
    `runs prune` removes dry runs' folders, `runs rm RUN...` removes runs.

    \b
    Example:
      hpctrain runs
      hpctrain runs -n 5 --json | jq '.[] | select(.state == "RUNNING") | .run'
      hpctrain runs prune --dry-run            # the dry runs' folders that would go
    """
    if ctx.invoked_subcommand is not None:
        return
    from ..ops.listing import format_runs
    from ..ops.runs_index import listing_rows
    root = runs_root(runs_dir)
    rows = listing_rows(root, limit, warn=lambda line: click.echo(line, err=True))
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo(f"No runs under {root} (`hpctrain submit JOB` creates one; --runs-dir picks "
                   "another folder).")
        return
    click.echo(format_runs(rows))


dry_run_option = click.option("--dry-run", is_flag=True,
                              help="Show what would be removed; remove nothing.")


@runs.command("rm")
@click.argument("run_refs", metavar="RUN...", nargs=-1, required=True, shell_complete=complete_runs)
@dry_run_option
@runs_dir_option
def runs_rm(run_refs, dry_run, runs_dir):
    """Remove run folders, named by full run id or folder (never a run with a pending or
    running job; checkpoints kept outside the run folder stay where they are).

    \b
    Example:
      hpctrain runs rm tiny-gpt-20250101-120000-ab12 --dry-run
    """
    from ..ops.cleanup import exact_runs, plan_removal
    _remove(plan_removal(exact_runs(list(run_refs), runs_root(_group_runs_dir(runs_dir)))), dry_run)


@runs.command("prune")
@dry_run_option
@runs_dir_option
def runs_prune(dry_run, runs_dir):
    """Remove the folders of dry runs (`submit --dry-run`: a script, never a job).

    \b
    Example:
      hpctrain runs prune --dry-run
      hpctrain runs prune
    """
    from ..ops.cleanup import abandoned, dry_run_folders, finish, plan_removal
    root = runs_root(_group_runs_dir(runs_dir))
    found = dry_run_folders(root)
    left = abandoned(root)
    for folder in left:    # what a `runs rm` or `prune` stopped half-way had already let go
        if not dry_run:
            finish(folder)
        click.echo(f"{'would finish' if dry_run else 'finished'} removing {show(folder)} (a "
                   "removal stopped half-way)")
    if not found:
        if not left:
            click.echo(f"No dry-run folders under {show(root)}.")
        return
    _remove(plan_removal(found), dry_run)


def _remove(removals, dry_run: bool) -> None:
    from ..ops.cleanup import remove
    for item in removals:
        kept = (f" (checkpoints kept in {show(item.checkpoints_kept)})" if item.checkpoints_kept
                else "")
        if dry_run:
            click.echo(f"would remove {show(item.run.path)}{kept}")
        elif remove([item])[0]:
            click.echo(f"removed {show(item.run.path)}{kept}")
        else:
            click.echo(f"{show(item.run.path)}: already removed (by another command meanwhile)")


def _group_runs_dir(runs_dir):
    """``hpctrain runs --runs-dir X prune`` means the same as ``runs prune --runs-dir X``."""
    return runs_dir or click.get_current_context().parent.params.get("runs_dir")


# ---- status ------------------------------------------------------------------------------------


@click.command()
@run_argument
@runs_dir_option
@json_option
def status(run_ref, runs_dir, as_json):
    """Show a run: live Slurm state and reason, nodes, time left, step and loss, the attempts
    table (one row per attempt: job, restart, steps, exit, checkpoints, decision), last checkpoint.

    \b
    Example:
      hpctrain status tiny-gpt            # a run id or unique prefix
      hpctrain status 4242 --json         # by Slurm job id
    """
    from ..ops.status import format_status, run_status
    data = run_status(find(run_ref, runs_dir))
    if as_json:
        echo_json(data)
    else:
        click.echo(format_status(data))


# ---- logs ------------------------------------------------------------------------------------


@click.command()
@run_argument
@click.option("--rank", "-r", type=limits.click_range("log_rank"), default=0, show_default=True,
              help="Which rank's log.")
@click.option("--attempt", "-a", type=limits.click_range("log_attempt"), default=None,
              help="Which attempt (default: the latest).")
@click.option("--batch", is_flag=True, help="The batch shell's log (hooks, signals, requeues) "
                                             "instead of a rank's.")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new lines until the run stops, across requeues.")
@click.option("--tail", "-t", "tail_lines", type=limits.click_range("log_tail"), default=None,
              help="Only the last N lines (before following).")
@runs_dir_option
def logs(run_ref, rank, attempt, batch, follow, tail_lines, runs_dir):
    """Print the log of one rank of one attempt of a run (default: rank 0, latest attempt).

    \b
    Example:
      hpctrain logs tiny-gpt                     # rank 0 of the latest attempt
      hpctrain logs tiny-gpt --rank 3 --attempt 1
      hpctrain logs tiny-gpt -f                  # follow, across requeues
      hpctrain logs tiny-gpt --batch             # the batch shell: signals, requeue decisions
    """
    from ..ops.logs import choose_log, follow_logs
    from ..view.follow import all_lines, complete_lines
    run = find(run_ref, runs_dir)
    path = choose_log(run, rank=rank, attempt=attempt, batch=batch, must_exist=not follow)
    shown = None
    if path is not None and path.exists():
        if follow:  # complete lines only: following picks up exactly where this stops
            lines, end = complete_lines(path)
            shown = (path, end)
        else:   # the end of a huge log, through the run-folder reader
            lines = all_lines(path)
        for line in lines[-tail_lines:] if tail_lines else lines:
            click.echo(line)
    if follow:
        follow_logs(run, rank=None if batch else rank, attempt=attempt, shown=shown,
                    echo=click.echo)


# ---- cancel ------------------------------------------------------------------------------------


@click.command()
@run_argument
@runs_dir_option
@json_option
def cancel(run_ref, runs_dir, as_json):
    """Cancel every pending or running job of a run. Recorded in the run (no requeue, chained
    jobs skip); checkpoints are kept, so `hpctrain resume` can continue it later.

    \b
    Example:
      hpctrain cancel tiny-gpt-20250101-120000-ab12
    """
    from ..ops.control import cancel_run
    from ..view.runview import build_view
    run = find(run_ref, runs_dir)
    ids = cancel_run(run)
    if as_json:
        echo_json({"run": run.id, "cancelled": ids})
        return
    if not ids:
        click.echo(f"Run {run.shown} has no pending or running job ({build_view(run).state}); "
                   "nothing to cancel.")
        return
    click.echo(f"Cancelled run {run.shown}: job(s) {', '.join(ids)}. Checkpoints are kept in "
               f"{show(run.checkpoint_dir())} (`hpctrain resume {run.shown}` continues from "
               "them).")


# ---- requeue / resume ----------------------------------------------------------------------------

wait_option = click.option("--wait/--no-wait", default=None,
                           help="Follow the new job to its end (default: on the local profile).")


def _after_resubmit(run, res, wait, as_json: bool, verb: str) -> None:
    where = f"step {res.from_step}" if res.from_step is not None else "the start (no complete checkpoint)"
    if as_json:
        echo_json({"run": run.id, "job_id": res.job_id, "how": res.how, "from_step": res.from_step,
                   "profile": res.profile, "world_size": res.world_size})
    elif res.how == "scontrol requeue":
        click.echo(f"Requeued job {res.job_id} of run {run.shown}: Slurm stops it (the ranks save "
                   f"on SIGTERM) and starts it again from the newest checkpoint ({where}).")
    else:
        ranks = f"{res.world_size} rank{'' if res.world_size == 1 else 's'}"
        click.echo(f"{verb} run {run.shown} as job {res.job_id} on {res.profile} ({ranks}), "
                   f"from {where}.")
    if res.submitted is None:
        return
    if wait is None:
        from ..scheduler.choose import backend_of
        wait = backend_of(run).on_this_machine and not as_json
    if wait:
        follow_in_terminal(run, job=res.submitted.job, quiet=as_json,
                           from_attempt=res.next_attempt)


@click.command()
@run_argument
@wait_option
@runs_dir_option
@json_option
def requeue(run_ref, wait, runs_dir, as_json):
    """Requeue a run: a running job goes back to the queue (`scontrol requeue`) and resumes from
    the newest checkpoint; a run whose jobs ended is resubmitted on its profile.

    \b
    Example:
      hpctrain requeue tiny-gpt
    """
    from ..ops.control import requeue_run
    run = find(run_ref, runs_dir)
    _after_resubmit(run, requeue_run(run), wait, as_json, "Resubmitted")


@click.command()
@run_argument
@click.option("--profile", "-p", "profile_name", shell_complete=complete_profiles,
              default=None, metavar="NAME|FILE",
              help="Resume on another cluster profile (default: the run's own).")
@click.option("--nodes", "-N", type=limits.click_range("resume_nodes"), default=None,
              help="Resume on another node count (the layout is checked again; the checkpoint "
                   "is resharded on load).")
@click.option("--steps", type=click.IntRange(min=1, max=10**9), default=None, metavar="N",
              help="Train to step N (train.steps): extends a finished run.")
@set_option
@click.option("--force", is_flag=True, help="Resume even if the run looks running or finished.")
@click.option("--accept-data-change", is_flag=True,
              help="Resume although the data settings (blend, split, seed, seq_length) give "
                   "the checkpoint's data position another meaning: samples are then skipped "
                   "or read again (recorded in the run's events).")
@wait_option
@runs_dir_option
@json_option
def resume(run_ref, profile_name, nodes, steps, overrides, force, accept_data_change, wait,
           runs_dir, as_json):
    """Resubmit a stopped run from its newest complete checkpoint, possibly on another profile
    or node count, or with values changed (--set, --steps: the learning-rate schedule then runs
    over the new train.steps). The old profile and job are kept as profile.N.yaml and
    job.N.yaml in the run folder.

    \b
    Example:
      hpctrain resume tiny-gpt
      hpctrain resume tiny-gpt --nodes 1          # after losing a node: DP shrinks
      hpctrain resume tiny-gpt -p h100-ib-pyxis -N 16
      hpctrain resume tiny-gpt --steps 2000      # a finished run trains on to step 2000
    """
    from ..errors import UsageError
    from ..ops.control import resume_run
    changes = parsed_overrides(overrides)
    if steps is not None:
        if changes.get("train.steps", steps) != steps:
            raise UsageError("--steps and --set train.steps disagree; give one of them")
        changes["train.steps"] = steps
    run = find(run_ref, runs_dir)
    res = resume_run(run, profile_name, nodes, force=force, overrides=changes,
                     accept_data_change=accept_data_change,
                     warn=warning_line)
    _after_resubmit(run, res, wait, as_json, "Resumed")

