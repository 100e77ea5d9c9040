"""``hpctrain.Run``'s own arguments (and those of what it inherits from ``RunFolder``) go through
one door per kind: attempt numbers (``record.folder.attempt_number``), rank numbers
(``rank_number``), job kinds (``checked_job_kind``) and records a caller has already read
(``checked_records``). Whatever else a caller hands in is one UsageError naming the argument
and what it takes, never a path outside the run's logs folder, a silently empty answer, or a
TypeError from inside."""

from __future__ import annotations

import os

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import hpctrain
from hpctrain import limits
from hpctrain.errors import UsageError
from tests.conftest import REPO

JOB = str(REPO / "examples" / "tiny.yaml")
_, FIRST_ATTEMPT, LAST_ATTEMPT = limits.INTEGERS["log_attempt"]
_, FIRST_RANK, LAST_RANK = limits.INTEGERS["log_rank"]
JOB_KINDS = ("train", "preflight")      # record.files.JOB_KINDS: what run.yaml's jobs are


class Hostile:
    """Every conversion a path or a message could try raises."""

    def __repr__(self):
        raise RuntimeError("repr on purpose")

    __str__ = __format__ = __index__ = __repr__

    def __eq__(self, other):
        raise RuntimeError("eq on purpose")

    __hash__ = object.__hash__


class Three:
    def __index__(self):
        return 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = hpctrain.submit(JOB, dry_run=True, runs_dir=tmp_path_factory.mktemp("runs"))
    run.add_job_id("4242", kind="train")
    run.append_ledger({"attempt": 1, "exit_reason": "preempted"})
    run.event("cancel")
    return run


@pytest.mark.parametrize("call, said", [
    (lambda r: r.job_ids(kind=5), "kind: expected 'train', 'preflight' or None, got 5"),
    (lambda r: r.job_ids("val"), "kind: expected 'train', 'preflight' or None, got 'val'"),
    (lambda r: r.job_ids(kind=Hostile()), "kind: expected"),
    (lambda r: r.add_job_id("1", kind="bogus"), "kind: expected 'train', 'preflight', got"),
    (lambda r: r.attempt_dir(-1), "attempt: expected an integer from 1 to 1,000,000, got -1"),
    (lambda r: r.attempt_dir(0), "attempt: expected an integer from 1 to 1,000,000, got 0"),
    (lambda r: r.attempt_dir(True), "attempt: expected an integer from 1 to 1,000,000, got True"),
    (lambda r: r.attempt_dir(1.0), "attempt: expected"),
    (lambda r: r.attempt_dir(math.nan), "attempt: expected"),
    (lambda r: r.attempt_dir("../.."), "attempt: expected"),
    (lambda r: r.attempt_dir("1/../../.."), "attempt: expected"),
    (lambda r: r.attempt_dir(10**100), "attempt: expected"),
    (lambda r: r.attempt_dir(Hostile()), "attempt: expected"),
    (lambda r: r.rank_log("a", "b"), "attempt: expected"),
    (lambda r: r.rank_log(1, "b"), "rank: expected an integer from 0 to 131,071, got 'b'"),
    (lambda r: r.rank_log(1, -1), "rank: expected an integer from 0 to 131,071, got -1"),
    (lambda r: r.rank_log(1, False), "rank: expected"),
    (lambda r: r.rank_log(1, "../../../../x"), "rank: expected"),
    (lambda r: r.rank_log(1, Hostile()), "rank: expected"),
    (lambda r: r.update_ledger_record(True, note="x"), "attempt: expected"),
    (lambda r: r.update_ledger_record("1", note="x"), "attempt: expected"),
    (lambda r: r.cancelled("cancel"), "events: expected the list of records Run.events() "
                                      "returns, or None"),
    (lambda r: r.cancelled(5), "events: expected"),
    (lambda r: r.cancelled([5]), "events: expected"),
    (lambda r: r.finished(5), "ledger: expected the list of records Run.ledger() returns"),
    (lambda r: r.finished("x"), "ledger: expected"),
    (lambda r: r.finished(None, Hostile()), "events: expected"),
    (lambda r: r.checkpoint_dir(job="tiny.yaml"), "job: expected a loaded JobConfig or None"),
    (lambda r: r.checkpoint_dir(profile="local"), "profile: expected a loaded ClusterProfile"),
])
def test_a_wrong_argument_to_a_run_is_one_usage_error_naming_it(run, call, said):
    """``job_ids(kind=5)`` was [] (a run that never submitted), ``attempt_dir(-1)`` and
    ``rank_log("a", "b")`` paths of no attempt, ``attempt_dir("../..")`` a path outside the
    run's logs, ``update_ledger_record(True)`` changed attempt 1 (True == 1), ``cancelled("x")``
    an AttributeError."""
    before = (run.ledger(), run.meta())
    with pytest.raises(UsageError) as err:
        call(run)
    message = str(err.value)
    assert message.startswith(said) and message.isprintable(), message
    assert (run.ledger(), run.meta()) == before      # nothing was written


