"""`hpctrain plan` prices a layout's checkpoint save and its Young/Daly interval."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from hpctrain.checkpoint_interval import daly_interval_s, job_mtbf_s
from hpctrain.cli import cli
from hpctrain.config import job_from_mapping, load_job, load_profile, profile_from_mapping
from hpctrain.config.schema import to_dict
from hpctrain.errors import ConfigError
from hpctrain.planner import Target, explain_layout
from hpctrain.planner.save_memory import SaveMemory
from hpctrain.planner.save_time import (DEFAULT_WRITE_GBS, HOST_COPY_GBS, REBUILD_GBS,
                                        SAVE_OVERHEAD_S, job_interval_s, save_time)
from tests.conftest import REPO

LLAMA = str(REPO / "examples" / "llama2-7b.yaml")


def saved(gathered: int = 0, copy: int = 10**9, ranks: int = 8) -> SaveMemory:
    return SaveMemory("fully_reshardable", 0, 0, gathered, copy, gathered + copy, ranks, None,
                      None)


def test_save_time_by_hand():
    # 1 GB per rank, 8 ranks per node, 4 GB/s per node, in the background
    st = save_time(saved(), dp=16, dp_link_gbs=None, write_gbs=4.0, background=True)
    assert st.bytes_per_node == 8 * 10**9 and not st.write_assumed
    assert st.write_s == pytest.approx(2.0)                         # 8 GB / 4 GB/s
    assert st.copy_s == pytest.approx(1 / HOST_COPY_GBS)
    assert st.blocking_s == pytest.approx(SAVE_OVERHEAD_S + 1 / HOST_COPY_GBS)  # only the copy
    assert st.sync_s == pytest.approx(SAVE_OVERHEAD_S + 2.0)
    sync = save_time(saved(), dp=16, dp_link_gbs=None, write_gbs=None, background=False)
    assert sync.write_assumed and sync.write_gbs == DEFAULT_WRITE_GBS
    assert sync.blocking_s == sync.sync_s == pytest.approx(SAVE_OVERHEAD_S + 8 / DEFAULT_WRITE_GBS)
    # fully_reshardable: 20 GB rebuilt per rank, all-gathered over DP 4 at 50 GB/s, re-assembled
    full = save_time(saved(gathered=20 * 10**9), dp=4, dp_link_gbs=50.0, write_gbs=4.0,
                     background=True)
    assert full.gather_s == pytest.approx(20 * 3 / 4 / 50 + 20 / REBUILD_GBS)
    assert full.gather_link_known
    unknown = save_time(saved(gathered=20 * 10**9), dp=4, dp_link_gbs=None, write_gbs=4.0,
                        background=True)
    assert unknown.gather_s == pytest.approx(20 / REBUILD_GBS) and not unknown.gather_link_known


def test_job_interval_is_the_shorter_of_minutes_and_steps():
    assert job_interval_s(15.0, 0, None) == 900
    assert job_interval_s(15.0, 100, 2.0) == 200
    assert job_interval_s(0.0, 0, 2.0) is None
    assert job_interval_s("auto", 1000, None) is None


def plan_json(*args: str) -> dict:
    res = CliRunner().invoke(cli, ["plan", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_llama_plan_shows_the_interval_from_its_own_save_time():
    data = plan_json(LLAMA, "--profile", "h100-ib-pyxis", "--tp", "2", "--pp", "1")
    (lay,) = data["layouts"]
    ck = lay["checkpoint_interval"]
    st, auto, job = ck["save_time"], ck["young_daly"], ck["job"]
    # 16 nodes of 8: 1/16 of each node's MTBF; Daly's formula on the plan's own δ
    assert auto["nodes"] == 16 and auto["mtbf_s"] == job_mtbf_s(6000, 16)
    assert auto["delta_s"] == pytest.approx(st["blocking_s"], abs=1e-3)
    assert auto["interval_s"] == pytest.approx(daly_interval_s(st["blocking_s"], auto["mtbf_s"]),
                                               abs=0.2)
    # async_save: the copy to host blocks, the write does not
    assert st["background"] and st["blocking_s"] < st["synchronous_s"]
    # the example saves every 30 minutes (or 1000 steps, far longer)
    assert job["chosen"] == "fixed" and job["interval_s"] == 1800.0
    assert job["save_fraction"] == pytest.approx(st["blocking_s"] / 1800, rel=1e-3)
    text = CliRunner().invoke(cli, ["plan", LLAMA, "-p", "h100-ib-pyxis", "--tp", "2", "--pp",
                                    "1"]).output
    assert "checkpoint (interval_minutes 30, interval_steps 1000): every 30.0 min (fixed" in text
    assert "interval_minutes: auto would save every" in text


def test_profile_reliability_and_write_bandwidth_move_the_estimate(tmp_path):
    job = load_job(LLAMA)
    base = to_dict(load_profile("h100-ib-pyxis"))
    flaky = profile_from_mapping({**base, "reliability": {"node_mtbf_hours": 1500},
                                  "storage": {**base["storage"], "write_bandwidth_gbs": 8}},
                                 "flaky.yaml")
    plans = []
    for profile in (load_profile("h100-ib-pyxis"), flaky):
        plan, problems = explain_layout(job, Target.from_profile(profile), tp=2, pp=1)
        assert not problems
        plans.append(plan.checkpointing)
    steady, fragile = plans
    assert fragile.save.write_gbs == 8 and not fragile.save.write_assumed
    assert fragile.save.write_s == pytest.approx(steady.save.write_s / 4)
    # a quarter of the MTBF: about half the interval (√M), never the same
    assert fragile.auto.interval_s == pytest.approx(
        daly_interval_s(fragile.save.blocking_s, job_mtbf_s(1500, 16)))
    assert 0.45 < fragile.auto.interval_s / steady.auto.interval_s < 0.55


def test_auto_in_the_job_is_what_the_plan_uses():
    job = load_job(LLAMA)
    auto_job = dataclasses.replace(job, checkpoint=dataclasses.replace(
        job.checkpoint, interval_minutes="auto", interval_steps=0))
    plan, _ = explain_layout(auto_job, Target.from_profile(load_profile("h100-ib-pyxis")), tp=2,
                             pp=1)
    assert plan.checkpointing.job is plan.checkpointing.auto
    assert plan.checkpointing.setting == "interval_minutes auto"


@pytest.mark.parametrize("value, message", [
    (0, "must be at least 0.1"), (-5, "must be at least 0.1"), (1e-300, "must be at least 0.1"),
    ("often", "expected a number"), (1e9, "must be at most 10^7")])
def test_node_mtbf_hours_is_validated(value, message):
    with pytest.raises(ConfigError) as err:
        profile_from_mapping({"reliability": {"node_mtbf_hours": value}}, "p.yaml")
    (path, msg), = err.value.problems
    assert path == "reliability.node_mtbf_hours" and message in msg


def test_interval_minutes_takes_a_number_or_auto():
    base = dict(name="x", model=dict(num_layers=2, hidden_size=8, num_attention_heads=2,
                                     vocab_size=10, seq_length=8),
                batch=dict(micro_batch_size=1, global_batch_size=1), train=dict(steps=1),
                data=dict(path="/tmp/x"))
    assert job_from_mapping({**base, "checkpoint": {"interval_minutes": "auto"}},
                            "j").checkpoint.interval_minutes == "auto"
    assert job_from_mapping({**base, "checkpoint": {"interval_minutes": 7}},
                            "j").checkpoint.interval_minutes == 7.0
    with pytest.raises(ConfigError) as err:
        job_from_mapping({**base, "checkpoint": {"interval_minutes": "autoo"}}, "j")
    (path, msg), = err.value.problems
    assert path == "checkpoint.interval_minutes"
    assert msg == "expected a number or auto, got 'autoo' (did you mean 'auto'?)"
