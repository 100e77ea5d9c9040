"""The full ``hpctrain runs`` listing read from one file beside the run folders.

Why: each run's row is kept in its folder (:mod:`hpctrain.view.summary_cache`), but listing
10,000 runs still opened, read and parsed 10,000 small files. ``RUNS_ROOT/.runs-index.json``
holds the same kept rows, each with the same fingerprint of the files it was built from, so the full
listing reads one file and stats each run's sources.

What holds, whatever the file says:

* The run folders are the record. Which runs are listed always comes from the runs folder
  itself; the index only supplies the row of a run it names whose files have not changed
  since (the same size, mtime and inode of each source as when the row was built). A run the
  index does not name, or whose files changed, is built as before; its scheduler state is
  asked for as before. So a run started, finished or damaged after the index was written is
  shown as it is now, and a removed one is gone.
* The index names runs by folder name only, never by path: it can name nothing outside its
  own runs folder, and it is read and written only by a listing of that folder.
* It is replaced atomically (temporary file, rename; no fsync: it can always be rebuilt), only
  by a full listing, only when a row changed. Two listings writing at once: the last one wins
  and, as every entry is checked when it is read, an older entry only costs building that row.
* A checksum covers the file: a torn, cut or edited index is found as a whole, not row by row.
  A damaged one (that, or a FIFO, a link, a folder in its place) is reported in one line,
  ignored and rewritten; one of another format version is rewritten silently.
* It is private to the user who wrote it (0600): its rows come from private run folders.
  A runs folder the listing cannot write is listed as before, only not faster.
"""

from __future__ import annotations

import json
import os
import tempfile
import zlib
from pathlib import Path
from typing import Callable

from .. import file_door, limits
from ..record import reader
from ..record.files import RunFileError
from ..view.summary_cache import SETTLED, fingerprint_at, summaries

INDEX_FILE = ".runs-index.json"
FORMAT = 2      # 2: rows as summary_cache's format 2 builds them
MAGIC = b"hpctrain-runs-index"


def index_path(root: Path | str) -> str:
    return os.path.join(str(root), INDEX_FILE)


def encode(entries: dict) -> bytes:
    """The file: a header line (magic, format, CRC-32 and length of the body), then the body as
    JSON: ``{"columns": [row keys], "runs": {folder name: [fingerprint, values]}}``, a row's
    values in the order of ``columns`` (a row with other keys is kept as its mapping). Rows as
    lists are about half the tokens of rows as mappings, so the file parses faster."""
    columns: list[str] = []
    for _, row in entries.values():
        columns = list(row)
        break
    width = len(columns)
    runs = {name: [print_, [row[c] for c in columns]
                   if len(row) == width and all(c in row for c in columns) else row]
            for name, (print_, row) in entries.items()}
    body = json.dumps({"columns": columns, "runs": runs}, separators=(",", ":")).encode("utf-8")
    return b"%s %d %08x %d\n" % (MAGIC, FORMAT, zlib.crc32(body), len(body)) + body


def decode(data: bytes) -> tuple[list, dict, str | None]:
    """The columns and entries of an index file's bytes, and what is wrong with it (None when
    nothing is, or when it is of another format version, which is rebuilt without a word)."""
    head, newline, body = data.partition(b"\n")
    parts = head.split(b" ")
    if not newline or len(parts) != 4 or parts[0] != MAGIC:
        return [], {}, "is not a runs index (its first line is not hpctrain's header)"
    if parts[1] != b"%d" % FORMAT:
        return [], {}, None
    try:
        crc, length = int(parts[2], 16), int(parts[3])
    except ValueError:
        return [], {}, "has a header that cannot be read"
    if length != len(body) or crc != zlib.crc32(body):
        return [], {}, "does not match its checksum (cut short or edited)"
    try:
        data = file_door.loads(body)
    except (ValueError, RecursionError):
        return [], {}, "is not JSON"
    columns = data.get("columns") if isinstance(data, dict) else None
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, dict) or not isinstance(columns, list) \
            or not all(isinstance(c, str) for c in columns):
        return [], {}, "does not hold columns and runs"
    return columns, runs, None


def read_index(root: Path | str) -> tuple[list, dict, str | None]:
    """The columns and entries of ``root``'s index ({} when there is none) and what is wrong
    with it, if anything. Read through the run-folder reader: regular files only, never a
    link, bounded."""
    try:
        data = reader.read_bytes(index_path(root), limits.RUN_RECORD_BYTES)
    except RunFileError as e:
        return [], {}, getattr(e, "why", None) or str(e)
    if data is None:
        return [], {}, None
    return decode(data)


def entry_row(entry, columns: list, print_: list) -> dict | None:
    """The row (a new mapping) an index entry keeps for a run whose fingerprint is now
    ``print_``; None when it was kept for other files, holds a state the run's files alone do
    not decide, or is not an entry at all. Called once per run: kept cheap."""
    if type(entry) is not list or len(entry) != 2 or entry[0] != print_:
        return None
    values = entry[1]
    if type(values) is list:
        if len(values) != len(columns):
            return None
        row = dict(zip(columns, values))
    elif type(values) is dict:
        row = values
    else:
        return None
    return row if row.get("state") in SETTLED else None


def write_index(root: Path | str, entries: dict) -> bool:
    """Replace ``root``'s index with ``entries`` (``{folder name: [fingerprint, row]}``): a
    temporary file (mkstemp: mode 0600) renamed over it. Whether it was written: a folder
    that cannot be written, or an index that cannot be replaced (a folder in its place), is
    not an error; the next listing builds the rows again."""
    root = str(root)
    try:
        fd, tmp = tempfile.mkstemp(prefix=INDEX_FILE + ".", dir=root)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(encode(entries))
        os.replace(tmp, index_path(root))
        return True
    except (OSError, ValueError, TypeError):
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


def listing_rows(root: Path, limit: int | None = None,
                 warn: Callable[[str], None] | None = None) -> list[dict]:
    """The rows of ``hpctrain runs`` for ``root``, newest first.

    ``-n N`` reads the N newest runs' own kept rows (cheaper than the whole index). The full
    listing reads the index, checks each entry against its run's files, builds the rows of
    the others (:func:`hpctrain.view.summary_cache.summaries`) and writes the index again
    when a row changed. ``warn`` gets one line when the index was damaged."""
    from .listing import newest_folders, newest_runs
    from ..record.folder import RunFolder
    if limit is not None:
        return summaries(newest_runs(root, limit))
    columns, entries, problem = read_index(root)
    rows: list = []
    misses: list[int] = []
    keep: dict = {}
    for entry in newest_folders(root):        # the folder says which runs there are
        name, path = entry.name, entry.path
        print_ = fingerprint_at(path)
        if print_[0] is None:                  # no run.yaml: not a run folder
            continue
        row = entry_row(entries.get(name), columns, print_)
        if row is None:
            misses.append(len(rows))
            rows.append(RunFolder(Path(path)))
        else:
            keep[name] = [print_, row]
            rows.append({**row, "run": name, "run_dir": path})
    hits = len(keep)
    if misses:
        for i, row in zip(misses, summaries([rows[i] for i in misses], keep=keep)):
            rows[i] = row
    written = False
    if (problem or len(keep) != hits or len(entries) != hits) and os.path.isdir(root):
        written = write_index(root, keep)
    if problem and warn is not None:
        what = ("rebuilt from the run folders" if written else
                f"not rewritten (remove {INDEX_FILE} there, or make the folder writable)")
        warn(f"Warning: the runs index {index_path(root)} {problem}; it was ignored (the run "
             f"folders are the record: no run is lost) and {what}.")
    return rows
