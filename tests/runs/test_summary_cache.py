"""The runs listing's kept rows (``RUN/.summary.json``): the same rows as building them from
the run's files, a change to those files seen at the next listing, a damaged kept file
ignored and rebuilt, and a running run's state always asked of its backend."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpctrain.record.folder import RunFolder, iter_runs
from hpctrain.scheduler.local.jobs import CONTROLLER_MODULE
from hpctrain.view.runview import add_usage, build_views
from hpctrain.view.summary_cache import CACHE_FILE, FORMAT, fingerprint, summaries
from tests.conftest import REPO, tool_module


def _bench_runs():
    return tool_module("bench_runs")


@pytest.fixture
def runs(tmp_path) -> list[RunFolder]:
    """Four finished local runs built as `tools/bench_runs` builds them, one never submitted,
    one whose ledger is damaged."""
    root = tmp_path / "runs"
    root.mkdir()
    _bench_runs().build(root, 4)
    found = sorted(iter_runs(root), key=lambda r: r.id)
    unsubmitted = found[1]
    unsubmitted.update_meta(jobs=[])
    for name in ("ledger.jsonl", "events.jsonl", "metrics.jsonl"):
        (unsubmitted.path / name).unlink()
    found[2].ledger_file.write_text('{"attempt": "one"}\n')        # damaged: a field's type
    return found


def _uncached(runs: list[RunFolder]) -> list[dict]:
    return [v.summary() for v in add_usage(build_views(runs))]


def test_kept_rows_equal_built_rows_field_for_field(runs):
    expected = _uncached(runs)
    assert {r["state"] for r in expected} == {"FINISHED", "NOT SUBMITTED", "DAMAGED"}
    assert summaries(runs) == expected                      # builds and keeps the rows
    kept = [r for r in runs if (r.path / CACHE_FILE).is_file()]
    assert runs[2] not in kept and len(kept) == 3           # a damaged run is never kept
    assert summaries(runs) == expected                      # from the kept rows


def test_a_change_to_the_ledger_or_metrics_is_seen_at_the_next_listing(runs):
    run = runs[0]
    summaries(runs)
    with run.metrics_file.open("a") as f:
        f.write(json.dumps({"step": 61, "loss": 0.5}) + "\n")
    (row,) = summaries([run])
    assert (row["step"], row["loss"]) == (61, 0.5)
    run.append_ledger({"attempt": 3, "start_step": 60, "end_step": 70, "exit_reason": "failed",
                       "decision": {"requeue": False, "reason": "out of budget"}})
    (row,) = summaries([run])
    assert (row["state"], row["step"], row["attempts"]) == ("STOPPED", 70, 3)
    assert summaries([run]) == _uncached([run])


def test_a_damaged_kept_file_is_ignored_and_rebuilt(runs):
    run = runs[0]
    expected = _uncached([run])
    summaries([run])
    cache = run.path / CACHE_FILE
    stale = {**expected[0], "state": "FINISHED", "loss": 99.0}
    for bad in ("{not json", json.dumps({"format": FORMAT, "fingerprint": None, "row": stale}),
                # a row an older version kept, for the files as they are now
                json.dumps({"format": FORMAT - 1, "fingerprint": fingerprint(run),
                            "row": stale}), "[]"):
        cache.write_text(bad)
        assert summaries([run]) == expected
        assert json.loads(cache.read_text())["row"]["loss"] == expected[0]["loss"]


@pytest.mark.parametrize("field, value", [
    ("step", -5), ("step", "60"), ("attempts", [1, 2]), ("total_steps", True),
    ("loss", {"a": 1}), ("loss", "0.5"), ("val_loss", True), ("gpu_hours", [1]),
    ("name", ["x"]), ("detail", 5), ("sweep", [1])])
def test_a_kept_row_whose_field_holds_another_kind_is_built_again(runs, field, value):
    """A kept row with the current fingerprint but a field no row holds (edited by hand, or
    written by something else): the listing builds the row from the run's files instead of
    showing it (and copying it into the runs index)."""
    run = runs[0]
    expected = _uncached([run])
    summaries([run])
    cache = run.path / CACHE_FILE
    kept = json.loads(cache.read_text())
    kept["row"][field] = value
    cache.write_text(json.dumps(kept))
    assert summaries([run]) == expected
    assert json.loads(cache.read_text())["row"][field] == expected[0][field]


def test_a_running_runs_state_comes_from_its_backend(runs):
    """A live local job (the process the local backend looks for) shows RUNNING and is not
    kept; once it is gone the ended state shows, though no file of the run changed."""
    run = runs[0]
    run.path.joinpath("submitit").mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             CONTROLLER_MODULE, str(run.submitit_dir)])
    try:
        run.update_meta(jobs=[{"job_id": str(proc.pid), "kind": "train"}])
        (row,) = summaries([run])
        assert row["state"] == "RUNNING" and row["job_id"] == str(proc.pid)
        assert not (run.path / CACHE_FILE).exists()
        (row,) = summaries([run])
        assert row["state"] == "RUNNING"
    finally:
        proc.kill()
        proc.wait()
    (row,) = summaries([run])
    assert row["state"] == "FINISHED"
    assert summaries([run]) == _uncached([run])
