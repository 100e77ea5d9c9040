"""The ``hpctrain`` command line: a thin Click layer over the library.

Commands are registered by name and imported only when used (or listed by ``--help``), and no
command module imports torch or megatron at import time: ``hpctrain --help`` and
``hpctrain render`` must start fast. Every ``HpcTrainError`` becomes ``Error: <message>`` on
stderr with the error's exit code (2 for usage errors); an unexpected exception becomes a
one-line internal error (``HPCTRAIN_DEBUG=1`` shows the traceback); Ctrl-C and SIGTERM stop a
command through the same door (``Interrupted.``/``Terminated.``, exit 130/143), after what it
cleans up on the way out.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading

import click

from .. import __version__
from ..errors import HpcTrainError, from_os_error

# name -> "module:attribute" (modules under hpctrain.cli)
COMMANDS = {
    "profiles": "profiles_cmd:profiles",
    "validate": "render_cmd:validate",
    "render": "render_cmd:render",
    "submit": "submit_cmd:submit",
    "plan": "plan_cmd:plan",
    "preflight": "preflight_cmd:preflight",
    "data": "data_cmd:data",
    "runs": "runs_cmd:runs",
    "status": "runs_cmd:status",
    "logs": "runs_cmd:logs",
    "cancel": "runs_cmd:cancel",
    "requeue": "runs_cmd:requeue",
    "resume": "runs_cmd:resume",
    "report": "report_cmd:report",
    "sync": "sync_cmd:sync",
    "bench": "bench_cmd:bench",
}


class LazyGroup(click.Group):
    """A group that imports a command's module only when that command is needed."""

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        target = COMMANDS.get(name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(f"{__name__}.{module_name}"), attr)

    def invoke(self, ctx):
        previous = _stop_on_sigterm()
        try:
            try:
                return super().invoke(ctx)
            finally:
                _restore_sigterm(previous)
                sys.stdout.flush()   # a closed pipe shows here, not at interpreter exit
        except BrokenPipeError:
            end_on_closed_pipe()
        except HpcTrainError as e:
            error_line(e)
            ctx.exit(e.exit_code)
        except OSError as e:   # the one place a filesystem error becomes a message
            if debugging():
                raise
            err = from_os_error(e)
            error_line(err)
            ctx.exit(err.exit_code)
        except KeyboardInterrupt as e:   # Ctrl-C, or SIGTERM (Terminated): the same clean-up ran
            signum = e.signum if isinstance(e, Terminated) else signal.SIGINT
            word = "Terminated" if signum == signal.SIGTERM else "Interrupted"
            note = getattr(e, "note", None)     # what the interrupted code says of it
            from ..file_door import printable
            click.echo(f"{word}: {printable(note)}" if note else f"{word}.", err=True)
            ctx.exit(128 + signum)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except Exception as e:  # a bug in hpctrain: say so in one line, keep the traceback opt-in
            if debugging():
                raise
            click.echo(f"Error: internal error: {type(e).__name__}: {e} "
                       "(set HPCTRAIN_DEBUG=1 for the traceback)", err=True)
            ctx.exit(1)


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, a session ending) stops a command the way Ctrl-C does:
    raised where the command is, so what it cleans up on an interruption (a run folder it was
    preparing, a temporary file) is cleaned up, then one line and exit 143. Python's default
    for SIGTERM ends the process at once, leaving such things half-made."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__()
        self.signum = signum


def _raise_terminated(signum, frame):
    raise Terminated(signum)


def _stop_on_sigterm():
    """Install the SIGTERM handler for the command's run (main thread only; a command that
    installs its own handlers keeps them); the previous handler, to restore, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None   # someone chose already (ignored, or a handler of a caller's)
    return signal.signal(signal.SIGTERM, _raise_terminated)


def _restore_sigterm(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def error_line(error: Exception) -> None:
    """``Error: <message>`` on stderr, printable: a message quotes values with
    ``file_door.show`` where it is built (so a usage error is one line), and this door escapes
    whatever one still holds (an escape code from a file or the environment) instead of
    printing it. Line feeds stay: what sbatch said when it refused a job is quoted whole,
    line by line."""
    from ..file_door import printable
    click.echo(f"Error: {printable(str(error))}", err=True)


def debugging() -> bool:
    """``HPCTRAIN_DEBUG`` asks for tracebacks: any value but empty, ``0``, ``false``, ``no`` or
    ``off`` (any case), so ``HPCTRAIN_DEBUG=0`` turns them off as it reads."""
    return os.environ.get("HPCTRAIN_DEBUG", "").strip().lower() not in ("", "0", "false", "no",
                                                                       "off")


def _show_usage_error(self, file=None) -> None:
    """Click's usage errors in one line, as every other error of the CLI: the message and
    where the help is (click prints the usage, a hint and a blank line before it)."""
    if file is None:
        file = click.get_text_stream("stderr")
    where = f" (see `{self.ctx.command_path} --help`)" if self.ctx is not None else ""
    message = " ".join(self.format_message().split())   # click's own may span lines
    if len(message) > 480:   # and quote back a value of any length: its start and end say enough
        message = f"{message[:300]} ... {message[-160:]}"
    click.echo(f"Error: {message}{where}", file=file)


click.exceptions.UsageError.show = _show_usage_error


def end_on_closed_pipe():
    """The reader of our output went away (``hpctrain plan ... | head -1``): end quietly, as
    Unix tools do, with the status of a process killed by SIGPIPE. Whatever is still buffered
    goes to /dev/null, so the interpreter's own flush at exit does not complain either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(128 + 13)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"],
                                              "max_content_width": 100})
@click.version_option(__version__, prog_name="hpctrain")
def cli():
    """Train large models on Slurm from a YAML description: render, plan, preflight, submit,
    and keep the run alive through preemption.

    \b
    Example:
      hpctrain submit examples/tiny.yaml              # the local profile, this machine
      hpctrain submit examples/tiny.yaml --profile dev-slurm
      hpctrain status tiny-gpt                        # attempts, step, loss, checkpoints
    """


def main(argv=None):
    """Console-script entry point."""
    try:
        cli.main(args=argv, prog_name="hpctrain", standalone_mode=True)
    except SystemExit as e:
        sys.exit(e.code)
