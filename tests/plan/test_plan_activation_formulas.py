"""The activation terms reduce to Korthikanti et al. 2022's closed forms on the paper's model.

The paper's GPT (Table 3's 175B/530B shapes): d = h/a, MHA, f = 4h, learned positions, dropout
on, attention that keeps its scores; 2-byte activations, 1-byte masks. Its per-layer bytes:
sbh(34 + 5as/h) with no parallelism, sbh(10 + 24/t + 5as/(ht)) with TP, sbh(34/t + 5as/(ht))
with TP+SP, sbh·34/t with selective recompute, 2sbh for full recompute. Our terms add the small
fp32 norm statistics the paper leaves out; everything else must match to the byte.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from plan_jobs import make_job

from hpctrain.model_shape import ModelShape
from hpctrain.planner.activations import (activation_bytes_per_layer, activation_terms,
                                          in_flight_microbatches, stage_activations)

GPT3_175B = dict(num_layers=96, hidden_size=12288, num_attention_heads=96, vocab_size=51200,
                 seq_length=2048, hidden_dropout=0.1, attention_dropout=0.1,
                 attention_backend="unfused")


def paper_shape(**overrides) -> ModelShape:
    return ModelShape.from_job(make_job({**GPT3_175B, **overrides}))


def without_statistics(shape, b, t, sp, selective) -> int:
    return sum(v for name, v in activation_terms(shape, b, t, sp, selective, 2)
               if "statistics" not in name)


@pytest.mark.parametrize("t", [1, 2, 8])
@pytest.mark.parametrize("b", [1, 4])
def test_the_four_forms_of_the_paper(t, b):
    m = paper_shape()
    s, h, a = m.seq_length, m.hidden_size, m.num_attention_heads
    sbh = s * b * h
    scores = Fraction(5 * a * s, h * t)
    assert without_statistics(m, b, t, False, False) == sbh * (10 + Fraction(24, t) + scores)
    if t > 1:
        assert without_statistics(m, b, t, True, False) == sbh * (Fraction(34, t) + scores)
        assert without_statistics(m, b, t, True, True) == sbh * Fraction(34, t)
    assert activation_bytes_per_layer(m, b, t, False, "full") == 2 * sbh


def test_flash_attention_drops_the_score_term():
    m = paper_shape(attention_backend="flash")
    s, b, h, a = m.seq_length, 1, m.hidden_size, m.num_attention_heads
    terms = dict(activation_terms(m, b, 1, False, False, 2))
    assert terms["attention log-sum-exp (fp32)"] == 4 * a * s * b
    assert without_statistics(m, b, 1, False, False) - 4 * a * s * b == 34 * s * b * h


def test_gqa_and_swiglu_generalize_the_attention_and_mlp_terms():
    # Llama-3-8B-like: 8 KV groups of d = 128, f = 14336, fused SwiGLU (the GPU kernels)
    m = ModelShape.from_job(make_job(dict(GPT3_175B, num_layers=32, hidden_size=4096,
                                          num_attention_heads=32, num_query_groups=8,
                                          ffn_hidden_size=14336, activation="swiglu",
                                          hidden_dropout=0.0, attention_dropout=0.0,
                                          attention_backend="flash")))
    s, h = m.seq_length, m.hidden_size
    terms = dict(activation_terms(m, 1, 1, False, False, 2))
    assert terms["linear_qkv output (Q, K, V views)"] == 2 * s * (4096 + 2 * 1024)
    assert terms["linear_fc1 output (SwiGLU input)"] == 2 * s * 2 * 14336
    assert terms["linear_fc2 input"] == 2 * s * 14336
    assert "MLP dropout mask" not in terms and terms["linear_fc1 input"] == 2 * s * h


@pytest.mark.parametrize("p, v", [(4, None), (8, None), (4, 2), (4, 4), (8, 3)])
def test_first_stage_holds_the_papers_number_of_layers(p, v):
    # 1F1B: the first stage keeps p microbatches of L/p layers = L layers' worth; the
    # interleaved schedule keeps L·(1 + (p − 1)/(p·v)) (Korthikanti et al., section 4.2.3).
    m = paper_shape(num_layers=96 if v != 3 else 48)
    L = m.num_layers
    act = stage_activations(m, tp=8, pp=p, vpp=v, pp_rank=0, micro_batch_size=1,
                            num_microbatches=64, sequence_parallel=True, recompute="selective")
    expected = L if v is None else L * (1 + Fraction(p - 1, p * v))
    assert act.in_flight * act.layers_per_chunk == expected
    assert act.stored == act.in_flight * act.chunk_microbatch + act.embedding


def test_later_stages_and_few_microbatches_hold_less():
    assert [in_flight_microbatches(4, None, r, 8) for r in range(4)] == [4, 3, 2, 1]
    assert in_flight_microbatches(4, None, 0, 2) == 2          # only 2 microbatches exist
    assert in_flight_microbatches(4, 2, 0, 1) == 2             # everything is warmup
    assert in_flight_microbatches(1, None, 0, 64) == 1         # no pipeline: one at a time


def test_every_per_microbatch_buffer_doubles_from_micro_batch_1_to_2():
    """The 7B example trains micro-batch 1; what a rank keeps per microbatch is linear in it:
    the first stage's dropout mask and, with TP, the vocabulary-parallel lookup's token ids
    and mask; the last stage's norm, output-layer input, fp32 softmax and per-token targets;
    and megatron-core's local attention buffer of b·a/t × s × s scores, 16-bit. (Not the
    loss's backward: the weight gradient it adds is one per step.)"""
    from hpctrain.planner.activations import (GPU_LOCAL_SPEC_KERNELS, attention_buffer_bytes,
                                              embedding_bytes, output_layer_bytes)
    m = paper_shape()
    k = GPU_LOCAL_SPEC_KERNELS
    for tp, sp in ((1, False), (2, False), (4, True)):
        one, two = ((embedding_bytes(m, b, tp, sp, 2, k), output_layer_bytes(m, b, tp, sp, 2, k),
                     attention_buffer_bytes(m, b, tp, 2, k)) for b in (1, 2))
        assert min(one) > 0 and two == tuple(2 * x for x in one)
        s, a = m.seq_length, m.num_attention_heads
        assert attention_buffer_bytes(m, 2, tp, 2, k) == 2 * a // tp * s * s * 2


