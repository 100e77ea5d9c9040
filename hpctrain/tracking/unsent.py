"""``RUN/tracking/unsent.jsonl``: what a tracker had not received when an attempt ended."""

from __future__ import annotations

from pathlib import Path

from ..record.files import append_jsonl
from .state import tracking_dir


def write_unsent(run_path: Path, tracker: str, attempt: int, records: list[dict],
                 error: str | None) -> Path:
    path = tracking_dir(run_path) / "unsent.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    for rec in records:
        append_jsonl(path, {"tracker": tracker, "attempt": attempt, "error": error,
                            "record": rec})
    return path
