"""checkpoint.interval_minutes: auto — Young/Daly's interval, checked by hand, without sleeping."""

from __future__ import annotations

import json
import math

import pytest

from hpctrain.checkpoint_interval import (MIN_INTERVAL_S, daly_interval_s, estimate, job_mtbf_s,
                                          young_interval_s)
from hpctrain.runtime.preemption import PeriodicSaves, SaveEstimate
from hpctrain.runtime.save_interval import UNMEASURED_CAP_S, AutoInterval, previous_blocking_s


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_daly_against_values_worked_by_hand():
    # δ = 1, M = 1: r = δ/2M = 0.5; √2 · (1 + √0.5/3 + 0.5/9) − 1 = 1.414214 · 1.291258 − 1
    assert daly_interval_s(1, 1) == pytest.approx(0.826114, abs=1e-6)
    # δ = 10 s, M = 375 h (16 nodes of 6000 h): √(2·10·1.35e6) = 5196.152; × 1.000642 − 10
    assert daly_interval_s(10, 1_350_000) == pytest.approx(5189.488, abs=1e-3)
    # δ = 60 s on the same job: √(1.62e8) = 12727.92; × 1.001567 − 60
    assert daly_interval_s(60, 1_350_000) == pytest.approx(12687.953, abs=1e-3)
    # δ = M = 3600 s: r = 0.5; 5091.169 · 1.291258 − 3600
    assert daly_interval_s(3600, 3600) == pytest.approx(2974.012, abs=1e-3)


def test_daly_edge_cases():
    # a save as long as two MTBFs or more: save once per MTBF (Daly's rule)
    assert daly_interval_s(200, 100) == 100
    assert daly_interval_s(200, 100.0) == daly_interval_s(10**6, 100.0) == 100.0
    # M huge: the higher-order terms vanish, Young's √(2δM) − δ remains, finite
    huge = job_mtbf_s(1e7, 1)                       # 3.6e10 s
    tau = daly_interval_s(5, huge)
    assert math.isfinite(tau)
    assert tau == pytest.approx(young_interval_s(5, huge) - 5, rel=1e-4)
    # a free save: Daly says 0; the estimate never saves more often than once a minute
    assert daly_interval_s(0, 1000) == 0
    assert estimate(0.0, 6000, 1).interval_s == MIN_INTERVAL_S
    with pytest.raises(ValueError):
        daly_interval_s(-1, 10)
    with pytest.raises(ValueError):
        daly_interval_s(1, 0)
    with pytest.raises(ValueError):
        job_mtbf_s(6000, 0)


def test_job_mtbf_and_expected_losses():
    assert job_mtbf_s(6000, 16) == 6000 * 3600 / 16
    est = estimate(10.0, 6000, 16, delta_source="measured", restart_s=120.0)
    assert est.chosen == "auto" and est.nodes == 16
    assert est.interval_s == pytest.approx(5189.488, abs=1e-3)
    assert est.save_fraction == pytest.approx(10 / 5189.488, rel=1e-6)
    assert est.lost_work_fraction == pytest.approx(((5189.488 + 10) / 2 + 120) / 1_350_000,
                                                   rel=1e-6)
    # Young/Daly is the optimum: the seeds' fixed 15 minutes loses more in total here
    fixed = estimate(10.0, 6000, 16, interval_s=900.0)
    assert fixed.chosen == "fixed" and fixed.optimum_s == est.interval_s
    assert fixed.save_fraction == pytest.approx(10 / 900)
    assert fixed.total_fraction > estimate(10.0, 6000, 16).total_fraction
    # no periodic saves: nothing spent on saves, lost work unbounded
    off = estimate(10.0, 6000, 16, interval_s=0.0)
    assert off.interval_s is None and off.save_fraction == 0 and off.lost_work_fraction is None
    record = json.loads(json.dumps(est.to_json()))
    assert record["delta_s"] == 10.0 and record["nodes"] == 16 and record["chosen"] == "auto"
    assert "every 86.5 min" in est.describe() and "375.0 h = 6000 h per node / 16 nodes" in \
        est.describe()


