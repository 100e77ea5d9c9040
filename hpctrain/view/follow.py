"""Follow a run to its end: progress lines, attempt outcomes and requeues as they happen.

The one home of following: ``hpctrain submit --wait``, ``requeue``/``resume --wait``, a local
sweep's runs, ``hpctrain logs --follow`` and ``Run.wait()`` all go through here. It reads only
files in the run folder and the scheduler's view of the run's jobs, so following can stop and
restart at any time without touching the job.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import HpcTrainError
from ..exit_codes import ExitReason
from ..file_door import printable, show
from .. import limits
from ..record import reader
from ..record.folder import RunFolder, is_run_folder
from ..scheduler.state import live_jobs

# runtime.checkpoint.save_faults.TRACEBACK_HEADER (the view does not import the runtime)
TRACEBACK_HEADER = "the traceback (kept in this rank's log):"
NOISE = ("Warning", "warnings.warn", "UserWarning", "FutureWarning", "DeprecationWarning")


class Tail:
    """New complete lines of a file since the last call (the file may not exist yet).
    ``offset`` counts bytes: a line cut mid-write (or mid-character) waits for its end.

    The unfinished line is held to its last ``limits.FOLLOWED_LINE_BYTES`` (a progress bar
    redrawn with carriage returns for hours is one line that never ends): what was let go is
    counted, and the line, once complete, says how much of its start is not shown."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset
        self.partial = b""
        self.dropped = 0          # bytes let go from the start of the unfinished line

    def lines(self) -> list[str]:
        """Through the run-folder reader: a FIFO or a link to a device in the log's place is
        an error naming it, and each call reads at most ``limits.RUN_LOG_BYTES``."""
        data = reader.read_from(self.path, self.offset, limits.RUN_LOG_BYTES)
        if data is None:
            return []
        self.offset += len(data)
        *complete, partial = (self.partial + data).split(b"\n")
        out = [printable(line.decode(errors="replace")) for line in complete]
        if complete and self.dropped:
            out[0] = f"[{self.dropped:,} bytes of this line not shown] {out[0]}"
            self.dropped = 0
        excess = len(partial) - limits.FOLLOWED_LINE_BYTES
        if excess > 0:
            self.dropped += excess
            partial = partial[excess:]
        self.partial = partial
        return out


def complete_lines(path: Path) -> tuple[list[str], int]:
    """The file's complete lines now, and the byte offset just after the last one (where a
    :class:`Tail` picks up without losing or repeating a line)."""
    data, start = log_end(path)
    end = data.rfind(b"\n") + 1
    return _lines(reader.decode(data[:end], path, strict=False)), start + end


def log_end(path: Path) -> tuple[bytes, int]:
    """A log's last ``limits.RUN_LOG_BYTES`` from the start of a line, and the offset where
    they start (a log can be huge; only its end is read)."""
    got = reader.tail_bytes(path, limits.RUN_LOG_BYTES)
    if got is None:
        return b"", 0
    data, size = got
    start = size - len(data)
    if start:                                  # the first line is cut by the seek
        cut = data.find(b"\n") + 1
        data, start = (data[cut:], start + cut) if cut else (b"", size)
    return data, start


def all_lines(path: Path) -> list[str]:
    """Every line of the log's end (:func:`log_end`), the unfinished last one included."""
    return _lines(reader.decode(log_end(path)[0], path, strict=False))


def _lines(text: str) -> list[str]:
    """A log's text as the lines ``logs`` and the followers print: each in the printable form
    (``file_door.printable``: an escape code a rank printed is shown, not acted on; bytes
    that are not UTF-8 are already U+FFFD)."""
    return [printable(line) for line in text.splitlines()]


class Rank0Progress:
    """Lines worth showing from rank 0's log: hpctrain's own, not library warnings, nor the
    indented source line Python prints under a warning (``  return func(*args, **kwargs)``)."""

    def __init__(self) -> None:
        self.after_warning = False

    def __call__(self, line: str) -> bool:
        if self.after_warning and line.startswith((" ", "\t")):
            return False
        if line.endswith(TRACEBACK_HEADER):   # a save fault's traceback: the rank log keeps it
            self.after_warning = True
            return False
        self.after_warning = any(n in line for n in NOISE)
        return bool(line.strip()) and not self.after_warning and not line.startswith("submitit ")


def hpctrain_line(line: str) -> bool:
    return line.startswith("[hpctrain]")


