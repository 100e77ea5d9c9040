"""The planner's work does not grow with absurd (but valid) sizes: chunks and pipeline ranks
that are alike are priced once. Counted in cache misses, not seconds, so the verdict does not
depend on this machine's speed."""

from __future__ import annotations

import pytest

from hpctrain.config.loader import job_from_mapping
from hpctrain.model_shape import ModelShape, _chunk_parameters
from hpctrain.planner.memory import _rank_buffers, state_bytes_per_pipeline_rank

SHAPE = ModelShape.from_job(job_from_mapping({
    "name": "deep", "model": {"num_layers": 512, "hidden_size": 1024, "num_attention_heads": 16,
                              "vocab_size": 32000, "seq_length": 2048},
    "batch": {"micro_batch_size": 1, "global_batch_size": 1024}, "train": {"steps": 1},
    "data": {"path": "unused"}}, "deep"))


def priced(pp: int, vpp: int | None, dp: int) -> tuple[int, int, tuple]:
    _chunk_parameters.cache_clear()
    _rank_buffers.cache_clear()
    states = state_bytes_per_pipeline_rank(SHAPE, tp=1, pp=pp, vpp=vpp, dp=dp, precision="bf16",
                                           grad_reduce_in_fp32=True, distributed_optimizer=True)
    return _chunk_parameters.cache_info().misses, _rank_buffers.cache_info().misses, states


def test_alike_pipeline_ranks_and_chunks_are_priced_once():
    chunks_2, ranks_2, states_2 = priced(pp=2, vpp=None, dp=8)
    chunks_many, ranks_many, states_many = priced(pp=256, vpp=2, dp=8)
    assert len(states_many) == 256 and len(set(states_many[1:-1])) == 1
    # first, middle and last stages: at most three kinds of chunk and of pipeline rank
    assert chunks_2 <= 3 and chunks_many <= 3
    assert ranks_2 <= 2 and ranks_many <= 3
    # and the sums are still the exact ones: every middle stage holds 2 × one-layer chunks
    assert states_many[1].weights == 2 * 2 * sum(
        p.numel for p in _chunk_parameters(SHAPE, 1, 256, 1, False, False))


