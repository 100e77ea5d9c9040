"""Reading a GPU kind's kernel table (``node.kernel_table``): the config's file door
(``yamlio.read_text_file``: a regular file, links followed, of bounded size, UTF-8, never a
device or a FIFO), JSON, then ``gpu_table.table_from_json``, which refuses every value the
step-time model could not use. Read once when a profile is loaded and again by the planner."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import UsageError
from ..gpu_table import GpuTable, TableError, table_from_json
from . import yamlio

TABLE_BYTES = 16 << 20      # a full grid of three layouts is about 100 KB


def load_table(path: str | os.PathLike) -> GpuTable:
    """The table at ``path``; ``TableError`` naming the file and what is wrong."""
    path = Path(path)
    try:
        text = yamlio.read_text_file(path, "kernel table", TABLE_BYTES, kind="JSON")
    except UsageError as e:
        raise TableError(str(e)) from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise TableError(f"kernel table {path}: is not JSON "
                         f"({str(e).splitlines()[0][:120]})") from None
    if not isinstance(data, dict):
        raise TableError(f"kernel table {path}: holds a JSON {type(data).__name__}, expected an "
                         "object")
    return table_from_json(data, str(path))