def follow(run: RunFolder, is_active: Callable[[], bool], echo: Callable[[str], None], *,
           poll_s: float = 1.0, rank: int | None = 0, attempt: int | None = None,
           line_filter: Callable[[str], bool] | None = None, timeout_s: float | None = None,
           from_attempt: int | None = None,
           batch_filter: Callable[[str], bool] = hpctrain_line,
           start_offsets: dict[Path, int] | None = None) -> dict:
    """Print the run's progress until ``is_active()`` turns false; return the last ledger record.

    ``attempt`` None follows whichever attempt is current (across requeues); a number follows
    only that attempt. ``from_attempt`` skips older attempts' logs (``hpctrain logs --follow``
    starts at the current one). ``rank`` None shows the batch shell's log only.
    ``start_offsets`` skips what was already shown of some files (path -> bytes).
    """
    offsets = start_offsets or {}
    line_filter = line_filter or Rank0Progress()

    def tail(path: Path) -> Tail:
        return Tail(path, offsets.get(path, 0))
    tails: dict[int, Tail] = {}
    batch_tails: dict[int, Tail] = {}
    seen_ledger = len(run.ledger())
    start = time.time()
    idle_rounds = 0
    # A ledger record is shown one round after it appeared: rank 0 appends it and then logs
    # the requeue decision, so the logs read in the next round hold the lines that came
    # before it (read in the same round, the record could print before "no requeue: ...").
    held: list[dict] = []
    with _stopping_follow(run):
        while True:
            attempts = [attempt] if attempt else [
                n for n in run.attempts_started() if from_attempt is None or n >= from_attempt]
            for n in attempts:
                if rank is not None:
                    if n not in tails:
                        tails[n] = tail(run.rank_log(n, rank))
                    for line in tails[n].lines():
                        if line_filter(line):
                            echo(line)
                if n not in batch_tails:
                    batch_tails[n] = tail(run.attempt_dir(n) / "batch.log")
                for line in batch_tails[n].lines():
                    if batch_filter(line):
                        echo(line)
            for rec in held:
                echo(describe_attempt(rec))
            if not is_run_folder(run.path):
                # removed meanwhile (`runs rm`, by hand): its records are gone with it, so "no
                # job is running" would be read from nothing and the follow end as if the run
                # had
                raise HpcTrainError(f"run folder {show(run.path)} was removed while it was "
                                    "being followed; stopped following (`hpctrain runs` "
                                    "lists the runs there are)")
            ledger = run.ledger()
            held = ledger[seen_ledger:]
            seen_ledger = len(ledger)
            if not is_active():
                idle_rounds += 1
                if idle_rounds >= 2:  # one more round to drain the logs after the job ended
                    break
            else:
                idle_rounds = 0
            if timeout_s is not None and time.time() - start > timeout_s:
                break
            time.sleep(poll_s)
        for rec in held:              # seen in the last round: after every line there was
            echo(describe_attempt(rec))
        ledger = run.ledger()
        return ledger[-1] if ledger else {}


def describe_attempt(rec: dict) -> str:
    """A ledger record as the followers print it, its values (read from the run folder) in the
    printable form."""
    return printable(_describe_attempt(rec))


def _describe_attempt(rec: dict) -> str:
    d = rec.get("decision") or {}
    steps = f"steps {rec.get('start_step')}→{rec.get('end_step')}"
    then = ("requeued" if d.get("requeue") else "stopped") + (f": {d['reason']}" if d.get("reason") else "")
    why = (f"\n[hpctrain]   {rec['message']}"
           if rec.get("exit_reason") == "failed" and rec.get("message") else "")
    if rec.get("note"):
        why += f"\n[hpctrain]   {rec['note']}"
    return (f"[hpctrain] attempt {rec.get('attempt')} ended: {rec.get('exit_reason')} ({steps}, "
            f"{rec.get('duration_s')} s); {then}{why}")


@contextlib.contextmanager
def _stopping_follow(run: RunFolder):
    """Ctrl-C (or SIGTERM) while following stops the following, never the run: the CLI's
    interruption line says so (the note on the exception) instead of a bare "Interrupted."."""
    try:
        yield
    except KeyboardInterrupt as e:
        e.note = (f"stopped following; run {run.shown} goes on (`hpctrain logs {run.id} -f` "
                  f"follows it again, `hpctrain cancel {run.id}` stops it)")
        raise


# ---- following a run to its end ---------------------------------------------------------------


