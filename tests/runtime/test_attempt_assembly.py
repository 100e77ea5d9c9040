"""What ``runtime.assembly`` gives an attempt beyond what the loop's stories see
(``test_training_loop.py`` builds every attempt through it): the straggler watch's memory of
the run's earlier attempts, and whether it may exclude a node.

A node the run already stopped for once is never stopped for again (each node costs one
requeue, whether the requeue left it out or had to keep it): that memory lives only in the
ledger, so an attempt that misread it would requeue the job for the same slow node forever."""

from __future__ import annotations

import types

from hpctrain.flops import model_flops_per_step
from hpctrain.model_shape import ModelShape
from hpctrain.runtime.assembly import straggler_watch
from hpctrain.runtime.faults import TestHooks
from hpctrain.runtime.straggler_timing import ComputeTimer
from hpctrain.runtime.watchdog import WATCHER_ENV
from tests.runtime.helpers import job_mapping, rank_context

WORLD = 4
NOTE = ("note: health.exclude_stragglers: only a Slurm batch script can requeue without a "
        "node; stragglers are named only")


def _ctx(tmp_path, name, exclude: bool, rank: int = 0):
    job = job_mapping(str(tmp_path / "unused"), "tp2dp2_zero1",
                      health={"exclude_stragglers": exclude})
    return rank_context(tmp_path, name, job, WORLD, rank, attempt=4)


def test_the_nodes_stopped_for_before_are_read_from_the_ledger(tmp_path, monkeypatch):
    monkeypatch.setenv(WATCHER_ENV, "batch")
    ctx = _ctx(tmp_path, "run", exclude=True)
    for record in (
            {"attempt": 1, "exit_reason": "straggler", "excluded_nodes": ["n3"]},
            {"attempt": 2, "exit_reason": "straggler", "excluded_nodes": [],
             "not_excluded_nodes": ["n4"]},        # the job could not start without n4
            {"attempt": 3, "exit_reason": "preempted", "excluded_nodes": ["n9"]}):
        ctx.run.append_ledger(record)
    feeder = types.SimpleNamespace()
    watch = straggler_watch(ctx, feeder, TestHooks(slow_rank=0, slow_s=0.25, attempt=1))
    assert watch.excluded_before == {"n3", "n4"}      # not n9: excluded for another reason
    assert watch.may_exclude
    assert watch.timer is feeder.timer and isinstance(feeder.timer, ComputeTimer)
    assert feeder.timer.extra_s == 0.25               # the test hook's slow rank is this one
    flops = model_flops_per_step(ModelShape.from_model(ctx.job.model),
                                 ctx.job.batch.global_batch_size, 2)
    assert watch.flops_per_rank == flops / WORLD


def test_exclusion_needs_the_batch_shell_and_rank_0_says_so_once(tmp_path, monkeypatch, lines):
    monkeypatch.delenv(WATCHER_ENV, raising=False)
    fresh = straggler_watch(_ctx(tmp_path, "fresh", exclude=True), types.SimpleNamespace(),
                            TestHooks())
    assert not fresh.may_exclude and fresh.excluded_before == set()
    assert lines == [NOTE]
    other = straggler_watch(_ctx(tmp_path, "rank-1", exclude=True, rank=1),
                            types.SimpleNamespace(), TestHooks())
    named_only = straggler_watch(_ctx(tmp_path, "named", exclude=False),
                                 types.SimpleNamespace(), TestHooks())
    assert not other.may_exclude and not named_only.may_exclude
    assert lines == [NOTE]                # not from rank 1, nor where exclusion is not asked
    monkeypatch.setenv(WATCHER_ENV, "batch")
    assert not straggler_watch(_ctx(tmp_path, "batch-named", exclude=False),
                               types.SimpleNamespace(), TestHooks()).may_exclude
