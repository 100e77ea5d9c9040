"""The README's reference tables are generated from the schema; they must be current."""

from hpctrain.config.reference import update_readme
from tests.conftest import REPO


def test_readme_reference_tables_match_the_schema():
    text = (REPO / "README.md").read_text()
    assert update_readme(text) == text, "README reference tables are stale: run tools/gen_reference"
