"""When is a job hung, and which rank stopped first.

A job is hung when **no** rank has made progress for the limit: in synchronous training one
stuck rank stops every other within a step (they wait for it in the next collective), and a
rank that is merely waiting while another works (rank 0 writing a manifest, a slow load) is
not a hang as long as someone still advances. The limit is the largest one the ranks report
in their heartbeats (``health.hang_timeout_s``, or derived from the measured step time; a
silent rank's stale report does not count while others still beat).

Which rank to blame, in this order:

1. a rank whose heartbeat file stopped changing (its side thread no longer runs: the process
   is stopped, dead, or its node is gone) — the longest silent first;
2. the rank at the lowest step;
3. a rank that issued fewer collectives on a process group than a peer of that group: the
   peers are waiting in a collective it never reached;
4. the rank without progress for longest.

The others stopped *because of* it and also stop beating progress, a little later: a rank
stopped with SIGSTOP is silent, the ranks waiting on it still beat and are behind nobody.
``HangMonitor`` measures staleness with the reader's own clock, so the nodes' clocks need not
agree. The verdict goes to ``logs/attempt-N/hang.json``, created exclusively: whoever decides
first (the batch shell's watcher, or a rank's watchdog where no watcher runs) wins, and every
other reader acts on that one verdict.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .heartbeat import EXITING, Beat

VERDICT_FILE = "hang.json"
STACKS_PATTERN = "stacks-rank-*.txt"


def stacks_path(attempt_dir: Path, rank: int) -> Path:
    return Path(attempt_dir) / f"stacks-rank-{rank}.txt"


def _idle_past(seconds: float, limit: float) -> float:
    """A judged rank's idle seconds to a tenth, as the verdict records them: rounded up where
    rounding to the nearest would give the limit itself (10.04 s judged past 10 s is 10.1, not
    10.0, which would read as not past it)."""
    shown = round(seconds, 1)
    return shown if shown > limit else math.ceil(seconds * 10) / 10


@dataclass
class Verdict:
    rank: int
    node: str
    pid: int
    step: int | None
    phase: str
    idle_s: float
    limit_s: float
    why: str
    silent_s: float | None = None
    start_step: int | None = None       # the attempt's first step (from the heartbeats)
    end_step: int | None = None         # the most steps any rank completed
    detected_at: float = 0.0            # epoch seconds, the decider's clock
    decided_by: str = ""
    stacks: str = ""                    # where the stack dumps go
    ranks: dict[str, dict] = field(default_factory=dict)   # every rank's state at the verdict

    @property
    def message(self) -> str:
        text = (f"rank {self.rank} on {self.node or '?'} made no progress for "
                f"{self.idle_s:.0f} s; last step {self.step if self.step is not None else 'none'}"
                f" ({self.phase}); {self.why}")
        return text + (f"; stacks in {self.stacks}" if self.stacks else "")

    def to_dict(self) -> dict:
        return {**asdict(self), "message": self.message}

    @classmethod
    def from_dict(cls, data: dict) -> "Verdict":
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


class HangMonitor:
    """Reads the ranks' beats over time and says when the job is hung, and who stopped first.

    ``beat_s``: how often the ranks write (a rank is *silent* when its file has not changed for
    ``silent_after_s``, by default three beats and at least 15 s)."""

    def __init__(self, beat_s: float, silent_after_s: float | None = None) -> None:
        self.silent_after_s = silent_after_s if silent_after_s is not None else max(15.0, 3 * beat_s)
        self.beats: dict[int, Beat] = {}
        self._seen_at: dict[int, float] = {}     # rank -> our clock when its beat last changed

    def update(self, beats: dict[int, Beat], now: float) -> None:
        for rank, beat in beats.items():
            old = self.beats.get(rank)
            if old is None or old.beat_at != beat.beat_at or old.pid != beat.pid:
                self._seen_at[rank] = now
            self.beats[rank] = beat

    def silent_s(self, rank: int, now: float) -> float:
        return max(0.0, now - self._seen_at[rank])

    def idle_s(self, rank: int, now: float) -> float:
        return self.beats[rank].idle_at_beat + self.silent_s(rank, now)

    def limit_s(self, now: float | None = None) -> float | None:
        """The largest limit the ranks report; a silent rank's last report does not count while
        others beat (it may predate the first step, when the limit is the rendezvous's)."""
        beating = [b.limit_s for r, b in self.beats.items() if b.limit_s and (
            now is None or self.silent_s(r, now) <= self.silent_after_s)]
        limits = beating or [b.limit_s for b in self.beats.values() if b.limit_s]
        return max(limits) if limits else None

    def behind(self) -> dict[int, tuple[str, int, int]]:
        """rank -> (group, its collectives, the most a peer issued) for ranks that issued fewer
        collectives on a group than a peer did."""
        groups: dict[str, dict[int, int]] = {}
        for rank, beat in self.beats.items():
            for group, seq in beat.collectives.items():
                groups.setdefault(group, {})[rank] = seq
        out: dict[int, tuple[str, int, int]] = {}
        for group, seqs in sorted(groups.items()):
            top = max(seqs.values())
            for rank, seq in seqs.items():
                if seq < top and rank not in out:
                    out[rank] = (group, seq, top)
        return out

    def check(self, now: float, decided_by: str = "") -> Verdict | None:
        """The verdict when no rank made progress for the limit; else None. A rank whose last
        beat says it is exiting (its attempt ended as every rank agreed: ``heartbeat.EXITING``)
        is not hung, however long its process takes to go; only the others are judged."""
        limit = self.limit_s(now)
        working = {r: b for r, b in self.beats.items() if b.phase != EXITING}
        if not working or limit is None:
            return None
        idle = {r: self.idle_s(r, now) for r in working}
        if min(idle.values()) <= limit:
            return None
        silent = {r: self.silent_s(r, now) for r in working}
        behind = self.behind()
        steps = [b.step for b in working.values() if b.step is not None]

        def blame(rank: int):
            beat, quiet = self.beats[rank], silent[rank] > self.silent_after_s
            return (0 if quiet else 1, -silent[rank] if quiet else 0.0,
                    beat.step if beat.step is not None else -1,
                    0 if rank in behind else 1, -idle[rank], rank)

        rank = min(working, key=blame)
        beat = self.beats[rank]
        if silent[rank] > self.silent_after_s:
            why = (f"its heartbeat stopped {silent[rank]:.0f} s ago: the process is stopped, dead "
                   f"or its node is gone; the other ranks wait for it")
        elif steps and beat.step is not None and beat.step < max(steps):
            why = f"it is at step {beat.step}, the others at up to {max(steps)}"
        elif rank in behind:
            group, seq, top = behind[rank]
            why = (f"its peers in process group {group} wait in a collective it never issued "
                   f"({seq} of their {top} collectives)")
        else:
            why = "it has gone longest without progress"
        if beat.where:
            why += f"; its main thread: {beat.where}"
        starts = [b.start_step for b in working.values() if b.start_step is not None]
        return Verdict(
            rank=rank, node=beat.node, pid=beat.pid, step=beat.step, phase=beat.phase,
            idle_s=_idle_past(idle[rank], limit), limit_s=limit, why=why,
            silent_s=round(silent[rank], 1) if silent[rank] > self.silent_after_s else None,
            start_step=min(starts) if starts else None, end_step=max(steps) if steps else None,
            detected_at=time.time(), decided_by=decided_by,
            ranks={str(r): {"node": b.node, "step": b.step, "phase": b.phase,
                            "idle_s": round(idle[r], 1), "silent_s": round(silent[r], 1),
                            "where": b.where, "behind": list(behind[r]) if r in behind else None}
                   for r, b in sorted(working.items())})


def verdict_path(attempt_dir: Path) -> Path:
    return Path(attempt_dir) / VERDICT_FILE


def claim_verdict(attempt_dir: Path, verdict: Verdict) -> Verdict:
    """Record ``verdict`` unless one is already there; return the one that stands. Written
    through the write door and linked into place (``exclusive``): the link fails when a
    verdict exists (or something else is where it goes), and a reader never sees a
    half-written one."""
    from ..errors import NotRegularFileError
    from ..outputs import write_atomic
    try:
        write_atomic(verdict_path(attempt_dir), json.dumps(verdict.to_dict(), indent=1),
                     exclusive=True)
    except (FileExistsError, NotRegularFileError):
        return read_verdict(attempt_dir) or verdict
    return verdict


def read_verdict(attempt_dir: Path) -> Verdict | None:
    from ..record import reader
    try:
        data = reader.read_json(verdict_path(attempt_dir))
        return None if data is None else Verdict.from_dict(data)
    except (reader.DamagedFile, ValueError, TypeError, KeyError):
        return None
