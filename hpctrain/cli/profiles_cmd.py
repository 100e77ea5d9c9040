"""``hpctrain profiles list|show|validate``."""

from __future__ import annotations

import click

from ..config import find_profile, list_profiles, load_profile, loader, yamlio
from ..config.schema import to_dict
from ..file_door import printable, show
from .common import echo_json, json_option


@click.group()
def profiles():
    """List, show and validate cluster profiles.

    \b
    Profiles are found by path, or by name in $HPCTRAIN_PROFILE_PATH,
    ~/.config/hpctrain/profiles/ and the packaged cluster_profiles/.

    \b
    Example:
      hpctrain profiles list
      hpctrain profiles show dev-slurm
      hpctrain profiles validate my-cluster.yaml
    """


@profiles.command("list")
@json_option
def list_cmd(as_json):
    """List the profiles on the search path.

    \b
    Example:
      hpctrain profiles list --json
    """
    rows = []
    for name, path in sorted(list_profiles().items()):
        try:
            p = _accepted(load_profile(str(path)))
            rows.append({"name": name, "scheduler": p.scheduler, "nodes": p.slurm.nodes,
                         "gpus_per_node": p.slurm.gpus_per_node, "path": str(path),
                         "description": p.description, "valid": True})
        except Exception as e:  # a broken profile is listed, not fatal
            rows.append({"name": name, "path": str(path), "valid": False,
                         "error": str(e).splitlines()[0]})
    if as_json:
        echo_json(rows)
        return
    for r in rows:   # a name is a file's name on disk: printed in the one printable form
        if r["valid"]:
            click.echo(f"{show(r['name'], 60):<18} {r['scheduler']:<6} {r['nodes']:>3} node(s) × "
                       f"{r['gpus_per_node']} GPU  {r['description']}")
        else:
            click.echo(f"{show(r['name'], 60):<18} INVALID: {printable(r['error'])}")


@profiles.command("show")
@click.argument("name")
@json_option
def show_cmd(name, as_json):
    """Show a profile with every default filled in.

    \b
    Example:
      hpctrain profiles show h100-ib-pyxis
    """
    path = find_profile(name)
    data = to_dict(load_profile(name))
    if as_json:
        echo_json({"path": str(path), "profile": data})
        return
    click.echo(f"# {path}")
    click.echo(yamlio.dump(data), nl=False)


@profiles.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def validate_cmd(files):
    """Check profile files; every problem is reported, exit code 2 if any.

    \b
    Example:
      hpctrain profiles validate cluster_profiles/*.yaml
    """
    failed = 0
    for f in files:
        try:
            _accepted(loader.load_profile(f))
            click.echo(f"{f}: ok")
        except Exception as e:
            failed += 1
            click.echo(f"Error: {e}", err=True)
    if failed:
        raise click.exceptions.Exit(2)


def _accepted(profile):
    """``profile``, once its scheduler's backend has accepted it (a local profile is one
    node); imported here, not at the top: listing profiles needs no backend otherwise."""
    from ..scheduler.choose import backend_for
    backend_for(profile)
    return profile
