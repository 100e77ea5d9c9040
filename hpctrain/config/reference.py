"""The profile and job field tables of docs/configuration.md, generated from the schema dataclasses.

``tools/gen_reference`` rewrites the page between the marker comments, and a test checks the
page is current, so the documentation cannot drift from what the loader accepts. Every cell is
escaped for a Markdown table: a ``|`` (the separator of a field's choices, ``slurm | local``)
would otherwise end the cell and break the row.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from .job import JobConfig
from .profile import ClusterProfile
from .schema import describe_fields

#: The page holding the tables, relative to the repository root.
REFERENCE_PAGE = PurePosixPath("docs/configuration.md")

MARKERS = {"profile": ClusterProfile, "job": JobConfig}


def cell(text: str) -> str:
    r"""One table cell's text: ``|`` escaped as ``\|`` (GitHub renders it as ``|``, also in code)."""
    return text.replace("|", "\\|")


def _fmt_default(value) -> str:
    if value == "required":
        return "**required**"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == [] or value == {}:
        return "`[]`" if value == [] else "`{}`"
    if value == "":
        return '""'
    return f"`{value}`"


def table(cls) -> str:
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for path, type_name, default, doc in describe_fields(cls):
        cells = (f"`{path}`", type_name, _fmt_default(default), doc)
        rows.append("| " + " | ".join(cell(c) for c in cells) + " |")
    return "\n".join(rows) + "\n"


def update_tables(text: str) -> str:
    """``text`` (the reference page) with every marked table regenerated from the schema."""
    for name, cls in MARKERS.items():
        start = f"<!-- reference:{name}:start -->\n"
        end = f"<!-- reference:{name}:end -->"
        if start not in text or end not in text:
            raise ValueError(f"{REFERENCE_PAGE} lacks the {name} reference markers")
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + start + table(cls) + end + tail
    return text
