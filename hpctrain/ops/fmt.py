"""Plain-text formatting for terminal output: aligned tables, durations, ages, numbers.

Pure functions, so the CLI's tables are tested without a terminal or a cluster.
"""

from __future__ import annotations

import datetime as _dt

from ..config.durations import format_duration, parse_iso  # noqa: F401  (shared with the ranks and backends)
from ..file_door import show

CELL_WIDTH = 300    # a run folder's name (at most 255 bytes) whole; a reason read from a file cut


def format_table(headers: list[str], rows: list[list], *, indent: str = "") -> str:
    """Left-aligned columns separated by two spaces; ``None`` shows as ``-``; the last column is
    not padded (it may be long, e.g. a decision's reason)."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    n = len(headers)
    if all(len(row) == n for row in cells):     # the usual table: one column at a time
        for i, column in enumerate(zip(*cells)):
            widths[i] = max(widths[i], max(map(len, column)))
    else:
        for row in cells:
            for i, v in enumerate(row[:n]):
                widths[i] = max(widths[i], len(v))
    # a full row is one str.format call (10,000-row listings spend most of their formatting
    # padding cells one by one)
    full = (indent.replace("{", "{{").replace("}", "}}")
            + "  ".join([f"{{:<{w}}}" for w in widths[:-1]] + ["{}"]))

    def line(values: list[str]) -> str:
        if len(values) == n:
            return full.format(*values).rstrip()
        padded = [v.ljust(widths[i]) if i < len(values) - 1 else v for i, v in enumerate(values)]
        return (indent + "  ".join(padded)).rstrip()
    return "\n".join([line(list(headers))] + [line(r) for r in cells])


def cell(value) -> str:
    """One table cell as printed: a run folder's name found on disk, a profile or a reason read
    from a run's files come through here, so each is one line of printable text, cut when very
    long (:func:`hpctrain.file_door.show`)."""
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return format_number(value)
    return show(str(value), CELL_WIDTH)


def format_number(x: float | int | None) -> str:
    """Four significant digits, without exponent noise for everyday magnitudes."""
    if x is None:
        return "-"
    if isinstance(x, int) or not isinstance(x, float):
        return str(x)  # the runtime writes a non-finite loss as the string "nan" or "inf"
    if x != x:  # NaN
        return "nan"
    if x == 0:
        return "0"
    if abs(x) >= 1e5 or abs(x) < 1e-3:
        return f"{x:.3e}"
    return f"{x:.4g}"


def format_gpu_hours(hours: float | None) -> str:
    """``0.0042``, ``3.21``, ``1,234`` GPU-hours: small rehearsal runs still show a figure.
    Past what any cluster has run (a duration edited into a ledger by hand), ``>1e12``: one
    short cell, as ``format_duration`` caps a duration, not a number of a hundred digits."""
    if hours is None or hours != hours:
        return "-"
    if not abs(hours) < 1e12:
        return ("-" if hours < 0 else "") + ">1e12"
    if hours >= 100:
        return f"{hours:,.0f}"
    return f"{hours:.3g}" if hours < 1 else f"{hours:.2f}"


def format_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"



def format_age(text: str | None, now: _dt.datetime | None = None) -> str:
    """How long ago an ISO time was: ``5m10s ago``."""
    t = parse_iso(text)
    if t is None:
        return "-"
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return format_duration((now - t).total_seconds()) + " ago"
