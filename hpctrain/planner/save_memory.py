"""Memory a checkpoint save takes on top of training, per GPU and per node's host memory.

The distributed optimizer saves its state in one of two formats (``checkpoint.optimizer_format``),
and they cost very different memory at save time (megatron-core 0.16.1,
``DistributedOptimizer.sharded_state_dict``):

* ``fully_reshardable``: ``get_parameter_state_dp_zero(use_gloo_comm=False,
  return_on_all_ranks=True)`` rebuilds the whole TP×PP shard's optimizer state on EVERY DP
  rank. Per model chunk (gradient buffer) it allocates three fp32 host tensors of the buffer's
  unpadded size ("world tensors": main params, exp_avg, exp_avg_sq); per bucket it copies the
  rank's slice into three host shards, then for each of the three keys moves one shard to the
  GPU, all-gathers it into DP receive tensors on the GPU (the bucket's size), copies those to
  the host and concatenates them. hpctrain then re-pads the world tensors to the buffer's padded
  size (``runtime/checkpoint/state.py``, fix 4): three more fp32 tensors per chunk while the
  unpadded ones are still alive. The result stays alive until the save call returns.
* ``dp_reshardable``: each rank's own optimizer tensors become the checkpoint's pieces; nothing
  is gathered (a few padding tensors of under 64 elements each on the GPU).

Both then hand the tensors this rank writes to the async writer: GPU tensors (the weights, and
with ``dp_reshardable`` the optimizer state) are copied to host memory, host views (the
``fully_reshardable`` slices) are cloned (dist_checkpointing's ``_clone_if_needed``); the fully
parallel save strategy spreads the replicated tensors over the DP group by size, so a rank
writes about 1/DP of them plus, at worst, one more tensor. These copies live until the
background write finishes.

``save_memory`` replays those allocations (in the order the code makes them, with Python's
lifetimes: a name rebound only after its new value exists) and returns the peaks. The GPU
peak at save counts the weights, gradient buffer and optimizer state, the allowance and the
save's transient, but not activations: a save runs between steps, when they are freed.
``tests/plan`` checks the host replay against what megatron-core and hpctrain allocate on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..model_shape import PRECISION_BYTES, ModelShape, chunk_parameters, pipeline_chunks
from .grad_buffer import bucket_elements, grad_buffer_layout

FP32 = 4
STATE_KEYS = 3                       # main param, exp_avg, exp_avg_sq (fp32 each)
# A save is "comfortable" in host memory when every rank of a node together needs at most this
# fraction of the node's memory: the rest holds the ranks' own host memory (CUDA context, pinned
# buffers, data loader workers) and the page cache the checkpoint writes go through.
HOST_SAVE_FRACTION = 0.5
# What ``auto`` assumes a node has when the profile says neither slurm.mem nor
# node.host_memory_gb (any GPU node has at least this much).
UNKNOWN_HOST_BYTES = 32 * 2**30


@dataclass(frozen=True)
class BufferShape:
    """One model chunk's gradient buffer, as the distributed optimizer sees it."""

    numel: int                               # padded
    numel_unpadded: int                      # megatron's: up to each bucket's last parameter
    buckets: tuple[tuple[int, int], ...]     # (padded size, size up to its last parameter)
    params: int                              # parameter elements (no padding)
    largest_param: int


@lru_cache(maxsize=2048)
def buffer_shapes(shape: ModelShape, tp: int, pp: int, vpp: int | None, dp: int,
                  overlap_grad_reduce: bool = False,
                  bucket_size: int | None = None) -> tuple[tuple[BufferShape, ...], ...]:
    """Per pipeline rank, its chunks' buffers (distributed optimizer padding)."""
    out = []
    for rank, chunks in enumerate(pipeline_chunks(shape.num_layers, pp, vpp)):
        shapes = []
        for chunk in chunks:
            params = chunk_parameters(shape, tp, pp, chunk)
            bucket = bucket_elements(overlap_grad_reduce, dp, rank == 0 and chunk.virtual_index == 0,
                                     bucket_size)
            lay = grad_buffer_layout(params, dp, True, bucket)
            buckets = []
            for start, end in lay.buckets:
                last = max((e for _, e in lay.params_in_bucket(start, end)), default=start)
                buckets.append((end - start, last - start))
            shapes.append(BufferShape(lay.numel, sum(u for _, u in buckets), tuple(buckets),
                                      lay.numel_unpadded, max(p.numel for p in params)))
        out.append(tuple(shapes))
    return tuple(out)


