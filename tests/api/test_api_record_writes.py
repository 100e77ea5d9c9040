"""What hpctrain writes into a run folder passes the checks of what it reads there: a record
that ``Run.append_ledger``, ``update_ledger_record``, ``event``, ``update_meta`` or
``add_job_id`` is handed, and that the run-folder reader would refuse (a field of the wrong
type, NaN where a number is checked, an object JSON cannot hold, a job id starting with '-'),
is one UsageError naming the file and the field, and nothing is written: the run never
becomes DAMAGED through its own API. One door (``record.folder._writable``), with a Hypothesis property."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings, strategies as st

import hpctrain
from hpctrain.errors import UsageError
from tests.conftest import REPO

JOB = str(REPO / "examples" / "tiny.yaml")


@pytest.fixture()
def run(tmp_path):
    return hpctrain.submit(JOB, dry_run=True, runs_dir=tmp_path / "runs")


def _files(run) -> dict:
    return {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()}


@pytest.mark.parametrize("write, file, said", [
    (lambda r: r.append_ledger({"attempt": "one"}), "ledger.jsonl", "attempt"),
    (lambda r: r.append_ledger({"attempt": -3}), "ledger.jsonl", "attempt"),
    (lambda r: r.append_ledger({"attempt": 1, "end_step": math.nan}), "ledger.jsonl",
     "end_step"),
    (lambda r: r.append_ledger({"attempt": 1, "last_loss": math.inf}), "ledger.jsonl",
     "last_loss"),
    (lambda r: r.append_ledger({"attempt": 1, "x": object()}), "ledger.jsonl", "JSON"),
    (lambda r: r.append_ledger([1, 2]), "ledger.jsonl", "a mapping"),
    (lambda r: r.event("cancel", time=5), "events.jsonl", "time"),
    (lambda r: r.event(7), "events.jsonl", "event"),
    (lambda r: r.event("cancel", step=math.inf), "events.jsonl", "step"),
    (lambda r: r.update_meta(jobs=5), "run.yaml", "jobs"),
    (lambda r: r.update_meta(scheduler="pbs"), "run.yaml", "scheduler"),
    (lambda r: r.update_meta(name={1, 2}), "run.yaml", "JSON"),
    (lambda r: r.add_job_id("-1"), "run.yaml", "job_id"),
])
def test_a_record_its_reader_would_refuse_is_not_written(run, write, file, said):
    before = _files(run)
    with pytest.raises(UsageError) as e:
        write(run)
    assert str(e.value).startswith(f"cannot write {file}: "), str(e.value)
    assert said in str(e.value) and "nothing was written" in str(e.value)
    assert _files(run) == before
    assert run.summary()["state"] == "NOT SUBMITTED"    # still readable, not DAMAGED


def test_an_update_of_a_ledger_record_is_checked_as_a_new_one(run):
    run.append_ledger({"attempt": 1, "exit_reason": "preempted"})
    before = _files(run)
    with pytest.raises(UsageError, match="cannot write ledger.jsonl: .*end_step"):
        run.update_ledger_record(1, end_step="ten")
    assert _files(run) == before
    assert run.update_ledger_record(1, end_step=10)
    assert run.ledger()[-1]["end_step"] == 10


def test_good_records_are_written_and_read_back_as_written(run):
    run.append_ledger({"attempt": 1, "exit_reason": "preempted", "end_step": 20})
    run.event("cancel", by="me")
    run.update_meta(note="kept")
    run.add_job_id("4242")
    assert run.ledger()[-1] == {"attempt": 1, "exit_reason": "preempted", "end_step": 20}
    assert run.events()[-1]["event"] == "cancel" and run.events()[-1]["by"] == "me"
    assert run.meta()["note"] == "kept" and run.job_ids() == ["4242"]


VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats()
                      | st.text(max_size=6),
                      lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
FIELDS = st.sampled_from(["attempt", "end_step", "start_step", "exit_reason", "job_id", "time",
                          "event", "node", "decision", "steps", "x"])


@settings(max_examples=150, deadline=None)
@given(record=st.dictionaries(FIELDS, VALUES, max_size=4))
def test_whatever_a_ledger_record_holds_the_run_stays_readable(tmp_path_factory, record):
    """Any record: written and read back equal, or refused with nothing written; the ledger
    always reads."""
    run = hpctrain.submit(JOB, dry_run=True, runs_dir=tmp_path_factory.mktemp("runs"))
    try:
        run.append_ledger(record)
    except UsageError as e:
        assert str(e).startswith("cannot write ledger.jsonl: ")
        assert not run.ledger_file.exists()
        return
    (read,) = run.ledger()
    assert json.dumps(read, sort_keys=True) == json.dumps(record, sort_keys=True)   # NaN too


def test_a_nan_in_a_free_form_field_is_written_as_the_reader_takes_it(run):
    """The reader's parser takes JSON's NaN literal where no check types the field (an
    event's own words): the door writes it as before, and the record reads back."""
    run.event("note", value=math.nan)
    assert math.isnan(run.events()[-1]["value"])
