"""A GPT model's dimensions and its parameters, exactly as megatron-core builds them (no torch).

One resolved shape serves the runtime's FLOPs (``hpctrain.flops``), its initial-weight export
and the planner (``hpctrain.planner``), so they all agree on what the model is. A job file leaves
some sizes to defaults (``ffn_hidden_size`` null means 4h, ``kv_channels`` null means h / a,
``num_query_groups`` null means plain multi-head attention); the shape holds them resolved.

Parameters are counted from one list per model chunk, in ``named_parameters()`` order (the
gradient buffer's alignment padding, ``plan/grad_buffer.py``, depends on it). Tensor
parallelism splits the column-parallel weights and biases (QKV, fc1, the vocabulary) and the
row-parallel weights (proj, fc2) by TP, but keeps row-parallel biases and the norms whole on
every TP rank. Pipeline parallelism puts the embedding on the first stage and the final norm
and output layer on the last; a tied output layer gets its own copy of the embedding weight on
the last stage when PP > 1 (megatron keeps the two in sync with an all-reduce). Interleaving
(VPP) gives each pipeline rank ``v`` model chunks: chunk ``j·p + r`` lives on rank ``r``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from functools import lru_cache

# Bytes per element of the model's parameters and activations for each training precision.
PRECISION_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


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
    def from_job(cls, job) -> "ModelShape":
        return cls.from_model(job.model)

    @classmethod
    def from_model(cls, m) -> "ModelShape":
        """``m``: a job's ``model`` section, or anything with its attribute names (missing
        normalization, attention and dropout settings take the job file's defaults)."""
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
            norm_has_bias=getattr(m, "normalization", "LayerNorm") == "LayerNorm",
            add_bias_linear=m.add_bias_linear,
            tied_output=not m.untie_embeddings_and_output_weights,
            # auto, flash and fused are fused kernels that keep no scores: Transformer
            # Engine's, or torch's scaled_dot_product_attention in the local layer spec;
            # unfused and local keep them (TE's unfused, megatron-core's DotProductAttention)
            attention_stores_scores=getattr(m, "attention_backend", "auto") in ("unfused", "local"),
            hidden_dropout=getattr(m, "hidden_dropout", 0.0),
            attention_dropout=getattr(m, "attention_dropout", 0.0),
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
        """The vocabulary as the runtime builds it on ``tp`` tensor-parallel ranks."""
        return padded_vocab_size(self.vocab_size, self.make_vocab_size_divisible_by, tp)


@dataclass(frozen=True)
class ParamSpec:
    name: str
    numel: int
    shared_embedding: bool = False  # megatron's flag: a tied embedding copy on PP's end stages
    matmul: bool = False            # a weight that takes part in a matrix multiply (FLOPs)


@dataclass(frozen=True)
class ChunkSpec:
    """One model chunk (one GPTModel instance) on one pipeline rank."""

    pipeline_rank: int
    virtual_index: int
    first_layer: int
    num_layers: int
    pre_process: bool
    post_process: bool


def pipeline_chunks(num_layers: int, pp: int, vpp: int | None) -> list[list[ChunkSpec]]:
    """The chunks each pipeline rank holds, in megatron's interleaved assignment."""
    v = vpp or 1
    total = pp * v
    per_chunk = num_layers // total
    ranks: list[list[ChunkSpec]] = [[] for _ in range(pp)]
    for j in range(v):
        for r in range(pp):
            c = j * pp + r
            ranks[r].append(ChunkSpec(r, j, c * per_chunk, per_chunk, c == 0, c == total - 1))
    return ranks