def test_the_right_arguments_give_what_the_run_holds(run):
    assert run.job_ids() == ["4242"] and run.job_ids(kind=None) == ["4242"]
    assert run.job_ids("preflight") == []
    assert run.attempt_dir(2) == run.logs_dir / "attempt-2"
    assert run.rank_log(2, 3) == run.logs_dir / "attempt-2" / "rank-3.log"
    # an integer of numpy's (as a DataFrame's column holds) is the number it stands for
    assert run.rank_log(np.int64(2), np.int32(3)) == run.rank_log(2, 3)
    assert run.attempt_dir(Three()) == run.attempt_dir(3)
    assert type(run.attempt_dir(np.int64(2)).name) is str
    events, ledger = run.events(), run.ledger()
    assert run.cancelled(events) is run.cancelled() is True
    assert run.finished(ledger, events) is run.finished() is False
    assert run.checkpoint_dir(run.resolved_job(), run.resolved_profile()) == run.checkpoint_dir()


def test_handles_on_one_run_are_equal_and_hash_alike(run, tmp_path):
    """``set(hpctrain.runs())``, or a dict keyed by run, needs a hashable handle: two handles
    on one folder (one given relative, one absolute) are one key; another run is another."""
    import hpctrain
    again = hpctrain.Run(os.path.relpath(run.path))
    assert again == run and hash(again) == hash(run) and len({run, again}) == 1
    other = hpctrain.Run(tmp_path / "elsewhere")
    assert other != run and {run: 1, other: 2}[again] == 1


def test_only_the_attempts_the_door_takes_are_listed_as_started(run):
    """A folder ``attempt-0``, ``attempt-01`` or ``attempt-99999999`` made by hand is no attempt:
    listing it would name an attempt that ``attempt_dir`` (and ``hpctrain logs --attempt``)
    refuses, or read another folder (``attempt-01`` is not attempt 1's)."""
    for name in ("attempt-1", "attempt-2", "attempt-0", "attempt-01", "attempt-99999999",
                 "attempt-x", "attempt--1"):
        (run.logs_dir / name).mkdir(parents=True, exist_ok=True)
    try:
        started = run.attempts_started()
        assert started == [1, 2]
        assert all(run.attempt_dir(n).is_dir() for n in started)
    finally:
        import shutil
        shutil.rmtree(run.logs_dir)


_HOSTILE = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 1, 2, LAST_ATTEMPT, LAST_ATTEMPT + 1, LAST_RANK,
                     LAST_RANK + 1, 10**30, math.nan, math.inf, -math.inf, 1.0, "", " ", "1",
                     "..", "../..", "1/../..", "/etc", "x\0", b"1", [1], (1,), {1: 2},
                     np.int64(5), np.float64(2.0), np.bool_(True), Hostile(), Three()]),
    st.integers(), st.floats(), st.text(max_size=8), st.binary(max_size=4))


