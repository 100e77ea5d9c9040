"""``hpctrain report -o PATH`` never loses data: it replaces only a PNG (an earlier report; the
signature is read through the run-folder reader), and inside a run folder it writes only where
``report`` writes by default, the run's own ``report.png`` (or where the trackers draw it,
its ``tracking/report.png``). Anything else is one ``Error:``
line naming ``--output`` and the fix, exit 2, and the file keeps every byte."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctrain.cli import cli
from hpctrain.ops.report import PNG_SIGNATURE
from tests.conftest import dry_run_folders


@pytest.fixture
def two_runs(tmp_path):
    root = tmp_path / "runs"
    runs = dry_run_folders(root)
    (runs[0] / "ledger.jsonl").write_text('{"attempt": 1, "exit_reason": "preempted"}\n')
    return root, runs[0], runs[1]


def _report(root: Path, *args: str):
    return CliRunner().invoke(cli, ["report", *args], env={"HPCTRAIN_RUNS_DIR": str(root)})


def _one_error(result, *needles: str) -> str:
    assert result.exit_code == 2, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    (line,) = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
    for needle in needles:
        assert needle in line, line
    return line


@pytest.mark.parametrize("target", ["ledger.jsonl", "run.yaml", "job.yaml", "other:run.yaml",
                                    "other:job.yaml", "outside"])
def test_report_never_replaces_a_file_that_is_not_a_png(two_runs, tmp_path, target):
    root, run, other = two_runs
    if target == "outside":
        path = tmp_path / "notes.txt"
        path.write_text("the user's own notes\n")
    elif target.startswith("other:"):
        path = other / target.split(":")[1]
    else:
        path = run / target
    before = path.read_bytes()
    line = _one_error(_report(root, run.name, "-o", str(path)), "--output", str(path))
    assert "not a PNG" in line or "inside run folder" in line, line
    assert path.read_bytes() == before                    # byte-identical
    assert sorted(p.name for p in path.parent.iterdir() if ".tmp" in p.name) == []


@pytest.mark.parametrize("where", ["own-subfolder", "other-report", "other-new"])
def test_report_writes_in_a_run_folder_only_as_that_run_s_report_png(two_runs, where):
    root, run, other = two_runs
    path = {"own-subfolder": run / "logs" / "r.png", "other-report": other / "report.png",
            "other-new": other / "mine.png"}[where]
    _one_error(_report(root, run.name, "-o", str(path)), "--output", "inside run folder",
               "report.png")
    assert not path.exists()


def test_a_path_through_dot_dot_into_a_run_folder_is_refused(two_runs, tmp_path):
    root, run, other = two_runs
    path = tmp_path / "elsewhere" / ".." / "runs" / other.name / "run.yaml"
    (tmp_path / "elsewhere").mkdir()
    before = (other / "run.yaml").read_bytes()
    _one_error(_report(root, run.name, "-o", str(path)), "--output")
    assert (other / "run.yaml").read_bytes() == before


def test_a_png_is_replaced_and_the_default_still_works(two_runs, tmp_path):
    root, run, other = two_runs
    out = tmp_path / "report.png"
    assert _report(root, run.name, "-o", str(out)).exit_code == 0
    first = out.read_bytes()
    assert first.startswith(PNG_SIGNATURE)
    result = _report(root, run.name, "-o", str(out), "--size", "640x480")
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(PNG_SIGNATURE) and out.read_bytes() != first
    for _ in range(2):                                     # the default, and again over it
        result = _report(root, run.name)
        assert result.exit_code == 0, result.output
        assert (run / "report.png").read_bytes().startswith(PNG_SIGNATURE)
    result = _report(root, run.name, "-o", str(run / "report.png"))
    assert result.exit_code == 0, result.output
    # where the trackers' sender draws the PNG it uploads (tracking/sender.py), in its own run
    (run / "tracking").mkdir()
    result = _report(root, run.name, "-o", str(run / "tracking" / "report.png"))
    assert result.exit_code == 0, result.output
    assert (run / "tracking" / "report.png").read_bytes().startswith(PNG_SIGNATURE)
    _one_error(_report(root, other.name, "-o", str(run / "tracking" / "report.png")),
               "--output", "is inside run folder")              # not for another run's report


def test_the_default_report_png_that_is_not_a_png_is_kept(two_runs):
    root, run, _ = two_runs
    (run / "report.png").write_bytes(b"notes, not a picture\n")
    _one_error(_report(root, run.name), "--output", "not a PNG")
    assert (run / "report.png").read_bytes() == b"notes, not a picture\n"


def test_a_comparison_is_never_written_into_a_run_folder(two_runs, tmp_path):
    root, run, other = two_runs
    before = (run / "ledger.jsonl").read_bytes()
    for path in (run / "ledger.jsonl", run / "report.png", other / "compare.png"):
        _one_error(_report(root, run.name, other.name, "-o", str(path)), "--output")
    assert (run / "ledger.jsonl").read_bytes() == before
    assert not (run / "report.png").exists() and not (other / "compare.png").exists()
    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    _one_error(_report(root, run.name, other.name, "-o", str(notes)), "not a PNG")
    assert notes.read_text() == "x"
    result = _report(root, run.name, other.name, "-o", str(tmp_path / "c.png"))
    assert result.exit_code == 0, result.output


def test_a_report_of_a_run_with_nothing_recorded_says_so_and_nothing_else(two_runs):
    """A run with no metrics yet (a dry run): the PNG and the summary, and not a word more on
    stderr (matplotlib warned "No artists with labels found to put in legend", with its
    source line, for the empty legend)."""
    from tests.conftest import hpctrain
    root, _, other = two_runs
    proc = hpctrain("report", other.name, env={"HPCTRAIN_RUNS_DIR": str(root),
                                               "PYTHONWARNINGS": "always"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and "No metrics recorded yet." in proc.stdout, proc.stderr
    assert (other / "report.png").read_bytes().startswith(PNG_SIGNATURE)
