"""Property: whatever words are given to the commands that read arguments (run names, sizes,
sweep specs, ``--set`` values, node counts, paths), the CLI ends with a result or one ``Error:``
line and exit code 2 (or 1 where the system failed), never ``internal error``, within bounded
time, and changes nothing on disk but the run folders it was asked to create. A value given
to ``--set`` or ``--sweep`` never starts a line of its own in the error (a newline in it once
split the error's ``[--set KEY=VALUE]`` label over two lines)."""

from __future__ import annotations

from click.testing import CliRunner
from hypothesis import example, given, strategies as st

from hpctrain.cli import cli
from tests.conftest import REPO

TINY = str(REPO / "examples" / "tiny.yaml")
_word = st.one_of(st.text(max_size=12), st.sampled_from(
    ["", " ", "0", "-1", "2", "10**9", "1e400", "nan", "0x10", "1:30", "x" * 300, "/dev/null",
     "/dev/zero", "/proc", "..", "a/b", "train.lr=", "train.lr=1,1", "train.lr=[1]",
     "train.lr=" + ",".join(map(str, range(2000))), "99999x99999", "10x10", "\udcff",
     "a\n\nb", "a\r\nb", "\x1b[31m", "a\u2028b", "y" * 5000]))

COMMANDS = st.one_of(
    st.builds(lambda w: ["status", w], _word),
    st.builds(lambda w: ["logs", w], _word),
    st.builds(lambda w: ["cancel", w], _word),
    st.builds(lambda w, s: ["report", w, "--size", s], _word, _word),
    st.builds(lambda n: ["render", TINY, "--nodes", n], _word),
    st.builds(lambda s: ["submit", TINY, "--dry-run", "--sweep", s], _word),
    st.builds(lambda n, c: ["submit", TINY, "--dry-run", "--nodes", n, "--chain", c], _word, _word),
    st.builds(lambda p: ["validate", TINY, "--profile", p], _word),
    st.builds(lambda v: ["validate", TINY, "--set", "train.schedule=" + v], _word),
    st.builds(lambda v: ["submit", TINY, "--dry-run", "--sweep", "train.schedule=cosine," + v],
              _word),
)


@given(COMMANDS)
# what an audit found, run whatever the budget draws: a line break or U+2028 in a --set or
# --sweep value split the error's label; a long run name or option value was quoted whole
@example(["validate", TINY, "--set", "train.schedule=a\n\nb"])
@example(["validate", TINY, "--set", "train.schedule=\x1b[31m\u2028x"])
@example(["submit", TINY, "--dry-run", "--sweep", "train.schedule=cosine,a\r\n\nb"])
@example(["status", "y" * 5000])
@example(["render", TINY, "--nodes", "9" * 3000])
@example(["validate", TINY, "--set", "train.schedule=" + "z" * 5000])
def test_any_arguments_give_a_result_or_one_error_line(tmp_path_factory, argv):
    root = tmp_path_factory.mktemp("runs")
    result = CliRunner().invoke(cli, argv, env={"HPCTRAIN_RUNS_DIR": str(root)})
    assert "internal error" not in result.output, (argv, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), (argv, result)
    if result.exit_code not in (0,):
        assert result.exit_code in (1, 2), (argv, result.exit_code, result.output)
        assert "Error" in result.output, (argv, result.output)
        # one line (a file's problems and a sweep's combinations included), at most a few
        # hundred characters
        assert len(result.output.strip().splitlines()) == 1, (argv, result.output)
        assert all(len(line) < 1000 for line in result.output.splitlines()), (argv, result.output)
