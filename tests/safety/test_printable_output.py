"""What reaches the terminal from a run folder is printable. A rank log holds whatever the
ranks printed (escape codes, a terminal title, bytes that are not UTF-8, bidirectional
overrides) and the ledger whatever a failure said; ``logs``, ``status`` and the preflight table
print them through ``file_door.printable``: every character a terminal would act on is shown
as ``\\x1b``, ``\\x07``, ``\\u202e``, and the line feeds and tabs that lay the text out stay."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, strategies as st

from hpctrain.cli import cli
from hpctrain.file_door import printable
from hpctrain.preflight.report import format_table
from hpctrain.record.folder import RunFolder
from tests.conftest import REPO
from tests.ops.helpers import record

TINY = str(REPO / "examples" / "tiny.yaml")
HOSTILE = "\x1b]0;pwned\x07 \x1b[2J \x9b31m \u202eevil \x08"


def _printable_block(text: str) -> bool:
    return all(c.isprintable() or c in "\n\t" for c in text)


@given(st.text())
def test_the_printable_form_keeps_the_layout_and_escapes_the_rest(text):
    """Property: the form holds only printable characters, line feeds and tabs; printable text
    (with its line feeds and tabs) is unchanged; a line is never split or joined."""
    shown = printable(text)
    assert _printable_block(shown)
    assert shown.count("\n") == text.count("\n")
    if _printable_block(text):
        assert shown == text
    assert printable(shown) == shown


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, RunFolder]:
    root = tmp_path_factory.mktemp("printable") / "runs"
    result = CliRunner().invoke(cli, ["submit", TINY, "--dry-run", "--runs-dir", str(root)])
    assert result.exit_code == 0, result.output
    folder = RunFolder(next(root.iterdir()))
    folder.attempt_dir(1).mkdir(parents=True)
    return root, folder


def _invoke(root: Path, *argv: str):
    result = CliRunner().invoke(cli, [*argv, "--runs-dir", str(root)])
    assert result.exit_code == 0, result.output
    return result.output


@given(st.binary(max_size=200))
def test_logs_prints_any_rank_log_as_printable_lines(run, data):
    """Property: whatever bytes a rank log holds, ``hpctrain logs`` prints printable lines (a
    byte that is not UTF-8 as U+FFFD); a log of printable text is printed as it is."""
    root, folder = run
    folder.rank_log(1, 0).write_bytes(data)
    out = _invoke(root, "logs", folder.id)
    assert _printable_block(out)
    text = data.decode("utf-8", errors="replace")
    if text.isprintable():
        assert out == (text + "\n" if text else "")


def test_logs_shows_escape_codes_instead_of_acting_on_them(run):
    root, folder = run
    folder.rank_log(1, 0).write_bytes(b"step 1\n\x1b[31mred\x1b[0m\ttab\nbad \xff byte\n")
    assert _invoke(root, "logs", folder.id) == \
        "step 1\n\\x1b[31mred\\x1b[0m\ttab\nbad \ufffd byte\n"


def test_status_shows_what_the_ledger_holds_in_the_printable_form(run):
    """A failure's message, a node's name and a note from the ledger were printed raw."""
    root, folder = run
    rec = record(1, 0, 12, "failed", False, why="boom")
    rec.update(message=f"RuntimeError: {HOSTILE} \x00", exclusion_note=f"note {HOSTILE}",
               nodes=[f"n1{HOSTILE}"])
    folder.append_ledger(rec)
    try:
        out = _invoke(root, "status", folder.id)
    finally:
        folder.ledger_file.unlink()
    assert _printable_block(out)
    assert "RuntimeError: \\x1b]0;pwned\\x07 \\x1b[2J \\x9b31m \\u202eevil \\x08 \\x00" in out


def test_the_preflight_table_is_printable():
    report = {"passed": False, "profile": "p", "summary": f"summary {HOSTILE}",
              "checks": [{"node": f"node{HOSTILE}", "check": "nccl.ib_hca", "status": "fail",
                          "measured": f"NCCL_IB_HCA={HOSTILE}", "expected": "x", "fix": "y"}]}
    text = format_table(report)
    assert _printable_block(text) and "NCCL_IB_HCA=\\x1b]0;pwned\\x07" in text