def follow_run(run: RunFolder, echo: Callable[[str], None] | None = None, *,
               on_poll: Callable[[dict | None], None] | None = None,
               from_attempt: int | None = None, poll_s: float = 1.0,
               timeout_s: float | None = None, last_record: bool = True) -> dict:
    """Follow ``run`` until none of its training jobs is pending or running; return the last
    ledger record ({} when no attempt ended, or without ``last_record``: then, silent, it
    reads only run.yaml). ``echo`` gets rank 0's and the batch shell's progress lines and one
    line per attempt that ended (None: silent); ``on_poll`` gets the newest metrics record on
    every poll (a progress bar). Past ``timeout_s``: TimeoutError."""
    start = time.monotonic()

    def active() -> bool:
        running = bool(live_jobs(run))
        if on_poll is not None:
            on_poll(run.latest_metrics())
        if running and timeout_s is not None and time.monotonic() - start > timeout_s:
            raise TimeoutError(f"run {run.shown} still has a pending or running job after "
                               f"{timeout_s:g} s")
        return running
    if echo is None:   # nothing to show: only the scheduler's view, no log reading
        with _stopping_follow(run):
            while active():
                time.sleep(poll_s)
        time.sleep(min(poll_s, 1.0))   # the ledger record is written as the job ends
        if not last_record:
            return {}
        ledger = run.ledger()
        return ledger[-1] if ledger else {}
    return follow(run, active, echo, poll_s=poll_s, from_attempt=from_attempt)


def failure_detail(job: Any) -> str:
    """What went wrong, from submitit's error pickle (the traceback's last lines) if any."""
    try:
        exc = job.exception()
    except Exception:   # no result pickle, or one submitit cannot read: nothing to add
        return ""
    if exc is None:
        return ""
    lines = [ln for ln in str(exc).splitlines() if ln.strip() and not ln.startswith("-" * 10)]
    return "\n".join(lines[-6:])


def unfinished_reason(run: RunFolder, last: dict, job: Any = None) -> str | None:
    """None when the run finished; else why not, in one message naming the way to its logs."""
    reason = last.get("exit_reason")
    if reason == ExitReason.FINISHED:
        return None
    detail = failure_detail(job) if job is not None else ""
    msg = (f"run {run.shown} did not finish: last attempt ended with {reason or 'no record'}"
           + (f" ({last['decision']['reason']})" if (last.get("decision") or {}).get("reason")
              else "")
           + (f"; {last['message']}" if reason == ExitReason.FAILED and last.get("message") else "")
           + f"; see `hpctrain logs {run.shown}`")
    return msg + (f"\n{detail}" if detail else "")


def follow_to_end(run: RunFolder, echo: Callable[[str], None] | None = None, *, job: Any = None,
                  on_poll: Callable[[dict | None], None] | None = None,
                  from_attempt: int | None = None, poll_s: float = 1.0) -> dict:
    """``follow_run``, then raise HpcTrainError with the reason unless the run finished
    (``job``: submitit's job, whose error pickle adds the traceback's last lines)."""
    last = follow_run(run, echo, on_poll=on_poll, from_attempt=from_attempt, poll_s=poll_s)
    why = unfinished_reason(run, last, job)
    if why:
        raise HpcTrainError(why)
    return last


def wait_for_runs(runs: list[RunFolder], echo: Callable[[str], None] | None = None,
                  poll_s: float = 2.0) -> dict[Path, str]:
    """Wait until none of ``runs`` has a pending or running job (one scheduler query per poll
    for all of them); return each run's final state, saying how each ended through ``echo``."""
    from .runview import build_views
    pending = {r.path for r in runs}
    states: dict[Path, str] = {}
    while pending:
        for view in build_views([r for r in runs if r.path in pending]):
            if not view.active_jobs:
                pending.discard(view.run.path)
                states[view.run.path] = view.state
                if echo is not None:
                    echo(f"run {view.run.shown}: {view.state} at step {view.step}")
        if pending:
            time.sleep(poll_s)
    return states


def wait_for_preflight_report(run: RunFolder, job: Any, limit_s: float,
                              on_progress: Callable[[str], None] | None = None) -> dict | None:
    """The report a preflight job's rank 0 writes (``RUN/preflight/report-*.json``), once it is
    there; None when the job ended without one or ``limit_s`` passed. ``on_progress`` gets the
    checks' progress messages as they are written."""
    pdir = run.path / "preflight"
    deadline = time.monotonic() + limit_s
    shown = 0
    progress = pdir / "progress.jsonl"
    seen_done_at = None
    while time.monotonic() < deadline:
        if on_progress is not None and progress.exists():
            try:
                lines = reader.read_jsonl(progress)
            except reader.DamagedFile:
                lines = []
            for line in lines[shown:]:
                if isinstance(line.get("msg"), str):
                    on_progress(line["msg"])
            shown = len(lines)
        reports = sorted(pdir.glob("report-*.json"))
        if reports:
            try:
                report = reader.read_json(reports[-1])
            except reader.DamagedFile:   # being written: read it on the next round
                report = None
            if report is not None:
                return report
        if _job_done(job):
            seen_done_at = seen_done_at or time.monotonic()
            if time.monotonic() - seen_done_at > 5:  # ended without a report
                return None
        time.sleep(0.5)
    return None


def _job_done(job: Any) -> bool:
    try:
        return job.done()
    except Exception:   # the scheduler could not be asked this time: ask again next round
        return False
