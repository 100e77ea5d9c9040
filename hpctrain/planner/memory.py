"""Bytes per GPU for weights, gradients and optimizer state, as megatron-core allocates them.

* Weights: the model's parameters in the training precision (bf16/fp16: 2 bytes, fp32: 4).
  With the distributed optimizer DDP moves them into one flat buffer of the padded size.
* Gradients: DDP's gradient buffer (padded with the distributed optimizer), fp32 when
  ``train.grad_reduce_in_fp32`` is true (megatron's default) or the precision is fp32, else
  16-bit.
* Optimizer (Adam): exp_avg and exp_avg_sq in fp32 (8 bytes), plus an fp32 master copy of the
  parameters under bf16/fp16 (4 bytes). The distributed optimizer keeps all of this only for
  the elements of its 1/DP slice of each gradient bucket.
* fp32 main gradients, when the gradient buffer is 16-bit: the optimizer's
  ``shard_main_param.grad = shard_model_grad.float()`` (``_copy_model_grads_to_main_grads``,
  called by ``prepare_grads`` inside the step; 4 bytes per element it updates). They are not
  state: they appear in the step and go at the next step's ``optimizer.zero_grad()``
  (``set_to_none=True``, before the forward passes), so they never meet the activations; a
  checkpoint saved between steps sees them. With an fp32 buffer ``.float()`` is the buffer
  itself and nothing is allocated. Measured on CPU with real megatron-core
  (tests/plan/test_plan_real_megatron_multi.py).
"""

from __future__ import annotations

import dataclasses
import operator
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from .grad_buffer import bucket_elements, grad_buffer_layout
from ..model_shape import PRECISION_BYTES, ChunkSpec, ModelShape, chunk_parameters, pipeline_chunks

GiB = 2**30
# What the runtime allocates through PyTorch's allocator beyond weights, gradients and
# optimizer state, measured after the first step on one H100 (tools/gpu_check, docs: 16.29 GiB
# allocated against 15.98 GiB of state): cuBLAS workspaces, the batch, loss and norm buffers.
RUNTIME_BUFFER_BYTES = int(0.31 * GiB)


def grad_bytes(precision: str, grad_reduce_in_fp32: bool) -> int:
    return 4 if precision == "fp32" or grad_reduce_in_fp32 else PRECISION_BYTES[precision]


@dataclass(frozen=True)
class OptimizerBytesPerElement:
    """Bytes per parameter element the optimizer owns: its state, and the fp32 main gradient
    that lives only from the step to the next ``zero_grad`` (not part of ``total``)."""

    master_params: int   # fp32 copy of 16-bit parameters
    moments: int         # Adam exp_avg + exp_avg_sq
    main_grads: int      # fp32 copy of 16-bit gradients, made in the step (transient)

    @property
    def total(self) -> int:
        """The state kept through the forward and backward passes."""
        return self.master_params + self.moments


def optimizer_bytes_per_element(precision: str, grad_reduce_in_fp32: bool) -> OptimizerBytesPerElement:
    sixteen_bit = precision in ("bf16", "fp16")
    return OptimizerBytesPerElement(
        master_params=4 if sixteen_bit else 0,
        moments=8,
        main_grads=4 if sixteen_bit and not grad_reduce_in_fp32 else 0,
    )


@dataclass(frozen=True)
class StateBytes:
    weights: int
    gradients: int
    optimizer: int
    optimizer_elements: int = 0   # parameter elements this rank's optimizer updates
    main_grads: int = 0           # fp32 main gradients: from the step to the next zero_grad

    @property
    def total(self) -> int:
        """What stays allocated through the forward and backward passes."""
        return self.weights + self.gradients + self.optimizer

    @property
    def between_steps(self) -> int:
        """What is allocated after a step (where a checkpoint is saved): the main gradients
        are freed only by the next step's ``zero_grad``."""
        return self.total + self.main_grads


def state_bytes_for_parameters(num_params: float, precision: str = "bf16",
                               grad_reduce_in_fp32: bool = True, data_parallel_size: int = 1,
                               distributed_optimizer: bool = False) -> StateBytes:
    """Back-of-the-envelope form for a parameter count (no padding): bytes per GPU."""
    per = optimizer_bytes_per_element(precision, grad_reduce_in_fp32)
    shards = data_parallel_size if distributed_optimizer else 1
    return StateBytes(int(num_params * PRECISION_BYTES[precision]),
                      int(num_params * grad_bytes(precision, grad_reduce_in_fp32)),
                      int(num_params * per.total / shards), int(num_params / shards),
                      int(num_params * per.main_grads / shards))


@lru_cache(maxsize=4096)
def _chunk_buffer(shape: ModelShape, tp: int, pp: int, chunk: ChunkSpec, dp: int,
                  distributed_optimizer: bool, bucket: int | None) -> tuple[int, int, tuple[int, ...]]:
    """(buffer elements, parameter elements, owned elements per DP rank) of one model chunk."""
    layout = grad_buffer_layout(chunk_parameters(shape, tp, pp, chunk), dp,
                                distributed_optimizer, bucket)
    owned = layout.owned_per_rank(dp) if distributed_optimizer else [layout.numel_unpadded] * dp
    return layout.numel, layout.numel_unpadded, tuple(owned)


