"""Reading a GPU kind's kernel table (``node.kernel_table``): the config's file door
(``yamlio.read_text_file``: a regular file, links followed, of bounded size, UTF-8, never a
device or a FIFO), JSON holding one object (``file_door.json_object``), then
``gpu_table.table_from_json``, which refuses every value the step-time model could not use.
Read once when a profile is loaded and again by the planner.

hpctrain ships the tables measured on the GPU kinds it was run on (``hpctrain/kernel_tables``,
by ``tools/gpu_check``'s kernels part); a profile names one as ``builtin:NAME``
(:func:`builtin_table`), or its own file measured on its cluster."""

from __future__ import annotations

import os
from pathlib import Path

from .. import file_door
from ..errors import UsageError
from ..gpu_table import GpuTable, TableError, table_from_json
from . import yamlio

TABLE_BYTES = 16 << 20      # a full grid of three layouts is about 100 KB
BUILTIN = "builtin:"
BUILTIN_DIR = Path(__file__).resolve().parent.parent / "kernel_tables"


def builtin_tables() -> list[str]:
    """The names of the tables hpctrain ships (``builtin:NAME``)."""
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.json"))


def builtin_table(value: str) -> Path | None:
    """The shipped table ``value`` names (``builtin:NAME``), None when it names a file;
    ``TableError`` for a name hpctrain does not ship (never a path: the name is matched
    against the shipped list, not joined to a folder)."""
    if not value.startswith(BUILTIN):
        return None
    name = value[len(BUILTIN):]
    names = builtin_tables()
    if name not in names:
        raise TableError(f"{value} is not a table hpctrain ships (it ships: "
                         f"{', '.join(BUILTIN + n for n in names) or 'none'})")
    return BUILTIN_DIR / f"{name}.json"


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