def test_auto_interval_caps_until_measured_then_follows_the_measured_saves():
    clock = Clock()
    periodic = PeriodicSaves(0, 0.0, 0, clock=clock)
    # an unmeasured estimate (a whole synchronous save of 300 s) would say hours: capped
    auto = AutoInterval(periodic, node_mtbf_hours=6000, nodes=2, delta_s=300.0,
                        source="bytes at 100 MB/s")
    first = auto.compute()
    assert first.interval_s == UNMEASURED_CAP_S == periodic.interval_s
    assert first.optimum_s == pytest.approx(daly_interval_s(300, 6000 * 3600 / 2))
    assert "capped at 15.0 min until a save is measured" in auto.line()
    # the rank-0 clock now asks for a save after the capped interval
    clock.t = UNMEASURED_CAP_S - 1
    assert not periodic.due(1)
    clock.t = UNMEASURED_CAP_S
    assert periodic.due(2)
    periodic.saved(2)
    # the save blocked the loop 2 s: Daly's interval for δ = 2 s, no cap any more
    after = auto.saved(2.0)
    assert after.delta_source == "measured" and after.delta_s == 2.0
    assert after.interval_s == pytest.approx(daly_interval_s(2.0, 6000 * 3600 / 2))
    assert periodic.interval_s == after.interval_s
    # later saves are smoothed: one slow save moves δ halfway
    assert auto.saved(4.0).delta_s == 3.0


def test_auto_interval_from_a_previous_attempts_periodic_save(tmp_path):
    from hpctrain.record.folder import RunFolder
    run = RunFolder(tmp_path / "run")

    def attempt_result(attempt: int, saves: list) -> None:   # what rank 0 leaves: result.json
        folder = run.attempt_dir(attempt)
        folder.mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps({"exit_reason": "preempted",
                                                        "saves": saves}))

    attempt_result(1, [{"step": 5, "reason": "periodic", "stall_seconds": 1.5},
                       {"step": 9, "reason": "emergency", "stall_seconds": 8.0}])
    attempt_result(2, [{"step": 12, "reason": "deadline", "stall_seconds": 7.0}])
    assert previous_blocking_s(run, 3) == 1.5
    attempt_result(3, [{"step": 14, "reason": "periodic", "stall_seconds": 0.9},
                       {"step": 16, "reason": "periodic", "stall_seconds": 0.7}])
    assert previous_blocking_s(run, 4) == 0.7       # the newest attempt's last periodic save
    assert previous_blocking_s(run, 1) is None
    # an attempt with no earlier measurement falls back on the deadline check's estimate
    est = SaveEstimate(previous_s=None, load_s=4.0)
    assert est.seconds == 4.0


# ------------------------------------------------------------------ across attempts (rank 0)
def _run(tmp_path):
    from hpctrain.record.folder import RunFolder
    run = RunFolder(tmp_path / "run")
    run.path.mkdir(parents=True)
    return run


def test_the_restart_cost_is_the_newest_recovery_the_ledger_measured(tmp_path):
    from hpctrain.runtime.save_interval import measured_restart_s
    run = _run(tmp_path)
    assert measured_restart_s(run) is None                     # no ledger yet
    run.append_ledger({"attempt": 1, "exit_reason": "failed"})
    assert measured_restart_s(run) is None                     # nothing measured
    for attempt, recovery in ((2, 95.0), (3, 0), (4, -0.5)):
        run.append_ledger({"attempt": attempt, "exit_reason": "failed", "recovery_s": recovery})
    run.append_ledger({"attempt": 5, "exit_reason": "preempted"})
    # newest first: attempt 5 measured nothing, attempt 4's clock skew measured nothing,
    # attempt 3's restart on a spare took no time worth a decimal
    assert measured_restart_s(run) == 0.0
    run.ledger_file.write_text('{"attempt": 6, "recovery_s": "fast"}\n')  # damaged: the
    assert measured_restart_s(run) is None                               # start-up instead


def test_where_the_save_time_came_from_is_said_in_order_of_trust():
    from hpctrain.runtime.save_interval import estimate_source
    est = SaveEstimate()
    assert estimate_source(est) == "default"
    est = SaveEstimate(state_bytes=10**9)
    assert estimate_source(est) == "bytes at 100 MB/s"
    est = SaveEstimate(load_s=4.0, state_bytes=10**9)
    assert estimate_source(est) == "this attempt's load time"
    est = SaveEstimate(previous_s=9.0, load_s=4.0, state_bytes=10**9)
    assert estimate_source(est) == "newest checkpoint's save time"
    est.record(3.0)
    assert estimate_source(est) == "measured"


def _ctx(run, attempt: int, interval="auto", world: int = 12, per_node: int = 8,
         rank0: bool = True):
    from types import SimpleNamespace as NS
    return NS(job=NS(checkpoint=NS(interval_minutes=interval)), run=run, attempt=attempt,
              world_size=world, env=NS(local_world_size=per_node), is_rank0=rank0,
              profile=NS(reliability=NS(node_mtbf_hours=6000.0)))


