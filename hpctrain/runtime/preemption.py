"""When to save and when to stop: preemption signals, the job's deadline, periodic saves.

Signals only set a flag (a handler must not do I/O in the middle of a collective); the
training loop reads the flag at the next step boundary, all ranks agree with one
all-reduce, save an emergency checkpoint at the same step and exit "preempted". The
profile's signal (USR1 by default) is handled, and SIGTERM and SIGINT too: some clusters
preempt with SIGTERM only, and a person's Ctrl-C deserves a checkpoint as well (a second
Ctrl-C stops at once). A flag file touched by the batch shell covers signals that arrived
before the handlers were installed; rank 0 looks for it from a background thread once a
second (:meth:`PreemptionFlag.watch_file`), so a slow metadata server on shared storage
never stalls a step, at the price of at most a second before the next step boundary sees it.

The decisions are pure and take a clock, so tests drive them without sleeping.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable

Clock = Callable[[], float]


def signal_number(name: str) -> int:
    name = name.upper()
    return int(getattr(signal, name if name.startswith("SIG") else f"SIG{name}"))


class PreemptionFlag:
    """Set by the preemption signals (or a flag file); read at step boundaries."""

    def __init__(self, signal_name: str = "USR1", flag_file: str | None = None) -> None:
        self.signal_names = [signal_name.upper().removeprefix("SIG"), "TERM", "INT"]
        self.flag_file = flag_file
        self.received: str | None = None
        self._previous: dict[int, object] = {}
        self._watcher: tuple[threading.Thread, threading.Event] | None = None

    def install(self) -> None:
        for name in dict.fromkeys(self.signal_names):
            num = signal_number(name)
            self._previous[num] = signal.signal(num, self._handle)

    def uninstall(self) -> None:
        self.stop_watching()
        for num, handler in self._previous.items():
            signal.signal(num, handler)
        self._previous.clear()

    FILE_POLL_S = 1.0

    def watch_file(self, interval_s: float = FILE_POLL_S) -> None:
        """Rank 0: look for the flag file every ``interval_s`` from a daemon thread until it
        appears (or :meth:`stop_watching`); the step only reads :attr:`requested`."""
        if not self.flag_file or self._watcher is not None:
            return
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set() and not self.check_file():
                stop.wait(interval_s)

        thread = threading.Thread(target=poll, name="hpctrain-flag-file", daemon=True)
        self._watcher = (thread, stop)
        thread.start()

    def stop_watching(self) -> None:
        if self._watcher is not None:
            thread, stop = self._watcher
            stop.set()
            thread.join(timeout=5)
            self._watcher = None

    def stand_down(self) -> None:
        """The attempt's work is over: ignore the preemption signal from now on. Python gives
        back the default action (terminate) to handled signals while the interpreter shuts
        down, so a late time-limit warning would otherwise turn a clean exit into a kill."""
        self.stop_watching()
        name = self.signal_names[0]
        if name not in ("TERM", "INT"):
            signal.signal(signal_number(name), signal.SIG_IGN)

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.received is not None:
            raise KeyboardInterrupt
        if self.received is None:
            self.received = signal.Signals(signum).name

    def check_file(self) -> bool:
        """Rank 0: the batch shell's flag file exists (a signal it trapped for us)."""
        if self.received is None and self.flag_file and os.path.exists(self.flag_file):
            self.received = "flag file"
        return self.received is not None

    @property
    def requested(self) -> bool:
        return self.received is not None


class DeadlinePolicy:
    """Stop in time to save before the scheduler's hard kill.

    Stop when ``time left < save_estimate × safety_factor + margin + one step``: the decision
    happens at a step boundary, so the next chance comes one step later.
    """

    def __init__(self, deadline: float | None, safety_factor: float, margin_s: float,
                 clock: Clock = time.time) -> None:
        self.deadline = deadline
        self.safety_factor = safety_factor
        self.margin_s = margin_s
        self.clock = clock

    def time_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - self.clock()

    def reserve(self, save_estimate_s: float, step_time_s: float) -> float:
        return save_estimate_s * self.safety_factor + self.margin_s + step_time_s

    def must_stop(self, save_estimate_s: float, step_time_s: float) -> bool:
        left = self.time_left()
        return left is not None and left < self.reserve(save_estimate_s, step_time_s)


class SaveEstimate:
    """How long a synchronous save takes: measured, else from the last attempt, else a guess.

    The guess matters on a first attempt under a short time limit: it comes from the bytes
    this rank will write at a conservative bandwidth, not a flat minute that would stop a
    one-minute job before its first step.
    """

    DEFAULT_S = 60.0
    GUESS_BANDWIDTH_BPS = 100e6   # a busy shared filesystem, per rank
    GUESS_OVERHEAD_S = 3.0        # metadata, barrier, manifest, rename

    def __init__(self, previous_s: float | None = None, load_s: float | None = None,
                 state_bytes: int | None = None) -> None:
        self.measured_s: float | None = None
        self.previous_s = previous_s
        self.load_s = load_s
        self.guess_s = (None if state_bytes is None else
                        self.GUESS_OVERHEAD_S + state_bytes / self.GUESS_BANDWIDTH_BPS)

    def record(self, seconds: float) -> None:
        self.measured_s = seconds if self.measured_s is None else max(seconds, 0.5 * (
            self.measured_s + seconds))

    @property
    def seconds(self) -> float:
        for value in (self.measured_s, self.previous_s, self.load_s, self.guess_s):
            if value is not None:
                return value
        return self.DEFAULT_S


class PeriodicSaves:
    """Whether a periodic checkpoint is due after ``step`` completed steps."""

    def __init__(self, interval_steps: int, interval_minutes: float, start_step: int,
                 clock: Clock = time.monotonic) -> None:
        self.interval_steps = interval_steps
        self.interval_s = interval_minutes * 60.0
        self.clock = clock
        self.last_step = start_step
        self.last_time = clock()

    def due(self, step: int) -> bool:
        if step <= self.last_step:
            return False
        if self.interval_steps and step % self.interval_steps == 0:
            return True
        return bool(self.interval_s) and self.clock() - self.last_time >= self.interval_s

    def saved(self, step: int) -> None:
        self.last_step = step
        self.last_time = self.clock()
