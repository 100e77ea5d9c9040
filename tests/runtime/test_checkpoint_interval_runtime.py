"""checkpoint.interval_minutes: auto in real ranks: the numbers it used, printed and recorded at
start, and the interval recomputed from the blocking time each periodic save measured."""

from __future__ import annotations

import pytest

from hpctrain.checkpoint_interval import MIN_INTERVAL_S, daly_interval_s, job_mtbf_s
from hpctrain.runtime.save_interval import UNMEASURED_CAP_S
from tests.runtime.conftest import result

pytestmark = pytest.mark.megatron


def expected_interval(event: dict, capped: bool) -> float:
    tau = max(MIN_INTERVAL_S, daly_interval_s(event["delta_s"], event["mtbf_s"]))
    return min(tau, UNMEASURED_CAP_S) if capped else tau


def test_auto_interval_is_reported_at_start_and_follows_the_measured_save(ws):
    # 2 ranks (TP2) on one node of a profile that says nodes fail every 5 hours; a background
    # save every 4 steps measures δ
    profile = ws_profile(2, node_mtbf_hours=5.0)
    run, res = ws.train("auto-interval", "tp2", steps=8, profile=profile,
                        checkpoint={"interval_minutes": "auto", "interval_steps": 4,
                                    "async_save": True})
    events = [e for e in run.events() if e["event"] == "checkpoint_interval"]
    start, *after = events
    assert start["why"] == "start" and start["step"] == 0 and start["attempt"] == 1
    assert start["nodes"] == 1 and start["node_mtbf_hours"] == 5.0
    assert start["mtbf_s"] == job_mtbf_s(5.0, 1) == 18000
    # nothing measured yet on a first attempt: the deadline check's estimate, capped
    assert start["delta_source"] in ("bytes at 100 MB/s", "default")
    assert start["delta_s"] > 0
    assert start["interval_s"] == pytest.approx(expected_interval(start, capped=True), abs=0.1)
    assert 0 < start["save_fraction"] < 1 and start["lost_work_fraction"] > 0
    # one recomputation per periodic save (step 4; step 8 is the final, synchronous save)
    assert [e["step"] for e in after] == [4]
    (measured,) = after
    saves = result(run, 1)["saves"]
    periodic = [s for s in saves if s["reason"] == "periodic"]
    assert [s["step"] for s in periodic] == [4] and not periodic[0]["sync"]
    assert measured["delta_source"] == "measured"
    assert measured["delta_s"] == pytest.approx(periodic[0]["stall_seconds"], abs=1e-3)
    # the event's δ is rounded to 1 ms and its interval to 0.1 s: the interval of any δ that
    # rounds to the one shown (Young/Daly grows with δ), within that rounding
    low, high = (expected_interval({**measured, "delta_s": measured["delta_s"] + d}, capped=False)
                 for d in (-0.0005, 0.0005))
    assert low - 0.05 <= measured["interval_s"] <= high + 0.05, (low, measured, high)
    line = next(ln for ln in res.output(0).splitlines() if "checkpoint interval: auto ->" in ln)
    assert "job MTBF M 5.0 h = 5 h per node / 1 node" in line
    assert "expected time lost: saves" in line and "lost work" in line


def ws_profile(world: int, **reliability) -> dict:
    from tests.runtime.helpers import local_profile
    return local_profile(world, reliability=reliability)
