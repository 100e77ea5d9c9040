"""The profile and job field tables in docs/configuration.md are generated from the schema;
they must be current and render as tables (tools/gen_reference rewrites them)."""

from hpctrain.config.reference import REFERENCE_PAGE, cell, table, update_tables
from hpctrain.config.job import JobConfig
from hpctrain.config.profile import ClusterProfile
from tests.conftest import REPO
from tests.docs.markdown_check import cells, table_problems


def test_reference_tables_match_the_schema():
    text = (REPO / REFERENCE_PAGE).read_text()
    assert update_tables(text) == text, f"{REFERENCE_PAGE} reference tables are stale: run tools/gen_reference"


def test_every_generated_row_has_four_cells_even_with_choices():
    for cls in (ClusterProfile, JobConfig):
        rows = table(cls).splitlines()
        assert [len(cells(row)) for row in rows] == [4] * len(rows)
    choices = [row for row in table(ClusterProfile).splitlines() if row.startswith("| `scheduler` |")]
    assert choices and cells(choices[0])[1] == "slurm \\| local"
    assert table_problems(REPO / REFERENCE_PAGE) == []


def test_a_pipe_in_any_cell_is_escaped():
    assert cell("a | b") == "a \\| b"
    assert len(cells("| " + " | ".join(cell(c) for c in ("`x`", "a | b", "`1`", "c|d")) + " |")) == 4