def test_overlapped_dp_communication_is_exposed_beyond_the_backward_and_by_its_last_bucket():
    """With overlap_grad_reduce megatron-core reduces each bucket once its gradients are ready,
    during the last microbatch's backward: exposed is what exceeds that backward, and at least
    the last bucket (reduced after the backward ends); with one bucket nothing is hidden. The
    parameter gather with overlap_param_gather likewise behind the first forward."""
    from hpctrain.planner.timing import Hardware, estimate_step_time
    hw = Hardware(peak_tflops=100.0, intra_node_busbw_gbs=100.0, inter_node_busbw_gbs=1.0,
                  gpus_per_node=1)

    def step(grad_bytes, **kw):
        return estimate_step_time(SHAPE, hw, tp=1, pp=1, vpp=None, dp=8, micro_batch_size=1,
                                  num_microbatches=4, sequence_parallel=False, recompute=None,
                                  act_bytes=2, grad_buffer_bytes=grad_bytes,
                                  weight_bytes=grad_bytes // 2, distributed_optimizer=True, **kw)
    overlaps = dict(overlap_grad_reduce=True, overlap_param_gather=True)
    for grad_bytes in (10**6, 10**11):          # hidden but for a bucket / mostly exposed
        plain = step(grad_bytes)
        both = step(grad_bytes, bucket_bytes=grad_bytes // 10, **overlaps)
        mb = plain.microbatch
        reduce = grad_bytes * 7 / 8 / 1e9
        gather = grad_bytes // 2 * 7 / 8 / 1e9
        assert plain.dp_comm_s == pytest.approx(reduce + gather)
        assert both.dp_comm_s == pytest.approx(max(reduce / 10, reduce - mb.backward_s)
                                               + max(gather / 10, gather - mb.forward_s))
        assert both.compute_s == plain.compute_s and both.dp_comm_s <= plain.dp_comm_s
        assert step(grad_bytes, **overlaps).dp_comm_s == pytest.approx(plain.dp_comm_s)


def test_pipeline_stages_on_one_node_send_over_nvlink_and_across_nodes_over_the_network():
    """Micro-batch 1, two pipeline stages, 8-GPU nodes: TP 2 × PP 2 × DP 2 fills one node, so
    each stage sends its activations (s·b·h 16-bit values, forward and backward, per
    microbatch) at the intra-node bandwidth; TP 4 × PP 2 × DP 2 spans two nodes, and the same
    sends cross the network at its bandwidth."""
    from hpctrain.planner.timing import Hardware, estimate_step_time
    hw = Hardware(peak_tflops=100.0, intra_node_busbw_gbs=100.0, inter_node_busbw_gbs=10.0,
                  gpus_per_node=8)

    def pp_comm(tp):
        return estimate_step_time(SHAPE, hw, tp=tp, pp=2, vpp=None, dp=2, micro_batch_size=1,
                                  num_microbatches=4, sequence_parallel=False, recompute=None,
                                  act_bytes=2, grad_buffer_bytes=10**6, weight_bytes=10**6 // 2,
                                  distributed_optimizer=True).pp_comm_s
    sends = 2 * 4 * SHAPE.seq_length * 1 * SHAPE.hidden_size * 2
    assert pp_comm(2) == pytest.approx(sends / 100e9)
    assert pp_comm(4) == pytest.approx(sends / 10e9)


def test_interleaved_stages_with_overlapped_sends_expose_only_filling_and_draining():
    """Four stages of two chunks each with overlap_p2p_comm: the sends of the steady state hide
    behind compute, and only filling and draining the pipeline, 2 (p - 1) sends, are exposed;
    without the overlap every microbatch's sends to and from every chunk are."""
    from hpctrain.planner.timing import Hardware, estimate_step_time
    hw = Hardware(peak_tflops=100.0, intra_node_busbw_gbs=100.0, inter_node_busbw_gbs=10.0,
                  gpus_per_node=8)

    def pp_comm(overlap):
        return estimate_step_time(SHAPE, hw, tp=1, pp=4, vpp=2, dp=2, micro_batch_size=1,
                                  num_microbatches=8, sequence_parallel=False, recompute=None,
                                  act_bytes=2, grad_buffer_bytes=10**6, weight_bytes=10**6 // 2,
                                  distributed_optimizer=True, overlap_p2p=overlap).pp_comm_s
    one_send = SHAPE.seq_length * SHAPE.hidden_size * 2 / 100e9
    assert pp_comm(True) == pytest.approx(2 * (4 - 1) * one_send)
    assert pp_comm(False) == pytest.approx(2 * 8 * 2 * one_send)


def test_without_a_kernel_table_attention_grows_with_the_micro_batch():
    """Priced from the peak FLOP/s, attention of micro-batch 2 takes twice micro-batch 1's
    time, forward and backward (the backward twice the forward), and half on each of 2 TP
    ranks."""
    from hpctrain.planner.timing import Rates
    rates = Rates(None, 100e12, "flash")
    f1, b1, measured = rates.attention_s(SHAPE, 1, 1)
    f2, b2, _ = rates.attention_s(SHAPE, 2, 1)
    half, _, _ = rates.attention_s(SHAPE, 2, 2)
    assert measured is False and f1 > 0
    assert (f2, b2, b1) == (pytest.approx(2 * f1), pytest.approx(4 * f1), pytest.approx(2 * f1))
    assert half == pytest.approx(f1)


def test_a_rank_that_updates_twice_the_elements_moves_twice_the_optimizer_bytes():
    """The optimizer step's memory traffic: the gradient buffer's scaling and zeroing, plus a
    fixed number of bytes per element the rank updates (Adam's reads and writes): twice the
    elements (half the DP ranks under the distributed optimizer) add as much again."""
    from hpctrain.planner.timing import optimizer_traffic
    buffer = 10**9

    def traffic(elements):
        return optimizer_traffic(elements, buffer, 2, 2)
    per_update = traffic(10**6) - traffic(0)
    assert traffic(0) == 3 * buffer and per_update > 28 * 10**6   # Adam alone: 28 B/element
    assert traffic(2 * 10**6) - traffic(0) == 2 * per_update


def test_fp32_training_makes_no_16_bit_copies_in_the_optimizer_step():
    """Per element the rank updates: fp32 training reads the gradient for its norm (4) and runs
    Adam (28); bf16 training first makes the fp32 main gradient from its 16-bit buffer (read 2,
    write 4) and afterwards copies the updated fp32 parameter into the 16-bit one (read 4,
    write 2): 44 bytes."""
    from hpctrain.planner.timing import optimizer_traffic
    assert optimizer_traffic(10**6, 0, 4, 4) == 32 * 10**6
    assert optimizer_traffic(10**6, 0, 2, 2) == 44 * 10**6


def test_the_first_stage_also_moves_its_embedding_and_the_embeddings_gradient():
    """Against a kernel table that measured 2000 GB/s: the first pipeline stage's memory-bound
    time exceeds a middle stage's by the embedding's work, on TP 2: the lookup writes s·b·h
    16-bit values forward, and backward reads them and scatters them into the gradient, and
    the rank's V/t × h embedding gradient is written and read in 16 bits and accumulated into
    its fp32 main_grad (read and write)."""
    from test_plan_step_model import synthetic_table

    from hpctrain.gpu_table import table_from_json
    from hpctrain.planner.timing import Hardware, Rates, microbatch_time
    table = table_from_json(synthetic_table())
    rates, hw = Rates(table, None, "flash"), Hardware(None, None, None, 8, table)

    def memory_s(first):
        return microbatch_time(SHAPE, rates, hw, tp=2, layers=4, micro_batch_size=1,
                               sequence_parallel=False, recompute=None, act_bytes=2,
                               first=first, last=False).memory_s
    lookup = SHAPE.seq_length * SHAPE.hidden_size * 2
    gradient = SHAPE.padded_vocab(2) // 2 * SHAPE.hidden_size * (2 * 2 + 2 * 4)
    assert memory_s(True) - memory_s(False) == pytest.approx((3 * lookup + gradient) / 2000e9)


def test_accumulating_weight_gradients_costs_the_same_whatever_the_micro_batch():
    """A layer's memory-bound work grows with the tokens of its microbatch, but accumulating
    its weight gradients into the fp32 main_grad reads and writes 4 bytes per weight element
    whatever the micro-batch (plus the 16-bit gradient written and read, without the fused
    kernel): twice micro-batch 1's traffic less micro-batch 2's leaves exactly that."""
    from hpctrain.planner.timing import layer_linears, memory_traffic
    weights = sum(n_in * n_out for _, n_in, n_out, _ in layer_linears(SHAPE, 2))
    for fused, per_weight in ((True, 8), (False, 8 + 2 * 2)):
        (_, one), (_, two) = (memory_traffic(SHAPE, b, 2, True, 2, fused) for b in (1, 2))
        assert 2 * one - two == weights * per_weight
