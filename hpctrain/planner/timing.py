"""Step time of a layout as the GPU runs it, from a measured kernel table or stated assumptions.

One microbatch through one pipeline rank is priced kernel by kernel:

* **GEMMs**, each linear layer's three (``linear_gemms``): the forward ``input @ weight.t()``,
  the input gradient ``grad_output @ weight`` and the weight gradient
  ``grad_output.t() @ input``, as megatron-core's ``LinearWithGradAccumulationAndAsyncCommunication``
  calls them, on s·b tokens (all-gathered under sequence parallelism), timed from the GPU kind's
  table (``hpctrain.gpu_table``: measured per operand layout and shape, interpolated between
  shapes). Full recomputation runs the forward GEMMs again.
* **attention** by the kernel that runs it (``local``: megatron-core's unfused
  DotProductAttention; ``flash``/``fused``: TE's), timed from the table at the job's batch,
  heads per TP rank, sequence length and head size; selective recomputation runs its forward
  again.
* **element-wise, norm, loss and optimizer work** as the bytes it moves (``memory_traffic``)
  at the bandwidth the table measured.
* **communication, only where it is exposed**, as megatron-core overlaps it: tensor parallel
  collectives in the forward pass are on the critical path, and in the backward pass a
  column-parallel layer's re-gather of its input runs beside its input-gradient GEMM and the
  reduction of that gradient beside its weight-gradient GEMM (``async_op=True`` in
  ``tensor_parallel/layers.py``), so only what exceeds the GEMM is exposed; a row-parallel
  layer's gather of its output gradient is exposed. Pipeline sends and receives are exposed in
  1F1B (blocking, batched p2p) and hidden in the interleaved schedule with
  ``overlap_p2p_comm`` except for filling and draining the pipeline. Data-parallel gradient
  reduction with ``overlap_grad_reduce`` runs bucket by bucket during the last microbatch's
  backward: exposed is the larger of the last bucket and what exceeds that backward; the
  parameter all-gather with ``overlap_param_gather`` likewise behind the first forward.
  A collective over n ranks moves ``bytes × 2(n−1)/n`` (all-reduce) or ``bytes × (n−1)/n``
  (reduce-scatter, all-gather; bytes = the gathered size) at the profile's bus bandwidth.

The step is ``(m + (p − 1)/v)`` microbatch slots of the slowest pipeline rank (the bubble),
plus the exposed DP communication and the optimizer step (its memory traffic).

**The host.** The GPU runs kernels only as fast as the host issues them. Where the table
measured the host (its ``host`` section, ``hpctrain.bench.host_issue``: seconds to issue one
layer's forward and backward, and a microbatch's own work, for the job's kind of layer), a
microbatch slot takes the longer of the two: the GPU's kernels, or the host issuing them
(``host_s``: what the host adds beyond the kernels, over all slots). Without that measurement
the plan says when a layout has so little GPU work per layer and microbatch that the host
bounded such steps on an H100 and an H200 (``HOST_BOUND_BELOW_S``), and prices the kernels
alone.

Without a table (``node.kernel_table`` unset) the same structure runs on assumptions, all
stated: GEMMs and attention at ``MATMUL_EFFICIENCY`` of the profile's peak FLOP/s (attention's
FLOPs: the causal half, backward twice the forward, Megatron-LM's count), and element-wise work
not counted (no bandwidth measured). Each layout then costs Megatron-LM's model FLOPs at that
rate, plus recomputation and exposed communication.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import flops as model_flops
from ..gpu_table import GpuTable, host_kind
from ..model_shape import ModelShape

MATMUL_EFFICIENCY = 0.70     # the assumption without a measured table
# Below this much GPU work per layer and microbatch (forward + backward, as the table prices
# it), the host issuing the kernels, not the GPU, bounded the step on an H100 (tools/gpu_check,
# 2026-11-27: 1.8-4.5 ms per layer ran 1.09-2.26x the modelled time; 6.9 ms and more ran
# 0.91-1.04x) and on an H200 (2026-11-29: the host issued forward and backward in 4.6-5.7 ms
# per layer and microbatch). Without the table's host measurement the plan says so instead.
HOST_BOUND_BELOW_S = 5e-3
FP32 = 4


@dataclass(frozen=True)
class Hardware:
    peak_tflops: float | None
    intra_node_busbw_gbs: float | None
    inter_node_busbw_gbs: float | None
    gpus_per_node: int | None
    table: GpuTable | None = None      # the GPU kind's measured kernel table


@dataclass(frozen=True)
class Gemm:
    name: str       # which linear layer
    op: str         # nt forward, nn input gradient, tn weight gradient (gpu_table.GEMM_LAYOUTS)
    m: int
    n: int
    k: int

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


@dataclass(frozen=True)
class MicrobatchTime:
    """One microbatch forward and backward through one pipeline rank's layers, in seconds."""

    gemm_s: float
    attention_s: float
    memory_s: float            # element-wise, norms, loss: bytes moved / bandwidth
    tp_exposed_s: float
    forward_s: float           # the forward part of gemm + attention + memory + TP
    gemm_flops: float = 0.0

    @property
    def compute_s(self) -> float:
        return self.gemm_s + self.attention_s + self.memory_s

    @property
    def total_s(self) -> float:
        return self.compute_s + self.tp_exposed_s

    @property
    def backward_s(self) -> float:
        return self.total_s - self.forward_s

    def to_json(self) -> dict:
        return {"gemm": self.gemm_s, "attention": self.attention_s, "memory_bound": self.memory_s,
                "tensor_parallel_exposed": self.tp_exposed_s, "forward": self.forward_s}


