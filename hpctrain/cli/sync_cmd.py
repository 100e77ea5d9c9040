"""``hpctrain sync``: send a run's metrics and events to its trackers from here."""

from __future__ import annotations

import click

from .common import complete_runs, find, runs_dir_option


@click.command()
@click.argument("run_ref", metavar="RUN", shell_complete=complete_runs)
@click.option("--no-upload", is_flag=True,
              help="Do not run `wandb sync` on the run's offline W&B folders.")
@runs_dir_option
def sync(run_ref, no_upload, runs_dir):
    """Send a run's trackers (tracking.wandb, tracking.mlflow) whatever they have not received,
    from the run's metrics.jsonl and events.jsonl, and upload W&B offline runs with `wandb
    sync`. For air-gapped compute nodes (W&B mode: offline) and trackers that were down.

    \b
    Example:
      hpctrain sync tiny-gpt
    """
    from ..tracking.sync import sync_run
    run = find(run_ref, runs_dir)
    raise SystemExit(sync_run(run, click.echo, wandb_upload=not no_upload))
