"""The faults a training rank injects into itself when a test asks (``HPCTRAIN_TEST_*``, read
through :mod:`hpctrain.fault_injection`, so nothing happens unless ``HPCTRAIN_TEST_HOOKS=1``).

The training loop makes one call per step, :meth:`TestHooks.at_step`, which does nothing at all
when no hook is active (the normal case); the checkpointer asks :meth:`TestHooks.kill_during_save`
once per save, and the straggler timer :meth:`TestHooks.forward_delay` once per attempt.

Steps are numbered as in the metrics: step N is the N-th optimizer step (1-based).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import UsageError
from ..fault_injection import value

HOLD_POLL_S = 0.05          # a hold looks for its release this often
STOPPED_GAP_S = 1.0         # a poll that took this much longer: the rank was stopped meanwhile
LINGER_AFTER_STOP_S = 1.0   # how long a released hold stays put after such a stop


class InjectedCrash(RuntimeError):
    """Raised by HPCTRAIN_TEST_CRASH_AT_STEP."""


def _at(text: str, name: str) -> tuple[int, int | None]:
    try:
        first, _, second = text.partition("@")
        return int(first), (int(second) if second else None)
    except ValueError:
        raise UsageError(f"{name}={text!r}: expected N or N@M") from None


def _steps(text: str, name: str) -> set[int]:
    try:
        return {int(s) for s in text.split(",") if s}
    except ValueError:
        raise UsageError(f"{name}: expected step numbers like 3,6") from None


def _parsed(name: str, get: Callable[[str], str | None], convert: Callable[[str], Any],
            expected: str):
    """``convert`` of the variable's value; a UsageError naming the variable and the form."""
    text = get(name)
    try:
        return convert(text)
    except ValueError:
        raise UsageError(f"{name}={text!r}: expected {expected}") from None


def _pair(sep: str, first: Callable[[str], Any], second: Callable[[str], Any]):
    """A converter of ``A<sep>B`` to ``(first(A), second(B))``."""
    def convert(text: str) -> tuple:
        a, _, b = text.partition(sep)
        return first(a), second(b)
    return convert


