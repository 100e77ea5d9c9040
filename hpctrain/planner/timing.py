"""Estimated step time and MFU of a layout, from the profile's peak FLOP/s and bandwidths.

The estimate is for ranking layouts, not a promise. Its assumptions, all shown to the user:

* dense matrix multiplies run at ``MATMUL_EFFICIENCY`` of the profile's ``node.peak_tflops``;
* a step costs 3 forward passes of FLOPs per token (``hpctrain.flops``: Megatron-LM's count,
  the attention core halved for the causal mask as flash attention computes it) plus what
  recomputation repeats: one more forward for full recompute, the attention core again for
  selective; the most loaded pipeline stage (the last, with the logits) sets the pace;
* the pipeline runs ``m + (p − 1)/v`` microbatch slots per step (bubble (p − 1)/(v·m));
* TP and PP communication does not overlap compute: per layer and microbatch, TP does 2
  all-reduces forward and 2 backward (SP's all-gather/reduce-scatter pairs cost the same), 2
  more forward under full recompute, on the intra-node link; PP sends one activation forward
  and one gradient backward per microbatch and chunk;
* DP reduce-scatters (distributed optimizer) or all-reduces the gradient buffer and
  all-gathers the parameters, on the inter-node link unless the DP group fits in a node. With
  ``parallel.overlap_grad_reduce`` (on by default, as in Megatron-LM) the gradient reduction
  runs bucket by bucket during the backward pass of the step's last microbatch, so only what
  exceeds that backward (2/3 of one microbatch's compute on the stage) is exposed; with
  ``overlap_param_gather`` the gather hides likewise behind the first microbatch's forward
  (1/3);
* a collective over n ranks moves ``bytes × 2(n−1)/n`` (all-reduce) or ``bytes × (n−1)/n``
  (reduce-scatter, all-gather) at the profile's bus bandwidth; point-to-point sends run at it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import flops as model_flops
from ..model_shape import ModelShape

MATMUL_EFFICIENCY = 0.70


@dataclass(frozen=True)
class Hardware:
    peak_tflops: float | None
    intra_node_busbw_gbs: float | None
    inter_node_busbw_gbs: float | None
    gpus_per_node: int | None


@dataclass(frozen=True)
class StepTime:
    compute_s: float          # the pipeline's compute, bubble included
    tp_comm_s: float
    pp_comm_s: float
    dp_comm_s: float          # exposed: what the overlaps do not hide
    notes: tuple[str, ...]

    @property
    def total_s(self) -> float:
        return self.compute_s + self.tp_comm_s + self.pp_comm_s + self.dp_comm_s


def _allreduce_s(nbytes: float, n: int, busbw_gbs: float) -> float:
    return nbytes * 2 * (n - 1) / n / (busbw_gbs * 1e9) if n > 1 else 0.0


def _gather_or_scatter_s(nbytes: float, n: int, busbw_gbs: float) -> float:
    return nbytes * (n - 1) / n / (busbw_gbs * 1e9) if n > 1 else 0.0


def estimate_step_time(shape: ModelShape, hw: Hardware, *, tp: int, pp: int, vpp: int | None,
                       dp: int, micro_batch_size: int, num_microbatches: int,
                       sequence_parallel: bool, recompute: str | None, act_bytes: int,
                       grad_buffer_bytes: int, weight_bytes: int,
                       distributed_optimizer: bool, overlap_grad_reduce: bool = False,
                       overlap_param_gather: bool = False) -> StepTime | None:
    """Seconds per optimizer step on the slowest pipeline stage; None without a peak."""
    if not hw.peak_tflops:
        return None
    notes: list[str] = []
    s, b, h = shape.seq_length, micro_batch_size, shape.hidden_size
    tokens = s * b
    # the attention core as flash/fused attention computes it: the causal half of the square
    attention_core_fwd = tokens * model_flops.attention_core_flops_per_token(shape)
    layer_fwd = tokens * model_flops.layer_matmul_flops_per_token(shape) + attention_core_fwd
    layer_cost = 3 * layer_fwd
    if recompute == "full":
        layer_cost += layer_fwd
    elif recompute == "selective":
        layer_cost += attention_core_fwd
    logits_cost = 3 * tokens * 2 * h * shape.padded_vocab(tp)
    stage_flops = (shape.num_layers // pp * layer_cost + logits_cost) / tp
    v = vpp or 1
    slots = num_microbatches + (pp - 1) / v
    microbatch = stage_flops / (hw.peak_tflops * 1e12 * MATMUL_EFFICIENCY)
    compute = microbatch * slots

    intra, inter, gpn = hw.intra_node_busbw_gbs, hw.inter_node_busbw_gbs, hw.gpus_per_node
    tp_comm = pp_comm = dp_comm = 0.0
    if tp > 1:
        if intra:
            per_layer = 4 + (2 if recompute == "full" else 0)
            msg = tokens * h * act_bytes
            tp_comm = per_layer * (shape.num_layers // pp) * _allreduce_s(msg, tp, intra) * slots
        else:
            notes.append("TP communication not counted: the profile has no "
                         "interconnect.intra_node_busbw_gbs")
    single_node = gpn is None or tp * pp * dp <= gpn
    if pp > 1:
        link = intra if single_node else inter
        if link:
            msg = tokens * h * act_bytes / (tp if sequence_parallel else 1)
            pp_comm = 2 * num_microbatches * v * msg / (link * 1e9)
        else:
            notes.append("PP communication not counted: the profile has no bus bandwidth for "
                         "the link between stages")
    if dp > 1:
        dp_in_node = gpn is not None and tp * dp <= gpn
        link = intra if dp_in_node else inter
        if link:
            if distributed_optimizer:
                reduce = _gather_or_scatter_s(grad_buffer_bytes, dp, link)
                gather = _gather_or_scatter_s(weight_bytes, dp, link)
            else:
                reduce, gather = _allreduce_s(grad_buffer_bytes, dp, link), 0.0
            if overlap_grad_reduce:
                reduce = max(0.0, reduce - microbatch * 2 / 3)
            if overlap_param_gather and distributed_optimizer:
                gather = max(0.0, gather - microbatch / 3)
            dp_comm = reduce + gather
        else:
            notes.append("DP communication not counted: the profile has no "
                         "interconnect.inter_node_busbw_gbs")
    return StepTime(compute, tp_comm, pp_comm, dp_comm, tuple(notes))
