"""Reading the project's Markdown as GitHub renders it: headings and their anchors, links, tables.

The checks in this folder use these to fail on a link or anchor that leads nowhere and on a table
row that GitHub would cut short or pad (a ``|`` left unescaped in a cell).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
DELIMITER_ROW = re.compile(r"^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def doc_pages() -> list[Path]:
    """The README and every page of docs/: the documentation a user reads on GitHub."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) for every line outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading (github-slugger's rule): the rendered text, lowercased,
    with punctuation and symbols removed and each space turned into a hyphen."""
    text = LINK.sub(lambda m: m["text"], heading)
    text = CODE_SPAN.sub(lambda m: m[2], text).lower()
    kept = []
    for ch in text:
        if ch in " -_" or ch.isalnum() or unicodedata.category(ch).startswith("M"):
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a page; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(text):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match[2])
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


@dataclass(frozen=True)
class Link:
    page: Path
    line: int
    target: str


def links(page: Path) -> list[Link]:
    """The links of a page's prose (code blocks and code spans are not links)."""
    out = []
    for number, line in prose_lines(page.read_text()):
        for match in LINK.finditer(CODE_SPAN.sub("", line)):
            out.append(Link(page, number, match["target"]))
    return out


def _name(page: Path, root: Path) -> str:
    return str(page.relative_to(root)) if page.is_relative_to(root) else str(page)


def broken(link: Link, root: Path = REPO) -> str | None:
    """Why a relative link or #anchor leads nowhere, or None when it resolves (external links
    are not followed). ``root``: the repository, which no link may leave."""
    if EXTERNAL.match(link.target):
        return None
    path, _, anchor = link.target.partition("#")
    target = (link.page.parent / path).resolve() if path else link.page.resolve()
    where = f"{_name(link.page, root)}:{link.line}: {link.target}"
    if not target.exists():
        return f"{where}: no such file"
    if not target.is_relative_to(root.resolve()):
        return f"{where}: outside the repository"
    if anchor:
        if target.suffix != ".md":
            return f"{where}: an anchor into a file that is not Markdown"
        if anchor not in anchors(target.read_text()):
            return f"{where}: no heading with anchor #{anchor} in {target.name}"
    return None


def cells(row: str) -> list[str]:
    """A table row's cells, split at every ``|`` not escaped as ``\\|`` (as GitHub splits them,
    inside code spans too)."""
    parts = re.split(r"(?<!\\)\|", row.strip())
    if parts and parts[0].strip() == "":
        parts = parts[1:]
    if parts and parts[-1].strip() == "":
        parts = parts[:-1]
    return [part.strip() for part in parts]


def table_problems(page: Path, root: Path = REPO) -> list[str]:
    """Rows whose number of cells differs from their table's header."""
    lines = prose_lines(page.read_text())
    problems = []
    i = 0
    while i < len(lines) - 1:
        number, line = lines[i]
        if line.lstrip().startswith("|") and DELIMITER_ROW.match(lines[i + 1][1].strip()):
            width = len(cells(line))
            j = i + 1
            while j < len(lines) and lines[j][1].lstrip().startswith("|") and lines[j][0] == number + (j - i):
                row_number, row = lines[j]
                if len(cells(row)) != width:
                    problems.append(f"{_name(page, root)}:{row_number}: {len(cells(row))} cells, "
                                    f"the header has {width}: {row[:100]}")
                j += 1
            i = j
        else:
            i += 1
    return problems