@dataclass
class TestHooks:
    """The runtime's faults for this rank; with the switch off (the normal case) every hook is
    a no-op."""

    __test__ = False   # not a pytest test class, whatever its name

    step_sleep_s: float = 0.0
    crash_step: int | None = None
    crash_rank: int | None = None
    nan_steps: set[int] = field(default_factory=set)
    kill_rank: int | None = None
    kill_step: int | None = None
    attempt: int | None = None
    hold_steps: set[int] = field(default_factory=set)
    hold_max_s: float = 600.0
    eval_hold_steps: set[int] = field(default_factory=set)
    hang_step: int | None = None
    hang_rank: int | None = None
    slow_rank: int | None = None
    slow_s: float = 0.0
    fill_after_save: bool = False
    slow_writer_s: float = 0.0
    slow_writer_item_s: float = 0.0
    read_threads: int | None = None
    page_lock_s: float = 0.0
    filled: list = field(default_factory=list)   # what the fill hook allocated (kept alive)
    _kill_armed: bool = True
    file_size_limit: int | None = None
    file_size_step: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "TestHooks":
        env = os.environ if env is None else env
        hooks = cls()

        def get(name: str) -> str | None:
            return value(name, env)
        if get("HPCTRAIN_TEST_STEP_SLEEP_S"):
            hooks.step_sleep_s = float(get("HPCTRAIN_TEST_STEP_SLEEP_S"))
        if get("HPCTRAIN_TEST_CRASH_AT_STEP"):
            hooks.crash_step, hooks.crash_rank = _at(get("HPCTRAIN_TEST_CRASH_AT_STEP"),
                                                     "HPCTRAIN_TEST_CRASH_AT_STEP")
        if get("HPCTRAIN_TEST_NAN_AT_STEP"):
            hooks.nan_steps = _steps(get("HPCTRAIN_TEST_NAN_AT_STEP"), "HPCTRAIN_TEST_NAN_AT_STEP")
        if get("HPCTRAIN_TEST_HOLD_AFTER_STEP"):
            hooks.hold_steps = _steps(get("HPCTRAIN_TEST_HOLD_AFTER_STEP"),
                                      "HPCTRAIN_TEST_HOLD_AFTER_STEP")
            hooks.hold_max_s = float(get("HPCTRAIN_TEST_HOLD_MAX_S") or hooks.hold_max_s)
        if get("HPCTRAIN_TEST_HOLD_IN_EVAL_AT_STEP"):
            hooks.eval_hold_steps = _steps(get("HPCTRAIN_TEST_HOLD_IN_EVAL_AT_STEP"),
                                           "HPCTRAIN_TEST_HOLD_IN_EVAL_AT_STEP")
            hooks.hold_max_s = float(get("HPCTRAIN_TEST_HOLD_MAX_S") or hooks.hold_max_s)
        if get("HPCTRAIN_TEST_KILL_DURING_SAVE"):
            hooks.kill_rank, hooks.kill_step = _at(get("HPCTRAIN_TEST_KILL_DURING_SAVE"),
                                                   "HPCTRAIN_TEST_KILL_DURING_SAVE")
        hooks.fill_after_save = get("HPCTRAIN_TEST_FILL_AFTER_SAVE") == "1"
        if get("HPCTRAIN_TEST_SLOW_WRITER_S"):
            hooks.slow_writer_s = _parsed("HPCTRAIN_TEST_SLOW_WRITER_S", get, float, "SECONDS")
        if get("HPCTRAIN_TEST_SLOW_WRITER_ITEM_S"):
            hooks.slow_writer_item_s = _parsed("HPCTRAIN_TEST_SLOW_WRITER_ITEM_S", get, float,
                                               "SECONDS")
        if get("HPCTRAIN_TEST_PAGE_LOCK_S"):
            hooks.page_lock_s = _parsed("HPCTRAIN_TEST_PAGE_LOCK_S", get, float, "SECONDS")
        if get("HPCTRAIN_TEST_READ_THREADS"):
            hooks.read_threads = int(get("HPCTRAIN_TEST_READ_THREADS"))
        if get("HPCTRAIN_TEST_FILE_SIZE_LIMIT_AT_SAVE"):
            hooks.file_size_limit, hooks.file_size_step = _parsed(
                "HPCTRAIN_TEST_FILE_SIZE_LIMIT_AT_SAVE", get, _pair("@", int, int), "BYTES@STEP")
        if get("HPCTRAIN_TEST_HANG_IN_COLLECTIVE"):
            hooks.hang_step, hooks.hang_rank = _at(get("HPCTRAIN_TEST_HANG_IN_COLLECTIVE"),
                                                   "HPCTRAIN_TEST_HANG_IN_COLLECTIVE")
        if get("HPCTRAIN_TEST_SLOW_RANK"):
            hooks.slow_rank, hooks.slow_s = _parsed("HPCTRAIN_TEST_SLOW_RANK", get,
                                                    _pair(":", int, float), "R:SECONDS")
        return hooks

    @property
    def active(self) -> bool:
        return bool(self.step_sleep_s or self.crash_step or self.nan_steps or self.hold_steps
                    or self.eval_hold_steps
                    or self.kill_rank is not None or self.hang_step is not None
                    or self.slow_rank is not None or self.fill_after_save or self.slow_writer_s
                    or self.slow_writer_item_s
                    or self.read_threads is not None or self.page_lock_s
                    or self.file_size_limit is not None)

    def first_attempt(self) -> bool:
        return self.attempt in (None, 1)

    def forward_delay(self, rank: int) -> float:
        """Seconds rank ``rank`` adds to every forward pass (HPCTRAIN_TEST_SLOW_RANK)."""
        return self.slow_s if self.slow_rank == rank and self.first_attempt() else 0.0

    def at_step(self, step: int, rank: int, *, released: Callable[[], bool],
                waiting: Callable[[], None] | None = None,
                log: Callable[[str], None] = print) -> bool:
        """Everything injected at the start of optimizer step ``step`` on ``rank``, in one call
        the loop makes every step: the hold after the previous step, a crash, a hang in the next
        collective, the step's sleep. Returns whether this step's loss is made NaN. With no
        hook active (the normal case) it returns at once."""
        if not self.active:
            return False
        self.hold_after(step - 1, released, waiting=waiting)
        self.maybe_crash(step, rank)
        self.maybe_hang_in_collective(step, rank, log)
        if self.step_sleep_s:
            time.sleep(self.step_sleep_s)
        return self.nan_in(step)

    def maybe_hang_in_collective(self, step: int, rank: int, log) -> None:
        """At the start of step ``step``: arm HPCTRAIN_TEST_HANG_IN_COLLECTIVE on this rank."""
        if self.hang_step != step or self.hang_rank not in (None, rank) or \
                not self.first_attempt():
            return
        block_next_megatron_collective(log)

    def hold_after(self, step: int, released, sleep=time.sleep, clock=time.monotonic,
                   waiting=None) -> bool:
        """Wait after ``step`` (once) until ``released()`` is true or the hold times out;
        True when it was released rather than timed out (or there was nothing to hold).
        ``waiting()`` is called while it waits (a hold on purpose is not a hang)."""
        if step not in self.hold_steps:
            return True
        self.hold_steps.discard(step)
        deadline = clock() + self.hold_max_s
        stopped = False
        while not released():
            if clock() >= deadline:
                return False
            if waiting is not None:
                waiting()
            before = clock()
            sleep(HOLD_POLL_S)
            stopped = clock() - before > STOPPED_GAP_S
        if stopped:
            # the rank was stopped (SIGSTOP) while it waited: the stack dump the watcher asked
            # for runs on whichever thread wakes first, so stay here a moment for it to find
            # the main thread where the stop caught it, not already in the next step
            sleep(LINGER_AFTER_STOP_S)
        return True

    def hold_in_evaluation(self, step: int, released, waiting=None) -> bool:
        """HPCTRAIN_TEST_HOLD_IN_EVAL_AT_STEP: hold (once, first attempt) in the evaluation
        after ``step``, as :meth:`hold_after` holds."""
        if step not in self.eval_hold_steps or not self.first_attempt():
            return True
        self.eval_hold_steps.discard(step)
        self.hold_steps.add(step)
        return self.hold_after(step, released, waiting=waiting)

    def maybe_crash(self, step: int, rank: int) -> None:
        if self.crash_step == step and self.crash_rank in (None, rank):
            raise InjectedCrash(f"HPCTRAIN_TEST_CRASH_AT_STEP: injected crash in step {step} "
                                f"on rank {rank}")

    def nan_in(self, step: int) -> bool:
        return step in self.nan_steps

    def fill_after_staging(self, arena, log) -> None:
        """HPCTRAIN_TEST_FILL_AFTER_SAVE: right after a background save was scheduled, take
        memory of the sizes it staged and fill it. The save's own host memory must refuse
        (its writer still reads it); if it did not, the fill lands in the bytes being written
        and the resume's digest check catches it."""
        if not self.fill_after_save:
            return
        import torch

        from .checkpoint.staging import ArenaBusy
        sizes = [n for n in arena.last_sizes if n]
        refused = False
        try:
            slots = arena.acquire("HPCTRAIN_TEST_FILL_AFTER_SAVE", sizes)
            for slot in slots:
                arena.tensor(slot, torch.uint8, (slot.nbytes,)).fill_(0xA5)
            arena.release("HPCTRAIN_TEST_FILL_AFTER_SAVE")
        except ArenaBusy:
            refused = True
        pin = torch.cuda.is_available()
        self.filled = [torch.full((n,), 0xA5, dtype=torch.uint8, pin_memory=pin) for n in sizes]
        self.fill_after_save = False     # once: the first background save
        log(f"test hook: filled {len(sizes)} {'pinned ' if pin else ''}buffers of the staged "
            f"sizes ({sum(sizes) / 1e6:.1f} MB) while the writer runs; the staging memory "
            f"{'refused them' if refused else 'gave them out'}")

    def limit_file_size(self, step: int) -> None:
        """Before the save of ``file_size_step`` (first attempt only): this process, and the
        writer processes it forks, may write no file past ``file_size_limit`` bytes
        (``RLIMIT_FSIZE``, with SIGXFSZ ignored so a write fails with EFBIG): a real storage
        fault in the middle of a real save."""
        if self.file_size_limit is None or step != self.file_size_step \
                or self.attempt not in (None, 1):
            return
        import resource
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.file_size_limit, self.file_size_limit))

    def cpu_page_lock(self):
        """HPCTRAIN_TEST_PAGE_LOCK_S: on the CPU, the checkpoint staging memory is
        "page-locked" as on a GPU, each segment taking SECONDS (a stand-in for
        ``cudaHostRegister``, which needs a GPU), so that the order of the resume, the first
        step, page-locking and the saves that wait for it runs as it does there. None: no
        stand-in."""
        if not self.page_lock_s:
            return None

        def page_lock(data_ptr: int, nbytes: int) -> None:
            time.sleep(self.page_lock_s)

        return page_lock

    def writer_delay(self, sync: bool) -> float:
        """HPCTRAIN_TEST_SLOW_WRITER_S: seconds a background save's writer waits before it
        writes (first attempt only), so that training reaches the next save while the writer
        still needs the staged bytes: that save must wait for it, not stage over them."""
        return 0.0 if sync or self.attempt not in (None, 1) else self.slow_writer_s

    def writer_item_delay(self) -> float:
        """HPCTRAIN_TEST_SLOW_WRITER_ITEM_S: seconds a background save's writer takes for each
        item (first attempt only): slow storage, where the write advances item by item."""
        return 0.0 if self.attempt not in (None, 1) else self.slow_writer_item_s

    def kill_during_save(self, rank: int, step: int) -> bool:
        if self.kill_rank != rank or not self._kill_armed or self.attempt not in (None, 1):
            return False
        if self.kill_step is not None and self.kill_step != step:
            return False
        self._kill_armed = False
        return True


COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base",
               "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast",
               "send", "recv", "isend", "irecv", "batch_isend_irecv")


def block_next_megatron_collective(log) -> None:
    """Replace torch.distributed's collectives (as megatron-core looks them up at call time) so
    that the next one megatron-core calls on a group of several ranks sleeps forever instead of
    being issued: this rank hangs inside megatron's collective call, its peers wait for it in
    theirs."""
    import sys as _sys

    import torch.distributed as dist

    def blocking(name, original):
        def call(*args, **kwargs):
            caller = _sys._getframe(1).f_globals.get("__name__", "")
            group = kwargs.get("group")
            alone = group is not None and dist.get_world_size(group) <= 1
            if caller.startswith("megatron.") and not alone:
                log(f"HPCTRAIN_TEST_HANG_IN_COLLECTIVE: torch.distributed.{name} called from "
                    f"{caller} blocks forever on this rank")
                while True:
                    time.sleep(3600)
            return original(*args, **kwargs)
        return call

    for name in COLLECTIVES:
        original = getattr(dist, name, None)
        if original is not None:
            setattr(dist, name, blocking(name, original))


def hold_release_reaches(run_path, step: int) -> bool:
    """A test's ``RUN/hold-release``: empty, it releases every hold; holding a step number, only
    the holds after steps up to that one (a drill that fails a run twice at two steps holds
    the second time after the first release)."""
    from ..record.reader import RunFileError, read_text
    try:
        text = read_text(Path(run_path) / "hold-release")
    except (RunFileError, OSError):
        return False
    if text is None:
        return False
    text = text.strip()
    return not text.isdigit() or step <= int(text)
