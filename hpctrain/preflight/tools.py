"""The one door through which preflight runs external programs.

A missing tool, a timeout or a non-zero exit is data (``ToolResult``), never an exception:
the caller turns it into a warn/fail row with a fix. Tests put fake ``nvidia-smi``/``ibstat``
executables on PATH that replay real captured output.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass


@dataclass
class ToolResult:
    argv: list[str]
    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    missing: bool = False
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return not self.missing and not self.timed_out and self.returncode == 0

    def problem(self) -> str:
        """One line saying why the tool gave no usable output."""
        name = self.argv[0]
        if self.missing:
            return f"`{name}` is not on PATH"
        if self.timed_out:
            return f"`{' '.join(self.argv)}` did not finish in time"
        said = (self.stderr or self.stdout).strip().splitlines()
        return f"`{name}` exited with {self.returncode}" + (f": {said[-1]}" if said else "")


def run_tool(argv: list[str], timeout: float = 30.0) -> ToolResult:
    if shutil.which(argv[0]) is None:
        return ToolResult(argv, None, missing=True)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return ToolResult(argv, None, stdout=(e.stdout or b"").decode(errors="replace")
                          if isinstance(e.stdout, bytes) else (e.stdout or ""), timed_out=True)
    except OSError as e:
        return ToolResult(argv, None, stderr=str(e), missing=True)
    return ToolResult(argv, proc.returncode, proc.stdout, proc.stderr)
