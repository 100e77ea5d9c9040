"""Activation memory: what each layer keeps for the backward pass, and how many are in flight.

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
count the bytes one transformer layer stores for one microbatch (16-bit activations, 1-byte
dropout masks):

    no parallelism              s·b·h·(34 + 5·a·s/h)
    tensor parallel (t)         s·b·h·(10 + 24/t + 5·a·s/(h·t))
    + sequence parallel         s·b·h·(34/t + 5·a·s/(h·t))
    + selective recompute       s·b·h·34/t              (the a·s² attention scores recomputed)
    full recompute              2·s·b·h (/t with SP)    (only each layer's input)

``activation_terms`` keeps the same terms one tensor at a time, generalized to what
megatron-core actually saves: Q is a·d wide and K, V are g·d wide (GQA); a saved view of Q, K
or V keeps linear_qkv's whole output alive, RoPE makes new Q and K, unfused attention repeats
K and V to a heads (and copies Q); the MLP is f wide (SwiGLU keeps its 2f-wide fc1 output); dropout masks
exist only when dropout is on; attention that stores no scores (flash, cuDNN fused) keeps an
fp32 log-sum-exp of a·s per sequence instead of the 5·a·s² terms (torch's kernels, in the
local spec, also their own output beside the projection's copy); norms keep fp32 statistics.
Which kernel runs changes what is kept (``Kernels``): the GPU runtime fuses SwiGLU and the
norms and keeps bool dropout masks; the CPU rehearsal runs torch's composite ops. With the
paper's model (d = h/a, g = a, f = 4h, learned positions, dropout on, unfused attention) the
terms reduce to the formulas above, plus the small norm statistics.

A pipeline rank holds several microbatches at once: 1F1B keeps ``p − r`` on rank ``r`` (the
first stage holds ``p``, so L layers' worth in total); the interleaved schedule keeps
``2(p − r − 1) + (v − 1)·p + 1`` chunk-microbatches of L/(p·v) layers each, a factor
``1 + (p − 1)/(p·v)`` more on the first stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..model_shape import ModelShape

FP32 = 4
BOOL = 1
INT64 = 8
ACTIVATION_NOTE = ("activations: Korthikanti et al. 2022 per-layer terms generalized to GQA, "
                   "RoPE and SwiGLU as megatron-core saves them (fused SwiGLU and norms, 1-byte "
                   "dropout masks on GPU), times the microbatches 1F1B/interleaving keeps in "
                   "flight on each stage")


@dataclass(frozen=True)
class Kernels:
    """Which implementation runs decides what it keeps for backward."""

    fused_swiglu: bool = True          # bias_swiglu fusion keeps only fc1's output
    fused_rmsnorm: bool = True         # torch's composite RMSNorm keeps x and x·(1/rms) in fp32
    dropout_mask_bytes: int | None = BOOL  # CUDA keeps a bool mask; CPU a noise tensor (None:
                                           # the activation dtype)
    norm_statistics_bytes: int | None = FP32   # LayerNorm's mean and 1/std: fp32 on CUDA, the
                                               # input's dtype on the CPU (None)
    # A softmax kernel (Transformer Engine's, apex's) keeps 16-bit probabilities; megatron's
    # torch fallback (the local spec without apex) computes them in fp32
    # (attention_softmax_in_fp32) and keeps that fp32 tensor *and* its 16-bit cast.
    fused_softmax: bool = True
    # torch's scaled_dot_product_attention (the local spec's fused attention) keeps its own
    # output for backward and hands the projection a copy in megatron's [s, b, h] layout;
    # Transformer Engine's attention writes that layout directly and keeps only it
    attention_output_copy: bool = False
    # Adam: Transformer Engine's FusedAdam (megatron-core's first choice) updates in place;
    # torch's foreach AdamW (no TE nor apex, on CUDA) allocates a copy at optimizer.step()
    foreach_adam: bool = False
    # gradient_accumulation_fusion (apex's wgrad kernel, as in NGC containers): weight gradients
    # are accumulated straight into the fp32 main_grad; without it each linear's backward first
    # materializes its weight gradient in the activation dtype (the output layer's is V/t × h)
    fused_wgrad_accumulation: bool = True
    # megatron-core's own (local) attention computes the scores into one buffer from its
    # global memory buffer (get_global_memory_buffer), allocated at the first forward and kept
    local_attention_buffer: bool = False
    # RoPE in one kernel (apply_rope_fusion; without TE megatron's formula compiled by
    # torch.compile, runtime/rope.py): each call keeps only the fp32 frequency table it is
    # passed, the same tensor in every layer (one s x d table per model chunk); the unfused
    # formula keeps its cos and sin for Q and for K in every layer. Measured on an H100
    # (2026-11-27): the kept bytes of 12 layouts equal the plan's to within 48 B per layer
    compiled_rope: bool = False


GPU_KERNELS = Kernels()
GPU_LOCAL_SPEC_KERNELS = Kernels(fused_softmax=False, foreach_adam=True,
                                 fused_wgrad_accumulation=False, local_attention_buffer=True,
                                 attention_output_copy=True)
CPU_KERNELS = Kernels(fused_swiglu=False, fused_rmsnorm=False, dropout_mask_bytes=None,
                      norm_statistics_bytes=None, fused_softmax=False,
                      fused_wgrad_accumulation=False, local_attention_buffer=True,
                      attention_output_copy=True)
# the loss's backward works on per-token operands beside the logits' gradient: its fp32
# gradient and update, int64 row indexes and the gathered rows (measured on CPU: 40 B)
LOSS_BACKWARD_BYTES_PER_TOKEN = 48


def activation_terms(shape: ModelShape, micro_batch_size: int, tp: int, sequence_parallel: bool,
                     selective_recompute: bool, act_bytes: int,
                     kernels: Kernels = GPU_KERNELS) -> list[tuple[str, int]]:
    """Bytes one transformer layer stores for one microbatch, as (tensor, bytes) pairs."""
    s, b, h = shape.seq_length, micro_batch_size, shape.hidden_size
    a, f, d = shape.num_attention_heads, shape.ffn_hidden_size, shape.kv_channels
    sb = s * b
    sp_split = tp if sequence_parallel else 1
    hidden = sb * h // sp_split            # elements of one (sequence-parallel) hidden state
    mask = kernels.dropout_mask_bytes or act_bytes
    ad, kv = shape.query_width, shape.kv_width
    scores_stored = shape.attention_stores_scores and not selective_recompute
    rope = not shape.learned_positions
    repeated = scores_stored and kv < ad
    terms = []

    def norm(name: str) -> None:
        terms.extend((f"{name} {what}", n) for what, n in
                     norm_terms(shape, sb // sp_split, hidden, act_bytes, kernels))

    norm("input_layernorm")
    terms.append(("linear_qkv input", hidden * act_bytes))
    if not repeated:   # V (and Q, K without RoPE) are saved as views of linear_qkv's output
        terms.append(("linear_qkv output (Q, K, V views)", sb * (ad + 2 * kv) // tp * act_bytes))
    if rope:
        terms.append(("query after RoPE", sb * ad // tp * act_bytes))
    elif repeated:   # with fewer KV groups than heads, Q's view cannot be flattened: a copy
        terms.append(("query (contiguous copy)", sb * ad // tp * act_bytes))
    if rope and not repeated:
        terms.append(("key after RoPE", sb * kv // tp * act_bytes))
    if rope and not kernels.compiled_rope:
        terms.append(("RoPE cos/sin for Q and K", 4 * s * d * act_bytes))
    if repeated:
        terms += [("key repeated to all heads", sb * ad // tp * act_bytes),
                  ("value repeated to all heads", sb * ad // tp * act_bytes)]
    if scores_stored:
        scores = b * a * s * s // tp
        if kernels.fused_softmax:
            terms.append(("attention softmax output", scores * act_bytes))
        else:
            terms.append(("attention softmax output (fp32)", scores * FP32))
            # the runtime passes no mask: each layer builds the s×s causal mask it fills with
            terms.append(("causal mask (bool, built by each layer)", s * s * BOOL))
            if act_bytes < FP32 and shape.attention_dropout <= 0:
                terms.append(("attention probabilities (16-bit cast)", scores * act_bytes))
        if shape.attention_dropout > 0:
            terms += [("attention dropout mask", scores * mask),
                      ("attention dropout output", scores * act_bytes)]
    elif not shape.attention_stores_scores and not selective_recompute:
        # (selective recompute reruns the whole core attention: it keeps none of this)
        terms.append(("attention log-sum-exp (fp32)", b * a * s // tp * FP32))
        if kernels.attention_output_copy:
            terms.append(("attention output (kept by the fused kernel)", sb * ad // tp * act_bytes))
    terms.append(("linear_proj input", sb * ad // tp * act_bytes))
    if shape.hidden_dropout > 0:
        terms.append(("attention output dropout mask", hidden * mask))
    norm("pre_mlp_layernorm")
    terms.append(("linear_fc1 input", hidden * act_bytes))
    if shape.gated_mlp:
        terms.append(("linear_fc1 output (SwiGLU input)", 2 * sb * f // tp * act_bytes))
        if not kernels.fused_swiglu:
            # unfused silu(x1) * (x2 + offset) also keeps silu(x1) and the shifted x2
            terms += [("SiLU output", sb * f // tp * act_bytes),
                      ("SwiGLU linear half", sb * f // tp * act_bytes)]
    else:
        terms.append(("GeLU input", sb * f // tp * act_bytes))
    terms.append(("linear_fc2 input", sb * f // tp * act_bytes))
    if shape.hidden_dropout > 0:
        terms.append(("MLP dropout mask", hidden * mask))
    return terms


def norm_terms(shape: ModelShape, tokens: int, hidden: int, act_bytes: int,
               kernels: Kernels) -> list[tuple[str, int]]:
    """What one norm keeps for ``tokens`` tokens of ``hidden`` elements: LayerNorm its input
    and per-token mean and 1/std; fused RMSNorm its input and fp32 1/rms; torch's composite
    RMSNorm (the CPU) computes in fp32 and keeps the upcast input and the normalized input."""
    if shape.norm_has_bias:
        stats = kernels.norm_statistics_bytes or act_bytes
        return [("input", hidden * act_bytes),
                (f"statistics (mean, 1/std, {8 * stats}-bit)", 2 * tokens * stats)]
    if kernels.fused_rmsnorm:
        return [("input", hidden * act_bytes), ("statistics (fp32 1/rms)", tokens * FP32)]
    return [("input (fp32, composite RMSNorm)", hidden * FP32),
            ("statistics (fp32 1/rms)", tokens * FP32),
            ("normalized input (fp32, composite RMSNorm)", hidden * FP32)]


def activation_bytes_per_layer(shape: ModelShape, micro_batch_size: int, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str | None = None,
                               act_bytes: int = 2, kernels: Kernels = GPU_KERNELS) -> int:
    """Bytes one layer keeps for one microbatch; for full recompute, its stored input."""
    if recompute == "full":
        sp_split = tp if sequence_parallel else 1
        return shape.seq_length * micro_batch_size * shape.hidden_size // sp_split * act_bytes
    return sum(v for _, v in activation_terms(shape, micro_batch_size, tp, sequence_parallel,
                                              recompute == "selective", act_bytes, kernels))


def output_layer_bytes(shape: ModelShape, micro_batch_size: int, tp: int,
                       sequence_parallel: bool, act_bytes: int,
                       kernels: Kernels = GPU_KERNELS) -> int:
    """The last stage: final norm, output-layer input and the fp32 softmax that the
    vocab-parallel cross entropy keeps (s·b·V/t, plus its per-token target and mask)."""
    sb = shape.seq_length * micro_batch_size
    sp_split = tp if sequence_parallel else 1
    hidden = sb * shape.hidden_size // sp_split * act_bytes
    norm = sum(n for _, n in norm_terms(shape, sb // sp_split, hidden // act_bytes, act_bytes,
                                        kernels))
    return norm + hidden + sb * shape.padded_vocab(tp) // tp * FP32 + sb * (INT64 + BOOL)


def embedding_bytes(shape: ModelShape, micro_batch_size: int, tp: int, sequence_parallel: bool,
                    act_bytes: int, kernels: Kernels = GPU_KERNELS) -> int:
    """The first stage: the embedding dropout's mask (its output is the first layer's input)
    and, with TP, the vocabulary-parallel lookup's masked token ids and mask."""
    sb = shape.seq_length * micro_batch_size
    lookup = sb * (INT64 + BOOL) if tp > 1 else 0
    if shape.hidden_dropout <= 0:
        return lookup
    sp_split = tp if sequence_parallel else 1
    mask = kernels.dropout_mask_bytes or act_bytes
    return lookup + sb * shape.hidden_size // sp_split * mask


