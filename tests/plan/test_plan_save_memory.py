"""A checkpoint save's memory in the plan: the auto choice of optimizer format, the format
recorded in the run, and the refusal of a layout whose save does not fit.

The replay of what a save allocates is checked against megatron-core itself in
test_plan_real_megatron_multi.py; these tests are about what the planner does with it.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner
from plan_jobs import LLAMA2_7B, TINY_GPT, make_job

from hpctrain.cli import cli
from hpctrain.config import load_job, load_profile, profile_from_mapping, yamlio
from hpctrain.config.profile import host_memory_bytes
from hpctrain.model_shape import ModelShape
from hpctrain.planner import check_fits
from hpctrain.planner.layouts import Target, explain_layout, resolve_optimizer_format
from hpctrain.planner.save_memory import (HOST_SAVE_FRACTION, UNKNOWN_HOST_BYTES, BufferShape,
                                       async_copy_bytes, buffer_shapes, gather_replay)
from hpctrain.submission import prepare_run
from hpctrain.submission import resolve_job as resolve   # checked, and auto decided
from tests.conftest import REPO

GiB = 2**30
LLAMA = REPO / "examples" / "llama2-7b.yaml"
H100 = load_profile("h100-ib-pyxis")


def llama(fmt: str = "auto", tp: int = 2, buckets: bool | None = None):
    """examples/llama2-7b.yaml at TP ``tp``; ``buckets=False``: one gradient bucket per model
    chunk (``parallel.overlap_grad_reduce`` off), None: as the job says."""
    job = load_job(LLAMA)
    par = dataclasses.replace(job.parallel, tensor_model_parallel_size=tp, sequence_parallel=tp > 1)
    if buckets is not None and "overlap_grad_reduce" in {f.name for f in dataclasses.fields(par)}:
        par = dataclasses.replace(par, overlap_grad_reduce=buckets)
    return dataclasses.replace(
        job, checkpoint=dataclasses.replace(job.checkpoint, optimizer_format=fmt), parallel=par)


def plan_of(job, profile=H100):
    plan, problems = explain_layout(job, Target.from_profile(profile))
    assert not problems
    return plan


def test_a_full_gather_costs_what_the_issue_says_for_7b_at_tp1():
    """One bucket per chunk (no overlapped gradient reduction): the all-gather receives the whole
    TP×PP shard's fp32 state, 4 bytes per parameter on the GPU (about 27 GB for 7B at TP1), and
    every DP rank holds 12 bytes per parameter on the host twice over while it gathers."""
    sv = plan_of(llama("fully_reshardable", tp=1, buckets=False)).save
    params = 6_738_415_616
    assert 4 * params <= sv.gpu_transient < 4 * params * (1 + 1 / 128) + 2**20
    assert sv.gathered_per_rank >= 12 * params
    assert sv.host_per_rank >= 24 * params
    assert sv.host_per_node == 8 * sv.host_per_rank


def test_overlapped_reduction_buckets_shrink_the_gpu_transient_not_the_host():
    shape = ModelShape.from_job(llama())
    (whole,), = buffer_shapes(shape, 1, 1, None, 128, overlap_grad_reduce=False)
    (bucketed,), = buffer_shapes(shape, 1, 1, None, 128, overlap_grad_reduce=True)
    assert len(whole.buckets) == 1 and len(bucketed.buckets) > 10
    # a bucket closes at the parameter that takes it past max(40M, 1M × DP) = 128M elements
    assert max(b for b, _ in bucketed.buckets) < 128_000_000 + bucketed.largest_param + 128
    host_w, gpu_w, held_w = gather_replay((whole,), 128)
    host_b, gpu_b, held_b = gather_replay((bucketed,), 128)
    assert gpu_b < gpu_w / 20
    assert held_b == pytest.approx(held_w, rel=1e-3)        # the state gathered is the same
    assert host_b < host_w                                  # only the per-bucket temporaries shrink


def test_auto_is_megatron_lms_default_on_gpus():
    """On a GPU profile auto is dp_reshardable whatever the memory: fully_reshardable's rebuild
    blocked training about six times longer per save on an H200 (the GPU check)."""
    for tp in (1, 8):
        plan = plan_of(llama("auto", tp=tp))
        assert plan.save.optimizer_format == "dp_reshardable" and plan.fits
        assert "Megatron-LM's default on GPUs" in plan.format_reason
        assert "optimizer_format: fully_reshardable" in plan.format_reason   # the way out
    # asked for by name, fully_reshardable is priced and fits at TP8 (its memory is counted)
    tp8 = plan_of(llama("fully_reshardable", tp=8))
    assert tp8.save.optimizer_format == "fully_reshardable" and tp8.fits
    assert tp8.save.host_per_node <= HOST_SAVE_FRACTION * host_memory_bytes(H100)


def cpu_tiny(host_gb: float | None):
    """The CPU rehearsal profile (dev-slurm) with ``host_gb`` of host memory per node, and the
    tiny GPT with the distributed optimizer and auto, resolved on it."""
    data = yamlio.read_mapping(REPO / "cluster_profiles" / "dev-slurm.yaml")
    data["node"]["host_memory_gb"] = host_gb
    profile = profile_from_mapping(data, "dev-slurm")
    tiny = make_job(TINY_GPT, gbs=8, parallel={"use_distributed_optimizer": True})
    tiny = dataclasses.replace(tiny, checkpoint=dataclasses.replace(tiny.checkpoint,
                                                                    optimizer_format="auto"))
    return tiny, profile


def test_auto_on_the_cpu_rehearsal_chooses_by_host_memory_and_says_why():
    tiny, roomy = cpu_tiny(64)
    fmt, why = resolve_optimizer_format(tiny, roomy, resolve(tiny, roomy).layout)
    assert fmt == "fully_reshardable" and "within 50% of 64 GiB" in why
    tiny, cramped = cpu_tiny(1e-6)
    fmt, why = resolve_optimizer_format(tiny, cramped, resolve(tiny, cramped).layout)
    assert fmt == "dp_reshardable" and "over 50% of" in why


def test_auto_without_host_memory_in_the_profile_assumes_a_small_node():
    tiny, bare = cpu_tiny(None)
    fmt, why = resolve_optimizer_format(tiny, bare, resolve(tiny, bare).layout)
    assert fmt == "fully_reshardable" and "assumed" in why
    assert f"{UNKNOWN_HOST_BYTES / GiB:g} GiB" in why
    gpu_bare = dataclasses.replace(H100, node=dataclasses.replace(H100.node, host_memory_gb=None))
    assert host_memory_bytes(gpu_bare) is None    # slurm.mem is 0: "all of it", size unknown
    assert plan_of(llama("fully_reshardable", tp=8), gpu_bare).save.fits_host is None


def test_slurm_mem_is_the_host_limit_when_it_is_a_size():
    def prof(mem, host=None):
        return profile_from_mapping({"name": "p", "slurm": {"mem": mem},
                                     "node": {"host_memory_gb": host}}, "p")
    assert host_memory_bytes(prof("480G")) == 480 * GiB
    assert host_memory_bytes(prof("2T", 100)) == 2048 * GiB
    assert host_memory_bytes(prof("500000")) == 500000 * 2**20      # Slurm's default unit: MB
    assert host_memory_bytes(prof("0", 1024)) == 1024 * GiB          # 0: all of the node's
    assert host_memory_bytes(prof(None)) is None


def test_resolve_records_the_format_in_the_run(tmp_path):
    job = llama("auto", tp=1)
    profile = H100
    resolved = resolve(job, profile)
    assert job.checkpoint.optimizer_format == "auto"          # the caller's job is untouched
    assert resolved.job.checkpoint.optimizer_format == "dp_reshardable"
    run = prepare_run(resolved, tmp_path / "runs")
    recorded = yamlio.read_mapping(run.job_file, "job")["checkpoint"]["optimizer_format"]
    assert recorded == "dp_reshardable"
    tiny, cpu = cpu_tiny(64)                                   # the CPU rehearsal's choice
    assert resolve(tiny, cpu).job.checkpoint.optimizer_format == "fully_reshardable"


def test_check_fits_refuses_a_save_that_does_not_fit_with_the_fix():
    fit = check_fits(llama("fully_reshardable", tp=1), H100)
    assert fit.fits is False and fit.plan.training_fits is True
    assert "the training step fits in 80 GiB per GPU but the checkpoint save does NOT fit" \
        in fit.message
    assert "use checkpoint.optimizer_format: dp_reshardable (or auto), or more TP/PP" in fit.message
    assert "of host memory per node (a save may use 50% of 2048 GiB)" in fit.message
    assert check_fits(llama("auto", tp=1), H100).fits is True


def test_submit_refuses_it_and_plan_shows_it(tmp_path):
    job_file = tmp_path / "job.yaml"
    data = yamlio.read_mapping(LLAMA, "job")
    data["parallel"].update(tensor_model_parallel_size=1, sequence_parallel=False)
    data["checkpoint"]["optimizer_format"] = "fully_reshardable"
    job_file.write_text(yamlio.dump(data))
    res = CliRunner().invoke(cli, ["submit", str(job_file), "--profile", "h100-ib-pyxis",
                                   "--runs-dir", str(tmp_path / "runs")])
    assert res.exit_code == 2, res.output
    assert res.output.startswith("Error: ") and "Traceback" not in res.output
    assert "checkpoint save does NOT fit: use checkpoint.optimizer_format: dp_reshardable" \
        in res.output
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())

    res = CliRunner().invoke(cli, ["plan", str(job_file), "--profile", "h100-ib-pyxis",
                                   "--tp", "1", "--no-sequence-parallel"])
    assert res.exit_code == 0, res.output
    assert "checkpoint save, optimizer_format fully_reshardable:" in res.output
    assert "[does NOT fit]" in res.output and "fix: use checkpoint.optimizer_format" in res.output
    res = CliRunner().invoke(cli, ["plan", str(job_file), "--profile", "h100-ib-pyxis",
                                   "--tp", "1", "--no-sequence-parallel", "--json"])
    (lay,) = json.loads(res.output)["layouts"]
    save = lay["checkpoint_save"]
    assert lay["fits"] is False and lay["training_fits"] is True
    assert save["fits_host"] is False and save["host_per_node"] == 8 * save["host_per_rank"]


def test_replay_on_gpu_moves_the_receive_buffers_off_the_host():
    """The same gather on a GPU: the receive list and the send copy live on the GPU, the host
    keeps its copies and the concatenations; the host peak is the CPU run's."""
    shape = ModelShape.from_job(make_job(LLAMA2_7B, gbs=8))
    buffers = buffer_shapes(shape, 8, 1, None, 16)[0]
    (buf,) = buffers
    (bucket, _), = buf.buckets
    host, gpu, held = gather_replay(buffers, 16, "cuda")
    assert gpu == 4 * bucket + 4 * bucket // 16
    assert (host, held) == gather_replay(buffers, 16, "cpu")[::2]
    assert held == 12 * buf.numel


