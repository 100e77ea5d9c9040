"""The README's profile and job reference tables, generated from the schema dataclasses.

``tools/gen_reference`` rewrites the README between the marker comments, and a test checks the
README is current, so the documentation cannot drift from what the loader accepts.
"""

from __future__ import annotations

from .job import JobConfig
from .profile import ClusterProfile
from .schema import describe_fields


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
        rows.append(f"| `{path}` | {type_name} | {_fmt_default(default)} | {doc.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


MARKERS = {"profile": ClusterProfile, "job": JobConfig}


def update_readme(text: str) -> str:
    for name, cls in MARKERS.items():
        start = f"<!-- reference:{name}:start -->\n"
        end = f"<!-- reference:{name}:end -->"
        if start not in text or end not in text:
            raise ValueError(f"README lacks the {name} reference markers")
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + start + table(cls) + end + tail
    return text
