"""A rank's heartbeat: one small JSON file per rank, rewritten by a side thread.

``logs/attempt-N/heartbeat/rank-R.json`` holds what the rank last did (``step``: steps
completed; ``phase``: what it is doing, e.g. ``step``, ``save: writing``), when that last
changed (``progress_at``), when the file was written (``beat_at``), the hang limit the rank
computed (``limit_s``), how many collectives it issued on each process group (``collectives``:
group name -> sequence number) and where its main thread is (``where``).

The side thread writes it even while the training thread is stuck in a collective, so a file
that stops changing means the whole process stopped (SIGSTOP, a dead node, a process that no
longer runs Python); a file whose ``progress_at`` stops moving means the training stopped.
Times are the rank's own clock; readers compare a rank's times only with each other (``beat_at
- progress_at``) and measure staleness with their own clock, so clocks need not agree across
nodes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..record import reader

FOLDER = "heartbeat"
# the phase of a rank's last beat once its attempt has ended the way every rank agreed on
# (finished, preempted, out of time): its process is on its way out, and however long the
# interpreter takes to exit on a loaded node, it is not hung (health.hang leaves it out)
EXITING = "exiting"


@dataclass
class Beat:
    rank: int
    node: str = ""
    pid: int = 0
    step: int | None = None             # steps completed (None: not training yet)
    start_step: int | None = None       # the step this attempt started from
    phase: str = "start"
    progress_at: float = 0.0            # the rank's clock: last step or phase change
    beat_at: float = 0.0                # the rank's clock: this file written
    limit_s: float | None = None        # the rank's hang limit now
    collectives: dict[str, int] = field(default_factory=dict)   # group -> collectives issued
    members: dict[str, list[int]] = field(default_factory=dict)  # group -> its global ranks
    where: str | None = None            # the main thread's innermost frames

    @property
    def idle_at_beat(self) -> float:
        """Seconds without progress when the beat was written."""
        return max(0.0, self.beat_at - self.progress_at)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Beat":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def folder(attempt_dir: Path) -> Path:
    return Path(attempt_dir) / FOLDER


def beat_path(attempt_dir: Path, rank: int) -> Path:
    return folder(attempt_dir) / f"rank-{rank}.json"


def write_beat(attempt_dir: Path, beat: Beat) -> None:
    """Atomic: a reader sees the previous beat or this one, never half of one. No fsync: a
    beat lost to a crash is replaced a few seconds later or no longer matters."""
    from ..config.yamlio import write_atomic
    write_atomic(beat_path(attempt_dir, beat.rank), json.dumps(beat.to_dict()), durable=False)


def read_beats(attempt_dir: Path) -> dict[int, Beat]:
    """Every rank's latest beat (unreadable files are skipped: being replaced, or damaged)."""
    beats: dict[int, Beat] = {}
    for path in folder(attempt_dir).glob("rank-*.json"):
        try:
            data = reader.read_json(path)
            if data is None:
                continue
            beat = Beat.from_dict(data)
        except (reader.DamagedFile, ValueError, TypeError, KeyError):
            continue
        beats[beat.rank] = beat
    return beats
