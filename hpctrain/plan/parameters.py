"""Parameter counts exactly as megatron-core's ``GPTModel`` allocates them, per rank.

Tensor parallelism splits the column-parallel weights and biases (QKV, fc1, the vocabulary) and
the row-parallel weights (proj, fc2) by TP, but keeps row-parallel biases and the norms whole
on every TP rank. Pipeline parallelism puts the embedding on the first stage and the final norm
and output layer on the last; a tied output layer gets its own copy of the embedding weight on
the last stage when PP > 1 (megatron keeps the two in sync with an all-reduce). Interleaving
(VPP) gives each pipeline rank ``v`` model chunks: chunk ``j·p + r`` lives on rank ``r``.

The parameter lists come out in ``named_parameters()`` order, because the gradient buffer's
alignment padding (``grad_buffer.py``) depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .shape import ModelShape


@dataclass(frozen=True)
class ParamSpec:
    name: str
    numel: int
    shared_embedding: bool = False  # megatron's flag: a tied embedding copy on PP's end stages


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
        out.append(ParamSpec(f"{prefix}{name}.weight", rows * cols))
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
    return out


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
