"""Bytes per GPU for weights, gradients and optimizer state, as megatron-core allocates them.

* Weights: the model's parameters in the training precision (bf16/fp16: 2 bytes, fp32: 4).
  With the distributed optimizer DDP moves them into one flat buffer of the padded size.
* Gradients: DDP's gradient buffer (padded with the distributed optimizer), fp32 when
  ``train.grad_reduce_in_fp32`` is true (megatron's default) or the precision is fp32, else
  16-bit.
* Optimizer (Adam): exp_avg and exp_avg_sq in fp32 (8 bytes), plus an fp32 master copy of the
  parameters under bf16/fp16 (4 bytes), plus an fp32 copy of the gradients when those are kept
  in 16-bit (the optimizer's ``main_grad.float()``, 4 bytes). The distributed optimizer keeps
  all of this only for the elements of its 1/DP slice of each gradient bucket.
"""

from __future__ import annotations

import dataclasses
import operator
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from .grad_buffer import bucket_elements, grad_buffer_layout
from ..model_shape import PRECISION_BYTES, ChunkSpec, ModelShape, chunk_parameters, pipeline_chunks

# A stated allowance for what the itemized memory leaves out: on a GPU the CUDA context, NCCL
# and cuBLAS workspaces (outside PyTorch's allocator: the fixed part), and everywhere the
# caching allocator's fragmentation (the fraction). Transient tensors of the backward pass are
# itemized with the activations (their backward working set).
ALLOWANCE_FIXED_BYTES = 2 * 2**30
ALLOWANCE_FRACTION = 0.10


def grad_bytes(precision: str, grad_reduce_in_fp32: bool) -> int:
    return 4 if precision == "fp32" or grad_reduce_in_fp32 else PRECISION_BYTES[precision]


@dataclass(frozen=True)
class OptimizerBytesPerElement:
    """Bytes of optimizer state per parameter element the optimizer owns."""

    master_params: int   # fp32 copy of 16-bit parameters
    moments: int         # Adam exp_avg + exp_avg_sq
    main_grads: int      # fp32 copy of 16-bit gradients at the step

    @property
    def total(self) -> int:
        return self.master_params + self.moments + self.main_grads


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

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer


def state_bytes_for_parameters(num_params: float, precision: str = "bf16",
                               grad_reduce_in_fp32: bool = True, data_parallel_size: int = 1,
                               distributed_optimizer: bool = False) -> StateBytes:
    """Back-of-the-envelope form for a parameter count (no padding): bytes per GPU."""
    opt = optimizer_bytes_per_element(precision, grad_reduce_in_fp32).total
    shards = data_parallel_size if distributed_optimizer else 1
    return StateBytes(int(num_params * PRECISION_BYTES[precision]),
                      int(num_params * grad_bytes(precision, grad_reduce_in_fp32)),
                      int(num_params * opt / shards))


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
    o_bytes = optimizer_bytes_per_element(precision, grad_reduce_in_fp32).total
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
        out.append(StateBytes(weights, numel * g_bytes, held * o_bytes, held))
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


def optimizer_step_bytes(optimizer_elements: int, kernels) -> int:
    """The transient of ``optimizer.step()``: torch's multi-tensor (foreach) Adam, which
    megatron-core falls back to on CUDA without Transformer Engine or apex, allocates
    ``sqrt(exp_avg_sq)`` for every element it updates at once (4 bytes each; measured on an
    H100: the first step's peak was the two new moments plus exactly this copy). TE's and apex's
    fused Adam work in place, and the CPU's single-tensor Adam holds one parameter's copy."""
    return optimizer_elements * 4 if kernels.foreach_adam else 0


def allowance_bytes(itemized: int, device: str = "cuda") -> int:
    fixed = ALLOWANCE_FIXED_BYTES if device == "cuda" else 0
    return int(fixed + ALLOWANCE_FRACTION * itemized)
