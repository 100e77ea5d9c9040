"""Bytes per GPU of each pipeline rank, for the layouts a real job takes: several DP ranks
sharing the distributed optimizer's slices, several pipeline ranks, interleaved chunks that are
alike, 16-bit or fp32 gradients (pure: the planner's arithmetic, checked against the
parameter count and against what the other DP ranks hold, never against its own numbers).
"""

from __future__ import annotations

import dataclasses

import pytest
from plan_jobs import TINY_GPT, TINY_LLAMA, make_job

from hpctrain.model_shape import ModelShape, count_parameters
from hpctrain.planner.activations import Kernels
from hpctrain.planner.memory import (
    ASSUMED_GPU_ALLOWANCE, CPU_ALLOWANCE, GiB, Allowance, StateBytes, optimizer_step_bytes,
    state_bytes_for_parameters, state_bytes_per_pipeline_rank)

# eight layers, so that PP 2 × VPP 4 has middle chunks that are alike
LLAMA8 = ModelShape.from_job(make_job(dict(TINY_LLAMA, num_layers=8)))
GPT = ModelShape.from_job(make_job(TINY_GPT))


def _ranks(shape, *, dp, pp=2, vpp=None, dist=True, fp32_grads=False, precision="bf16",
           dp_rank=None, bucket_size=None):
    return state_bytes_per_pipeline_rank(
        shape, tp=1, pp=pp, vpp=vpp, dp=dp, precision=precision,
        grad_reduce_in_fp32=fp32_grads, distributed_optimizer=dist, dp_rank=dp_rank,
        bucket_size=bucket_size)


@pytest.mark.parametrize("vpp, bucket_size", [(None, None), (4, None), (None, 1000), (4, 1000)])
def test_the_dp_ranks_share_each_pipeline_rank_s_buffer_and_the_busiest_is_planned(vpp,
                                                                                   bucket_size):
    dp = 4
    busiest = _ranks(LLAMA8, dp=dp, vpp=vpp, bucket_size=bucket_size)
    each = [_ranks(LLAMA8, dp=dp, vpp=vpp, dp_rank=r, bucket_size=bucket_size) for r in range(dp)]
    params = count_parameters(LLAMA8, 1, 2, vpp).per_pipeline_rank
    assert len(busiest) == 2
    for p in range(2):
        held = [each[r][p].optimizer_elements for r in range(dp)]
        padded = busiest[p].gradients // 2           # the 16-bit gradient buffer, padded
        assert sum(held) == params[p]        # each parameter has one owner; padding none
        assert padded >= params[p] and padded - params[p] < padded / 2
        assert busiest[p].optimizer_elements == max(held)
        assert all(each[r][p].weights == busiest[p].weights == padded * 2 for r in range(dp))
        # an fp32 master copy and two fp32 moments of what it owns; an fp32 copy of its
        # 16-bit gradients made in the step
        assert busiest[p].optimizer == max(held) * (4 + 8)
        assert busiest[p].main_grads == max(held) * 4
        assert busiest[p].total == busiest[p].weights + busiest[p].gradients + busiest[p].optimizer
        assert busiest[p].between_steps == busiest[p].total + busiest[p].main_grads


@pytest.mark.parametrize("vpp", [None, 4])
def test_without_the_distributed_optimizer_every_dp_rank_holds_its_whole_pipeline_rank(vpp):
    params = count_parameters(LLAMA8, 1, 2, vpp).per_pipeline_rank
    for dp_rank in (None, 0, 3):
        ranks = _ranks(LLAMA8, dp=4, vpp=vpp, dist=False, dp_rank=dp_rank)
        for p, state in enumerate(ranks):
            assert state.optimizer_elements == params[p]
            assert state.weights == params[p] * 2                 # unpadded bf16 weights
            assert state.gradients >= params[p] * 2
            assert state.optimizer == params[p] * 12
    # the untied model's pipeline ranks hold every parameter once
    assert sum(params) == count_parameters(LLAMA8, 1, 1).per_pipeline_rank[0]


def test_fp32_gradients_double_the_buffer_and_need_no_copy_in_the_step():
    bf16 = _ranks(GPT, dp=2, pp=1)
    fp32 = _ranks(GPT, dp=2, pp=1, fp32_grads=True)
    assert fp32[0].gradients == 2 * bf16[0].gradients
    assert fp32[0].main_grads == 0 and bf16[0].main_grads == 4 * bf16[0].optimizer_elements
    assert fp32[0].optimizer == bf16[0].optimizer
    full = _ranks(GPT, dp=2, pp=1, precision="fp32", fp32_grads=True)
    assert full[0].weights == 2 * bf16[0].weights
    assert full[0].optimizer == 8 * full[0].optimizer_elements     # no master copy


