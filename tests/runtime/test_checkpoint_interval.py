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
    periodic = PeriodicSaves(0, 0.0, clock=clock)
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
    assert previous_blocking_s(run, 1) is None
    # an attempt with no earlier measurement falls back on the deadline check's estimate
    est = SaveEstimate(previous_s=None, load_s=4.0)
    assert est.seconds == 4.0
