"""The layout search (hpctrain.planner.layouts) on the facts a user reads in `hpctrain plan`:
which tensor-parallel sizes are tried without a node size, the pipeline bubble of a plain and
an interleaved schedule, and what the CPU rehearsal counts (no GPU buffers)."""

from __future__ import annotations

from plan_jobs import LLAMA2_7B, make_job

from hpctrain.config import Layout
from hpctrain.planner.layouts import RUNTIME_BUFFER_BYTES, Target, plan_layout, plan_layouts
from hpctrain.planner.timing import Hardware

GiB = 2**30
H100 = Hardware(989.0, 360.0, 45.0, 8)


def test_without_a_node_size_tensor_parallelism_stays_inside_eight_gpus():
    """16 GPUs whose node size nobody stated: TP is tried up to 8 (an NVLink domain), never 16;
    every divisor of 8 is tried, and beside each every pipeline size the rest divides into."""
    job = make_job(LLAMA2_7B, mbs=1, gbs=64)
    result = plan_layouts(job, Target(16, None, 80 * GiB, Hardware(989.0, None, None, None)))
    tps = {p.layout.tensor_model_parallel_size for p in result.layouts}
    # a rejected layout is its description: "TP2×PP4 mbs 1"
    tps |= {int(r.layout.split("×")[0].removeprefix("TP")) for r in result.rejected}
    assert tps == {1, 2, 4, 8}
    tried = _described(result)
    for tp in (1, 2, 4, 8):
        pps = {int(n.split("×")[1].split(" ")[0].removeprefix("PP")) for n in tried
               if n.startswith(f"TP{tp}×")}
        assert pps == {d for d in range(1, 17) if (16 // tp) % d == 0}, (tp, pps)


def test_the_pipeline_bubble_of_a_plain_and_an_interleaved_schedule():
    """PP4 over 8 microbatches idles (4 - 1) / 8 of the step; two model chunks per stage
    (VPP2) halve it; one stage has none."""
    job = make_job(LLAMA2_7B, mbs=1, gbs=8)
    target = Target(4, 8, 80 * GiB, H100)

    def bubble(pp, vpp):
        layout = Layout(4 // pp, pp, vpp, 1, 1, 8)
        return plan_layout(job, layout, target, sequence_parallel=False,
                           recompute=None).pipeline_bubble_fraction
    assert bubble(4, None) == 3 / 8
    assert bubble(4, 2) == 3 / 16
    assert bubble(1, None) == 0


def test_the_cpu_rehearsal_counts_no_gpu_buffers():
    """The runtime's GPU buffers (NCCL, cuBLAS workspaces) are counted on GPUs only: a CPU
    plan's memory breakdown has none."""
    assert Target(1, 1, None, Hardware(None, None, None, 1), "cpu").buffers == 0
    assert Target(8, 8, 80 * GiB, H100).buffers == RUNTIME_BUFFER_BYTES > 0


def _described(result) -> set[str]:
    """Every layout tried, planned or rejected, as `hpctrain plan` names it."""
    from hpctrain.planner.layouts import _describe
    named = {_describe(p.layout.tensor_model_parallel_size, p.layout.pipeline_model_parallel_size,
                       p.layout.virtual_pipeline_model_parallel_size, p.layout.micro_batch_size,
                       p.sequence_parallel) for p in result.layouts}
    return named | {r.layout for r in result.rejected}


def test_interleaving_is_tried_at_every_split_of_a_stages_layers():
    """32 layers on 4 pipeline stages: 8 per stage, so 2, 4 or 8 model chunks per stage (and
    none); never a split that leaves a stage a fraction of a layer."""
    job = make_job(LLAMA2_7B, mbs=1, gbs=64)
    tried = _described(plan_layouts(job, Target(8, 8, 80 * GiB, H100), tp=2, pp=4))
    vpps = {name.split(" ")[0].partition("VPP")[2] or None for name in tried}
    assert vpps == {None, "2", "4", "8"}


def test_sequence_parallelism_is_tried_only_beside_tensor_parallelism_on_gpus():
    job = make_job(LLAMA2_7B, mbs=1, gbs=64)
    gpus = _described(plan_layouts(job, Target(8, 8, 80 * GiB, H100)))
    assert any(name.endswith(" SP") for name in gpus)
    assert not any(name.startswith("TP1×") and name.endswith(" SP") for name in gpus)
    cpu = _described(plan_layouts(job, Target(4, 4, None, Hardware(None, None, None, 4), "cpu")))
    assert cpu and not any(name.endswith(" SP") for name in cpu)
