"""The tracker thread: rank 0 hands it records, checkpoint steps and files; it does the sending.

Training never waits on a tracker: :meth:`TrackerThread.add`, :meth:`commit` and
:meth:`add_file` only put an item on a queue. On the thread, each tracker (a *channel*) keeps
the records it has not been sent and is sent those up to the newest committed step (a
published checkpoint, or the end of training; see :mod:`hpctrain.tracking`). A tracker that
fails is warned about once, keeps its records and is tried again every ``retry_s``; when it
answers again the log says so. :meth:`close` waits at most ``flush_timeout_s`` when training
finished, at most ``STOPPING_FLUSH_S`` when the attempt stops to be continued (a preempted job's
time is short, and the next attempt sends what is left first), then writes
what a tracker did not receive to ``tracking/unsent.jsonl``.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import limits
from ..record.reader import read_jsonl
from .backends import Backend, RunInfo
from .records import final_records, record_kind, shown_events
from .state import TrackingState, already_sent
from .unsent import write_unsent

RETRY_S = 5.0
STOPPING_FLUSH_S = 10.0
REPORT_TIMEOUT_S = 120.0


class _Channel:
    def __init__(self, backend: Backend, entry: dict) -> None:
        self.backend = backend
        self.entry = entry                 # this tracker's part of state.json
        self.opened = False
        self.pending: list[dict] = []
        self.files: list[Path] = []
        self.error: str | None = None      # the last failure, while the tracker is failing
        self.next_try = 0.0

    @property
    def name(self) -> str:
        return self.backend.name



@dataclass(frozen=True)
class Voice:
    """Who the tracker thread works for, in its messages: an attempt of training (its rank 0),
    or ``hpctrain sync``, which a person waits for and which has no next attempt."""

    gives_up: str       # after "did not answer within N s at the end of"
    goes_on: str        # after "retrying every N s;"
    later: str          # who sends what is left ({run}: the run's id)


TRAINING_VOICE = Voice("the attempt; the attempt does not wait for it", "training continues",
                       "the next attempt or `hpctrain sync {run}`")
SYNC_VOICE = Voice("sync; sync does not wait for it any longer",
                   "sync goes on trying until tracking.flush_timeout_s",
                   "`hpctrain sync {run}` run again")

class TrackerThread:
    def __init__(self, backends: list[Backend], info: RunInfo, *, resume_step: int,
                 metrics_file: Path, events_file: Path, flush_timeout_s: float,
                 log: Callable[[str], None], retry_s: float = RETRY_S,
                 stopping_flush_s: float = STOPPING_FLUSH_S, voice: Voice | None = None) -> None:
        self.voice = voice or TRAINING_VOICE
        self.info = info
        self.state = TrackingState(info.run_path)
        self.channels = [_Channel(b, self.state.of(b.name)) for b in backends]
        self.resume_step = resume_step
        self.metrics_file, self.events_file = metrics_file, events_file
        self.flush_timeout_s = flush_timeout_s
        self.retry_s = retry_s
        self.log = log
        self.committed = 0
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._main, name="hpctrain-tracking", daemon=True)
        self._unsent_written = False
        self._flush_s = flush_timeout_s
        self._stopping_flush_s = stopping_flush_s
        self._want_report = False

    # ---- the training thread's side: never blocks ------------------------------------------
    def start(self) -> "TrackerThread":
        self._thread.start()
        return self

    def add(self, record: dict) -> None:
        self._queue.put(("record", record))

    def commit(self, step: int) -> None:
        """Every step up to ``step`` is final (a checkpoint holds it, or training finished)."""
        self._queue.put(("commit", step))

    def add_file(self, path: Path) -> None:
        self._queue.put(("file", Path(path)))

    def add_report(self) -> None:
        """The run's ``hpctrain report`` PNG, drawn on the thread and sent as a file."""
        self._queue.put(("report", None))

    def close(self, status: str) -> None:
        """End of the attempt (``status``: finished, stopped or failed): flush for at most
        ``flush_timeout_s``, then record what was not sent."""
        wait = self.flush_timeout_s if status == "finished" else min(self.flush_timeout_s,
                                                                     self._stopping_flush_s)
        self._flush_s = wait
        self._queue.put(("close", status))
        self._thread.join(wait + 15 + (REPORT_TIMEOUT_S if status == "finished" else 0))
        if self._thread.is_alive():        # stuck inside a tracker call: give up on it
            self.log(f"tracking: a tracker did not answer within {wait:.0f} s at the end of "
                     f"{self.voice.gives_up}")
            self._write_unsent()

    # ---- the tracker thread ------------------------------------------------------------------
    def _main(self) -> None:
        self._backfill()
        closing: str | None = None
        while closing is None:
            try:
                kind, value = self._queue.get(timeout=self._wait())
            except queue.Empty:
                kind, value = None, None
            if kind is not None:
                closing = self._take(kind, value)
                while closing is None:         # everything already queued, then one pump
                    try:
                        kind, value = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    closing = self._take(kind, value)
            self._pump(force=False)
        deadline = time.monotonic() + self._flush_s
        while True:
            self._pump(force=True)
            if not any(self._due(ch) or ch.files for ch in self.channels) \
                    or time.monotonic() >= deadline:
                break
            time.sleep(min(1.0, self.retry_s))
        if self._want_report:
            path = self._report()
            if path is not None:
                self._take("file", path)
                self._pump(force=True)
        for ch in self.channels:
            if ch.opened:
                try:
                    ch.backend.close(closing)
                except Exception as e:  # noqa: BLE001 - a tracker's failure is never training's
                    self.log(f"tracking: {ch.name}: closing the run failed: {_short(e)}")
        self._write_unsent()

    def _take(self, kind: str, value) -> str | None:
        if kind == "report":               # drawn at the end, after the records are sent
            self._want_report = True
            return None
        with self._lock:
            if kind == "record":
                for ch in self.channels:
                    if not already_sent(ch.entry, value):
                        ch.pending.append(value)
            elif kind == "commit":
                self.committed = max(self.committed, value)
            elif kind == "file":
                for ch in self.channels:
                    ch.files.append(value)
            elif kind == "close":
                return value
        return None

    def _report(self) -> Path | None:
        """``hpctrain report``'s PNG, drawn by the command itself in a process of its own (the
        runtime's layer does not import the commands'; matplotlib stays out of rank 0)."""
        import subprocess
        import sys
        path = self.info.run_path / "tracking" / "report.png"
        try:
            done = subprocess.run([sys.executable, "-m", "hpctrain", "report",
                                   str(self.info.run_path), "-o", str(path)],
                                  capture_output=True, text=True, timeout=REPORT_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            self.log(f"tracking: the report PNG could not be drawn: {_short(e)}")
            return None
        if done.returncode != 0 or not path.exists():
            if "matplotlib" not in done.stderr:     # hpctrain[report] not installed: no PNG
                self.log("tracking: the report PNG could not be drawn: "
                         + (done.stderr.strip().splitlines() or ["no output"])[-1])
            return None
        return path

    def _backfill(self) -> None:
        """Records of earlier attempts a tracker has not received, up to the step this attempt
        resumed from (the ones after it are being trained again)."""
        self.committed = self.resume_step
        if not self.resume_step:
            return
        lowest = min((min(ch.entry["sent_step"], *ch.entry["sent_evals"].values())
                      for ch in self.channels), default=0)
        if lowest >= self.resume_step:
            return
        try:
            records = final_records(read_jsonl(self.metrics_file, limits.RUN_METRICS_BYTES),
                                    lowest, self.resume_step)
        except Exception as e:  # noqa: BLE001
            self.log(f"tracking: cannot read {self.metrics_file.name} to send earlier steps: "
                     f"{_short(e)}")
            return
        for ch in self.channels:
            ch.pending.extend(r for r in records if not already_sent(ch.entry, r))

    def _wait(self) -> float:
        waiting = [ch.next_try for ch in self.channels if ch.error and (self._due(ch) or
                                                                        ch.files)]
        return max(0.05, min(waiting) - time.monotonic()) if waiting else 1.0

    def _due(self, ch: _Channel) -> list[dict]:
        return [r for r in ch.pending if r["step"] <= self.committed]

    def _pump(self, force: bool) -> None:
        for ch in list(self.channels):
            if ch.error and not force and time.monotonic() < ch.next_try:
                continue
            try:
                self._send(ch)
            except ImportError as e:
                self.log(f"tracking: {ch.name} is not installed where rank 0 runs ({_short(e)}):"
                         f" pip install 'hpctrain[{ch.name}]' in the nodes' Python; its records "
                         "stay in metrics.jsonl for `hpctrain sync`")
                self.channels.remove(ch)
                continue
            except Exception as e:  # noqa: BLE001 - a tracker's failure is never training's
                with self._lock:
                    buffered = len(ch.pending)
                if ch.error is None:
                    self.log(f"tracking: {ch.name} cannot be reached ({_short(e)}); "
                             f"{buffered} record(s) kept, retrying every {self.retry_s:g} s; "
                             f"{self.voice.goes_on}")
                ch.error = _short(e)
                ch.next_try = time.monotonic() + self.retry_s
                continue
            if ch.error is not None:
                self.log(f"tracking: {ch.name} reachable again; buffered records sent")
                ch.error = None

    def _send(self, ch: _Channel) -> None:
        if not ch.opened:
            ch.backend.open(self.info, ch.entry)
            ch.opened = True
            self._save()
        events = read_jsonl(self.events_file) if self.events_file.exists() else []
        new = events[ch.entry["events_sent"]:]
        if new:
            shown = shown_events(new)
            if shown:
                ch.backend.log_events(shown, ch.entry.get("events_shown", 0))
                ch.entry["events_shown"] = ch.entry.get("events_shown", 0) + len(shown)
            ch.entry["events_sent"] = len(events)
            self._save()
        committed = self.committed
        with self._lock:
            due = sorted(self._due(ch), key=lambda r: r["step"])
        if due:
            ch.backend.log_records(due)
            with self._lock:
                sent = {id(r) for r in due}
                ch.pending = [r for r in ch.pending if id(r) not in sent]
            ch.entry["sent_step"] = max(ch.entry["sent_step"], committed)
            evals = ch.entry["sent_evals"]
            for r in due:
                kind = record_kind(r)
                if kind != "train":
                    evals[kind] = max(evals.get(kind, 0), r["step"])
            self._save()
        while ch.files:
            ch.backend.log_file(ch.files[0])
            ch.files.pop(0)

    def _save(self) -> None:
        with self._lock:
            try:
                self.state.save()
            except OSError as e:
                self.log(f"tracking: cannot write {self.state.path}: {e.strerror}")

    def _write_unsent(self) -> None:
        with self._lock:
            if self._unsent_written:
                return
            self._unsent_written = True
            for ch in self.channels:
                left = [r for r in ch.pending if r["step"] <= self.committed]
                if not left:
                    continue
                try:
                    path = write_unsent(self.info.run_path, ch.name, self.info.attempt, left,
                                        ch.error)
                except OSError as e:
                    self.log(f"tracking: cannot write the unsent records: {e.strerror}")
                    continue
                self.log(f"tracking: {ch.name} did not receive {len(left)} record(s) (steps "
                         f"{left[0]['step']}-{left[-1]['step']}); kept in {path} and in "
                         f"metrics.jsonl: {self.voice.later.format(run=self.info.run_id)} "
                         "sends them")


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."
