"""The planner against what ran on a GPU: captured output of tools/gpu_check on one NVIDIA
H100 80GB HBM3 (tests/fixtures/gpu/h100-2026-11-27.json: the reference loop's first
microbatch's kept-for-backward bytes through autograd's saved-tensor hooks, and each training
process's torch.cuda.max_memory_allocated), for the check model and the planner's variants,
each with megatron's unfused attention and with the fused one. The jobs are gpu_check's own,
so a change to the planner (or to the jobs) is held against the measurement here, on the CPU."""

from __future__ import annotations

import json

import pytest

import hpctrain
from hpctrain.config import yamlio
from tests.conftest import REPO, tool_module

CAPTURED = json.loads((REPO / "tests" / "fixtures" / "gpu" /
                       "h100-2026-11-27.json").read_text())


def _tool():
    return tool_module("gpu_check")


def _plan_captured_jobs(folder, kernel_table: str | None = None) -> dict:
    """Each captured job (gpu_check's own) planned as gpu_check ran it: one H100 (80 GB), TP1
    PP1, with ``kernel_table`` named in the profile or none: name -> (job, layout)."""
    tool = _tool()
    data = str(folder / "unused")
    jobs = {"check fused": tool.job_mapping(data, False, "local"),
            "check local": tool.job_mapping(data, False, "local", stock_local=True),
            **dict(tool.variant_jobs(data, False))}
    profile = tool.profile_mapping(False, 989.0, 79.18)
    if kernel_table:
        profile["node"]["kernel_table"] = kernel_table
    (folder / "h100.yaml").write_text(yamlio.dump(profile))
    out = {}
    for name, job in jobs.items():
        path = folder / f"{name.replace(' ', '-')}.yaml"
        path.write_text(yamlio.dump(job))
        (layout,) = hpctrain.plan(path, folder / "h100.yaml", tp=1, pp=1)["layouts"]
        out[name] = (job, layout)
    return out


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> dict:
    return _plan_captured_jobs(tmp_path_factory.mktemp("captured"))


def test_every_captured_layout_is_planned():
    assert len(CAPTURED["kept_for_backward_bytes"]) == 12


@pytest.mark.parametrize("name", sorted(CAPTURED["kept_for_backward_bytes"]))
def test_what_one_microbatch_keeps_for_backward_is_the_plans_count(planned, name):
    """To within 48 bytes per layer (torch's attention kernels keep a few bytes of state the
    count leaves out), with the unfused and the fused attention alike."""
    job, layout = planned[name]
    act = layout["activation_bytes"]
    plan = act["chunk_microbatch"] + act["output_layer"] + act["embedding"]
    kept = CAPTURED["kept_for_backward_bytes"][name]
    assert abs(plan - kept) <= 48 * job["model"]["num_layers"], (name, plan, kept, plan - kept)


@pytest.mark.parametrize("name", sorted(CAPTURED["peak_bytes"]))
def test_the_itemized_peak_is_within_a_tenth_of_the_measured_peak(planned, name):
    _, layout = planned[name]
    itemized = layout["memory_bytes_per_gpu"]["itemized"]
    peak = CAPTURED["peak_bytes"][name]
    assert abs(itemized / peak - 1) <= 0.10, (name, itemized, peak)


@pytest.fixture(scope="module")
def planned_from_the_table(tmp_path_factory) -> dict:
    """The same jobs planned from the kernel table hpctrain ships for this GPU kind (measured
    by the same gpu_check run)."""
    return {name: layout for name, (_, layout) in _plan_captured_jobs(
        tmp_path_factory.mktemp("timed"), "builtin:nvidia-h100-80gb-hbm3").items()}


@pytest.mark.parametrize("name", sorted(CAPTURED["step_time_s"]))
def test_the_step_time_is_the_tables_where_the_gpu_bounds_it(planned_from_the_table, name):
    """Where the plan does not say the host bounds the step, the measured step is the plan's
    to within 10%; where it says so, the step took at least the plan's time (the host only
    adds to what the kernels take). Either way the plan's kernels are this GPU kind's."""
    layout = planned_from_the_table[name]
    plan, measured = layout["step_time_s"], CAPTURED["step_time_s"][name]
    notes = layout["step_time_breakdown_s"]["notes"]
    host_bound = any("bounded the step" in n for n in notes)
    assert layout["step_time_breakdown_s"]["source"].startswith("kernel table NVIDIA H100")
    if host_bound:
        assert measured >= 0.9 * plan, (name, plan, measured)
    else:
        assert abs(plan / measured - 1) <= 0.10, (name, plan, measured, notes)


def test_the_host_bound_steps_are_the_ones_the_plan_names(planned_from_the_table):
    """Every captured step that ran more than 10% over the plan is one the plan says the host
    bounds (the model prices kernels, not the host issuing them)."""
    over = {n for n, t in CAPTURED["step_time_s"].items()
            if t > 1.10 * planned_from_the_table[n]["step_time_s"]}
    named = {n for n, lay in planned_from_the_table.items()
             if any("bounded the step" in x for x in lay["step_time_breakdown_s"]["notes"])}
    assert over and over <= named, (over, named)
