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