def layer_parameters(shape: ModelShape, tp: int, prefix: str) -> list[ParamSpec]:
    """One transformer layer (local spec order: norm, proj, qkv, norm, fc1, fc2)."""
    h, bias = shape.hidden_size, shape.add_bias_linear
    qkv_out = (shape.query_width + 2 * shape.kv_width) // tp
    fc1_out = shape.ffn_hidden_size * (2 if shape.gated_mlp else 1) // tp
    out: list[ParamSpec] = []

    def norm(name: str) -> None:
        out.append(ParamSpec(f"{prefix}{name}.weight", h))
        if shape.norm_has_bias:
            out.append(ParamSpec(f"{prefix}{name}.bias", h))

    def linear(name: str, rows: int, cols: int, bias_numel: int) -> None:
        out.append(ParamSpec(f"{prefix}{name}.weight", rows * cols, matmul=True))
        if bias:
            out.append(ParamSpec(f"{prefix}{name}.bias", bias_numel))

    norm("input_layernorm")
    linear("self_attention.linear_proj", h, shape.query_width // tp, h)   # row-parallel: bias whole
    linear("self_attention.linear_qkv", qkv_out, h, qkv_out)              # column-parallel
    norm("pre_mlp_layernorm")
    linear("mlp.linear_fc1", fc1_out, h, fc1_out)
    linear("mlp.linear_fc2", h, shape.ffn_hidden_size // tp, h)
    return out


def chunk_parameters(shape: ModelShape, tp: int, pp: int, chunk: ChunkSpec) -> list[ParamSpec]:
    """Every parameter of one model chunk on one TP rank, in ``named_parameters()`` order."""
    return list(_chunk_parameters(shape, tp, pp, chunk.num_layers, chunk.pre_process,
                                  chunk.post_process))


@functools.lru_cache(maxsize=1024)
def _chunk_parameters(shape: ModelShape, tp: int, pp: int, num_layers: int, pre_process: bool,
                      post_process: bool) -> tuple[ParamSpec, ...]:
    """Cached: the planner prices thousands of layouts whose chunks repeat (a chunk's
    parameters depend only on these arguments), so its cost does not grow with every layer
    of every candidate."""
    chunk = ChunkSpec(0, 0, 0, num_layers, pre_process, post_process)
    h = shape.hidden_size
    vocab_rows = shape.padded_vocab(tp) // tp
    tied_across_stages = shape.tied_output and pp > 1
    out: list[ParamSpec] = []
    if chunk.pre_process:
        out.append(ParamSpec("embedding.word_embeddings.weight", vocab_rows * h,
                             shared_embedding=tied_across_stages and not chunk.post_process))
        if shape.learned_positions:
            out.append(ParamSpec("embedding.position_embeddings.weight",
                                 shape.max_position_embeddings * h))
    for i in range(chunk.num_layers):
        out += layer_parameters(shape, tp, f"decoder.layers.{i}.")
    if chunk.post_process:
        out.append(ParamSpec("decoder.final_layernorm.weight", h))
        if shape.norm_has_bias:
            out.append(ParamSpec("decoder.final_layernorm.bias", h))
        if not (shape.tied_output and chunk.pre_process):
            out.append(ParamSpec("output_layer.weight", vocab_rows * h,
                                 shared_embedding=tied_across_stages))
    return tuple(out)


@dataclass(frozen=True)
class ParameterCount:
    total: int                   # unique parameters of the whole model (a tied weight once)
    per_pipeline_rank: tuple[int, ...]  # on one TP rank of each pipeline rank, copies included
    padded_vocab_size: int

    @property
    def most_loaded_rank(self) -> int:
        return max(self.per_pipeline_rank)


def total_parameters(shape: ModelShape, tp: int = 1) -> int:
    """Unique parameters of the whole model, with the vocabulary padded for this TP."""
    h, v = shape.hidden_size, shape.padded_vocab(tp)
    layer = sum(p.numel for p in layer_parameters(shape, 1, ""))
    embed = v * h + (shape.max_position_embeddings * h if shape.learned_positions else 0)
    final_norm = h * (2 if shape.norm_has_bias else 1)
    output = 0 if shape.tied_output else v * h
    return embed + shape.num_layers * layer + final_norm + output


@lru_cache(maxsize=256)
def count_parameters(shape: ModelShape, tp: int = 1, pp: int = 1,
                     vpp: int | None = None) -> ParameterCount:
    """Total and per-rank parameter counts for a TP × PP (× VPP) layout."""
    per_rank = tuple(sum(p.numel for c in chunks for p in chunk_parameters(shape, tp, pp, c))
                     for chunks in pipeline_chunks(shape.num_layers, pp, vpp))
    return ParameterCount(total_parameters(shape, tp), per_rank, shape.padded_vocab(tp))


def layer_matmul_parameters(shape: ModelShape) -> int:
    """Weights of one transformer layer that take part in matrix multiplies (FLOPs)."""
    return sum(p.numel for p in layer_parameters(shape, 1, "") if p.matmul)
