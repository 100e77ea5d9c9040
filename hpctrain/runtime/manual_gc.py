"""Python's garbage collector, run at the same steps on every rank (Megatron-LM's --manual-gc).

Python's automatic collector starts whenever allocation counts cross its thresholds, at a
different moment on each rank; a full collection over a large training process takes tens
of milliseconds, and every other rank waits for the slow one at the next collective. As
Megatron-LM's ``train()`` does with ``--manual-gc``: automatic collection off, one full
collection before the first step, then one every ``train.manual_gc_interval`` steps
(0: never again). Steps are agreed across ranks, so every rank collects at the same step.
"""

from __future__ import annotations

import gc as _gc


class ManualGC:
    def __init__(self, enabled: bool, interval: int, gc=_gc) -> None:
        self.enabled = enabled
        self.interval = interval
        self.gc = gc
        self.collections = 0
        self._was_enabled: bool | None = None

    @classmethod
    def from_train(cls, train) -> "ManualGC":
        return cls(bool(train.manual_gc), int(train.manual_gc_interval))

    def start(self) -> None:
        if not self.enabled or self._was_enabled is not None:
            return
        self._was_enabled = self.gc.isenabled()
        self.gc.disable()
        self._collect()

    def after_step(self, step: int) -> None:
        """Step ``step`` (1-based) finished."""
        if self.enabled and self._was_enabled is not None and self.interval \
                and step % self.interval == 0:
            self._collect()

    def stop(self) -> None:
        """Give automatic collection back (as it was before :meth:`start`)."""
        if self._was_enabled:
            self.gc.enable()
        self._was_enabled = None

    def _collect(self) -> None:
        self.gc.collect()
        self.collections += 1