def _whole(value, low: int, high: int) -> int | None:
    """What the door should make of ``value``: the integer, or None for a refusal."""
    if isinstance(value, (bool, float, str, bytes, np.bool_, np.floating)):
        return None
    if isinstance(value, (int, np.integer, Three)):
        n = int(value.__index__())
        return n if low <= n <= high else None
    return None


@given(_HOSTILE)
def test_the_attempt_door_gives_a_folder_in_the_logs_or_one_usage_error(run, value):
    """Property: whatever is given as an attempt, ``attempt_dir`` and ``rank_log`` give a path
    directly inside the run's logs folder named by an attempt from 1 to the bound of
    ``hpctrain logs --attempt``, or one printable UsageError naming ``attempt``."""
    expected = _whole(value, FIRST_ATTEMPT, LAST_ATTEMPT)
    for call in (lambda: run.attempt_dir(value), lambda: run.rank_log(value, 0).parent):
        try:
            path = call()
        except UsageError as e:
            assert expected is None and str(e).startswith("attempt: expected an integer from 1 "
                                                          "to 1,000,000, got ")
            assert str(e).isprintable()
        else:
            assert path == run.logs_dir / f"attempt-{expected}"


@given(_HOSTILE)
def test_the_rank_door_gives_a_log_in_the_attempt_folder_or_one_usage_error(run, value):
    """Property: the same for a rank: a ``rank-R.log`` directly in the attempt's folder, R from
    0 below the largest world size, or one UsageError naming ``rank``."""
    expected = _whole(value, FIRST_RANK, LAST_RANK)
    try:
        path = run.rank_log(1, value)
    except UsageError as e:
        assert expected is None and str(e).startswith("rank: expected an integer from 0 to ")
        assert str(e).isprintable()
    else:
        assert path == run.logs_dir / "attempt-1" / f"rank-{expected}.log"


@given(st.one_of(_HOSTILE, st.sampled_from([*JOB_KINDS, "Train", "train ", "validation"])))
def test_the_job_kind_door_selects_a_kind_or_says_which_there_are(run, value):
    """Property: ``job_ids(kind)`` answers for "train", "preflight" and None; anything else is
    one UsageError naming ``kind`` (never the empty list of a kind no job has)."""
    ok = value is None or (type(value) is str and value in JOB_KINDS)
    try:
        ids = run.job_ids(kind=value)
    except UsageError as e:
        assert not ok and str(e).startswith("kind: expected 'train', 'preflight' or None, got ")
        assert str(e).isprintable()
    else:
        assert ok and ids == {"train": ["4242"], "preflight": [], None: ["4242"]}[value]


@given(st.one_of(_HOSTILE, st.lists(st.one_of(st.just({"event": "cancel"}), _HOSTILE),
                                    max_size=3)))
def test_the_records_door_takes_records_or_none(run, value):
    """Property: ``cancelled`` and ``finished`` take what ``events()`` and ``ledger()`` return
    (a list of dicts) or None; anything else is one UsageError naming the argument."""
    ok = value is None or (type(value) is list and all(type(v) is dict for v in value))
    for name, call in (("events", lambda: run.cancelled(value)),
                       ("ledger", lambda: run.finished(value)),
                       ("events", lambda: run.finished(None, value))):
        try:
            answer = call()
        except UsageError as e:
            assert not ok and str(e).startswith(f"{name}: expected the list of records ")
            assert str(e).isprintable()
        else:
            assert ok and answer in (True, False)


