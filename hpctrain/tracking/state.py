"""``RUN/tracking/state.json``: each tracker's run id and how far it has been sent.

One file per run, written only by the run's rank 0 (one attempt at a time) and by ``hpctrain
sync`` (on a run with no live job), replaced atomically. Per tracker: the ids that make the next
attempt continue the same tracker run, ``sent_step`` (every training record up to it was
received), ``sent_evals`` (per evaluation kind, the newest step whose evaluation was received:
an evaluation cut short by a preemption is run again by the next attempt at a step whose
training record was already sent) and ``events_sent`` (how many of ``events.jsonl``'s records
were looked at).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..config import yamlio
from ..record.files import record_kind


def tracking_dir(run_path: Path) -> Path:
    return Path(run_path) / "tracking"


EVAL_KINDS = ("validation", "test")


def already_sent(entry: dict, record: dict) -> bool:
    """Whether the tracker of ``entry`` (:meth:`TrackingState.of`) received ``record``'s step:
    training records up to ``sent_step``, each evaluation kind up to its own step."""
    kind = record_kind(record)
    sent = entry["sent_step"] if kind == "train" else entry["sent_evals"].get(kind, 0)
    return record.get("step", 0) <= sent


class TrackingState:
    def __init__(self, run_path: Path) -> None:
        self.run_path = Path(run_path)
        self.path = tracking_dir(run_path) / "state.json"
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            data = {}
        except (OSError, ValueError):
            # A damaged state file would start a second tracker run; keep it aside, start anew.
            data = {}
            try:
                self.path.rename(self.path.with_suffix(".damaged"))
            except OSError:
                pass
        self.data: dict = data if isinstance(data, dict) else {}

    def of(self, tracker: str) -> dict:
        entry = self.data.setdefault(tracker, {})
        entry.setdefault("sent_step", 0)
        entry.setdefault("events_sent", 0)
        # a state written before sent_evals: every evaluation up to sent_step was sent with it
        entry.setdefault("sent_evals", {kind: entry["sent_step"] for kind in EVAL_KINDS})
        return entry

    def save(self) -> None:
        yamlio.write_atomic(self.path, json.dumps(self.data, indent=1, sort_keys=True) + "\n",
                            within=self.run_path)