def in_flight_microbatches(pp: int, vpp: int | None, pp_rank: int, num_microbatches: int) -> int:
    """Chunk-microbatches whose activations pipeline rank ``pp_rank`` holds at its peak
    (megatron-core's warmup count + 1, capped at everything it runs)."""
    if pp == 1:
        return 1
    if vpp is None:
        return min(pp - pp_rank, num_microbatches)
    total = num_microbatches * vpp
    warmup = (pp - pp_rank - 1) * 2 + (vpp - 1) * pp
    return total if warmup >= total else warmup + 1


@dataclass(frozen=True)
class StageActivations:
    per_layer: int            # one layer, one microbatch, in the chosen recompute form
    layers_per_chunk: int
    chunk_microbatch: int     # all layers of one chunk for one microbatch
    in_flight: int            # chunk-microbatches held at the peak
    embedding: int
    output_layer: int
    backward_working_set: int  # transient while one layer runs backward (see stage_activations)
    workspace: int = 0         # kept across layers and steps: local attention's score buffer

    @property
    def stored(self) -> int:
        """What the forward passes leave for the backward passes at the peak (Korthikanti)."""
        return self.in_flight * self.chunk_microbatch + self.embedding + self.output_layer

    @property
    def total(self) -> int:
        return self.stored + self.backward_working_set + self.workspace

    def to_json(self) -> dict:
        """The activations' parts on the most loaded rank, to compare with a measurement."""
        return {"per_layer_per_microbatch": self.per_layer,
                "layers_per_chunk": self.layers_per_chunk,
                "chunk_microbatch": self.chunk_microbatch, "in_flight": self.in_flight,
                "embedding": self.embedding, "output_layer": self.output_layer,
                "stored": self.stored, "backward_working_set": self.backward_working_set,
                "workspace": self.workspace, "total": self.total}