def test_a_later_attempt_starts_from_the_last_ones_measured_save_and_recovery(tmp_path):
    from hpctrain.runtime.save_interval import AutoInterval
    run = _run(tmp_path)
    clock = Clock()
    periodic = PeriodicSaves(0, 0.0, 0, clock=clock)
    assert AutoInterval.for_trainer(_ctx(run, 1, interval=30.0), periodic, SaveEstimate()) is None
    folder = run.attempt_dir(1)
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({"exit_reason": "failed", "saves": [
        {"step": 5, "reason": "periodic", "stall_seconds": 2.0}]}))
    run.append_ledger({"attempt": 2, "exit_reason": "failed", "recovery_s": 75.0})
    auto = AutoInterval.for_trainer(_ctx(run, 3, interval="".join(["au", "to"])), periodic,
                                    SaveEstimate(load_s=400.0))    # "auto" as a loader makes it
    # 12 ranks at 8 per node: 2 nodes; δ: attempt 1's periodic save, a measurement (no cap)
    assert (auto.nodes, auto.delta_s, auto.restart_s) == (2, 2.0, 75.0)
    assert auto.source == "previous attempt's periodic save" and auto.measured
    est = auto.compute()
    assert est.interval_s == pytest.approx(daly_interval_s(2.0, 6000 * 3600 / 2))
    assert est.interval_s > UNMEASURED_CAP_S
    # no earlier save measured and no recovery: the deadline check's estimate, capped, and
    # this process's own start-up as the restart's cost
    fresh = _run(tmp_path / "fresh")
    auto = AutoInterval.for_trainer(_ctx(fresh, 1, world=8), periodic,
                                    SaveEstimate(load_s=400.0))
    assert (auto.nodes, auto.delta_s, auto.source) == (1, 400.0, "this attempt's load time")
    assert not auto.measured and auto.compute().interval_s == UNMEASURED_CAP_S
    assert auto.restart_s is not None and auto.restart_s > 0
    # one rank per node (a CPU cluster, or one GPU per node): as many nodes as ranks
    assert AutoInterval.for_trainer(_ctx(fresh, 1, world=3, per_node=1), periodic,
                                    SaveEstimate(load_s=1.0)).nodes == 3


def test_a_save_that_measured_nothing_leaves_the_interval_as_it_was():
    clock = Clock()
    periodic = PeriodicSaves(0, 0.0, 0, clock=clock)
    auto = AutoInterval(periodic, node_mtbf_hours=6000, nodes=1, delta_s=300.0,
                        source="bytes at 100 MB/s")
    for nothing in (None, -1.0):
        est = auto.saved(nothing)
        assert est.delta_s == 300.0 and est.interval_s == UNMEASURED_CAP_S
        assert not auto.measured
    assert auto.saved(0.0).delta_s == 0.0 and auto.measured   # a free save is a measurement


def test_rank_0_reports_the_interval_once_with_the_numbers_it_used(tmp_path):
    clock = Clock()
    run = _run(tmp_path)
    periodic = PeriodicSaves(0, 0.0, 0, clock=clock)
    auto = AutoInterval(periodic, node_mtbf_hours=6000, nodes=7, delta_s=2.0,
                        source="measured", restart_s=60.0)
    assert "capped" not in auto.line()             # computed on first use

    def reported():
        return [e for e in run.events() if e["event"] == "checkpoint_interval"]

    auto.report(_ctx(run, 1, rank0=False), step=40, why="start")    # other ranks: no event
    assert reported() == []
    fresh = AutoInterval(periodic, node_mtbf_hours=6000, nodes=7, delta_s=2.0,
                         source="measured", restart_s=60.0)
    assert fresh.report(_ctx(run, 1, rank0=False), step=40, why="start").interval_s > 0
    est = auto.report(_ctx(run, 1), step=40, why="start")
    (event,) = reported()
    assert (event["step"], event["why"], event["attempt"]) == (40, "start", 1)
    assert event["mtbf_hours"] == 857.14 and event["delta_s"] == 2.0
    assert event["total_lost_fraction"] == round(est.total_fraction, 6) > 0
    assert event["interval_s"] == pytest.approx(est.interval_s, rel=1e-3)


def test_an_unmeasured_interval_below_the_cap_is_kept():
    """The cap keeps an overestimated δ from leaving a run without checkpoints; an interval
    already shorter than the cap (a small job on unreliable nodes) is Daly's, as it is."""
    auto = AutoInterval(PeriodicSaves(0, 0.0, 0, clock=Clock()), node_mtbf_hours=2.0, nodes=4,
                        delta_s=30.0, source="bytes at 100 MB/s")
    est = auto.compute()
    assert est.interval_s == pytest.approx(daly_interval_s(30.0, 2.0 * 3600 / 4))
    assert est.interval_s < UNMEASURED_CAP_S and "capped" not in auto.line()
