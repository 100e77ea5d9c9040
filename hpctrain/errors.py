"""Errors that hpctrain shows to users.

Every failure a user can cause (bad YAML, unknown profile, a layout that does not fit, sbatch
refusing a job) is raised as an `HpcTrainError`. The CLI turns it into ``Error: ...`` on stderr
and the error's exit code, never a traceback. Anything else escaping is a bug in hpctrain.
"""

from __future__ import annotations

from . import exit_codes


class HpcTrainError(Exception):
    """A failure the user can act on. ``str(err)`` is the complete message."""

    exit_code = exit_codes.FAILED


class UsageError(HpcTrainError):
    """Bad input: a file, a field, an option. Exit code 2, as for Click's own usage errors."""

    exit_code = exit_codes.USAGE


class ConfigError(UsageError):
    """One or more problems in a profile or job file, all reported at once.

    ``problems`` is a list of ``(field_path, message)`` pairs, e.g.
    ``("slurm.gpus_per_node", "expected an integer, got 'four'")``.
    """

    SHOWN = 50   # a file of a thousand mistakes gets a readable message, not a thousand lines

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = list(problems)
        super().__init__(self._format())

    def _format(self) -> str:
        if len(self.problems) == 1:
            path, msg = self.problems[0]
            return f"{self.source}: {path}: {msg}" if path else f"{self.source}: {msg}"
        lines = [f"{self.source} has {len(self.problems)} problems:"]
        lines += [f"  - {p}: {m}" if p else f"  - {m}" for p, m in self.problems[:self.SHOWN]]
        if len(self.problems) > self.SHOWN:
            lines.append(f"  - ... and {len(self.problems) - self.SHOWN} more")
        return "\n".join(lines)


class SubmissionError(HpcTrainError):
    """The scheduler refused a job; the message is what the scheduler said."""


class RunNotFoundError(UsageError):
    """A run name, folder or job id that matches no run folder."""