@pytest.mark.parametrize("fmt", ["fully_reshardable", "dp_reshardable"])
def test_without_the_distributed_optimizer_nothing_is_gathered(fmt):
    job = dataclasses.replace(llama(fmt, tp=8), parallel=dataclasses.replace(
        llama(fmt, tp=8).parallel, use_distributed_optimizer=False))
    sv = plan_of(job).save
    assert sv.gpu_transient == 0 and sv.gathered_per_rank == 0


def test_a_two_bucket_gather_on_the_cpu_rehearsal_to_the_byte():
    """Adam's state of one buffer (1000 elements, padded to 1024, two buckets of 512) gathered
    over 2 DP ranks on the CPU rehearsal. The gather's peak comes as the second bucket starts:
    the three world tensors, that bucket's three new shards, and still the first bucket's
    shards and its last state key's receive list and concatenation. Everything but the world
    tensors goes at the end, and re-padding them to 1024 elements keeps the unpadded and the
    padded copies side by side for a moment: that is the peak of the whole save here."""
    buf = BufferShape(numel=1024, numel_unpadded=1000, buckets=((512, 512), (512, 488)),
                      params=1000, largest_param=600)
    world, shards, one_key = 3 * 4 * 1000, 3 * 4 * 256, 4 * 512
    host, gpu, held = gather_replay((buf,), 2, "cpu", realign=False)
    assert (host, gpu, held) == (world + 2 * shards + 2 * one_key, 0, world)
    host, gpu, held = gather_replay((buf,), 2, "cpu")
    assert (host, gpu, held) == (world + 3 * 4 * 1024, 0, 3 * 4 * 1024)