@pytest.mark.parametrize("scheduler", ["bogus", "Local", ""])
def test_a_run_file_naming_no_scheduler_hpctrain_has_is_damage(tmp_path, scheduler):
    """run.yaml's scheduler picks the backend asked about the run's jobs: any other word was
    read as Slurm's, so a run of this machine said UNKNOWN (squeue knew no such job) instead of
    DAMAGED naming the file."""
    import yaml
    from hpctrain.record.reader import DamagedFile
    run = hpctrain.submit(JOB, dry_run=True, runs_dir=tmp_path / "runs")
    run.add_job_id("123", kind="train")
    meta = yaml.safe_load(run.run_file.read_text())
    run.run_file.write_text(yaml.safe_dump({**meta, "scheduler": scheduler}))
    assert run.state() == "DAMAGED"
    assert run.summary()["damaged"]["file"] == str(run.run_file)
    assert "scheduler: expected 'slurm' or 'local'" in run.summary()["damaged"]["why"]
    with pytest.raises(DamagedFile) as err:
        run.status()
    assert err.value.path == run.run_file
    # a run folder written before the scheduler was recorded is a Slurm run, as it always was
    run.run_file.write_text(yaml.safe_dump({k: v for k, v in meta.items() if k != "scheduler"}))
    assert run.meta().get("scheduler") is None and run.state() != "DAMAGED"


@pytest.mark.parametrize("kind", ["bogus", "Train", "val/../x", ""])
def test_a_metrics_record_of_no_kind_hpctrain_writes_is_damage(tmp_path, kind):
    """A record's kind picks what ``metrics()`` returns and the names ``sync`` sends a tracker
    (``<kind>/loss``): any other word was left out of ``metrics()`` without a word, and sent to
    W&B or MLflow as a metric called ``bogus/loss``. Now the line is damage naming the file."""
    import json
    from hpctrain.record.reader import DamagedFile
    from hpctrain.tracking.records import metric_values
    run = hpctrain.submit(JOB, dry_run=True, runs_dir=tmp_path / "runs")
    good = [{"kind": k, "step": 2, "loss": 2.5} for k in ("train", "validation", "test")]
    run.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in good))
    assert [r["kind"] for r in run.metrics(kind=None)] == ["train", "validation", "test"]
    assert sorted(n for r in good for n in metric_values(r)) == [
        "test/loss", "train/loss", "validation/loss"]
    with run.metrics_file.open("a") as f:
        f.write(json.dumps({"kind": kind, "step": 3, "loss": 2.0}) + "\n")
    with pytest.raises(DamagedFile) as err:
        run.metrics(kind=None)
    assert err.value.path == run.metrics_file and "expected 'train' or 'validation' or " \
        "'test'" in str(err.value)
    assert run.state() == "DAMAGED"


def test_the_schedulers_a_run_file_may_name_are_those_with_a_backend():
    from hpctrain.config.profile import SCHEDULERS
    from hpctrain.scheduler.choose import BACKENDS
    assert set(SCHEDULERS) == set(BACKENDS)


_PATH_ONLY = {"attempt_dir", "rank_log", "id", "shown", "run_file", "job_file", "profile_file",
              "script_file", "submitit_dir", "logs_dir", "ledger_file", "events_file",
              "metrics_file"}
_CALLS = {"meta": (), "update_meta": ((), {"x": 1}), "add_job_id": ("1",), "job_ids": (),
          "ledger": (), "append_ledger": ({"attempt": 1},),
          "update_ledger_record": ((1,), {"note": "x"}), "events": (), "event": ("cancel",),
          "metrics": (), "latest_metrics": (), "cancelled": (), "attempt_records": (),
          "ledger_for_budget": (), "finished": (), "attempts_started": (), "begin_attempt": (),
          "resolved_job": (), "resolved_profile": (), "checkpoint_dir": (), "lock": ()}


def test_every_method_of_a_run_is_either_about_its_files_or_names_a_path():
    """A method added to RunFolder is sorted here: one that reads or writes the run's files
    goes through ``Run``'s door (``api.FOLDER_METHODS``)."""
    from hpctrain.api import FOLDER_METHODS
    from hpctrain.record.folder import RunFolder
    public = {n for n in vars(RunFolder) if not n.startswith("_")}
    assert public == set(FOLDER_METHODS) | _PATH_ONLY
    assert set(FOLDER_METHODS) == set(_CALLS)