def stage_activations(shape: ModelShape, *, tp: int, pp: int, vpp: int | None, pp_rank: int,
                      micro_batch_size: int, num_microbatches: int, sequence_parallel: bool,
                      recompute: str | None, recompute_method: str = "uniform",
                      recompute_num_layers: int = 1, act_bytes: int = 2,
                      kernels: Kernels = GPU_KERNELS) -> StageActivations:
    """Peak activation bytes on one GPU of pipeline rank ``pp_rank``.

    On top of what the forward passes store, the backward pass needs a working set, the larger
    of two moments (they do not overlap: the loss's tensors are freed before the layers'
    backward starts):

    * a layer's backward: the gradients of that layer's activations (taken as large as the
      activations: an upper bound, measured on CPU), and what recomputation rebuilds (k layers
      for full recompute, the attention scores for selective);
    * on the last stage, the loss's backward (``logits_backward_bytes``).
    """
    layers = shape.num_layers // (pp * (vpp or 1))
    in_flight = in_flight_microbatches(pp, vpp, pp_rank, num_microbatches)
    args = (shape, micro_batch_size, tp, sequence_parallel)
    full_layer = activation_bytes_per_layer(*args, None, act_bytes, kernels)
    per_layer, chunk, rebuilt = full_layer, layers * full_layer, 0
    if recompute == "full":
        per_layer = activation_bytes_per_layer(*args, "full", act_bytes, kernels)
        k = max(1, min(recompute_num_layers, layers))
        if recompute_method == "block":
            # the first k layers of each chunk keep only their input, the rest everything
            chunk, rebuilt = k * per_layer + (layers - k) * full_layer, full_layer
        else:
            # groups of k layers keep the group's input; backward recomputes one group at a time
            chunk, rebuilt = math.ceil(layers / k) * per_layer, k * full_layer
        if not shape.learned_positions:
            # the checkpoint also keeps the RoPE frequency table it is passed (fp32), once
            chunk += shape.seq_length * shape.kv_channels * FP32
    elif recompute == "selective":
        per_layer = activation_bytes_per_layer(*args, "selective", act_bytes, kernels)
        chunk, rebuilt = layers * per_layer, full_layer - per_layer
    if recompute != "full" and kernels.compiled_rope and not shape.learned_positions:
        chunk += shape.seq_length * shape.kv_channels * FP32   # the one frequency table
    last = pp_rank == pp - 1
    logits = (logits_backward_bytes(shape, micro_batch_size, tp, act_bytes, kernels)
              if last else 0)
    first_chunk_in_flight = min(in_flight, pp) if vpp else in_flight
    return StageActivations(
        per_layer=per_layer,
        layers_per_chunk=layers,
        chunk_microbatch=chunk,
        in_flight=in_flight,
        embedding=embedding_bytes(*args, act_bytes, kernels) * first_chunk_in_flight
        if pp_rank == 0 else 0,
        output_layer=output_layer_bytes(*args, act_bytes, kernels) if last else 0,
        backward_working_set=max(full_layer + rebuilt, logits),
        workspace=attention_buffer_bytes(shape, micro_batch_size, tp, act_bytes, kernels),
    )