def test_more_dp_ranks_shrink_the_optimizer_state_not_the_weights():
    two, eight = _ranks(GPT, dp=2, pp=1)[0], _ranks(GPT, dp=8, pp=1)[0]
    assert eight.optimizer < two.optimizer / 3
    assert eight.weights >= two.weights and eight.weights - two.weights < two.weights / 10


def test_the_step_adds_the_main_gradients_and_foreach_adam_s_copy():
    state = _ranks(GPT, dp=2, pp=1)[0]
    fused, foreach = Kernels(foreach_adam=False), Kernels(foreach_adam=True)
    assert optimizer_step_bytes(state, fused) == state.main_grads
    assert optimizer_step_bytes(state, foreach) == \
        state.main_grads + 4 * state.optimizer_elements
    fp32 = _ranks(GPT, dp=2, pp=1, fp32_grads=True)[0]
    assert optimizer_step_bytes(fp32, fused) == 0


def test_the_back_of_the_envelope_form_shards_only_with_the_distributed_optimizer():
    plain = state_bytes_for_parameters(1e9, "bf16", False, data_parallel_size=8)
    sharded = state_bytes_for_parameters(1e9, "bf16", False, data_parallel_size=8,
                                         distributed_optimizer=True)
    assert plain.optimizer_elements == 1e9 and sharded.optimizer_elements == 1e9 / 8
    assert sharded.main_grads == plain.main_grads / 8 == 1e9 * 4 / 8
    assert sharded.weights == plain.weights and sharded.gradients == plain.gradients


def test_the_allowance_adds_its_fixed_part_and_its_slack_and_says_where_it_comes_from():
    itemized = 40 * GiB
    assert ASSUMED_GPU_ALLOWANCE.bytes(itemized) == int(2 * GiB + 0.05 * itemized)
    assert CPU_ALLOWANCE.bytes(itemized) == int(0.10 * itemized)
    assumed = ASSUMED_GPU_ALLOWANCE.describe()
    assert assumed.startswith("allowance 2.00 GiB outside PyTorch's allocator")
    assert "+ 5.0% of the itemized peak" in assumed and "assumed, not measured" in assumed
    measured = dataclasses.replace(ASSUMED_GPU_ALLOWANCE, outside_allocator_bytes=int(1.5 * GiB),
                                   measured="h100-80gb (hpctrain bench kernels, 2026-11-20)")
    assert measured.describe() == (
        "allowance 1.50 GiB outside PyTorch's allocator (CUDA context, NCCL, libraries) + 5.0% "
        "of the itemized peak (allocator slack), measured on h100-80gb (hpctrain bench "
        "kernels, 2026-11-20)")
    assert isinstance(Allowance(0, 0.0).bytes(10), int)
    assert StateBytes(1, 2, 3).between_steps == 6


def test_overlapped_gradient_reduction_buckets_only_the_first_stage_s_first_chunk():
    # parallel.overlap_grad_reduce with 1,000-element buckets: megatron-core splits the first
    # pipeline stage's first model chunk into buckets, each padded for the distributed
    # optimizer; every other chunk stays one bucket (and a job that does not overlap, the
    # default, keeps one bucket everywhere)
    from hpctrain.model_shape import chunk_parameters, pipeline_chunks
    from hpctrain.planner.grad_buffer import grad_buffer_layout

    def ranks(overlap=None, vpp=None):
        kw = {} if overlap is None else {"overlap_grad_reduce": overlap}
        return state_bytes_per_pipeline_rank(
            LLAMA8, tp=1, pp=2, vpp=vpp, dp=4, precision="bf16", grad_reduce_in_fp32=False,
            distributed_optimizer=True, bucket_size=1000, **kw)

    for vpp in (None, 4):
        plain, overlapped = ranks(False, vpp), ranks(True, vpp)
        assert ranks(None, vpp) == plain
        assert overlapped[1] == plain[1]                       # later stages: one bucket
        first = pipeline_chunks(8, 2, vpp)[0][0]
        params = chunk_parameters(LLAMA8, 1, 2, first)
        extra = (grad_buffer_layout(params, 4, True, 1000).numel
                 - grad_buffer_layout(params, 4, True, None).numel)
        assert extra > 0
        # 16-bit gradients: 2 bytes per element of the padded buffer, the first chunk's only
        assert overlapped[0].gradients - plain[0].gradients == 2 * extra


def test_a_measured_allowance_is_said_in_gib_of_2_to_the_30_bytes():
    measured = Allowance(1_610_612_736, 0.03, measured="h100-80gb")   # 1.5 × 2**30 bytes
    assert measured.describe().startswith("allowance 1.50 GiB outside PyTorch's allocator")
    assert "+ 3.0% of the itemized peak" in measured.describe()
