"""The one way hpctrain writes a duration: ``42s``, ``3m05s``, ``2h03m``, ``1d04h``.

A value (no I/O), so the CLI's tables and the ranks' progress lines (their ETA) share it.
"""

from __future__ import annotations

import datetime as _dt


def format_duration(seconds: float | int | None) -> str:
    """``42s``, ``3m05s``, ``2h03m``, ``1d04h`` (None: ``-``)."""
    if seconds is None:
        return "-"
    if not abs(seconds) < 1e15:         # NaN, infinite or beyond 30 million years
        return "-" if seconds != seconds else ("-" if seconds < 0 else "") + ">1e15s"
    s = int(round(seconds))
    if s < 0:
        return "-" + format_duration(-s)
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def parse_iso(text: str | None) -> _dt.datetime | None:
    """ISO times from run folders (with offset) or Slurm (local, no offset); None if unreadable.
    The one reader of a recorded time: a time at the edge of what ``datetime`` holds (year 1,
    or year 9999 with an offset) is read, but moving it to local time or UTC, as every caller
    does, overflows; such a time is unreadable too, not an error in the middle of a listing."""
    if not text:
        return None
    try:
        t = _dt.datetime.fromisoformat(str(text))
        t = t if t.tzinfo else t.astimezone()
        t.astimezone(_dt.timezone.utc)
        t.astimezone()
    except (ValueError, OverflowError, OSError):
        return None
    return t
