"""A run's ``logs/`` and ``logs/attempt-N`` are folders of its own: a symbolic link there (to
another run's logs, or anywhere) is damage named in one line, never followed. Before, ``hpctrain
logs`` printed the other run's rank logs as this run's, and an attempt begun in the run would
have written into the other run's folder. The door is the one place these paths are made
(``RunFolder.logs_dir`` and ``attempt_dir``)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import hpctrain
from hpctrain.cli import cli
from hpctrain.record.folder import RunFolder
from hpctrain.record.reader import DamagedFile
from tests.conftest import dry_run_folders

SECRET = "the other run's own line"


@pytest.fixture()
def two_runs(tmp_path):
    """Two real run folders (dry runs on the local profile); the second has a rank log."""
    root = tmp_path / "runs"
    linked, other = (p.name for p in dry_run_folders(root))
    other_attempt = root / other / "logs" / "attempt-1"
    other_attempt.mkdir(parents=True)
    (other_attempt / "rank-0.log").write_text(SECRET + "\n")
    (other_attempt / "batch.log").write_text(SECRET + "\n")
    return root, linked, other


def _link(root, linked, other, where: str) -> str:
    """``where`` (logs, or logs/attempt-1) of the first run made a link to the other run's."""
    path = root / linked / where
    if path.is_dir():
        path.rmdir()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(root / other / where)
    return where


@pytest.mark.parametrize("where", ["logs", "logs/attempt-1"])
@pytest.mark.parametrize("argv", [["logs"], ["logs", "--batch"], ["status"],
                                  ["status", "--json"], ["report"]])
def test_no_command_reads_another_runs_logs_through_a_link(two_runs, where, argv):
    root, linked, other = two_runs
    _link(root, linked, other, where)
    result = CliRunner().invoke(cli, [argv[0], linked, *argv[1:]],
                                env={"HPCTRAIN_RUNS_DIR": str(root)})
    assert SECRET not in result.output, result.output
    assert "Traceback" not in result.output
    assert result.exit_code == 2, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("Error:")]
    assert f"{linked}/{where}: is a symbolic link" in line and "never another's" in line


@pytest.mark.parametrize("where", ["logs", "logs/attempt-1"])
def test_the_listing_names_the_link_and_lists_the_other_run(two_runs, where):
    root, linked, other = two_runs
    _link(root, linked, other, where)
    result = CliRunner().invoke(cli, ["runs", "--json"], env={"HPCTRAIN_RUNS_DIR": str(root)})
    assert result.exit_code == 0, result.output
    rows = {row["run"]: row for row in json.loads(result.output)}
    assert rows[linked]["state"] == "DAMAGED" and "symbolic link" in rows[linked]["detail"]
    assert rows[other]["state"] != "DAMAGED"


@pytest.mark.parametrize("where", ["logs", "logs/attempt-1"])
def test_the_api_and_a_new_attempt_refuse_the_link_and_write_nothing_there(two_runs, where):
    root, linked, other = two_runs
    _link(root, linked, other, where)
    before = sorted(p.name for p in (root / other / "logs").iterdir())
    run = RunFolder(root / linked)
    with pytest.raises(DamagedFile, match="is a symbolic link"):
        run.attempt_dir(1)
    with pytest.raises(DamagedFile):
        run.rank_log(1, 0)
    with pytest.raises(DamagedFile):
        run.begin_attempt()        # what a job's batch shell does first
    with pytest.raises(DamagedFile):
        hpctrain.Run(root / linked).rank_log(1, 0)
    assert sorted(p.name for p in (root / other / "logs").iterdir()) == before
    # the run without a link is untouched by any of it
    assert RunFolder(root / other).attempts_started() == [1]