@dataclass(frozen=True)
class StepTime:
    compute_s: float          # the pipeline's compute, bubble included (no communication)
    tp_comm_s: float          # exposed tensor-parallel communication, bubble included
    pp_comm_s: float
    dp_comm_s: float          # exposed: what the overlaps do not hide
    notes: tuple[str, ...]
    optimizer_s: float = 0.0  # the optimizer step and what goes with it (memory traffic)
    microbatch: MicrobatchTime | None = None   # of the slowest pipeline rank
    source: str = ""          # the kernel table, or the assumption used
    slots: float = 0.0        # microbatch slots per step: m + (p − 1)/v
    host_s: float = 0.0       # what issuing the work on the host adds beyond the kernels
    host_microbatch_s: float | None = None   # the host's time per microbatch (measured)

    @property
    def total_s(self) -> float:
        return (self.compute_s + self.tp_comm_s + self.pp_comm_s + self.dp_comm_s
                + self.optimizer_s + self.host_s)


def _allreduce_s(nbytes: float, n: int, busbw_gbs: float) -> float:
    return nbytes * 2 * (n - 1) / n / (busbw_gbs * 1e9) if n > 1 else 0.0


def _gather_or_scatter_s(nbytes: float, n: int, busbw_gbs: float) -> float:
    return nbytes * (n - 1) / n / (busbw_gbs * 1e9) if n > 1 else 0.0


# ----------------------------------------------------------------------------- the kernels
def _split(n: int, tp: int) -> float:
    """A dimension split over TP ranks (megatron-core requires it to divide; a shape that does
    not is still priced, by its share)."""
    return n // tp if n % tp == 0 else n / tp


def layer_linears(shape: ModelShape, tp: int) -> list[tuple[str, float, float, bool]]:
    """One transformer layer's linear layers on one TP rank: (name, in, out, column-parallel)."""
    h, ad, kv = shape.hidden_size, shape.query_width, shape.kv_width
    f = shape.ffn_hidden_size
    fc1 = 2 * f if shape.gated_mlp else f
    return [("linear_qkv", h, _split(ad + 2 * kv, tp), True),
            ("linear_proj", _split(ad, tp), h, False),
            ("linear_fc1", h, _split(fc1, tp), True),
            ("linear_fc2", _split(f, tp), h, False)]


