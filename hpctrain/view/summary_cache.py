"""The rows of ``hpctrain runs``, kept in each run folder so a team's runs folder lists fast.

Building a run's row reads run.yaml (through the strict YAML loader), the ledger, the events
and the end of the metrics: about 2.5 ms a run, 25 s for 10,000 runs. A run that has ended does
not change unless one of those files does, so its row is kept in ``RUN/.summary.json`` with a
fingerprint of the files it was built from (size, mtime_ns and inode of each). The listing
stats those files and uses the kept row when the fingerprint matches; otherwise it builds the
row as before and replaces the file (atomically; a folder it cannot write is not an error).

What is never taken from the file, so the listing always shows the live state:

* a row whose state came from the scheduler (RUNNING, PENDING, a job's final word such as
  FAILED or UNKNOWN): only FINISHED, CANCELLED, STOPPED and NOT SUBMITTED, which the run's own
  files decide once no job is active, are kept; every other run is asked of its backend, all
  of them in one query per backend as before;
* a DAMAGED run (a file the reader refuses): built again each time, so repairing it shows;
* GPU-hours that the scheduler's accounting may still fill in: a row of a run on a backend
  with accounting is kept only once its GPU-hours come from that accounting.

The file is read through the run-folder reader like every other; one that cannot be read,
is not this format, or names another fingerprint is ignored and rewritten.
"""

from __future__ import annotations

import json
import os

from ..record import reader
from ..record.files import RunFileError
from ..record.folder import RunFolder
from .cost import ACCOUNTING
from .runview import CANCELLED, FINISHED, NOT_SUBMITTED, STOPPED, add_usage, build_views

CACHE_FILE = ".summary.json"
# 2: rows print names and sweep values read from disk in their printable form, and a run
# whose file gives a JSON key twice is DAMAGED: a row an older version kept is built again
FORMAT = 2
# the files (and the logs folder, whose attempt-N folders count attempts) a row is built from
SOURCES = ("run.yaml", "job.yaml", "ledger.jsonl", "events.jsonl", "metrics.jsonl", "logs")
_SOURCE_SUFFIXES = tuple(os.sep + name for name in SOURCES)
SETTLED = (FINISHED, CANCELLED, STOPPED, NOT_SUBMITTED)
_PER_FOLDER = ("run", "run_dir")          # filled in from where the folder is now


def fingerprint(run: RunFolder) -> list:
    """``[size, mtime_ns, inode]`` of each source file (None when missing), in SOURCES order."""
    return fingerprint_at(str(run.path))


def fingerprint_at(folder: str) -> list:
    """:func:`fingerprint` of the run folder at the path ``folder`` (no Path object made; the
    listing of 10,000 runs is mostly these 60,000 ``lstat`` calls)."""
    out = []
    lstat = os.lstat
    for name in _SOURCE_SUFFIXES:
        try:
            st = lstat(folder + name)
        except OSError:
            out.append(None)
            continue
        out.append([st.st_size, st.st_mtime_ns, st.st_ino])
    return out


def cached_row(run: RunFolder, print_: list) -> dict | None:
    """The kept row of ``run`` when its fingerprint is ``print_``; None otherwise (no file, a
    file that cannot be read or is not this format, or files changed since)."""
    try:
        data = reader.read_json(str(run.path) + os.sep + CACHE_FILE)
    except RunFileError:
        return None
    if not data or data.get("format") != FORMAT:
        return None
    row = valid_row(data.get("fingerprint"), data.get("row"), print_)
    return None if row is None else {**row, "run": run.id, "run_dir": str(run.path)}


# what each field of a row may hold (RunView.summary builds them): a kept row whose field holds
# anything else was not written by hpctrain, and is built again from the run's files
_COUNTS = ("step", "total_steps", "attempts")
_NUMBERS = ("loss", "val_loss", "gpu_hours")
NOT_FINITE = ("nan", "inf", "-inf")
_TEXTS = ("name", "profile", "job_id", "detail", "created", "last_event", "last_event_time",
          "gpu_hours_source")


def _typed(row: dict) -> bool:
    def count(v):
        return v is None or (type(v) is int and v >= 0)

    def number(v):     # the metrics write a loss that is not finite as its text
        return v is None or v in NOT_FINITE or \
            (type(v) in (int, float) and v == v and abs(v) != float("inf"))

    return (all(count(row.get(k)) for k in _COUNTS) and all(number(row.get(k)) for k in _NUMBERS)
            and all(row.get(k) is None or type(row.get(k)) is str for k in _TEXTS)
            and (row.get("sweep") is None or isinstance(row.get("sweep"), dict)))


def valid_row(kept_print, row, print_: list) -> dict | None:
    """``row`` (as kept, without the folder's own fields) when it was kept for the fingerprint
    ``print_``, holds a state the run's files alone decide and every field of its kind; None
    otherwise."""
    if kept_print != print_ or not isinstance(row, dict) or row.get("state") not in SETTLED:
        return None
    return row if _typed(row) else None


def keepable(row: dict, accounted: bool) -> bool:
    """A row the run's files alone decide (see the module docstring)."""
    if row.get("state") not in SETTLED or "damaged" in row:
        return False
    return not accounted or row.get("gpu_hours_source") == ACCOUNTING \
        or row.get("state") == NOT_SUBMITTED


def bare(row: dict) -> dict:
    """``row`` without the fields filled in from where the folder is now."""
    return {k: v for k, v in row.items() if k not in _PER_FOLDER}


def keep_row(run: RunFolder, print_: list, row: dict) -> None:
    """Replace the run's kept row; a folder that cannot be written (read-only, another
    user's) just is not sped up."""
    from ..config import yamlio
    data = {"format": FORMAT, "fingerprint": print_, "row": bare(row)}
    try:
        yamlio.write_atomic(run.path / CACHE_FILE, json.dumps(data), durable=False,
                            within=run.path)
    except (OSError, ValueError, TypeError):
        pass


def summaries(runs: list[RunFolder], keep: dict | None = None) -> list[dict]:
    """The rows of ``runs`` (``RunView.summary``), in order: kept rows where they hold, the
    others built with one scheduler query and one accounting query per backend. ``keep``,
    when given, receives ``[fingerprint, row]`` of every row that may be kept, by folder name
    (what the runs index, :mod:`hpctrain.ops.runs_index`, is written from)."""
    rows: list[dict | None] = []
    prints: dict = {}
    stale: list[RunFolder] = []
    for run in runs:
        print_ = fingerprint(run)
        row = cached_row(run, print_)
        rows.append(row)
        if row is None:
            prints[run.path] = print_      # taken before the files are read: a change while
            stale.append(run)              # the row is built is seen at the next listing
        elif keep is not None:
            keep[run.id] = [print_, bare(row)]
    built = {}
    for view in add_usage(build_views(stale)):
        row = view.summary()
        built[view.run.path] = row
        if keepable(row, accounted=_has_accounting(view)):
            print_ = prints[view.run.path]
            keep_row(view.run, print_, row)
            if keep is not None:
                keep[view.run.id] = [print_, bare(row)]
    return [row if row is not None else built[run.path] for run, row in zip(runs, rows)]


def _has_accounting(view) -> bool:
    """Whether the run's backend may later report GPU-hours its accounting does not have yet."""
    from ..scheduler.backend import Backend
    try:
        return type(view.backend).accounted_gpu_seconds is not Backend.accounted_gpu_seconds
    except Exception:
        return True
