"""The console script's first code: a Ctrl-C or SIGTERM that arrives while the command line is
still being imported (click, the CLI's modules: tens of milliseconds) ends the command as one
arriving later does, with one line and exit 130 or 143, not an import traceback.

Nothing has been written by then, so there is nothing to clean up: the early handler ends the
process at once. Once the CLI is imported its own handling takes over (``hpctrain.cli``:
``Interrupted.``/``Terminated.`` after the command's clean-up). A signal the caller chose to
ignore (a shell's background job ignores SIGINT) stays ignored."""

from __future__ import annotations

import os
import signal


def _end_now(signum, frame) -> None:
    word = "Terminated." if signum == signal.SIGTERM else "Interrupted."
    os.write(2, (word + "\n").encode())
    os._exit(128 + signum)


def main(argv=None):
    early = {}
    for signum, default in ((signal.SIGINT, signal.default_int_handler),
                            (signal.SIGTERM, signal.SIG_DFL)):
        if signal.getsignal(signum) is default:
            early[signum] = signal.signal(signum, _end_now)
    try:
        from .cli import main as cli_main
    finally:
        for signum, previous in early.items():
            signal.signal(signum, previous)
    return cli_main(argv)