def llama_like(**overrides) -> ModelShape:
    """Llama-3-8B-like: RoPE, 8 KV groups of d = 128, SwiGLU, no dropout, flash attention."""
    return ModelShape.from_job(make_job({
        **GPT3_175B, "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "num_query_groups": 8, "ffn_hidden_size": 14336, "activation": "swiglu",
        "position_embedding_type": "rope", "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "attention_backend": "flash", **overrides}))


def test_two_tensor_parallel_ranks_each_keep_half_of_the_rotated_keys_and_queries():
    """Llama on 2 TP ranks: each rank rotates its own heads, so it keeps half the keys and
    queries after RoPE that one rank keeps (the cos/sin table is whole on each)."""
    m = llama_like()
    one, two = (dict(activation_terms(m, 1, tp, False, False, 2)) for tp in (1, 2))
    assert one["key after RoPE"] == 2 * m.seq_length * 1024 == 2 * two["key after RoPE"]
    assert one["query after RoPE"] == 2 * two["query after RoPE"]
    assert one["RoPE cos/sin for Q and K"] == two["RoPE cos/sin for Q and K"]


def test_an_unfused_swiglu_also_keeps_its_silu_output_and_linear_half():
    """Where the SwiGLU kernel is not fused (the CPU, a container without it), the layer keeps
    silu(x1) and the shifted x2 besides fc1's output: 2 · s·b·f/t more per layer."""
    from hpctrain.planner.activations import GPU_KERNELS, Kernels
    m = llama_like()
    fused = activation_bytes_per_layer(m, 1, 2, False, None, 2, GPU_KERNELS)
    unfused = activation_bytes_per_layer(m, 1, 2, False, None, 2, Kernels(fused_swiglu=False))
    assert unfused - fused == 2 * m.seq_length * 14336 // 2 * 2


@pytest.mark.parametrize("method", ["uniform", "block"])
def test_full_recompute_keeps_what_its_method_checkpoints(method):
    """Full recomputation of 8 layers per stage, recompute_num_layers 2 (megatron-core's
    meaning): `uniform` checkpoints the input of each group of 2 layers (4 inputs) and rebuilds
    one group at a time (2 layers); `block` checkpoints the first 2 layers' inputs, keeps the
    other 6 layers whole and rebuilds one layer. Both keep the RoPE frequency table (fp32)."""
    m = llama_like()
    act = stage_activations(m, tp=1, pp=4, vpp=None, pp_rank=0, micro_batch_size=1,
                            num_microbatches=8, sequence_parallel=False, recompute="full",
                            recompute_method=method, recompute_num_layers=2)
    layer_input = 2 * m.seq_length * m.hidden_size
    whole = activation_bytes_per_layer(m, 1)
    rope_table = m.seq_length * m.kv_channels * 4
    assert act.per_layer == layer_input and act.layers_per_chunk == 8
    if method == "uniform":
        assert act.chunk_microbatch == 4 * layer_input + rope_table
    else:
        assert act.chunk_microbatch == 2 * layer_input + 6 * whole + rope_table


def test_layernorm_keeps_a_mean_and_1_over_std_per_token_of_its_rank():
    """GPT-3's LayerNorms keep each token's mean and 1/std in fp32 on CUDA (the paper's terms
    leave them out); under sequence parallelism a rank normalizes s·b/t tokens, so it keeps
    1/t of them."""
    m = paper_shape()
    s = m.seq_length
    for tp, sp, tokens in ((1, False, s), (4, False, s), (4, True, s // 4)):
        terms = dict(activation_terms(m, 1, tp, sp, False, 2))
        assert terms["input_layernorm statistics (mean, 1/std, 32-bit)"] == 2 * tokens * 4
        assert terms["pre_mlp_layernorm statistics (mean, 1/std, 32-bit)"] == 2 * tokens * 4


def test_gqa_under_the_local_attention_repeats_keys_and_values_to_every_head():
    """megatron-core's own (unfused) attention repeats GQA's 8 key and value groups to all 32
    heads before the scores: each layer keeps both at the query's width, and no rotated key
    of its own; with as many groups as heads nothing is repeated."""
    m = llama_like(attention_backend="local")
    sb, ad = m.seq_length, m.query_width
    terms = dict(activation_terms(m, 1, 1, False, False, 2))
    assert terms["key repeated to all heads"] == terms["value repeated to all heads"] == sb * ad * 2
    assert "key after RoPE" not in terms
    mha = dict(activation_terms(llama_like(attention_backend="local", num_query_groups=32),
                                1, 1, False, False, 2))
    assert "key repeated to all heads" not in mha and "key after RoPE" in mha


def test_in_fp32_the_losss_backward_adds_the_output_layers_gradients():
    """In fp32 the logits' gradient stays in the softmax's storage, and the output layer's
    backward adds its input gradient (s·b·h) beside the loss's per-token operands; without
    gradient-accumulation fusion (the local spec) also its weight gradient, V/t × h."""
    from hpctrain.planner.activations import (GPU_KERNELS, LOSS_BACKWARD_BYTES_PER_TOKEN,
                                              Kernels, logits_backward_bytes)
    m = paper_shape()
    sb, h, tp = m.seq_length, m.hidden_size, 2
    fused = logits_backward_bytes(m, 1, tp, 4, GPU_KERNELS)
    assert fused == sb * h * 4 + sb * LOSS_BACKWARD_BYTES_PER_TOKEN
    unfused = logits_backward_bytes(m, 1, tp, 4, Kernels(fused_wgrad_accumulation=False))
    assert unfused - fused == m.padded_vocab(tp) // tp * h * 4
