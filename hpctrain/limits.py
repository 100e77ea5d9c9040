"""Every size a user gives, bounded in one place, with the limit in the error.

The CLI's options and the Python API's arguments are checked here with the same words, so
``hpctrain.submit(job, nodes="2")`` is refused like ``--nodes 2x``: one UsageError naming the
option, what it expects and the limit, never a TypeError or ZeroDivisionError from deep inside.
Limits are wide (far past any real use) but finite, so no loop, allocation or figure built
from a user's number can run away.
"""

from __future__ import annotations

import math
import operator

from .config.job import MAX_LAYERS
from .config.profile import MAX_GPUS_PER_NODE, MAX_NODES, MAX_WORLD_SIZE
from .errors import UsageError

MAX_SWEEP_POINTS = 1000          # runs of one sweep (the product of its value lists)
MAX_CHAIN = 1000                 # jobs of one chain (--chain)
MAX_PARALLEL = 10_000            # --max-parallel of a sweep's job array
REPORT_PIXELS = (200, 10_000)    # each side of `report --size`
MAX_MICRO_BATCH = 2**16
# `data prepare --workers`: a process per core of the largest nodes; each is a Python with a
# tokenizer (tens of MB, ~0.1 s to start), so -j 100000 would exhaust the machine, not help
MAX_TOKENIZER_WORKERS = 256

# What hpctrain reads from a run folder (``hpctrain.record.reader``): far above what it writes
# there, so only a damaged or hostile file reaches them.
RUN_SMALL_BYTES = 16 << 20      # run.yaml, job.yaml, a result, a heartbeat, a manifest
RUN_RECORD_BYTES = 256 << 20    # ledger.jsonl, events.jsonl
RUN_METRICS_BYTES = 1 << 30     # metrics.jsonl read whole (Run.metrics(), report)
RUN_LOG_BYTES = 64 << 20        # what `logs` prints of a rank log at once (the end of it)
# the unfinished line a follower (`logs -f`, `submit --wait`) holds: a rank that draws a
# progress bar with carriage returns for hours never ends its line, and its end is what shows
FOLLOWED_LINE_BYTES = 1 << 20

# name -> (the option a user knows it by, lowest, highest)
INTEGERS = {
    "nodes": ("--nodes", 1, MAX_NODES),
    "gpus": ("--gpus", 1, MAX_WORLD_SIZE),
    "tp": ("--tp", 1, MAX_GPUS_PER_NODE),
    "pp": ("--pp", 1, MAX_LAYERS),
    "vpp": ("--vpp", 0, MAX_LAYERS),
    "micro_batch_size": ("--micro-batch-size", 1, MAX_MICRO_BATCH),
    "chain": ("--chain", 1, MAX_CHAIN),
    "max_parallel": ("--max-parallel", 1, MAX_PARALLEL),
    "report_width": ("--size (width)", REPORT_PIXELS[0], REPORT_PIXELS[1]),
    "resume_nodes": ("--nodes", 1, MAX_NODES),
    "runs_limit": ("--limit", 1, 1_000_000),
    "log_rank": ("--rank", 0, MAX_WORLD_SIZE - 1),
    "log_attempt": ("--attempt", 1, 1_000_000),
    "log_tail": ("--tail", 1, 10_000_000),
    "plan_top": ("--top", 1, 10_000),
    "preflight_wait_s": ("--wait", 1, 7 * 24 * 3600),
    "report_height": ("--size (height)", REPORT_PIXELS[0], REPORT_PIXELS[1]),
    "workers": ("--workers", 1, MAX_TOKENIZER_WORKERS),
}


def integer(name: str, value, *, optional: bool = True, argument: bool = False,
            label: str | None = None, fix: str | None = None):
    """``value`` as a plain int if it is an integer within ``name``'s range: an int or a type
    that says it is one (``__index__``: numpy's, as a DataFrame's column gives them), never a
    bool, a float or text. UsageError otherwise, naming the option (with ``argument``, the
    Python argument and its option; ``label``, what the caller calls it) and the range, then
    ``fix`` where given. None passes when ``optional``."""
    option, low, high = INTEGERS[name]
    if label is not None:
        option = label
    elif argument:
        option = f"{name} ({option})"
    if value is None and optional:
        return None
    tail = f"; {fix}" if fix else ""
    number = None
    if isinstance(value, int) and not isinstance(value, bool):
        # the plain int it holds: an int subclass's own comparisons or str, which may raise,
        # are never asked, and the caller goes on with the plain value
        number = int.__index__(value)
    elif not isinstance(value, (bool, float, str, bytes)):
        try:
            number = operator.index(value)
        except Exception:  # noqa: BLE001 - no __index__, or a caller's that raises
            number = None
    if number is None:
        raise UsageError(f"{option}: expected an integer from {low:,} to {high:,}, got "
                         f"{shown(value)}{tail}")
    if not low <= number <= high:
        raise UsageError(f"{option}: expected an integer from {low:,} to {high:,}, got "
                         f"{number:,}{tail}")
    return number


