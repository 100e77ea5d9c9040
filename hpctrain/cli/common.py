"""Options and helpers shared by several commands (kept free of heavy imports)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..config import DEFAULT_PROFILE

profile_option = click.option(
    "--profile", "-p", "profile_name", default=DEFAULT_PROFILE, show_default=True, metavar="NAME|FILE",
    help="Cluster profile: a name from `hpctrain profiles list` or a path to a YAML file.")
nodes_option = click.option("--nodes", "-N", type=click.IntRange(min=1), default=None,
                            help="Override the profile's node count.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
runs_dir_option = click.option(
    "--runs-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    envvar="HPCTRAIN_RUNS_DIR",
    help="Folder holding run folders (default: $HPCTRAIN_RUNS_DIR, the profile's "
         "storage.runs_root, or ./runs).")


def echo_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def interactive() -> bool:
    """Progress bars and live output only when a person is watching."""
    return sys.stderr.isatty()