@pytest.mark.parametrize("name", sorted(_CALLS))
@pytest.mark.parametrize("where", ["empty folder", "no such folder"])
def test_a_run_that_is_no_run_folder_says_so_instead_of_reading_as_empty(tmp_path, name, where):
    """``Run("runs/typo").metrics()`` was [] and ``job_ids()`` [] (a run that never logged nor
    submitted), ``cancelled()`` and ``finished()`` False; ``Run("/tmp").event(...)`` wrote an
    events.jsonl there and ``begin_attempt()`` made logs/attempt-1. Every method that reads or
    writes a run's files says the path is no run folder, as ``state()`` did, and writes
    nothing."""
    from hpctrain.errors import RunNotFoundError
    folder = tmp_path / "typo\nname"
    if where == "empty folder":
        folder.mkdir()
    call = _CALLS[name]
    args, kwargs = call if len(call) == 2 and isinstance(call[1], dict) else (call, {})
    with pytest.raises(RunNotFoundError) as err:
        getattr(hpctrain.Run(folder), name)(*args, **kwargs)
    assert str(err.value).endswith("is not a run folder (no run.yaml); `hpctrain runs` lists "
                                   "the run folders")
    assert str(err.value).isprintable()              # the line feed in the name is shown as \n
    assert sorted(p.name for p in tmp_path.rglob("*")) == \
        (["typo\nname"] if where == "empty folder" else [])


def test_waiting_for_a_run_with_a_damaged_ledger_gives_its_state(tmp_path):
    """``wait`` returns ``state()``, DAMAGED when a file of the run cannot be read
    (docs/operations.md): a damaged ledger was a DamagedFile instead (read once more after the
    jobs ended, for a record ``wait`` did not return), while a damaged events or metrics file
    gave DAMAGED. Only run.yaml, which says which jobs to wait for, is an error when damaged."""
    from hpctrain.record.reader import DamagedFile
    run = hpctrain.submit(JOB, dry_run=True, runs_dir=tmp_path / "runs")
    run.ledger_file.write_text('{"attempt": "one"}\n')
    lines = []
    for echo in (None, lines.append):
        assert run.wait(echo=echo, poll_s=0.05, timeout_s=60) == run.state() == "DAMAGED"
    assert run.summary()["damaged"]["file"] == str(run.ledger_file)
    run.run_file.write_text("jobs: 5\n")
    for echo in (None, lines.append):
        with pytest.raises(DamagedFile) as err:
            run.wait(echo=echo, poll_s=0.05, timeout_s=60)
        assert err.value.path == run.run_file


@pytest.mark.parametrize("attempt", [LAST_ATTEMPT + 1, 2**63 - 1])
def test_a_ledger_attempt_past_the_attempt_door_is_damage_naming_the_line(tmp_path, attempt):
    """A ledger record's attempt is a number the attempt door takes (or 0, from older
    folders): one past it (a ledger edited by hand) made the next attempt's number one that
    ``attempt_dir`` refuses, a UsageError from inside the batch shell naming no file."""
    import json
    from hpctrain.record.folder import RunFolder
    from hpctrain.record.reader import DamagedFile
    run = hpctrain.submit(JOB, dry_run=True, runs_dir=tmp_path / "runs")
    run.ledger_file.write_text(json.dumps({"attempt": 1}) + "\n" +
                               json.dumps({"attempt": attempt}) + "\n")
    assert run.state() == "DAMAGED"
    for call in (run.ledger, RunFolder(run.path).begin_attempt):
        with pytest.raises(DamagedFile, match=r"line 2: attempt: expected an integer from 0 to "
                                              r"1,000,000, got "):
            call()
    assert not list(run.logs_dir.glob("attempt-*"))