def click_range(name: str):
    """The click type of the CLI option behind ``name``: the same range as ``integer``."""
    import click
    _, low, high = INTEGERS[name]
    return click.IntRange(min=low, max=high)


# name -> (the option, lowest, highest) of the CLI's options that take a number that need not
# be whole (seconds)
NUMBERS = {
    "kernel_budget_s": ("--budget", 10, 3600),
    # ``Run.wait``'s seconds: a poll of 0 reads the run's files in a busy loop, one of 1e300
    # overflows ``time.sleep``, and a NaN timeout never expires (``elapsed > nan`` is false)
    "poll_s": ("poll_s", 0.05, 3600),
    "timeout_s": ("timeout_s", 0, 10 * 365 * 24 * 3600),
}


def click_float_range(name: str):
    """The click type of the number option behind ``name``: its range, NaN refused (click's
    FloatRange lets ``nan`` through, since it compares false with both ends, and a budget of
    NaN seconds is never spent: ``time > deadline`` is always false)."""
    import click

    class FiniteRange(click.FloatRange):
        def convert(self, value, param, ctx):
            number = super().convert(value, param, ctx)
            if math.isnan(number):
                self.fail(f"{value!r} is not a number in the range {self._describe_range()}.",
                          param, ctx)
            return number

    _, low, high = NUMBERS[name]
    return FiniteRange(min=low, max=high)


def number(name: str, value, *, optional: bool = True):
    """``value`` as a float if it is a real number (not a bool, not a string) within
    ``name``'s range of :data:`NUMBERS`, NaN refused; UsageError naming it and the range
    otherwise. None passes when ``optional``."""
    option, low, high = NUMBERS[name]
    if value is None and optional:
        return None
    # the plain number it holds (as ``integer``: a subclass's own methods are never asked)
    plain = None if isinstance(value, bool) else int.__index__(value) \
        if isinstance(value, int) else float.__float__(value) if isinstance(value, float) else None
    if plain is None or plain != plain or not low <= plain <= high:  # NaN; inf is past every high
        raise UsageError(f"{option}: expected a number of seconds from {low:g} to {high:,}, got "
                         f"{shown(value)}")
    return float(plain)


def boolean(option: str, value, *, optional: bool = True):
    if value is None and optional:
        return None
    if not isinstance(value, bool):
        raise UsageError(f"{option}: expected True or False, got {shown(value)}")
    return value


def choice(option: str, value, choices, *, optional: bool = True):
    """``value`` as the plain ``str`` of one of ``choices`` (a str subclass is compared by the
    text it holds: its own ``__eq__`` or ``__hash__``, which may raise, is never asked)."""
    if value is None and optional:
        return None
    text = str.__str__(value) if isinstance(value, str) else None
    if text is None or text not in choices:
        raise UsageError(f"{option}: expected one of {', '.join(choices)}, got {shown(value)}")
    return text


def sweep_points(counts: list[int]) -> int:
    """The number of runs of a sweep whose axes have ``counts`` values; refused past the cap
    before a single combination is built."""
    total = math.prod(counts)
    if total > MAX_SWEEP_POINTS:
        product = " × ".join(str(c) for c in counts)
        raise UsageError(f"--sweep: {product} = {total:,} combinations; a sweep may have at most "
                         f"{MAX_SWEEP_POINTS:,} runs (split it, or sweep fewer values)")
    return total


def shown(value) -> str:
    """A wrong argument as a message quotes it: ``config.safety.short`` (an object whose repr
    raises, or a list of millions of items, is named, not written out) and its type."""
    from .config.safety import short
    return f"{short(value, 40)} (a {type(value).__name__})"
