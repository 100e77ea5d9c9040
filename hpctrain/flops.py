"""Model size and training FLOPs of a GPT, from its architecture alone (no torch).

The runtime reports model FLOPs utilization (MFU) with these numbers and the planner sizes
layouts with them, so both agree. The count is Megatron-LM's (``num_floating_point_operations``
in ``megatron/training/training.py`` at ``core_v0.16.1``, dense GPT case), so an MFU printed by
hpctrain compares with one printed by Megatron-LM for the same model and step time:

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

import math
from dataclasses import dataclass


def padded_vocab_size(vocab_size: int, divisible_by: int, tensor_parallel: int = 1) -> int:
    """The vocabulary rounded up so every tensor-parallel rank gets an equal slice.

    Rounded to a multiple of lcm(divisible_by, TP) rather than Megatron-LM's divisible_by × TP:
    with the default of 128 and TP ≤ 8 the size is the same for every TP, so a checkpoint's
    embedding has one shape and resumes on any layout.
    """
    multiple = math.lcm(max(1, divisible_by), max(1, tensor_parallel))
    return -(-vocab_size // multiple) * multiple


@dataclass(frozen=True)
class ModelShape:
    """The numbers the counts need; ``from_model`` reads them off a job's ``model`` section."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    ffn_hidden_size: int
    vocab_size: int              # padded
    seq_length: int
    gated_mlp: bool              # swiglu: three MLP matrices instead of two
    add_bias_linear: bool
    untied_output: bool
    learned_positions: bool
    max_position_embeddings: int
    norm_has_bias: bool = True   # LayerNorm: weight and bias; RMSNorm: weight only

    @classmethod
    def from_model(cls, model, tensor_parallel: int = 1) -> "ModelShape":
        """``model``: a job's ``model`` section (or anything with the same attribute names)."""
        heads = model.num_attention_heads
        return cls(
            num_layers=model.num_layers,
            hidden_size=model.hidden_size,
            num_attention_heads=heads,
            num_query_groups=model.num_query_groups or heads,
            kv_channels=model.kv_channels or model.hidden_size // heads,
            ffn_hidden_size=model.ffn_hidden_size or 4 * model.hidden_size,
            vocab_size=padded_vocab_size(model.vocab_size, model.make_vocab_size_divisible_by,
                                         tensor_parallel),
            seq_length=model.seq_length,
            gated_mlp=model.activation == "swiglu",
            add_bias_linear=model.add_bias_linear,
            untied_output=model.untie_embeddings_and_output_weights,
            learned_positions=model.position_embedding_type == "learned_absolute",
            max_position_embeddings=model.max_position_embeddings or model.seq_length,
            norm_has_bias=getattr(model, "normalization", "LayerNorm") == "LayerNorm",
        )

    @property
    def attention_width(self) -> int:
        return self.num_attention_heads * self.kv_channels

    @property
    def kv_width(self) -> int:
        return self.num_query_groups * self.kv_channels


def layer_matmul_params(m: ModelShape) -> int:
    """Weights of one transformer layer that take part in matrix multiplies."""
    h = m.hidden_size
    qkv = h * (m.attention_width + 2 * m.kv_width)
    proj = m.attention_width * h
    mlp = (3 if m.gated_mlp else 2) * h * m.ffn_hidden_size
    return qkv + proj + mlp


def layer_params(m: ModelShape) -> int:
    """All weights of one layer: matrix multiplies, biases and the two norms."""
    h = m.hidden_size
    biases = 0
    if m.add_bias_linear:
        fc1_out = (2 if m.gated_mlp else 1) * m.ffn_hidden_size
        biases = (m.attention_width + 2 * m.kv_width) + h + fc1_out + h
    norms = 2 * _norm_params(m)
    return layer_matmul_params(m) + biases + norms


def _norm_params(m: ModelShape) -> int:
    return m.hidden_size * (2 if m.norm_has_bias else 1)


def param_counts(m: ModelShape) -> dict[str, int]:
    """``{"embedding", "output", "layers", "total"}``: parameter counts of the whole model."""
    embedding = m.vocab_size * m.hidden_size
    if m.learned_positions:
        embedding += m.max_position_embeddings * m.hidden_size
    output = m.vocab_size * m.hidden_size if m.untied_output else 0
    layers = m.num_layers * layer_params(m) + _norm_params(m)  # + the final norm
    return {"embedding": embedding, "output": output, "layers": layers,
            "total": embedding + output + layers}


def attention_core_flops_per_token(m: ModelShape, causal: bool = True) -> float:
    """Forward FLOPs of one layer's QKᵀ and (QKᵀ)V for one token: 2 · 2 · s · d_attn over the
    full square, halved when ``causal`` (Megatron-LM's count: only half the mask is computed)."""
    full = 4.0 * m.seq_length * m.attention_width
    return full / 2 if causal else full


def forward_flops_per_token(m: ModelShape, causal: bool = True) -> float:
    """Forward FLOPs for one token of a full-length sequence (Megatron-LM's count)."""
    per_layer = 2 * layer_matmul_params(m) + attention_core_flops_per_token(m, causal)
    logits = 2 * m.hidden_size * m.vocab_size
    return float(m.num_layers * per_layer + logits)


def model_flops_per_step(m: ModelShape, global_batch_size: int) -> float:
    """Training FLOPs of one optimizer step, 3 × forward over every token of the batch: equal
    to Megatron-LM 0.16.1's ``num_floating_point_operations(args, global_batch_size)``."""
    return 3.0 * forward_flops_per_token(m) * global_batch_size * m.seq_length


def model_flops_per_step_full_attention(m: ModelShape, global_batch_size: int) -> float:
    """The older count, attention scores over the full s × s square (not halved for the causal
    mask): Narayanan et al. 2021's 72·B·s·l·h²·(1 + s/6h + V/12lh) for a plain GPT."""
    return 3.0 * forward_flops_per_token(m, causal=False) * global_batch_size * m.seq_length


def mfu(flops_per_step: float, step_time_s: float, world_size: int,
        peak_tflops_per_device: float | None) -> float | None:
    """Model FLOPs utilization in [0, 1]; None when the peak is unknown or time is zero."""
    if not peak_tflops_per_device or step_time_s <= 0 or world_size <= 0:
        return None
    return flops_per_step / step_time_s / (world_size * peak_tflops_per_device * 1e12)
