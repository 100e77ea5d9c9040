"""What a plan costs: time to train the job's train.steps and GPU-hours, for each layout it
ranks, in ``plan`` and ``plan --json``; none where no step time is estimated."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO
from tests.ops.helpers import cli

JOB = str(REPO / "examples" / "llama2-7b.yaml")


def plan_json(tmp_path, *extra: str) -> dict:
    return json.loads(cli(tmp_path, "plan", JOB, "-p", "h100-ib-pyxis", "--json", *extra).stdout)


def test_plan_json_cost_is_step_time_times_steps_on_every_gpu(tmp_path):
    data = plan_json(tmp_path)
    steps = 250_000                                    # llama2-7b.yaml's train.steps
    assert data["layouts"]
    for layout in data["layouts"]:
        cost = layout["cost"]
        assert cost["steps"] == steps
        assert cost["time_to_train_s"] == pytest.approx(layout["step_time_s"] * steps)
        assert cost["gpu_hours"] == pytest.approx(cost["time_to_train_s"] * data["world_size"] / 3600,
                                                  abs=1e-3)
    longer = plan_json(tmp_path, "--set", f"train.steps={2 * steps}")
    assert [lay["cost"]["gpu_hours"] for lay in longer["layouts"]] == pytest.approx(
        [2 * lay["cost"]["gpu_hours"] for lay in data["layouts"]], rel=1e-6)
    pinned = plan_json(tmp_path, "--tp", "2", "--pp", "1")
    assert pinned["layouts"][0]["cost"]["gpu_hours"] > 0


def test_plan_prints_the_cost_of_every_ranked_layout(tmp_path):
    out = cli(tmp_path, "plan", JOB, "-p", "h100-ib-pyxis", "--top", "3").stdout
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("Cost of train.steps = 250,000"))
    assert "on 128 GPUs" in lines[head] and "GPU-hours" in lines[head + 1]
    rows = lines[head + 2:head + 5]
    assert [row.split()[0] for row in rows] == ["1", "2", "3"]
    hours = [float(row.split()[-1].replace(",", "")) for row in rows]
    assert hours == sorted(hours) and hours[0] > 1000     # ranked by step time: cheapest first
    data = plan_json(tmp_path)
    assert hours[0] == pytest.approx(data["layouts"][0]["cost"]["gpu_hours"], rel=1e-3)


def test_no_cost_without_a_step_time(tmp_path):
    """The local profile knows no peak TFLOP/s: nothing to multiply, nothing printed."""
    out = cli(tmp_path, "plan", str(REPO / "examples" / "tiny.yaml")).stdout
    assert "Cost of" not in out
    data = json.loads(cli(tmp_path, "plan", str(REPO / "examples" / "tiny.yaml"), "--json").stdout)
    assert all(lay["cost"]["gpu_hours"] is None for lay in data["layouts"])