def linear_gemms(name: str, tokens: int, n_in: int, n_out: int) -> list[Gemm]:
    """The three GEMMs of one linear layer on ``tokens`` rows, as megatron-core calls them."""
    return [Gemm(name, "nt", tokens, n_out, n_in),      # input @ weight.t()
            Gemm(name, "nn", tokens, n_in, n_out),      # grad_output @ weight
            Gemm(name, "tn", n_out, n_in, tokens)]      # grad_output.t() @ input


def layer_gemms(shape: ModelShape, micro_batch_size: int, tp: int) -> list[Gemm]:
    tokens = shape.seq_length * micro_batch_size
    return [g for name, n_in, n_out, _ in layer_linears(shape, tp)
            for g in linear_gemms(name, tokens, n_in, n_out)]


def output_layer_gemms(shape: ModelShape, micro_batch_size: int, tp: int) -> list[Gemm]:
    return linear_gemms("output_layer", shape.seq_length * micro_batch_size, shape.hidden_size,
                        shape.padded_vocab(tp) // tp)


@dataclass(frozen=True)
class Rates:
    """How kernels are priced: from a measured table, or from the stated assumptions."""

    table: GpuTable | None
    peak_flops: float | None
    attention_backend: str

    def gemm_s(self, g: Gemm) -> float:
        if self.table is not None:
            return self.table.gemm_seconds(g.op, g.m, g.n, g.k)
        return g.flops / (self.peak_flops * MATMUL_EFFICIENCY)

    def attention_s(self, shape: ModelShape, micro_batch_size: int, tp: int) -> tuple[float, float, bool]:
        """(forward, backward, measured) seconds of one layer's attention on one TP rank."""
        heads = shape.num_attention_heads // tp
        if self.table is not None:
            for backend in _backends(self.attention_backend):
                got = self.table.attention_seconds(backend, micro_batch_size, heads,
                                                   shape.seq_length, shape.kv_channels)
                if got is not None:
                    return got[0], got[1], True
        if not self.peak_flops:
            return 0.0, 0.0, False
        fwd = (shape.seq_length * micro_batch_size
               * model_flops.attention_core_flops_per_token(shape) / tp)
        rate = self.peak_flops * MATMUL_EFFICIENCY
        return fwd / rate, 2 * fwd / rate, False

    def bandwidth(self) -> float | None:
        if self.table is not None and self.table.bandwidth_gbs:
            return self.table.bandwidth_gbs * 1e9
        return None


def _backends(backend: str) -> tuple[str, ...]:
    """Which measured kernel stands for the job's attention backend: TE's ``auto`` picks its
    fused cuDNN kernel where it can, else flash; hpctrain's torch attention in the local spec
    (``torch-*``, runtime/fused_attention.py) tries flash, then cuDNN, then memory-efficient
    (deterministic mode leaves cuDNN out: flash, the kernel that runs, is first either way)."""
    return {"auto": ("fused", "flash"),
            "torch-auto": ("torch-flash", "torch-cudnn", "torch-efficient"),
            "torch-fused": ("torch-cudnn",)}.get(backend, (backend,))


# ----------------------------------------------------------------------------- memory traffic
def memory_traffic(shape: ModelShape, micro_batch_size: int, tp: int, sequence_parallel: bool,
                   act_bytes: int, fused_wgrad_accumulation: bool = True) -> tuple[int, int]:
    """Bytes one transformer layer's memory-bound work reads and writes for one microbatch on
    one TP rank: (forward, backward). Counted per op as read + write of its operands:

    * each norm (2): forward reads x, writes y; backward reads dy and x, writes dx;
    * each residual add (2): reads two, writes one, forward and (summing gradients) backward;
    * RoPE on Q and K: reads and writes them, forward and backward;
    * the MLP activation: forward reads fc1's output (2f for SwiGLU), writes f; backward reads
      the gradient and the input, writes the input's gradient;
    * accumulating the weight gradients into the fp32 main_grad: read + write 4 bytes per weight
      element (fused into the GEMM's epilogue), plus writing and reading the 16-bit gradient
      when not fused.
    Norms and residuals work on the s·b/t tokens of a rank under sequence parallelism."""
    tokens = shape.seq_length * micro_batch_size
    e = act_bytes
    hidden = tokens * shape.hidden_size // (tp if sequence_parallel else 1)
    fwd = 2 * 2 * hidden * e + 2 * 3 * hidden * e
    bwd = 2 * 3 * hidden * e + 2 * 3 * hidden * e
    if not shape.learned_positions:
        qk = tokens * (shape.query_width + shape.kv_width) // tp
        fwd += 2 * qk * e
        bwd += 2 * qk * e
    f = shape.ffn_hidden_size // tp
    f_in = 2 * f if shape.gated_mlp else f
    fwd += tokens * (f_in + f) * e
    bwd += tokens * (f + 2 * f_in) * e
    weights = sum(n_in * n_out for _, n_in, n_out, _ in layer_linears(shape, tp))
    bwd += weights * (2 * FP32 + (0 if fused_wgrad_accumulation else 2 * e))
    return fwd, bwd


def loss_traffic(shape: ModelShape, micro_batch_size: int, tp: int, act_bytes: int) -> tuple[int, int]:
    """megatron-core's vocab-parallel cross entropy over s·b·V/t logits (forward, backward):
    the fp32 cast (16-bit logits), max, subtract, exp, sum and divide in place forward; the
    in-place gradient and its cast back to the logits' dtype backward."""
    logits = shape.seq_length * micro_batch_size * (shape.padded_vocab(tp) // tp)
    cast = act_bytes + FP32 if act_bytes < FP32 else 0
    return logits * (cast + 4 + 8 + 8 + 4 + 8), logits * (8 + cast)


def optimizer_traffic(optimizer_elements: int, grad_buffer_bytes: int, act_bytes: int,
                      grad_bytes_per_element: int) -> int:
    """Bytes the step after the backward passes moves: scaling the gradient buffer (read +
    write) and zeroing it for the next step (write); per element the rank updates, the fp32
    main gradient (made from a 16-bit buffer: read 2, write 4), the gradient norm (read 4),
    Adam (read parameter, gradient, two moments; write parameter and moments: 28) and the copy
    of the updated fp32 parameter into the model's 16-bit one (read 4, write 2)."""
    main_grad = 0 if grad_bytes_per_element == FP32 else grad_bytes_per_element + FP32
    per_element = main_grad + FP32 + 28 + (FP32 + act_bytes if act_bytes < FP32 else 0)
    return 3 * grad_buffer_bytes + optimizer_elements * per_element


# ----------------------------------------------------------------------------- one microbatch
def microbatch_time(shape: ModelShape, rates: Rates, hw: Hardware, *, tp: int, layers: int,
                    micro_batch_size: int, sequence_parallel: bool, recompute: str | None,
                    act_bytes: int, first: bool, last: bool,
                    fused_wgrad_accumulation: bool = True) -> MicrobatchTime:
    """One microbatch through ``layers`` transformer layers of one pipeline rank (plus the
    embedding on the first, the output layer and loss on the last), forward and backward."""
    tokens = shape.seq_length * micro_batch_size
    e = act_bytes
    full = recompute == "full"
    bandwidth = rates.bandwidth()
    gemms = layer_gemms(shape, micro_batch_size, tp)
    by_op = {op: sum(rates.gemm_s(g) for g in gemms if g.op == op) for op in ("nt", "nn", "tn")}
    per_linear = {(g.name, g.op): rates.gemm_s(g) for g in gemms}
    attn_f, attn_b, _ = rates.attention_s(shape, micro_batch_size, tp)
    mem_f, mem_b = memory_traffic(shape, micro_batch_size, tp, sequence_parallel, e,
                                  fused_wgrad_accumulation)
    mem_f_s = mem_f / bandwidth if bandwidth else 0.0
    mem_b_s = mem_b / bandwidth if bandwidth else 0.0
    gemm_fwd = by_op["nt"] * (2 if full else 1)
    gemm_s = gemm_fwd + by_op["nn"] + by_op["tn"]
    attn_s = attn_f * (2 if recompute in ("full", "selective") else 1) + attn_b
    mem_s = mem_f_s * (2 if full else 1) + mem_b_s
    tp_f, tp_b = _tp_exposed(shape, hw, tp, tokens, sequence_parallel, e, per_linear)
    tp_s = tp_f * (2 if full else 1) + tp_b
    fwd = by_op["nt"] + attn_f + mem_f_s + tp_f
    flops = sum(g.flops for g in gemms) + (sum(g.flops for g in gemms if g.op == "nt")
                                          if full else 0)
    gemm_s, attn_s, mem_s, tp_s, fwd, flops = (layers * x for x in (gemm_s, attn_s, mem_s, tp_s,
                                                                     fwd, flops))
    if last:
        out = output_layer_gemms(shape, micro_batch_size, tp)
        out_s = {g.op: rates.gemm_s(g) for g in out}
        gemm_s += sum(out_s.values())
        flops += sum(g.flops for g in out)
        loss_f, loss_b = loss_traffic(shape, micro_batch_size, tp, e)
        norm = 5 * tokens * shape.hidden_size // (tp if sequence_parallel else 1) * e
        if bandwidth:
            mem_s += (loss_f + loss_b + norm) / bandwidth
            fwd += (loss_f + 2 * norm / 5) / bandwidth
        fwd += out_s["nt"]
        if tp > 1 and hw.intra_node_busbw_gbs:
            full_bytes = tokens * shape.hidden_size * e
            link = hw.intra_node_busbw_gbs
            if sequence_parallel:
                ag = _gather_or_scatter_s(full_bytes, tp, link)
                tp_s += ag + max(0.0, ag - out_s["nn"]) + max(0.0, ag - out_s["tn"])
                fwd += ag
            else:
                tp_s += max(0.0, _allreduce_s(full_bytes, tp, link) - out_s["tn"])
    if first:
        lookup = tokens * shape.hidden_size * e
        grad = (shape.padded_vocab(tp) // tp) * shape.hidden_size * (2 * e + 2 * FP32)
        if bandwidth:
            mem_s += (2 * lookup + lookup + grad) / bandwidth
            fwd += 2 * lookup / bandwidth
        if tp > 1 and hw.intra_node_busbw_gbs:
            link = hw.intra_node_busbw_gbs
            if sequence_parallel:      # reduce-scatter forward, all-gather of its gradient
                rs = _gather_or_scatter_s(lookup, tp, link)
                tp_s += 2 * rs
                fwd += rs
            else:
                ar = _allreduce_s(lookup, tp, link)
                tp_s += ar
                fwd += ar
    return MicrobatchTime(gemm_s, attn_s, mem_s, tp_s, fwd, flops)


def _tp_exposed(shape: ModelShape, hw: Hardware, tp: int, tokens: int, sequence_parallel: bool,
                e: int, per_linear: dict) -> tuple[float, float]:
    """Exposed tensor-parallel communication of one layer, (forward, backward)."""
    link = hw.intra_node_busbw_gbs
    if tp == 1 or not link:
        return 0.0, 0.0
    nbytes = tokens * shape.hidden_size * e
    fwd = bwd = 0.0
    if sequence_parallel:
        comm = _gather_or_scatter_s(nbytes, tp, link)
        fwd = 4 * comm            # all-gather before qkv and fc1, reduce-scatter after proj, fc2
        bwd = 2 * comm            # proj and fc2: all-gather of their output gradient
        for name in ("linear_qkv", "linear_fc1"):   # beside the GEMMs: re-gather, reduce-scatter
            bwd += max(0.0, comm - per_linear[(name, "nn")])
            bwd += max(0.0, comm - per_linear[(name, "tn")])
    else:
        comm = _allreduce_s(nbytes, tp, link)
        fwd = 2 * comm            # all-reduce after proj and fc2
        for name in ("linear_qkv", "linear_fc1"):   # input-gradient all-reduce beside wgrad
            bwd += max(0.0, comm - per_linear[(name, "tn")])
    return fwd, bwd


# ----------------------------------------------------------------------------- the step
def estimate_step_time(shape: ModelShape, hw: Hardware, *, tp: int, pp: int, vpp: int | None,
                       dp: int, micro_batch_size: int, num_microbatches: int,
                       sequence_parallel: bool, recompute: str | None, act_bytes: int,
                       grad_buffer_bytes: int, weight_bytes: int,
                       distributed_optimizer: bool, overlap_grad_reduce: bool = False,
                       overlap_param_gather: bool = False, overlap_p2p: bool = False,
                       attention_backend: str = "flash", optimizer_elements: int = 0,
                       bucket_bytes: int | None = None, grad_bytes_per_element: int = FP32,
                       fused_wgrad_accumulation: bool = True) -> StepTime | None:
    """Seconds per optimizer step on the slowest pipeline rank; None when neither a kernel
    table nor a peak FLOP/s is known. ``grad_buffer_bytes``/``weight_bytes``: the most loaded
    rank's gradient buffer and weights; ``bucket_bytes``: one gradient bucket (None: one bucket
    for the whole buffer)."""
    table = hw.table
    if table is None and not hw.peak_tflops:
        return None
    rates = Rates(table, hw.peak_tflops * 1e12 if hw.peak_tflops else None, attention_backend)
    notes: list[str] = []
    if table is None:
        source = (f"assumed: GEMMs and attention at {MATMUL_EFFICIENCY:.0%} of "
                  f"{hw.peak_tflops:g} TFLOP/s, element-wise work not counted (no kernel table: "
                  "node.kernel_table)")
    else:
        source = f"kernel table {table.describe()}"
        if rates.attention_s(shape, micro_batch_size, tp)[2] is False:
            notes.append(f"attention ({attention_backend}) not in the kernel table: its FLOPs at "
                         f"{MATMUL_EFFICIENCY:.0%} of the peak")
        if not table.bandwidth_gbs:
            notes.append("element-wise, norm and optimizer work not counted: the kernel table "
                         "has no bandwidth")
    layers = shape.num_layers // pp
    stages = {(r == 0, r == pp - 1) for r in range(pp)}
    kw = dict(tp=tp, layers=layers, micro_batch_size=micro_batch_size,
              sequence_parallel=sequence_parallel, recompute=recompute, act_bytes=act_bytes,
              fused_wgrad_accumulation=fused_wgrad_accumulation)
    micro = max((microbatch_time(shape, rates, hw, first=f, last=la, **kw) for f, la in stages),
                key=lambda t: t.total_s)
    v = vpp or 1
    slots = num_microbatches + (pp - 1) / v
    host_mb = _host_microbatch_s(table, attention_backend, layers)
    host_s = slots * max(0.0, host_mb - micro.total_s) if host_mb is not None else 0.0
    notes += _host_notes(table, micro, layers, host_mb, attention_backend)

    intra, inter, gpn = hw.intra_node_busbw_gbs, hw.inter_node_busbw_gbs, hw.gpus_per_node
    if tp > 1 and not intra:
        notes.append("TP communication not counted: the profile has no "
                     "interconnect.intra_node_busbw_gbs")
    pp_comm = dp_comm = 0.0
    single_node = gpn is None or tp * pp * dp <= gpn
    if pp > 1:
        link = intra if single_node else inter
        if link:
            msg = shape.seq_length * micro_batch_size * shape.hidden_size * act_bytes / (
                tp if sequence_parallel else 1)
            sends = 2 * (pp - 1) if overlap_p2p and vpp else 2 * num_microbatches * v
            pp_comm = sends * msg / (link * 1e9)
        else:
            notes.append("PP communication not counted: the profile has no bus bandwidth for "
                         "the link between stages")
    if dp > 1:
        dp_in_node = gpn is not None and tp * dp <= gpn
        link = intra if dp_in_node else inter
        if link:
            bucket = min(bucket_bytes or grad_buffer_bytes, grad_buffer_bytes)
            if distributed_optimizer:
                comm = lambda n: _gather_or_scatter_s(n, dp, link)  # noqa: E731
            else:
                comm = lambda n: _allreduce_s(n, dp, link)  # noqa: E731
            reduce = comm(grad_buffer_bytes)
            if overlap_grad_reduce:
                reduce = max(comm(bucket), reduce - micro.backward_s)
            gather = 0.0
            if distributed_optimizer:
                gather = _gather_or_scatter_s(weight_bytes, dp, link)
                if overlap_param_gather:
                    first_bucket = bucket * weight_bytes / max(grad_buffer_bytes, 1)
                    gather = max(_gather_or_scatter_s(first_bucket, dp, link),
                                 gather - micro.forward_s)
            dp_comm = reduce + gather
        else:
            notes.append("DP communication not counted: the profile has no "
                         "interconnect.inter_node_busbw_gbs")
    optimizer_s = 0.0
    bandwidth = rates.bandwidth()
    if bandwidth and optimizer_elements:
        optimizer_s = optimizer_traffic(optimizer_elements, grad_buffer_bytes, act_bytes,
                                        grad_bytes_per_element) / bandwidth
    return StepTime(micro.compute_s * slots, micro.tp_exposed_s * slots, pp_comm, dp_comm,
                    tuple(notes), optimizer_s, micro, source, slots, host_s, host_mb)


def _host_microbatch_s(table: GpuTable | None, attention_backend: str,
                       layers: int) -> float | None:
    """The host's time to issue one microbatch through ``layers`` layers, from the table's
    host measurement of the job's kind of layer (None: not measured)."""
    kind = host_kind(attention_backend)
    if table is None or table.host is None or kind is None:
        return None
    return table.host.seconds(kind, layers)


def _host_notes(table: GpuTable | None, micro: MicrobatchTime, layers: int,
                host_mb: float | None, attention_backend: str) -> list[str]:
    """What the plan says about the host: which bounds the step where the host is measured,
    else a warning where the GPU's work per layer is under ``HOST_BOUND_BELOW_S``."""
    if host_mb is not None:
        if host_mb <= micro.total_s:
            return []
        return [f"the host issues a microbatch in {host_mb * 1e3:.1f} ms and the GPU runs it in "
                f"{micro.total_s * 1e3:.1f} ms: the host bounds the step (the kernel table's host "
                f"measurement, {host_kind(attention_backend)} layers); a larger micro-batch moves "
                f"the bound back to the GPU"]
    per_layer = micro.total_s / max(layers, 1)
    if table is None or table.device == "cpu" or per_layer >= HOST_BOUND_BELOW_S:
        return []
    return [f"{per_layer * 1e3:.1f} ms of GPU work per layer and microbatch: below "
            f"{HOST_BOUND_BELOW_S * 1e3:.0f} ms the host issuing the kernels, not the GPU, "
            f"bounded the step on an H100 and an H200 (1.1-3.1x this model's time; the table "
            f"has no host measurement of these layers: `hpctrain bench kernels`); a larger "
            f"micro-batch moves the bound back to the GPU"]
