"""Model FLOPs equal Megatron-LM 0.16.1's ``num_floating_point_operations`` for dense GPTs.

``megatron_num_floating_point_operations`` below is a transcription of that function
(``megatron/training/training.py`` at tag ``core_v0.16.1``) along the path a dense GPT takes:
no hybrid/Mamba layers, no MoE, no multi-token prediction, no multi-latent or linear
attention. It reads the same ``args`` attributes Megatron-LM's argument parser produces; the
test builds that namespace from a job the way Megatron-LM's arguments would describe it.
The runtime's MFU (``runtime/metrics.py``: the count of one ``ModelShape``) and the planner's
step time (``plan/timing.py``, built from the count's parts per layer and for the logits) must
both give the transcription's number.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from plan_jobs import GPT2_SMALL, LLAMA2_7B, LLAMA3_8B, make_job

from hpctrain.flops import model_flops_per_step, model_flops_per_step_full_attention
from hpctrain.model_shape import ModelShape, padded_vocab_size
from hpctrain.planner.timing import MATMUL_EFFICIENCY, Hardware, estimate_step_time


def megatron_num_floating_point_operations(args, batch_size):
    """Transcribed from Megatron-LM core_v0.16.1 (training.py), dense transformer path."""
    def transformer_flops():
        # Group Query Attention.
        if not args.group_query_attention:
            args.num_query_groups = args.num_attention_heads
        # MoE.
        if args.num_experts is None:
            # Every Transformer MLP is dense.
            num_dense_layers = args.num_layers
            num_moe_layers = 0
            num_experts_routed_to = 0
        else:
            raise NotImplementedError("MoE is not part of the transcription")
        if args.mtp_num_layers is not None:
            raise NotImplementedError("MTP is not part of the transcription")
        mtp_num_layers = 0
        num_layers = args.num_layers

        moe_ffn_hidden_size = (args.moe_ffn_hidden_size if args.moe_ffn_hidden_size is not None
                               else args.ffn_hidden_size)
        shared_expert_ffn_hidden_size = (0 if args.moe_shared_expert_intermediate_size is None
                                         else args.moe_shared_expert_intermediate_size)
        forward_backward_expansion_factor = 3
        fma_expansion_factor = 2
        ffn_expansion_factor = 3 if args.swiglu else 2

        assert not args.multi_latent_attention
        query_projection_size = args.kv_channels * args.num_attention_heads
        key_projection_size = args.kv_channels * args.num_query_groups
        value_projection_size = args.kv_channels * args.num_query_groups
        gate_projection_size = query_projection_size if args.attention_output_gate else 0
        standard_self_attn_term = (
            forward_backward_expansion_factor
            * fma_expansion_factor
            * (
                args.hidden_size
                * (query_projection_size + key_projection_size + value_projection_size
                   + gate_projection_size)
                + query_projection_size
                * args.seq_length
                / 2  # causal mask (only half of the mask is non-zero)
                * 2  # QK^T and (QK^T)V
                + query_projection_size
                * args.hidden_size
            )
        )
        assert args.experimental_attention_variant is None
        num_linear_attention_layers = 0
        linear_self_attn_term = 0
        num_standard_attention_layers = num_layers
        self_attn_term = (linear_self_attn_term * num_linear_attention_layers
                          + standard_self_attn_term * num_standard_attention_layers)
        return (
            batch_size
            * args.seq_length
            * (
                forward_backward_expansion_factor
                * fma_expansion_factor
                * args.hidden_size
                * (
                    (args.ffn_hidden_size * ffn_expansion_factor) * num_dense_layers
                    + (moe_ffn_hidden_size * num_experts_routed_to * ffn_expansion_factor)
                    * num_moe_layers
                    + (shared_expert_ffn_hidden_size * ffn_expansion_factor) * num_moe_layers
                )
                + self_attn_term
                + forward_backward_expansion_factor
                * fma_expansion_factor
                * mtp_num_layers
                * (3 * args.hidden_size + 2 * args.hidden_size * args.hidden_size)
                + forward_backward_expansion_factor
                * fma_expansion_factor
                * args.hidden_size
                * args.padded_vocab_size
                * (mtp_num_layers + 1)
            )
        )

    assert not args.is_hybrid_model
    return transformer_flops()


def megatron_args(job, tp: int = 1) -> SimpleNamespace:
    """The ``args`` Megatron-LM would hold for this job's model (its own defaults where the
    job says nothing: ffn 4h, kv_channels h/a, MHA unless --group-query-attention)."""
    m = job.model
    groups = m.num_query_groups
    return SimpleNamespace(
        num_layers=m.num_layers, hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        group_query_attention=groups is not None and groups != m.num_attention_heads,
        num_query_groups=groups,
        kv_channels=m.kv_channels or m.hidden_size // m.num_attention_heads,
        ffn_hidden_size=m.ffn_hidden_size or 4 * m.hidden_size,
        swiglu=m.activation == "swiglu", seq_length=m.seq_length,
        padded_vocab_size=padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, tp),
        num_experts=None, mtp_num_layers=None, moe_ffn_hidden_size=None,
        moe_shared_expert_intermediate_size=None, multi_latent_attention=False,
        attention_output_gate=False, experimental_attention_variant=None,
        is_hybrid_model=False)


CASES = {
    "llama2-7b MHA swiglu untied s4096": (LLAMA2_7B, 1, 1024),
    "llama3-8b GQA8 swiglu untied s8192 tp4": (LLAMA3_8B, 4, 512),
    "gpt2 MHA gelu tied bias s1024": (GPT2_SMALL, 1, 512),
    "gpt2 MHA gelu untied s2048": (dict(GPT2_SMALL, seq_length=2048,
                                        untie_embeddings_and_output_weights=True), 2, 256),
    "MQA, kv_channels != h/a, odd ffn, s512": (dict(LLAMA2_7B, num_layers=6, hidden_size=1536,
                                                    num_attention_heads=12, num_query_groups=1,
                                                    kv_channels=160, ffn_hidden_size=4100,
                                                    vocab_size=50001, seq_length=512), 8, 96),
    "GQA gelu tied s16384": (dict(GPT2_SMALL, num_query_groups=4, seq_length=16384,
                                  position_embedding_type="rope"), 1, 8),
}


@pytest.mark.parametrize("name", list(CASES))
def test_model_flops_equal_megatron_lm(name):
    model, tp, gbs = CASES[name]
    job = make_job(model, gbs=gbs)
    expected = megatron_num_floating_point_operations(megatron_args(job, tp), gbs)
    # the runtime's count (metrics.py builds its shape exactly so)
    shape = ModelShape.from_model(job.model)
    runtime = model_flops_per_step(shape, gbs, tp)
    assert runtime == pytest.approx(expected, rel=1e-12)
    # the planner's step time of the same model on TP ranks, one microbatch at a time and no
    # recomputation: its compute time at the peak is the same count
    step = estimate_step_time(ModelShape.from_job(job), Hardware(1000.0, None, None, None), tp=tp,
                              pp=1, vpp=None, dp=1, micro_batch_size=1, num_microbatches=gbs,
                              sequence_parallel=False, recompute=None, act_bytes=2,
                              grad_buffer_bytes=0, weight_bytes=0, distributed_optimizer=False)
    planned = step.compute_s * 1000.0e12 * MATMUL_EFFICIENCY * tp
    assert planned == pytest.approx(expected, rel=1e-12)


def test_full_attention_count_differs_only_by_the_causal_half():
    job = make_job(LLAMA2_7B, gbs=1)
    shape = ModelShape.from_model(job.model)
    causal, full = model_flops_per_step(shape, 1), model_flops_per_step_full_attention(shape, 1)
    m = job.model
    tokens = m.seq_length
    # 3 passes × 2 FLOPs × (s/2 · d_attn for the scores + the same for the values) per layer
    halved = 3 * 2 * m.num_layers * m.seq_length * m.hidden_size * tokens
    assert full - causal == pytest.approx(halved, rel=1e-12)
    # the older count reports an MFU about 7.5% higher for Llama-2 7B at s = 4096
    assert 1.07 < full / causal < 1.08


def test_a_one_gpu_gpt2_counts_its_vocabulary_padded_for_one_rank():
    # GPT-2 small with its vocabulary unpadded (make_vocab_size_divisible_by: 1): 50257 on one
    # GPU, one more on two; a caller that names no TP gets the one-GPU count
    job = make_job(GPT2_SMALL, gbs=8)
    shape = ModelShape.from_model(job.model)
    assert shape.padded_vocab(1) == 50257 < shape.padded_vocab(2)
    expected = megatron_num_floating_point_operations(megatron_args(job, 1), 8)
    assert model_flops_per_step(shape, 8) == pytest.approx(expected, rel=1e-12)
    # the older full-square count is Narayanan et al. (2021)'s formula for a plain GPT:
    # 72·B·s·l·h²·(1 + s/6h + V/12lh)
    b, s, layers, h, v = 8, 1024, 12, 768, 50257
    narayanan = 72 * b * s * layers * h**2 * (1 + s / (6 * h) + v / (12 * layers * h))
    assert model_flops_per_step_full_attention(shape, 8) == pytest.approx(narayanan, rel=1e-12)
    assert model_flops_per_step_full_attention(shape, 8, tp=2) > narayanan
