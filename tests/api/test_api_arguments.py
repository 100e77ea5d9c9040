"""The Python API's arguments go through the same bounds (hpctrain.limits) as the CLI's options:
a wrong type or size is one UsageError naming the argument, never a TypeError from deep inside,
and nothing is created on disk."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, strategies as st

import hpctrain
from hpctrain import limits
from hpctrain.errors import UsageError
from tests.conftest import REPO

JOB = str(REPO / "examples" / "tiny.yaml")


@pytest.mark.parametrize("call, named", [
    (lambda d: hpctrain.submit(JOB, nodes="2", dry_run=True, runs_dir=d), "nodes"),
    (lambda d: hpctrain.submit(JOB, nodes=0, dry_run=True, runs_dir=d), "nodes"),
    (lambda d: hpctrain.submit(JOB, sweep=5, dry_run=True, runs_dir=d), "sweep"),
    (lambda d: hpctrain.submit(JOB, chain=0, dry_run=True, runs_dir=d), "chain"),
    (lambda d: hpctrain.submit(JOB, dry_run="yes", runs_dir=d), "dry_run"),
    (lambda d: hpctrain.submit(None, dry_run=True, runs_dir=d), "job"),
    (lambda d: hpctrain.plan(JOB, gpus=-1), "gpus"),
    (lambda d: hpctrain.plan(JOB, tp=2.0), "tp"),
    (lambda d: hpctrain.plan(JOB, recompute="all"), "recompute"),
    (lambda d: hpctrain.runs(d, limit=-1), "limit"),
    (lambda d: hpctrain.submit(JOB, overrides=5, dry_run=True, runs_dir=d), "overrides"),
    (lambda d: hpctrain.submit(JOB, overrides=[5], dry_run=True, runs_dir=d), "overrides"),
    (lambda d: hpctrain.submit(JOB, overrides=b"train.steps=3", dry_run=True, runs_dir=d),
     "overrides"),
    (lambda d: hpctrain.submit(JOB, overrides=[None], dry_run=True, runs_dir=d), "overrides"),
    # an endless or huge value list is refused at the cap, not listed first
    (lambda d: hpctrain.submit(JOB, sweep={"train.lr": itertools.count(1)}, dry_run=True,
                               runs_dir=d), "sweep train.lr: more than 1,000 values"),
    (lambda d: hpctrain.submit(JOB, sweep={"train.lr": range(10 ** 9)}, dry_run=True,
                               runs_dir=d), "sweep train.lr: more than 1,000 values"),
])
def test_bad_arguments_are_usage_errors_naming_the_argument(tmp_path, call, named):
    with pytest.raises(UsageError) as err:
        call(tmp_path / "runs")
    assert str(err.value).startswith(named)
    assert not (tmp_path / "runs").exists()


@given(st.sampled_from(sorted(set(limits.INTEGERS) & {"nodes", "gpus", "tp", "pp", "vpp",
                                                      "micro_batch_size"})),
       st.one_of(st.integers(-2**70, 2**70), st.floats(), st.text(max_size=5), st.booleans(),
                 st.lists(st.integers(), max_size=2)))
def test_plan_arguments_are_checked_before_use(name, value):
    option, low, high = limits.INTEGERS[name]
    ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    try:
        limits.integer(name, value, argument=True)
    except UsageError as e:
        assert not ok and str(e).startswith(f"{name} ({option})") and f"{high:,}" in str(e)
    else:
        assert ok


def test_sweep_product_is_capped_before_anything_is_built(tmp_path):
    sweep = {"train.lr": [i * 1e-5 for i in range(1, 1001)], "train.steps": [10, 20]}
    with pytest.raises(UsageError, match=r"1000 × 2 = 2,000 combinations; a sweep may have at most 1,000"):
        hpctrain.submit(JOB, sweep=sweep, dry_run=True, runs_dir=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_a_run_named_under_a_home_folder_no_user_has_is_not_found(tmp_path):
    """``~nouser/x`` names no folder (Python's expanduser raises for it): one 'no run' line on
    every command that takes a RUN, and from the API, never an internal error."""
    from tests.conftest import hpctrain as cli_run
    root = tmp_path / "runs"
    root.mkdir()
    for command in (["status"], ["logs"], ["cancel"], ["runs", "rm", "--dry-run"]):
        proc = cli_run(*command, "~nouser-hpctrain-test/x", "--runs-dir", str(root), timeout=60)
        assert proc.returncode == 2, (command, proc.stderr)
        (line,) = proc.stderr.splitlines()
        assert "no run" in line and "internal error" not in line, (command, line)
    with pytest.raises(UsageError):
        hpctrain.Run("~nouser-hpctrain-test/x").status()


def test_waiting_no_time_for_a_finished_run_gives_its_state(tmp_path, monkeypatch):
    """``Run.wait(timeout_s=0)``: a run with no job left is answered, not timed out (the
    deadline is only a question while a job is pending or running)."""
    from tests.ops.helpers import crafted_run, record
    from tests.scheduler.fake_slurm import FakeSlurm
    FakeSlurm(tmp_path, monkeypatch)
    run = crafted_run(tmp_path / "runs", ledger=[record(1, 0, 30, "finished", False, saved=30)],
                      steps=30)
    for timeout in (0, 1e-9):
        assert hpctrain.Run(str(run.path)).wait(timeout_s=timeout) == "FINISHED"


class _IntSubclass(int):
    def __le__(self, other):
        raise RuntimeError("an int subclass's comparison, on purpose")

    __ge__ = __lt__ = __gt__ = __le__


@given(st.sampled_from(sorted(limits.INTEGERS)), st.integers(-2**70, 2**70))
def test_the_integer_door_hands_on_the_plain_int_it_checked(name, number):
    """Property: ``limits.integer`` reads an int subclass as the plain int it holds (its own
    comparisons, which may raise, are never asked) and returns that plain int, or refuses it
    with one UsageError naming the option."""
    _, low, high = limits.INTEGERS[name]
    try:
        got = limits.integer(name, _IntSubclass(number))
    except UsageError as e:
        assert not low <= number <= high and f"{high:,}" in str(e)
    else:
        assert low <= number <= high and type(got) is int and got == number
