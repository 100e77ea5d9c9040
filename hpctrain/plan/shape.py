"""The model's dimensions, resolved the way megatron-core resolves them.

A job file leaves some sizes to defaults (``ffn_hidden_size`` null means 4h, ``kv_channels``
null means h / a, ``num_query_groups`` null means plain multi-head attention). Every planner
module works from this one resolved shape so that the parameter count, the activation terms
and the FLOPs all agree on what the model is.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.job import JobConfig, ModelSection
from ..flops import padded_vocab_size

# Bytes per element of the model's parameters and activations for each training precision.
PRECISION_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class ModelShape:
    """One GPT model as megatron-core builds it (local or Transformer Engine layer spec)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    ffn_hidden_size: int
    vocab_size: int
    make_vocab_size_divisible_by: int
    seq_length: int
    max_position_embeddings: int
    learned_positions: bool
    gated_mlp: bool          # SwiGLU: linear_fc1 is twice as wide
    norm_has_bias: bool      # LayerNorm has a bias, RMSNorm does not
    add_bias_linear: bool
    tied_output: bool        # output layer shares the input embedding's weight
    attention_stores_scores: bool  # unfused/local attention keeps the a×s×s softmax output
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0

    @classmethod
    def from_job(cls, job: JobConfig) -> "ModelShape":
        return cls.from_model(job.model)

    @classmethod
    def from_model(cls, m: ModelSection) -> "ModelShape":
        heads = m.num_attention_heads
        return cls(
            num_layers=m.num_layers,
            hidden_size=m.hidden_size,
            num_attention_heads=heads,
            num_query_groups=m.num_query_groups or heads,
            kv_channels=m.kv_channels or m.hidden_size // heads,
            ffn_hidden_size=m.ffn_hidden_size or 4 * m.hidden_size,
            vocab_size=m.vocab_size,
            make_vocab_size_divisible_by=m.make_vocab_size_divisible_by,
            seq_length=m.seq_length,
            max_position_embeddings=m.max_position_embeddings or m.seq_length,
            learned_positions=m.position_embedding_type == "learned_absolute",
            gated_mlp=m.activation == "swiglu",
            norm_has_bias=m.normalization == "LayerNorm",
            add_bias_linear=m.add_bias_linear,
            tied_output=not m.untie_embeddings_and_output_weights,
            # auto resolves to flash or cuDNN fused attention where Transformer Engine is
            # installed (every GPU container we target); neither keeps the scores. The local
            # layer spec (model.transformer_impl: local) always runs unfused attention.
            attention_stores_scores=m.attention_backend in ("unfused", "local")
            or getattr(m, "transformer_impl", "transformer_engine") == "local",
            hidden_dropout=m.hidden_dropout,
            attention_dropout=m.attention_dropout,
        )

    @property
    def query_width(self) -> int:
        """a·d: the width of Q and of the attention output."""
        return self.num_attention_heads * self.kv_channels

    @property
    def kv_width(self) -> int:
        """g·d: the width of K and of V (smaller than a·d under GQA)."""
        return self.num_query_groups * self.kv_channels

    def padded_vocab(self, tp: int) -> int:
        """The vocabulary as the runtime builds it (``hpctrain.flops.padded_vocab_size``)."""
        return padded_vocab_size(self.vocab_size, self.make_vocab_size_divisible_by, tp)
