"""Options and helpers shared by several commands (kept free of heavy imports)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..config import DEFAULT_PROFILE, safety
from ..config.profile import MAX_NODES


class CheckedPath(click.Path):
    """A path option (or its environment variable) that may end up in the batch script and in
    file names: one line of text, no control characters, a usable length, checked before click
    looks at the file system (a NUL byte would make os.stat raise). Quoting does the rest."""

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            why = safety.text_problem(value, safety.PATH_MAX) or safety.path_problem(value)
            if why:
                envvar = getattr(param, "envvar", None)
                source = f" (from ${envvar})" if envvar and ctx and \
                    ctx.get_parameter_source(param.name).name == "ENVIRONMENT" else ""
                self.fail(f"{safety.short(value)}{source} {why}", param, ctx)
        return super().convert(value, param, ctx)


profile_option = click.option(
    "--profile", "-p", "profile_name", default=DEFAULT_PROFILE, show_default=True, metavar="NAME|FILE",
    help="Cluster profile: a name from `hpctrain profiles list` or a path to a YAML file.")
nodes_option = click.option("--nodes", "-N", type=click.IntRange(min=1, max=MAX_NODES), default=None,
                            help="Override the profile's node count.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
runs_dir_option = click.option(
    "--runs-dir", type=CheckedPath(file_okay=False, path_type=Path), default=None,
    envvar="HPCTRAIN_RUNS_DIR",
    help="Folder holding run folders (default: $HPCTRAIN_RUNS_DIR, the profile's "
         "storage.runs_root, or ./runs).")


def echo_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def interactive() -> bool:
    """Progress bars and live output only when a person is watching."""
    return sys.stderr.isatty()