def test_the_async_copy_is_the_ranks_share_of_what_the_format_saves():
    """bf16 weights of 1000 elements over 4 DP ranks, the largest tensor 600: every rank hands
    the writer a quarter of the weights plus one tensor at worst; dp_reshardable adds the
    rank's own Adam slice (260 elements: the most loaded rank, padding included),
    fully_reshardable a quarter of all of Adam's state instead."""
    buf = BufferShape(numel=1040, numel_unpadded=1000, buckets=((1040, 1000),), params=1000,
                      largest_param=600)
    weights, one_tensor = 2 * 1000 // 4, 4 * 600
    assert async_copy_bytes((buf,), 4, 2, 260, "dp_reshardable") == \
        weights + one_tensor + 3 * 4 * 260
    assert async_copy_bytes((buf,), 4, 2, 260, "fully_reshardable") == \
        (2 * 1000 + 3 * 4 * 1000) // 4 + one_tensor


def test_a_dp_reshardable_save_on_gpus_holds_only_its_copy_on_the_host():
    """Megatron-LM's default format gathers nothing: each rank's host memory during the save is
    what it hands the background writer, and the GPU gets nothing more."""
    sv = plan_of(llama("dp_reshardable", tp=8)).save
    assert sv.gathered_per_rank == 0 and sv.gpu_transient == 0
    assert sv.host_per_rank == sv.async_copy_per_rank > 0
