"""The 7B/70B memory figures of the reference material, where they state their assumptions.

The seeds are in ../shared/seeds/: 001 (lesson "Pre-training Infrastructure", Exercise 1) and
003 (system design "Distributed Training", back-of-envelope and ZeRO table). Where a seed
assumes something megatron-core does not do, the test says which part matches and why the
rest differs.
"""

from __future__ import annotations

from hpctrain.planner.memory import optimizer_bytes_per_element, state_bytes_for_parameters

GB = 1e9


def test_seed_001_exercise_1_7b_mixed_precision():
    # "Parameters: 7B (float16) ... AdamW: parameter copy + 1st moment + 2nd moment, all in
    # fp32 ... Gradients (fp32)": 14 GB + 84 GB + 28 GB = 126 GB. That is megatron-core's fp16
    # training with grad_reduce_in_fp32 (its default) and no distributed optimizer.
    b = state_bytes_for_parameters(7e9, "fp16", grad_reduce_in_fp32=True)
    assert (b.weights / GB, b.optimizer / GB, b.gradients / GB) == (14, 84, 28)
    assert b.total / GB == 126
    # "ZeRO Stage 1 targets optimizer state sharding first": over 8 ranks the 84 GB is 10.5.
    z1 = state_bytes_for_parameters(7e9, "fp16", True, data_parallel_size=8,
                                    distributed_optimizer=True)
    assert z1.optimizer / GB == 10.5 and z1.weights == b.weights and z1.gradients == b.gradients


def test_seed_003_7b_and_70b_back_of_envelope():
    # 003: "Model size (BF16): 7B × 2 bytes = 14 GB; Optimizer states (Adam): 7B × 8 bytes =
    # 56 GB (momentum + variance); Gradients (BF16): 14 GB" and for 70B "140 GB just for
    # parameters ... Adam optimizer states (2× params in FP32 = 560 GB) and gradients (140 GB)".
    # bf16 gradients are megatron's grad_reduce_in_fp32: false. The moments match; megatron
    # also keeps an fp32 master copy, and with 16-bit gradients makes an fp32 copy of them in
    # the step (freed by the next zero_grad), so at the step its optimizer holds twice what the
    # seed counts.
    per = optimizer_bytes_per_element("bf16", grad_reduce_in_fp32=False)
    for n, weights, moments in ((7e9, 14, 56), (70e9, 140, 560)):
        b = state_bytes_for_parameters(n, "bf16", grad_reduce_in_fp32=False)
        assert b.weights / GB == weights and b.gradients / GB == weights
        assert n * per.moments / GB == moments
        assert b.optimizer == n * (per.moments + per.master_params)
        assert b.main_grads == n * per.main_grads
        assert b.optimizer + b.main_grads == 2 * moments * GB


def test_seed_003_zero_stage_1_shards_the_moments_over_8_gpus():
    # 003's ZeRO table, 7B on 8 GPUs: optimizer 56 GB at stage 0, 7 GB at stage 1 (moments only).
    per = optimizer_bytes_per_element("fp32", grad_reduce_in_fp32=True)
    assert per.master_params == 0 and per.main_grads == 0   # fp32 training: no extra copies
    stage0 = state_bytes_for_parameters(7e9, "fp32")
    stage1 = state_bytes_for_parameters(7e9, "fp32", data_parallel_size=8,
                                        distributed_optimizer=True)
    assert (stage0.optimizer / GB, stage1.optimizer / GB) == (56, 7)
    # the seed's 28 GB of weights is fp32 too; its 14 GB of bf16 gradients has no fp32-weights
    # counterpart in megatron-core, whose gradient buffer is then fp32 (28 GB)
    assert stage0.weights / GB == 28 and stage0.gradients / GB == 28
