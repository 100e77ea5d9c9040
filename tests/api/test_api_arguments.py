"""The Python API's arguments go through the same bounds (hpctrain.limits) as the CLI's options:
a wrong type or size is one UsageError naming the argument, never a TypeError from deep inside,
and nothing is created on disk."""

from __future__ import annotations

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
