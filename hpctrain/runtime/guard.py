"""The loss-spike and NaN guard: skip a bad update, stop the run after too many in a row.

Every rank calls :meth:`StabilityGuard.check` with the same step loss (all-reduced) and the
same global gradient norm (computed collectively by the optimizer), so every rank reaches
the same verdict without another collective. A skipped step consumes its data but does not
change weights or optimizer state. After ``max_skipped_steps`` skips in a row the run stops
with exit code UNSTABLE: the data or the hyper-parameters need a human.

Spike rule: loss > ``spike_factor`` × mean of the last ``spike_window`` accepted losses,
once that window is full (early losses fall fast and would trip it). Skipped losses never
enter the window, so one spike cannot raise the bar for the next.

Pure Python; its state goes into checkpoints so a resumed run judges exactly as an
uninterrupted one would.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    skip: bool
    reason: str | None = None   # why the update was skipped
    stop: str | None = None     # set when the run must stop (the message)


class StabilityGuard:
    """The job's ``train.stability`` (its loader bounds each value: a window of at least one
    step, a factor of at least 0, at least one skip before stopping)."""

    def __init__(self, skip_nonfinite: bool, spike_factor: float, spike_window: int,
                 max_skipped_steps: int) -> None:
        self.skip_nonfinite = skip_nonfinite
        self.spike_factor = spike_factor
        self.spike_window = spike_window
        self.max_skipped_steps = max_skipped_steps
        self.history: deque[float] = deque(maxlen=self.spike_window)
        self.skipped_in_a_row = 0
        self.skipped_total = 0

    @classmethod
    def from_stability(cls, s) -> "StabilityGuard":
        """From a job's ``train.stability`` section."""
        return cls(s.skip_nonfinite, s.spike_factor, s.spike_window, s.max_skipped_steps)

    def judge(self, loss: float, grad_norm: float | None) -> str | None:
        """Why this update must be skipped, or None. Does not change state."""
        if self.skip_nonfinite:
            if not math.isfinite(loss):
                return f"loss is {loss}"
            if grad_norm is not None and not math.isfinite(grad_norm):
                return f"gradient norm is {grad_norm}"
        if self.spike_factor > 0 and len(self.history) == self.spike_window and math.isfinite(loss):
            mean = sum(self.history) / len(self.history)
            if loss > self.spike_factor * mean:
                return (f"loss spike: {loss:.4f} > {self.spike_factor:g} × running mean "
                        f"{mean:.4f} of the last {self.spike_window} steps")
        return None

    def check(self, loss: float, grad_norm: float | None) -> Verdict:
        """Judge a step and record it."""
        reason = self.judge(loss, grad_norm)
        if reason is None:
            self.skipped_in_a_row = 0
            if math.isfinite(loss):
                self.history.append(float(loss))
            return Verdict(False)
        self.skipped_in_a_row += 1
        self.skipped_total += 1
        stop = None
        if self.skipped_in_a_row >= self.max_skipped_steps:
            stop = (f"{self.skipped_in_a_row} updates in a row were skipped (last: {reason}); "
                    f"train.stability.max_skipped_steps is {self.max_skipped_steps}. Check the "
                    f"data at this position and the learning rate, then resume")
        return Verdict(True, reason, stop)

    def state_dict(self) -> dict:
        return {"history": list(self.history), "skipped_in_a_row": self.skipped_in_a_row,
                "skipped_total": self.skipped_total}

    def load_state_dict(self, state: dict) -> None:
        self.history = deque((float(x) for x in state.get("history", [])), maxlen=self.spike_window)
        self.skipped_in_a_row = int(state.get("skipped_in_a_row", 0))
        self.skipped_total = int(state.get("skipped_total", 0))
