"""Every Markdown table in README.md and docs/*.md has as many cells in each row as its header:
an unescaped ``|`` in a cell (a field's choices, ``slurm | local``) splits it, and GitHub then
drops what overflows."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tests.docs.markdown_check import cells, doc_pages, table_problems


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_table_row_has_the_headers_column_count(page):
    problems = table_problems(page)
    assert not problems, "\n".join(problems)


def test_an_unescaped_pipe_in_a_cell_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("| field | type |\n|---|---|\n| `a` | x \\| y |\n| `b` | x | y |\n\n"
                    "```\n| not | a | table |\n|---|\n| x |\n```\n")
    assert cells("| `a` | x \\| y |") == ["`a`", "x \\| y"]
    (problem,) = table_problems(page, root=tmp_path)
    assert problem.startswith("page.md:4: 3 cells, the header has 2")
