"""The planner against what ran on a GPU: captured output of tools/gpu_check on one NVIDIA
H100 80GB HBM3 (tests/fixtures/gpu/h100-2026-11-27.json, the check model at micro-batch 2) and
one NVIDIA H200 (h200-2026-11-29.json, at micro-batch 4): the reference loop's first
microbatch's kept-for-backward bytes through autograd's saved-tensor hooks, each training
process's torch.cuda.max_memory_allocated and step time, for the check model and the planner's
variants, each with megatron's unfused attention and with the fused one. The jobs are
gpu_check's own, so a change to the planner (or to the jobs) is held against the measurement
here, on the CPU."""

from __future__ import annotations

import json

import pytest

import hpctrain
from hpctrain.config import yamlio
from tests.conftest import REPO, tool_module

FIXTURES = REPO / "tests" / "fixtures" / "gpu"
CAPTURES = {name: json.loads((FIXTURES / f"{name}.json").read_text())
            for name in ("h100-2026-11-27", "h200-2026-11-29")}
TABLES = {"h100-2026-11-27": "builtin:nvidia-h100-80gb-hbm3",
          "h200-2026-11-29": "builtin:nvidia-h200"}


def _tool():
    return tool_module("gpu_check")


def _plan_captured_jobs(folder, capture: dict, kernel_table: str | None = None) -> dict:
    """Each captured job (gpu_check's own) planned as gpu_check ran it on the captured GPU,
    TP1 PP1, with ``kernel_table`` named in the profile or none: name -> (job, layout)."""
    tool = _tool()
    data = str(folder / "unused")
    mbs = capture["check_micro_batch_size"]
    jobs = {"check fused": tool.job_mapping(data, False, "local", micro_batch_size=mbs),
            "check local": tool.job_mapping(data, False, "local", stock_local=True,
                                            micro_batch_size=mbs),
            **dict(tool.variant_jobs(data, False))}
    profile = tool.profile_mapping(False, capture["peak_tflops"], capture["gpu_memory_gb"])
    if kernel_table:
        profile["node"]["kernel_table"] = kernel_table
    (folder / "gpu.yaml").write_text(yamlio.dump(profile))
    out = {}
    for name, job in jobs.items():
        path = folder / f"{name.replace(' ', '-')}.yaml"
        path.write_text(yamlio.dump(job))
        (layout,) = hpctrain.plan(path, folder / "gpu.yaml", tp=1, pp=1)["layouts"]
        out[name] = (job, layout)
    return out


def _cases(key: str) -> list[tuple[str, str]]:
    return [(capture, name) for capture in CAPTURES for name in sorted(CAPTURES[capture][key])]


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> dict:
    return {capture: _plan_captured_jobs(tmp_path_factory.mktemp(capture), data)
            for capture, data in CAPTURES.items()}


@pytest.fixture(scope="module")
def planned_from_the_table(tmp_path_factory) -> dict:
    """The same jobs planned from the kernel table hpctrain ships for the captured GPU kind
    (measured by the same gpu_check run)."""
    return {capture: {name: layout for name, (_, layout) in _plan_captured_jobs(
        tmp_path_factory.mktemp(capture + "-timed"), data, TABLES[capture]).items()}
        for capture, data in CAPTURES.items()}


@pytest.mark.parametrize("capture", sorted(CAPTURES))
def test_every_captured_layout_is_planned(capture):
    assert len(CAPTURES[capture]["kept_for_backward_bytes"]) == 12
    assert set(CAPTURES[capture]["peak_bytes"]) == set(CAPTURES[capture]["step_time_s"]) == \
        set(CAPTURES[capture]["kept_for_backward_bytes"])


@pytest.mark.parametrize("capture,name", _cases("kept_for_backward_bytes"))
def test_what_one_microbatch_keeps_for_backward_is_the_plans_count(planned, capture, name):
    """To within 48 bytes per layer (torch's attention kernels keep a few bytes of state the
    count leaves out), with the unfused and the fused attention alike."""
    job, layout = planned[capture][name]
    act = layout["activation_bytes"]
    plan = act["chunk_microbatch"] + act["output_layer"] + act["embedding"]
    kept = CAPTURES[capture]["kept_for_backward_bytes"][name]
    assert abs(plan - kept) <= 48 * job["model"]["num_layers"], (name, plan, kept, plan - kept)


@pytest.mark.parametrize("capture,name", _cases("peak_bytes"))
def test_the_itemized_peak_is_within_a_tenth_of_the_measured_peak(planned, capture, name):
    _, layout = planned[capture][name]
    itemized = layout["memory_bytes_per_gpu"]["itemized"]
    peak = CAPTURES[capture]["peak_bytes"][name]
    assert abs(itemized / peak - 1) <= 0.10, (name, itemized, peak)


def _host_bound(layout: dict) -> bool:
    return any("bounded the step" in n for n in layout["step_time_breakdown_s"]["notes"])


@pytest.mark.parametrize("capture,name", _cases("step_time_s"))
def test_the_step_time_is_the_tables_where_the_gpu_bounds_it(planned_from_the_table, capture,
                                                               name):
    """Where the plan does not say the host bounds the step, the measured step is the plan's
    to within 10%; where it says so, the step took at least the plan's time (the host only
    adds to what the kernels take). Either way the plan's kernels are this GPU kind's."""
    layout = planned_from_the_table[capture][name]
    plan, measured = layout["step_time_s"], CAPTURES[capture]["step_time_s"][name]
    notes = layout["step_time_breakdown_s"]["notes"]
    assert layout["step_time_breakdown_s"]["source"].startswith(
        "kernel table " + CAPTURES[capture]["gpu"])
    if _host_bound(layout):
        assert measured >= 0.9 * plan, (name, plan, measured)
    else:
        assert abs(plan / measured - 1) <= 0.10, (name, plan, measured, notes)


@pytest.mark.parametrize("capture", sorted(CAPTURES))
def test_the_host_bound_steps_are_the_ones_the_plan_names(planned_from_the_table, capture):
    """Every captured step that ran more than 10% over the plan is one the plan says the host
    bounds (the model prices kernels, not the host issuing them)."""
    planned = planned_from_the_table[capture]
    over = {n for n, t in CAPTURES[capture]["step_time_s"].items()
            if t > 1.10 * planned[n]["step_time_s"]}
    named = {n for n, lay in planned.items() if _host_bound(lay)}
    assert over and over <= named, (over, named)