@lru_cache(maxsize=1024)
def state_bytes_per_pipeline_rank(shape: ModelShape, *, tp: int, pp: int, vpp: int | None,
                                  dp: int, precision: str, grad_reduce_in_fp32: bool,
                                  distributed_optimizer: bool,
                                  overlap_grad_reduce: bool = False,
                                  dp_rank: int | None = None,
                                  bucket_size: int | None = None) -> tuple[StateBytes, ...]:
    """Exact bytes on one GPU of each pipeline rank: the optimizer state of DP rank
    ``dp_rank``, or of the most loaded DP rank (slices differ by the padding they hold)."""
    w_bytes = PRECISION_BYTES[precision]
    g_bytes = grad_bytes(precision, grad_reduce_in_fp32)
    per = optimizer_bytes_per_element(precision, grad_reduce_in_fp32)
    out = []
    for rank, chunks in enumerate(pipeline_chunks(shape.num_layers, pp, vpp)):
        # the layer range does not change a chunk's buffer, only where the chunk sits does:
        # middle pipeline ranks are all alike, and are summed once (cost independent of PP)
        keys = tuple((dataclasses.replace(chunk, pipeline_rank=0, virtual_index=0, first_layer=0),
                      bucket_elements(overlap_grad_reduce, dp,
                                      rank == 0 and chunk.virtual_index == 0, bucket_size))
                     for chunk in chunks)
        numel, unpadded, held = _rank_buffers(shape, tp, pp, keys, dp, distributed_optimizer,
                                              dp_rank)
        weights = (numel if distributed_optimizer else unpadded) * w_bytes
        out.append(StateBytes(weights, numel * g_bytes, held * per.total, held,
                              held * per.main_grads))
    return tuple(out)


@lru_cache(maxsize=4096)
def _rank_buffers(shape: ModelShape, tp: int, pp: int, keys: tuple, dp: int,
                  distributed_optimizer: bool, dp_rank: int | None) -> tuple[int, int, int]:
    """(padded elements, parameter elements, optimizer elements held by DP rank ``dp_rank``
    or by the most loaded one) of one pipeline rank's chunks."""
    numel = unpadded = 0
    owned: list[int] | tuple[int, ...] = (0,) * dp
    for (key, bucket), times in Counter(keys).items():    # a rank's chunks are mostly alike
        n, u, mine = _chunk_buffer(shape, tp, pp, key, dp, distributed_optimizer, bucket)
        numel += times * n
        unpadded += times * u
        if times > 1:
            mine = [times * m for m in mine]
        owned = list(map(operator.add, owned, mine))   # element-wise in C, no numpy on the CLI
    return numel, unpadded, (max(owned) if dp_rank is None else owned[dp_rank])


def optimizer_step_bytes(state: StateBytes, kernels) -> int:
    """What exists only during the optimizer step (the activations are freed by then): the
    fp32 main gradients of 16-bit gradients (``StateBytes.main_grads``), and torch's
    multi-tensor (foreach) Adam's ``sqrt(exp_avg_sq)`` for every element it updates at once
    (4 bytes each), which megatron-core falls back to on CUDA without Transformer Engine or apex
    (measured on an H100: the first step's peak was the two new moments plus exactly this copy).
    TE's and apex's fused Adam work in place, and the CPU's single-tensor Adam holds one
    parameter's copy."""
    return state.main_grads + (state.optimizer_elements * 4 if kernels.foreach_adam else 0)


@dataclass(frozen=True)
class Allowance:
    """What a fit adds to the itemized memory, stated apart from it: the memory that
    ``torch.cuda.max_memory_allocated`` does not see. On a GPU: what the process uses outside
    PyTorch's caching allocator (the CUDA context, NCCL's buffers, library handles), and the
    allocator's slack (segments reserved beyond what is allocated at the peak, a fraction of
    the peak). ``measured``: where the figures come from (a GPU kind's measured table), or
    None where they are assumed."""

    outside_allocator_bytes: int
    slack_fraction: float
    measured: str | None = None

    def bytes(self, itemized: int) -> int:
        return int(self.outside_allocator_bytes + self.slack_fraction * itemized)

    def describe(self) -> str:
        gib = self.outside_allocator_bytes / GiB
        parts = (f"{gib:.2f} GiB outside PyTorch's allocator (CUDA context, NCCL, libraries) + "
                 f"{self.slack_fraction:.1%} of the itemized peak (allocator slack)")
        if self.measured:
            return f"allowance {parts}, measured on {self.measured}"
        return (f"allowance {parts}: assumed, not measured for this GPU kind (name a kernel "
                "table measured by `hpctrain bench kernels` in the profile's node.kernel_table)")


# Unmeasured defaults, replaced by a GPU kind's measured table (node.kernel_table). 2 GiB: a
# CUDA context with its libraries (some hundred MiB to 1 GiB per process) and NCCL's buffers
# for the TP, PP and DP communicators; 5%: reserved-but-unallocated segments of a loop whose
# tensor shapes repeat every step. The CPU rehearsal counts host memory: 10%, no fixed part.
ASSUMED_GPU_ALLOWANCE = Allowance(2 * GiB, 0.05)
CPU_ALLOWANCE = Allowance(0, 0.10)