class _Live:
    """Bytes alive on one device, and the most ever alive at once."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    def alloc(self, n: int) -> None:
        self.now += n
        self.peak = max(self.peak, self.now)

    def free(self, n: int) -> None:
        self.now -= n


def gather_replay(buffers: tuple[BufferShape, ...], dp: int, device: str = "cuda",
                  realign: bool = True) -> tuple[int, int, int]:
    """(host peak, GPU peak, host bytes held at the end) of ``get_parameter_state_dp_zero``
    with NCCL on all ranks, then hpctrain's re-padding of the world tensors.

    On a CPU run "GPU" tensors are host tensors and ``.cpu()`` returns them unchanged: the
    receive list IS the host copy, and the send shard is not copied."""
    host, gpu = _Live(), _Live()
    on_gpu = device == "cuda"
    cat_prev = 0        # the last key's concatenation, alive until the next one replaces it
    copies_prev = 0     # the last key's host copies of the receive list
    shards_prev = 0     # the last bucket's three host shards
    world = []
    for buf in buffers:
        w = STATE_KEYS * FP32 * buf.numel_unpadded
        host.alloc(w)
        world.append(w)
        for padded, _ in buf.buckets:
            local = padded // dp
            shards = STATE_KEYS * FP32 * local
            host.alloc(shards)
            host.free(shards_prev)
            shards_prev = shards
            for _ in range(STATE_KEYS):
                recv = FP32 * padded
                (gpu if on_gpu else host).alloc(recv)      # receive list (new list first)
                if on_gpu:
                    host.free(copies_prev)                 # then the old list's name is rebound
                    copies_prev = 0
                    gpu.alloc(FP32 * local)                # send_tensor.cuda()
                else:
                    host.free(copies_prev)
                # all_gather; send freed
                if on_gpu:
                    gpu.free(FP32 * local)
                    host.alloc(recv)                       # [t.cpu() for t in recv_tensors]
                    gpu.free(recv)
                copies_prev = recv
                host.alloc(recv)                           # torch.cat
                host.free(cat_prev)
                cat_prev = recv
    host.free(shards_prev + copies_prev + cat_prev)        # the function's locals go
    held = sum(world)
    if realign:
        for i, buf in enumerate(buffers):
            padded = STATE_KEYS * FP32 * buf.numel
            host.alloc(padded)
            host.free(world[i])
            held += padded - world[i]
    return host.peak, gpu.peak, held


@dataclass(frozen=True)
class SaveMemory:
    """A checkpoint save of one layout, on its most loaded pipeline rank."""

    optimizer_format: str
    gpu_transient: int          # allocated on the GPU by the save, beyond the training state
    gpu_at_save: int            # weights + gradients + optimizer + allowance + transient
    gathered_per_rank: int      # host: the rebuilt optimizer state (fully_reshardable)
    async_copy_per_rank: int    # host: what this rank hands the background writer
    host_per_rank: int          # host peak of one rank during the save
    ranks_per_node: int
    gpu_limit: int | None
    host_limit: int | None      # the node's host memory; None: unknown

    @property
    def host_per_node(self) -> int:
        return self.host_per_rank * self.ranks_per_node

    @property
    def fits_gpu(self) -> bool | None:
        return None if self.gpu_limit is None else self.gpu_at_save <= self.gpu_limit

    @property
    def fits_host(self) -> bool | None:
        if self.host_limit is None:
            return None
        return self.host_per_node <= HOST_SAVE_FRACTION * self.host_limit

    @property
    def fits(self) -> bool | None:
        verdicts = [v for v in (self.fits_gpu, self.fits_host) if v is not None]
        return None if not verdicts else all(verdicts)

    def to_json(self) -> dict:
        return {"optimizer_format": self.optimizer_format, "gpu_transient": self.gpu_transient,
                "gpu_at_save": self.gpu_at_save, "gathered_per_rank": self.gathered_per_rank,
                "async_copy_per_rank": self.async_copy_per_rank,
                "host_per_rank": self.host_per_rank, "host_per_node": self.host_per_node,
                "host_limit": self.host_limit, "fits_gpu": self.fits_gpu,
                "fits_host": self.fits_host, "fits": self.fits}


def async_copy_bytes(buffers: tuple[BufferShape, ...], dp: int, weight_bytes: int,
                     owned_elements: int, fmt: str) -> int:
    """Host bytes of this rank's share of the checkpoint: 1/DP of the tensors replicated over
    DP (the weights; the optimizer state too with fully_reshardable, or without the distributed
    optimizer: ``fmt`` "replicated") plus one more tensor at worst, and with dp_reshardable the
    rank's own optimizer slice."""
    params = sum(b.params for b in buffers)
    largest = max((b.largest_param for b in buffers), default=0)
    replicated = weight_bytes * params
    own = 0
    if fmt == "dp_reshardable":
        own = STATE_KEYS * FP32 * owned_elements
    else:
        replicated += STATE_KEYS * FP32 * params
    return -(-replicated // dp) + FP32 * largest + own


def save_memory(shape: ModelShape, fmt: str, *, tp: int, pp: int, vpp: int | None, dp: int,
                precision: str, states, allowance, device: str, ranks_per_node: int,
                gpu_limit: int | None, host_limit: int | None, owned_per_stage: tuple[int, ...],
                distributed_optimizer: bool = True, overlap_grad_reduce: bool = False,
                bucket_size: int | None = None, runtime_buffers: int = 0) -> SaveMemory:
    """The save's memory where it peaks (the most loaded pipeline rank for the GPU and for the
    host, which may differ). ``states``: each pipeline rank's ``StateBytes``;
    ``allowance(itemized)``: the planner's allowance; ``owned_per_stage``: the parameter
    elements whose optimizer state the most loaded DP rank keeps, per pipeline rank;
    ``runtime_buffers``: the runtime's own allocations. Between steps the fp32 main gradients of a
    16-bit buffer are still allocated (freed by the next step's ``zero_grad``)."""
    stages = buffer_shapes(shape, tp, pp, vpp, dp, overlap_grad_reduce, bucket_size)
    weight_bytes = PRECISION_BYTES[precision]
    copy_fmt = fmt if distributed_optimizer else "replicated"
    gpu_side, host_side = [], []
    for rank, buffers in enumerate(stages):
        base = states[rank].between_steps + runtime_buffers   # a save runs between steps
        transient = gathered = host_gather = 0
        if distributed_optimizer and fmt == "fully_reshardable":
            host_gather, transient, gathered = gather_replay(buffers, dp, device)
        copy = async_copy_bytes(buffers, dp, weight_bytes, owned_per_stage[rank], copy_fmt)
        host = max(host_gather, gathered + copy)
        if device == "cuda":
            gpu_side.append((base + allowance(base) + transient, transient))
        else:                       # a CPU run: the training state is host memory too
            host += base
        host_side.append((host, gathered, copy))
    gpu_at_save, transient = max(gpu_side) if gpu_side else (0, 0)
    host, gathered, copy = max(host_side)
    return SaveMemory(fmt, transient, gpu_at_save, gathered, copy, host, ranks_per_node,
                      gpu_limit if device == "cuda" else None, host_limit)


def choose_format(fully: SaveMemory, distributed_optimizer: bool,
                  device: str = "cuda") -> tuple[str, str]:
    """What ``checkpoint.optimizer_format: auto`` becomes, and why (one clause).

    On GPUs: dp_reshardable, Megatron-LM's default. Measured on one H200 (``tools/gpu_check``,
    a 0.95B GPT, README "GPU check"): fully_reshardable's rebuild of the optimizer state
    blocked training about 60 s per save, dp_reshardable's copy to host 9.8 s; a job that must
    resume on another TP/PP asks for fully_reshardable by name. On the CPU rehearsal (small
    models, where practising such resumes is the point): fully_reshardable when its save takes
    at most ``HOST_SAVE_FRACTION`` of the node's host memory (``UNKNOWN_HOST_BYTES`` when the
    profile does not say), else dp_reshardable."""
    gib = 2**30
    if not distributed_optimizer:
        return "fully_reshardable", "no distributed optimizer, so nothing is gathered at save"
    if device == "cuda":
        return "dp_reshardable", ("Megatron-LM's default on GPUs: fully_reshardable's rebuild "
                                  "blocked training about 6x longer per save on an H200 (set "
                                  "checkpoint.optimizer_format: fully_reshardable to resume on "
                                  "another TP/PP)")
    limit = fully.host_limit or UNKNOWN_HOST_BYTES
    known = "" if fully.host_limit else " (assumed: the profile gives no node.host_memory_gb)"
    budget = HOST_SAVE_FRACTION * limit
    need = f"{fully.host_per_node / gib:.1f} GiB of host memory per node"
    if fully.host_per_node > budget:
        return "dp_reshardable", (f"fully_reshardable's save would need {need}, over "
                                  f"{HOST_SAVE_FRACTION:.0%} of {limit / gib:g} GiB{known}")
    return "fully_reshardable", (f"its save needs {need}, within {HOST_SAVE_FRACTION:.0%} of "
                                 f"{limit / gib:g} GiB{known}")
