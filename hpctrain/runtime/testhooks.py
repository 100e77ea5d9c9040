"""Fault injection for tests, from ``HPCTRAIN_TEST_*`` environment variables.

Steps are numbered as in the metrics: step N is the N-th optimizer step (1-based).

``HPCTRAIN_TEST_STEP_SLEEP_S=0.5``        sleep this long in every step (slow a run down so a
                                          test can signal it mid-run)
``HPCTRAIN_TEST_CRASH_AT_STEP=N[@R]``     raise an exception in step N (on rank R, or every rank)
``HPCTRAIN_TEST_NAN_AT_STEP=N[,M,...]``   make the loss (and so the gradients) NaN in those steps
``HPCTRAIN_TEST_HOLD_AFTER_STEP=N[,M]``   after step N every rank waits until it is told to stop
                                          (a handled signal, or the batch shell's flag file) or
                                          the file ``RUN/hold-release`` appears, at most
                                          ``HPCTRAIN_TEST_HOLD_MAX_S`` (default 600) seconds: a
                                          test acts on a run that is certainly mid-way, however
                                          fast the machine trains
``HPCTRAIN_TEST_KILL_DURING_SAVE=R[@N]``  rank R SIGKILLs itself after writing its shards of a
                                          checkpoint (of step N, or the first one) and before
                                          it is published; in the run's first attempt only
                                          (a fault to recover from, where a crash at a step
                                          repeats in every attempt like a bug would)

Unset (the normal case) every hook is a no-op.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Mapping

from ..errors import UsageError


class InjectedCrash(RuntimeError):
    """Raised by HPCTRAIN_TEST_CRASH_AT_STEP."""


def _at(value: str, name: str) -> tuple[int, int | None]:
    try:
        first, _, second = value.partition("@")
        return int(first), (int(second) if second else None)
    except ValueError:
        raise UsageError(f"{name}={value!r}: expected N or N@M") from None


def _steps(value: str, name: str) -> set[int]:
    try:
        return {int(s) for s in value.split(",") if s}
    except ValueError:
        raise UsageError(f"{name}: expected step numbers like 3,6") from None


@dataclass
class TestHooks:
    step_sleep_s: float = 0.0
    crash_step: int | None = None
    crash_rank: int | None = None
    nan_steps: set[int] = field(default_factory=set)
    kill_rank: int | None = None
    kill_step: int | None = None
    attempt: int | None = None
    hold_steps: set[int] = field(default_factory=set)
    hold_max_s: float = 600.0
    _kill_armed: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "TestHooks":
        env = os.environ if env is None else env
        hooks = cls()
        if env.get("HPCTRAIN_TEST_STEP_SLEEP_S"):
            hooks.step_sleep_s = float(env["HPCTRAIN_TEST_STEP_SLEEP_S"])
        if env.get("HPCTRAIN_TEST_CRASH_AT_STEP"):
            hooks.crash_step, hooks.crash_rank = _at(env["HPCTRAIN_TEST_CRASH_AT_STEP"],
                                                     "HPCTRAIN_TEST_CRASH_AT_STEP")
        if env.get("HPCTRAIN_TEST_NAN_AT_STEP"):
            hooks.nan_steps = _steps(env["HPCTRAIN_TEST_NAN_AT_STEP"], "HPCTRAIN_TEST_NAN_AT_STEP")
        if env.get("HPCTRAIN_TEST_HOLD_AFTER_STEP"):
            hooks.hold_steps = _steps(env["HPCTRAIN_TEST_HOLD_AFTER_STEP"],
                                      "HPCTRAIN_TEST_HOLD_AFTER_STEP")
            hooks.hold_max_s = float(env.get("HPCTRAIN_TEST_HOLD_MAX_S") or hooks.hold_max_s)
        if env.get("HPCTRAIN_TEST_KILL_DURING_SAVE"):
            hooks.kill_rank, hooks.kill_step = _at(env["HPCTRAIN_TEST_KILL_DURING_SAVE"],
                                                   "HPCTRAIN_TEST_KILL_DURING_SAVE")
        return hooks

    @property
    def active(self) -> bool:
        return bool(self.step_sleep_s or self.crash_step or self.nan_steps or self.hold_steps
                    or self.kill_rank is not None)

    def hold_after(self, step: int, released, sleep=time.sleep, clock=time.monotonic) -> bool:
        """Wait after ``step`` (once) until ``released()`` is true or the hold times out;
        True when it was released rather than timed out (or there was nothing to hold)."""
        if step not in self.hold_steps:
            return True
        self.hold_steps.discard(step)
        deadline = clock() + self.hold_max_s
        while not released():
            if clock() >= deadline:
                return False
            sleep(0.05)
        return True

    def maybe_crash(self, step: int, rank: int) -> None:
        if self.crash_step == step and self.crash_rank in (None, rank):
            raise InjectedCrash(f"HPCTRAIN_TEST_CRASH_AT_STEP: injected crash in step {step} "
                                f"on rank {rank}")

    def nan_in(self, step: int) -> bool:
        return step in self.nan_steps

    def kill_during_save(self, rank: int, step: int) -> bool:
        if self.kill_rank != rank or not self._kill_armed or self.attempt not in (None, 1):
            return False
        if self.kill_step is not None and self.kill_step != step:
            return False
        self._kill_armed = False
        return True
