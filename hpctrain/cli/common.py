"""Options, arguments and printing helpers shared by several commands (kept free of heavy
imports): the only module a command module imports from ``hpctrain.cli``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from .. import file_door
from ..config import DEFAULT_PROFILE, safety
from ..config.profile import MAX_NODES
from ..errors import HpcTrainError


class CheckedPath(click.Path):
    """A path option (or its environment variable) that may end up in the batch script and in
    file names: one line of text, no control characters, a usable length, checked before click
    looks at the file system (a NUL byte would make os.stat raise). Quoting does the rest."""

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            self.check_text(value, param, ctx)
            self.check_path(value, param, ctx)
        return super().convert(value, param, ctx)

    def check_path(self, value: str, param, ctx) -> None:
        """A blank value (click reads "" as ``.``, the current folder) and one behind a symlink
        loop (``file_door.resolve``; it read as "does not exist") are refused here, naming the
        option the user typed."""
        if not value.strip():
            self.fail(f"{safety.short(value)} is blank; give a path", param, ctx)
        try:
            file_door.resolve(os.path.expanduser(value))
        except file_door.Refused as e:
            self.fail(f"{file_door.show(value)} {e.why}; remove the loop or give another path",
                      param, ctx)

    def check_text(self, value: str, param, ctx) -> None:
        why = safety.text_problem(value, safety.PATH_MAX) or safety.path_problem(value)
        if why:
            source = f" (from ${param.envvar})" if _from_environment(param, ctx) else ""
            self.fail(f"{safety.short(value)}{source} {why}", param, ctx)


def _from_environment(param, ctx) -> bool:
    """Whether the option's value came from its environment variable."""
    if not getattr(param, "envvar", None) or ctx is None:
        return False
    source = ctx.get_parameter_source(param.name)
    return source is not None and source.name == "ENVIRONMENT"


class RunsRoot(CheckedPath):
    """``--runs-dir`` or ``$HPCTRAIN_RUNS_DIR``: checked as a runs root when it is read
    (``record.folder.usable_root``, the one door of runs roots), so a variable set to a file,
    a FIFO or ``~nouser/runs`` is refused naming the variable, not the option."""

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            from ..record.folder import usable_root
            self.check_text(value, param, ctx)
            usable_root(value, f"${param.envvar}" if _from_environment(param, ctx)
                        else "--runs-dir")
        return click.Path.convert(self, value, param, ctx)


def complete_profiles(ctx, param, incomplete: str):
    """Shell completion of ``-p``: the profile names ``hpctrain profiles list`` shows; what
    looks like a path (``./``, ``/``, ``~``, ``.yaml``) completes as a file."""
    from click.shell_completion import CompletionItem

    from ..config.loader import list_profiles
    if incomplete.startswith((".", "/", "~")) or "/" in incomplete:
        return [CompletionItem(incomplete, type="file")]
    try:   # a bad $HPCTRAIN_PROFILE_PATH completes nothing rather than print a traceback
        names = sorted(list_profiles())
    except (HpcTrainError, OSError):
        return []
    return [CompletionItem(name) for name in names if name.startswith(incomplete)]


profile_option = click.option(
    "--profile", "-p", "profile_name", default=DEFAULT_PROFILE, show_default=True, metavar="NAME|FILE",
    shell_complete=complete_profiles, help="Cluster profile: a name from `hpctrain profiles list` or a path to a YAML file.")
nodes_option = click.option("--nodes", "-N", type=click.IntRange(min=1, max=MAX_NODES), default=None,
                            help="Override the profile's node count.")
set_option = click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE",
    help="Change one value of the job (repeatable), with the keys and values of --sweep: "
         "--set train.lr=3e-4 --set train.steps=200.")


def job_options(f):
    """JOB, --profile, --nodes and --set: what every command that loads a job on a profile
    takes, in this order (render, its plan view, submit)."""
    for decorate in reversed((click.argument("job_file", metavar="JOB",
                                             type=click.Path(dir_okay=False)),
                              profile_option, nodes_option, set_option)):
        f = decorate(f)
    return f


def parsed_overrides(specs) -> dict:
    """``--set`` specs as a mapping (the errors of ``--sweep``)."""
    from ..submission.sweep_values import parse_overrides
    return parse_overrides(list(specs or ()))


json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
runs_dir_option = click.option(
    "--runs-dir", type=RunsRoot(file_okay=False, path_type=Path), default=None,
    envvar="HPCTRAIN_RUNS_DIR",
    help="Folder holding run folders (default: $HPCTRAIN_RUNS_DIR, the profile's "
         "storage.runs_root, or ./runs).")


def runs_root(runs_dir: Path | None) -> Path:
    """--runs-dir / $HPCTRAIN_RUNS_DIR, else the default profile's storage.runs_root, else ./runs."""
    from ..record.folder import runs_root as find_root
    return find_root(runs_dir)


def complete_runs(ctx, param, incomplete: str):
    """Shell completion of RUN: the run ids under the runs folder, newest first."""
    from click.shell_completion import CompletionItem

    from ..record.folder import iter_runs
    try:   # a TAB never prints a traceback: a bad runs root completes nothing
        root = runs_root(ctx.params.get("runs_dir"))
        runs = sorted(iter_runs(root), key=lambda r: r.path.stat().st_mtime, reverse=True)
    except (HpcTrainError, OSError):
        return []
    return [CompletionItem(r.id) for r in runs if r.id.startswith(incomplete)]


def run_argument(f):
    """RUN: a run folder, a run id, a job's name (its newest run), a unique prefix of a run id,
    or a job id the run submitted."""
    return click.argument("run_ref", metavar="RUN", shell_complete=complete_runs)(f)


def find(run_ref: str, runs_dir):
    """The run RUN names; a job's name is its newest run, and which one goes to stderr."""
    from ..record.folder import find_run
    return find_run(run_ref, runs_root(runs_dir), note=lambda message: click.echo(message, err=True))


def follow_in_terminal(run, *, job=None, quiet: bool = False,
                       from_attempt: int | None = None) -> None:
    """Print the run's progress until its jobs end, with a progress bar when a person watches;
    say how it finished, or raise with the reason it did not (``hpctrain.view.follow``)."""
    from ..errors import HpcTrainError
    from ..view.follow import follow_to_end
    from .progress import ProgressLine
    try:
        total = run.resolved_job().train.steps
    except HpcTrainError:
        total = None
    bar = ProgressLine(total, enabled=interactive() and not quiet, echo=click.echo)

    def on_poll(m: dict | None) -> None:
        m = m or {}
        bar.update(m.get("step"), f"loss {m['loss']:.4g}" if isinstance(m.get("loss"), float)
                   else "")
    try:
        last = follow_to_end(run, (lambda s: None) if quiet else bar.echo, job=job,
                             on_poll=on_poll, from_attempt=from_attempt)
    finally:
        bar.close()
    if not quiet:
        loss = last.get("last_loss")
        click.echo(f"Run {run.shown} finished at step {last.get('end_step')} "
                   f"(loss {f'{loss:.4f}' if isinstance(loss, float) else loss}).")


def echo_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def interactive() -> bool:
    """Progress bars and live output only when a person is watching."""
    return sys.stderr.isatty()


def warning_line(message: str) -> None:
    """``warning: <message>`` on stderr, one printable line (as ``Error:`` lines are): a path
    from ``$HOME`` or a file may hold an escape code or a line feed; it is shown escaped."""
    from ..file_door import printable
    click.echo(f"warning: {printable(str(message), keep='')}", err=True)
