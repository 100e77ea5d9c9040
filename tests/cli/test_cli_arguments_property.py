"""Property: whatever words are given to the commands that read arguments (run names, sizes,
sweep specs, node counts, paths), the CLI ends with a result or one ``Error:`` line and exit
code 2 (or 1 where the system failed), never ``internal error``, within bounded time, and
changes nothing on disk but the run folders it was asked to create."""

from __future__ import annotations

from click.testing import CliRunner
from hypothesis import given, strategies as st

from hpctrain.cli import cli
from tests.conftest import REPO

TINY = str(REPO / "examples" / "tiny.yaml")
_word = st.one_of(st.text(max_size=12), st.sampled_from(
    ["", " ", "0", "-1", "2", "10**9", "1e400", "nan", "0x10", "1:30", "x" * 300, "/dev/null",
     "/dev/zero", "/proc", "..", "a/b", "train.lr=", "train.lr=1,1", "train.lr=[1]",
     "train.lr=" + ",".join(map(str, range(2000))), "99999x99999", "10x10", "\udcff"]))

COMMANDS = st.one_of(
    st.builds(lambda w: ["status", w], _word),
    st.builds(lambda w: ["logs", w], _word),
    st.builds(lambda w: ["cancel", w], _word),
    st.builds(lambda w, s: ["report", w, "--size", s], _word, _word),
    st.builds(lambda n: ["render", TINY, "--nodes", n], _word),
    st.builds(lambda s: ["submit", TINY, "--dry-run", "--sweep", s], _word),
    st.builds(lambda n, c: ["submit", TINY, "--dry-run", "--nodes", n, "--chain", c], _word, _word),
    st.builds(lambda p: ["validate", TINY, "--profile", p], _word),
)


@given(COMMANDS)
def test_any_arguments_give_a_result_or_one_error_line(tmp_path_factory, argv):
    root = tmp_path_factory.mktemp("runs")
    result = CliRunner().invoke(cli, argv, env={"HPCTRAIN_RUNS_DIR": str(root)})
    assert "internal error" not in result.output, (argv, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), (argv, result)
    if result.exit_code not in (0,):
        assert result.exit_code in (1, 2), (argv, result.exit_code, result.output)
        assert "Error" in result.output, (argv, result.output)
