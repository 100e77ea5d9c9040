"""Follow a run to its end: progress lines, attempt outcomes and requeues as they happen.

Used by ``hpctrain submit --wait`` (the local profile waits by default) and
``hpctrain logs --follow``. It reads only files in the run folder and the scheduler's view of
the run's jobs, so following can stop and restart at any time without touching the job.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from .runs import Run

NOISE = ("Warning", "warnings.warn", "UserWarning", "FutureWarning", "DeprecationWarning")


class Tail:
    """New complete lines of a file since the last call (the file may not exist yet).
    ``offset`` counts bytes: a line cut mid-write (or mid-character) waits for its end."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset
        self.partial = b""

    def lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *complete, self.partial = (self.partial + data).split(b"\n")
        return [line.decode(errors="replace") for line in complete]


def complete_lines(path: Path) -> tuple[list[str], int]:
    """The file's complete lines now, and the byte offset just after the last one (where a
    :class:`Tail` picks up without losing or repeating a line)."""
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    return data[:end].decode(errors="replace").splitlines(), end


def rank0_progress(line: str) -> bool:
    """Lines worth showing from rank 0's log: hpctrain's own, not library warnings."""
    return bool(line.strip()) and not any(n in line for n in NOISE) \
        and not line.startswith("submitit ")


def hpctrain_line(line: str) -> bool:
    return line.startswith("[hpctrain]")


def follow(run: Run, is_active: Callable[[], bool], echo: Callable[[str], None], *,
           poll_s: float = 1.0, rank: int | None = 0, attempt: int | None = None,
           line_filter: Callable[[str], bool] = rank0_progress, timeout_s: float | None = None,
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

    def tail(path: Path) -> Tail:
        return Tail(path, offsets.get(path, 0))
    tails: dict[int, Tail] = {}
    batch_tails: dict[int, Tail] = {}
    seen_ledger = len(run.ledger())
    start = time.time()
    idle_rounds = 0
    while True:
        attempts = [attempt] if attempt else [n for n in run.attempts_started()
                                               if from_attempt is None or n >= from_attempt]
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
        ledger = run.ledger()
        for rec in ledger[seen_ledger:]:
            echo(describe_attempt(rec))
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
    ledger = run.ledger()
    return ledger[-1] if ledger else {}


def describe_attempt(rec: dict) -> str:
    d = rec.get("decision", {})
    steps = f"steps {rec.get('start_step')}→{rec.get('end_step')}"
    then = ("requeued" if d.get("requeue") else "stopped") + (f": {d['reason']}" if d.get("reason") else "")
    why = (f"\n[hpctrain]   {rec['message']}"
           if rec.get("exit_reason") == "failed" and rec.get("message") else "")
    if rec.get("note"):
        why += f"\n[hpctrain]   {rec['note']}"
    return (f"[hpctrain] attempt {rec.get('attempt')} ended: {rec.get('exit_reason')} ({steps}, "
            f"{rec.get('duration_s')} s); {then}{why}")
