"""A one-line progress bar for the waits a person watches (``submit --wait``, ``resume --wait``).

It is drawn on stderr and redrawn in place, under the log lines that keep scrolling on stdout.
When nobody is watching (stderr is not a terminal: CI, a pipe, ``--json``) it draws nothing,
so logs and scripts only ever see the plain lines.
"""

from __future__ import annotations

import sys
from typing import Callable, TextIO

CLEAR = "\r\x1b[K"


def render_bar(step: int | None, total: int | None, text: str = "", width: int = 28) -> str:
    """``[#######.............]  60/120  50%  loss 2.31`` (pure: the tests check it)."""
    if not total or step is None:
        return f"[{'.' * width}]  waiting  {text}".rstrip()
    frac = min(1.0, max(0.0, step / total))
    filled = int(round(frac * width))
    return f"[{'#' * filled}{'.' * (width - filled)}]  {step}/{total}  {100 * frac:3.0f}%  {text}".rstrip()


class ProgressLine:
    def __init__(self, total: int | None, *, enabled: bool, echo: Callable[[str], None],
                 stream: TextIO | None = None) -> None:
        self.total = total
        self.enabled = enabled
        self._echo = echo
        self.stream = stream or sys.stderr
        self.shown = ""

    def update(self, step: int | None, text: str = "") -> None:
        if not self.enabled:
            return
        self.shown = render_bar(step, self.total, text)
        self.stream.write(CLEAR + self.shown)
        self.stream.flush()

    def echo(self, line: str) -> None:
        """Print a log line above the bar (the bar is cleared, then drawn again)."""
        if self.enabled and self.shown:
            self.stream.write(CLEAR)
            self.stream.flush()
        self._echo(line)
        if self.enabled and self.shown:
            self.stream.write(self.shown)
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.shown:
            self.stream.write(CLEAR)
            self.stream.flush()
            self.shown = ""