def attention_buffer_bytes(shape: ModelShape, micro_batch_size: int, tp: int, act_bytes: int,
                           kernels: Kernels) -> int:
    """megatron-core's local DotProductAttention writes the b·a/t × s × s scores of every layer
    into one tensor of its global memory buffer (``get_global_memory_buffer().get_tensor``),
    which stays allocated: once per GPU, whatever the number of layers or microbatches."""
    if not (kernels.local_attention_buffer and shape.attention_stores_scores):
        return 0
    return (micro_batch_size * shape.num_attention_heads // tp * shape.seq_length ** 2
            * act_bytes)


def logits_backward_bytes(shape: ModelShape, micro_batch_size: int, tp: int, act_bytes: int,
                          kernels: Kernels = GPU_KERNELS) -> int:
    """What the loss's backward allocates on the last stage, beyond what the forward stored.

    megatron-core's vocab-parallel cross entropy (``tensor_parallel/cross_entropy.py``) saves
    the fp32 softmax (counted with the output layer) and returns the logits' gradient *in that
    same storage* (``grad_input = softmax``, updated in place): nothing new in fp32. With 16-bit
    logits, autograd casts that gradient to the logits' dtype (s·b·V/t in 16 bits) and frees the
    fp32 softmax once the loss's backward returns, so the output layer's backward runs in less
    than this peak. In fp32 the gradient stays in the softmax's storage through the output
    layer's backward, which adds its input gradient (s·b·h, all-gathered with SP) and, without
    gradient-accumulation fusion, its weight gradient (V/t × h); with 16-bit logits that
    backward runs once the fp32 softmax is freed, and counts only where it outgrows the cast.
    Beside them the loss's per-token operands (``LOSS_BACKWARD_BYTES_PER_TOKEN``). Measured on
    CPU in fp32 and bf16 (tests/plan/test_plan_real_megatron.py, a vocabulary of 16000: within
    ``LOSS_BACKWARD_BYTES_PER_TOKEN`` per token of the peak)."""
    sb = shape.seq_length * micro_batch_size
    vocab = shape.padded_vocab(tp) // tp
    cast = sb * vocab * act_bytes if act_bytes < FP32 else 0
    freed = sb * vocab * FP32 if act_bytes < FP32 else 0    # the fp32 softmax, once cast
    wgrad = 0 if kernels.fused_wgrad_accumulation else vocab * shape.hidden_size * act_bytes
    output_layer_backward = sb * shape.hidden_size * act_bytes + wgrad
    return max(cast, cast + output_layer_backward - freed) + sb * LOSS_BACKWARD_BYTES_PER_TOKEN
