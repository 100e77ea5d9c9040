"""An empty or blank RUN is an error for every command (one door: the run lookup), and every
size a user gives is bounded with the limit in the error."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from hpctrain.errors import UsageError
from hpctrain.record.folder import find_run
from tests.conftest import REPO, hpctrain


def test_an_empty_run_name_selects_nothing(tmp_path):
    runs = tmp_path / "runs"
    proc = hpctrain("submit", str(REPO / "examples" / "tiny.yaml"), "--dry-run", "--runs-dir", str(runs))
    assert proc.returncode == 0, proc.stderr
    for command in (["status", ""], ["cancel", ""], ["logs", " "], ["report", "\t"]):
        proc = hpctrain(*command, "--runs-dir", str(runs))
        assert proc.returncode == 2 and proc.stderr.startswith("Error: RUN:"), (command, proc.stderr)


@given(st.text(alphabet=" \t\n\r\x0b\x0c", max_size=4))
def test_blank_names_are_refused_at_the_lookup(name):
    with pytest.raises(UsageError, match="RUN: expected"):
        find_run(name, REPO / "no-such-root")


def test_report_size_is_bounded(tmp_path):
    proc = hpctrain("report", "x", "--size", "100000x100000", "--runs-dir", str(tmp_path))
    assert proc.returncode == 2 and "each from 200 to 10,000" in proc.stderr


def _options(command, path=()):
    """(command path, option) for every option of every command of the CLI."""
    import click
    if isinstance(command, click.Group):     # the CLI loads its commands when asked for them
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            yield from _options(command.get_command(ctx, name), path + (name,))
    for param in command.params:
        if isinstance(param, click.Option) and not param.is_flag:
            yield " ".join(path), param


def test_every_number_option_has_a_range_and_refuses_nan():
    """What the doors say for sizes holds for every option, not the ones a test tried: an
    integer option takes its range from limits.py (``data prepare -j 100000`` once spawned a
    hundred thousand tokenizer processes), and a number option refuses NaN (click's
    FloatRange takes it: ``bench kernels --budget nan`` was a budget never spent)."""
    import click

    from hpctrain.cli import cli
    seen = 0
    for where, option in _options(cli):
        kind = option.type
        if isinstance(kind, click.types._NumberParamTypeBase):
            seen += 1
            assert isinstance(kind, (click.IntRange, click.FloatRange)), (where, option.name)
            assert kind.min is not None and kind.max is not None, (where, option.name)
            for word in ("nan", "inf", "-inf", str(10 ** 30)):
                with pytest.raises(click.BadParameter):
                    kind.convert(word, option, None)
    assert seen >= 15
