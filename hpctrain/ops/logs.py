"""``hpctrain logs``: which file is "the log" of a run, and following it across requeues.

Logs live in ``logs/attempt-N/``: ``rank-R.log`` per rank and ``batch.log`` for the batch shell.
When the asked-for file is not there, the error lists what is, so the next command is obvious.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from ..errors import UsageError
from ..record.folder import RunFolder


def ranks_logged(run: RunFolder, attempt: int) -> list[int]:
    d = run.attempt_dir(attempt)
    if not d.is_dir():
        return []
    found = [re.fullmatch(r"rank-(\d+)\.log", p.name) for p in d.iterdir()]
    return sorted(int(m.group(1)) for m in found if m)


def check_submitted(run: RunFolder, nothing: str = "so there are no logs") -> None:
    """A UsageError when ``run`` is a dry run (``submit --dry-run``: a run folder and a script,
    no job ever submitted), with how to submit the job: it will never have a log, so neither
    reading nor following one can say anything else; and ``requeue`` or ``resume`` would
    submit a job that skipped what ``submit`` does first (preparing the data), so they refuse
    it too (``nothing``: what the command cannot do, in words)."""
    meta = run.meta()
    if not meta.get("dry_run") or meta.get("jobs"):
        return
    import os
    import shlex
    from ..file_door import show
    source, profile = meta.get("job_source") or "", meta.get("profile") or ""
    if source and os.path.isfile(source) and show(source) == source and show(profile) == profile:
        how = f"`hpctrain submit {shlex.quote(source)} --profile {shlex.quote(profile)}`"
        if meta.get("overrides"):
            how += " with the same --set values"
        if meta.get("sweep"):
            how += " and --sweep values"
    else:
        how = "`hpctrain submit` as before, without --dry-run"
    script = f" (its script is {show(run.script_file)})" if run.script_file.is_file() else ""
    raise UsageError(f"run {run.shown} is a dry run: nothing was submitted, {nothing}"
                     f"{script}; submit it with {how}")


def choose_log(run: RunFolder, *, rank: int, attempt: int | None, batch: bool,
               must_exist: bool = True) -> Path | None:
    """The log file asked for; None when following a run whose first attempt has not begun.
    A dry run (never submitted) is refused whether followed or not: no log will ever come."""
    started = run.attempts_started()
    if not started:
        check_submitted(run)
    if attempt is None:
        if not started:
            if not must_exist:
                return None
            raise UsageError(f"run {run.shown} has no attempt yet (its job has not started: "
                             f"`hpctrain status {run.shown}` says why; `hpctrain logs "
                             f"{run.shown} -f` waits)")
        attempt = started[-1]
    elif attempt not in started:
        have = f"attempts {', '.join(map(str, started))}" if started else "no attempt yet"
        raise UsageError(f"--attempt {attempt}: run {run.shown} has {have}")
    path = run.attempt_dir(attempt) / "batch.log" if batch else run.rank_log(attempt, rank)
    if must_exist and not path.exists():
        ranks = ranks_logged(run, attempt)
        have = (f"rank logs {', '.join(map(str, ranks))}" if ranks else "no rank logs")
        if batch:   # the batch shell of a Slurm job writes it; a local run has none
            fix = ("drop --batch to read a rank's log (--rank)" if ranks else
                   "pick another attempt with --attempt")
            raise UsageError(f"no batch.log in attempt {attempt} of run {run.shown} (it has {have}; "
                             f"only a Slurm job's batch shell writes one); {fix}")
        raise UsageError(f"no {path.name} in attempt {attempt} of run {run.shown} (it has {have}"
                         f"{' and batch.log' if (run.attempt_dir(attempt) / 'batch.log').exists() else ''}); "
                         "pick one with --rank or --batch")
    return path


def follow_logs(run: RunFolder, *, rank: int | None, attempt: int | None,
                shown: tuple[Path, int] | None, echo: Callable[[str], None],
                poll_s: float = 1.0) -> None:
    """Print new lines until the run has no pending or running job; with no ``attempt``, go on
    into the attempts that follow (requeues). What was already printed is not repeated; a rank
    log is shown whole, with the batch shell's ``[hpctrain]`` lines (signals, requeues) between.
    ``shown``: the file already printed and the byte offset its printing stopped at."""
    from ..scheduler.state import live_jobs
    from ..view.follow import complete_lines, follow, hpctrain_line
    current = attempt or (run.attempts_started() or [1])[-1]
    offsets = {}
    if shown is not None:
        offsets[shown[0]] = shown[1]
        if rank is not None:  # the batch lines of this attempt were not printed: start at the end
            batch = run.attempt_dir(current) / "batch.log"
            if batch.exists():
                offsets[batch] = complete_lines(batch)[1]
    follow(run, lambda: bool(live_jobs(run)), echo, poll_s=poll_s, rank=rank, attempt=attempt,
           from_attempt=current, line_filter=lambda line: True,
           batch_filter=(lambda line: True) if rank is None else hpctrain_line,
           start_offsets=offsets)
