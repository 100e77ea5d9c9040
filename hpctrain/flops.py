"""Training FLOPs of a GPT, from its architecture alone (no torch).

The runtime reports model FLOPs utilization (MFU) with these numbers and the planner sizes
layouts with them, both from one ``hpctrain.model_shape.ModelShape``, so they agree. The count
is Megatron-LM's (``num_floating_point_operations`` in ``megatron/training/training.py`` at
``core_v0.16.1``, dense GPT case), so an MFU printed by hpctrain compares with one printed by
Megatron-LM for the same model and step time:

* forward FLOPs per token = 2 × (weights in matrix multiplies) + 2 · s · d_attn per layer: the
  QKᵀ scores and the weighted sum over values are 2 · s · d_attn each over the full s × s
  square, and Megatron-LM halves both for the causal mask (only half of it is computed);
* a training step costs 3 × forward (backward = 2 × forward) per token;
* activation recomputation is NOT counted: MFU measures useful model FLOPs, not the extra work
  the hardware did; biases, norms, softmax and embedding lookups are not counted either.

The output projection to the (padded) vocabulary counts, tied to the embedding or not. The
older full-square count (4 · s · d_attn per layer, about 7.5% more FLOPs for Llama-2 7B at
s = 4096) stays available as ``model_flops_per_step_full_attention``.
"""

from __future__ import annotations

from .model_shape import ModelShape, layer_matmul_parameters


def attention_core_flops_per_token(m: ModelShape, causal: bool = True) -> float:
    """Forward FLOPs of one layer's QKᵀ and (QKᵀ)V for one token: 2 · 2 · s · d_attn over the
    full square, halved when ``causal`` (Megatron-LM's count: only half the mask is computed)."""
    full = 4.0 * m.seq_length * m.query_width
    return full / 2 if causal else full


def layer_matmul_flops_per_token(m: ModelShape) -> float:
    """Forward FLOPs of one layer's matrix multiplies for one token: 2 × their weights."""
    return 2.0 * layer_matmul_parameters(m)


def forward_flops_per_token(m: ModelShape, tp: int = 1, causal: bool = True) -> float:
    """Forward FLOPs for one token of a full-length sequence (Megatron-LM's count), the
    vocabulary padded for ``tp`` tensor-parallel ranks as the runtime builds it."""
    per_layer = layer_matmul_flops_per_token(m) + attention_core_flops_per_token(m, causal)
    logits = 2 * m.hidden_size * m.padded_vocab(tp)
    return float(m.num_layers * per_layer + logits)


def model_flops_per_step(m: ModelShape, global_batch_size: int, tp: int = 1) -> float:
    """Training FLOPs of one optimizer step, 3 × forward over every token of the batch: equal
    to Megatron-LM 0.16.1's ``num_floating_point_operations(args, global_batch_size)``."""
    return 3.0 * forward_flops_per_token(m, tp) * global_batch_size * m.seq_length


def model_flops_per_step_full_attention(m: ModelShape, global_batch_size: int,
                                        tp: int = 1) -> float:
    """The older count, attention scores over the full s × s square (not halved for the causal
    mask): Narayanan et al. 2021's 72·B·s·l·h²·(1 + s/6h + V/12lh) for a plain GPT."""
    return 3.0 * forward_flops_per_token(m, tp, causal=False) * global_batch_size * m.seq_length


def mfu(flops_per_step: float, step_time_s: float, world_size: int,
        peak_tflops_per_device: float | None) -> float | None:
    """Model FLOPs utilization in [0, 1]; None when the peak is unknown or time is zero."""
    if not peak_tflops_per_device or step_time_s <= 0 or world_size <= 0:
        return None
    return flops_per_step / step_time_s / (world_size * peak_tflops_per_device * 1e12)
