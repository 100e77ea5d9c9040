"""Reading a GPU kind's kernel table (``node.kernel_table``): the config's file door
(``yamlio.read_text_file``: a regular file, links followed, of bounded size, UTF-8, never a
device or a FIFO), JSON holding one object (``file_door.json_object``), then
``gpu_table.table_from_json``, which refuses every value the step-time model could not use.
Read once when a profile is loaded and again by the planner."""

from __future__ import annotations

import os
from pathlib import Path

from .. import file_door
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
        data = file_door.json_object(text)
    except file_door.Refused as e:
        raise TableError(f"kernel table {path}: {e.why}") from None
    return table_from_json(data, str(path))
