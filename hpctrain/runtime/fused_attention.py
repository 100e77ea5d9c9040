"""Core attention through ``torch.nn.functional.scaled_dot_product_attention`` for megatron-core's
local layer spec: fused attention on a GPU without Transformer Engine.

megatron-core has no fused attention of its own outside Transformer Engine: its local spec runs
``DotProductAttention``, which materializes the b·a·s² scores (and, without apex's softmax
kernels, their fp32 softmax beside a 16-bit cast) and keeps them for backward. torch ships
fused kernels (FlashAttention-2, cuDNN's fused attention, the memory-efficient kernel) behind
one call; :class:`TorchFusedAttention` has ``DotProductAttention``'s constructor and forward
signature and goes into the local spec's ``core_attention`` seam (``layers.layer_spec``).

* It holds no parameters and no buffers, so its checkpoints are the local spec's (and load
  into Transformer Engine's spec like any local-spec checkpoint).
* Causal masking is the kernel's (``is_causal``): no s×s mask is built. A mask that megatron
  passes is honoured as ``DotProductAttention`` honours it (True = masked out).
* GQA: key and value keep their g heads (``enable_gqa``) where the kernel takes them so
  (torch: FlashAttention-2 and the math kernel); where only cuDNN's or the memory-efficient
  kernel can run (``attention_backend: fused``, fp32, a head size flash refuses), key and
  value are repeated to a heads first, as ``DotProductAttention`` does, and the log says so.
* The softmax scale is ``DotProductAttention``'s net scale (``1/sqrt(d)`` or the config's
  ``softmax_scale``; query-key layer scaling divides and multiplies back by the layer number,
  so it cancels).
* Dropout draws from megatron's model-parallel CUDA RNG tracker, as ``DotProductAttention``
  does (without sequence parallelism): the kernel's Philox seed comes from the generator the
  tracker forks.
* The kernel is chosen, not left to torch's defaults: ``sdpa_kernel`` with the ordered list of
  :func:`kernel_order` (``set_priority``), and the one that runs is read at the first forward
  from torch's own dispatcher (``torch._fused_sdp_choice``) and kept in :data:`KERNEL_IN_USE`
  for the log, ``result.json`` and ``tools/gpu_check``.

Imports torch and megatron: call only inside a rank.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from megatron.core import tensor_parallel
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.utils import divide

# model.attention_backend -> torch kernels, in the order they are tried (GPU). The order is
# deliberate: FlashAttention-2 first (GQA without copies, dropout, a deterministic backward
# under torch.use_deterministic_algorithms), cuDNN's fused attention next (fast on Hopper, but
# torch itself ranks it last after correctness reports, and it has no deterministic backward),
# the memory-efficient kernel last. The math kernel (the s² scores again) is never a silent
# fallback on a GPU: a shape no fused kernel takes fails at the first forward, naming the
# kernels tried.
GPU_KERNELS = {
    "auto": (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
             SDPBackend.EFFICIENT_ATTENTION),
    "flash": (SDPBackend.FLASH_ATTENTION,),
    "fused": (SDPBackend.CUDNN_ATTENTION,),
}
# deterministic mode: no cuDNN (torch has no deterministic backward for it); flash and
# memory-efficient attention run their deterministic backward under
# torch.use_deterministic_algorithms(True)
DETERMINISTIC_GPU_KERNELS = {
    "auto": (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION),
    "flash": (SDPBackend.FLASH_ATTENTION,),
}
# the CPU rehearsal: torch's CPU flash kernel, or the math kernel where it cannot run
# (attention dropout: the CPU flash kernel has none)
CPU_KERNELS = (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH)

KERNEL_NAMES = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.CUDNN_ATTENTION: "cudnn",
                SDPBackend.EFFICIENT_ATTENTION: "efficient", SDPBackend.MATH: "math"}

KERNEL_IN_USE: dict[str, str] = {}     # filled at the first forward: {"kernel": ..., "tried": ...}


class KernelChoiceError(ValueError):
    """model.attention_backend asks for kernels that this mode cannot use."""


def kernel_order(backend: str, device: str, deterministic: bool) -> tuple:
    """The torch kernels ``model.attention_backend`` may use on ``device``, in order."""
    if device != "cuda":
        return CPU_KERNELS
    table = DETERMINISTIC_GPU_KERNELS if deterministic else GPU_KERNELS
    if backend not in table:
        raise KernelChoiceError(
            f"model.attention_backend: {backend} cannot run with train.deterministic_mode: "
            f"cuDNN's fused attention has no deterministic backward; use auto or flash"
            if deterministic and backend in GPU_KERNELS else
            f"model.attention_backend: {backend} is not a fused attention kernel")
    return table[backend]


def kernel_name(backend) -> str:
    return KERNEL_NAMES.get(backend, str(backend))


def describe_kernels(kernels) -> str:
    return ",".join(kernel_name(k) for k in kernels)


class TorchFusedAttention(MegatronModule):
    """``DotProductAttention``'s drop-in: same constructor, same forward, no score tensors.

    ``kernels`` (the ordered torch backends) is bound by ``layers.layer_spec`` through the
    module spec's params."""

    def __init__(self, config, layer_number: int, attn_mask_type: AttnMaskType,
                 attention_type: str, attention_dropout: float | None = None,
                 softmax_scale: float | None = None, cp_comm_type: str | None = None,
                 pg_collection=None, kernels: tuple = CPU_KERNELS):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("context parallelism needs Transformer Engine's attention")
        if getattr(config, "softmax_type", "vanilla") != "vanilla":
            raise ValueError(f"softmax_type {config.softmax_type} needs DotProductAttention")
        if getattr(config, "window_size", None) is not None:
            raise ValueError("sliding-window attention needs DotProductAttention")
        if pg_collection is None:
            from megatron.core.process_groups_config import ProcessGroupCollection
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        self.pg_collection = pg_collection
        self.tp_group = pg_collection.tp
        tp = pg_collection.tp.size()
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        projection = config.kv_channels * config.num_attention_heads
        self.hidden_size_per_partition = divide(projection, tp)
        self.heads_per_partition = divide(config.num_attention_heads, tp)
        self.groups_per_partition = divide(config.num_query_groups, tp)
        head_dim = divide(projection, config.num_attention_heads)
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(
            head_dim)
        self.dropout_p = config.attention_dropout if attention_dropout is None else \
            attention_dropout
        self.kernels = tuple(kernels)
        # GQA without repeating key and value: None until the first GQA forward asks torch's
        # dispatcher (:func:`takes_gqa`); the same answer for every later forward (one shape)
        self.native_gqa: bool | None = None

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        """query [sq, b, np, hn], key/value [sk, b, ng, hn] -> context [sq, b, np·hn]."""
        if packed_seq_params is not None:
            raise ValueError("packed sequences need Transformer Engine's attention")
        if attention_bias is not None:
            raise ValueError("an attention bias needs DotProductAttention")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        # [s, b, heads, d] -> [b, heads, s, d]: views, the kernels take any batch/head strides
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        sdpa_mask, causal = None, False
        if attention_mask is not None:
            sdpa_mask = ~attention_mask          # megatron: True = masked out; torch: attend
        elif mask_type == AttnMaskType.causal and q.size(2) > 1:
            if q.size(2) != k.size(2):
                raise ValueError("causal attention with a query shorter than the keys "
                                 "(inference) needs DotProductAttention")
            causal = True
        p = self.dropout_p if self.training else 0.0
        gqa = self.heads_per_partition != self.groups_per_partition
        with sdpa_kernel(list(self.kernels), set_priority=True):
            if gqa and self.native_gqa is None:
                self.native_gqa = takes_gqa(q, k, v, sdpa_mask, p, causal, self.softmax_scale)
                if not self.native_gqa:
                    from .log import logger
                    logger.info(f"attention: no kernel of {describe_kernels(self.kernels)} "
                                f"takes grouped key/value heads here; key and value are "
                                f"repeated to {self.heads_per_partition} heads per rank")
            if gqa and not self.native_gqa:
                repeat = self.heads_per_partition // self.groups_per_partition
                k, v = (t.repeat_interleave(repeat, dim=1) for t in (k, v))
                gqa = False
            if not KERNEL_IN_USE:
                _record_choice(q, k, v, sdpa_mask, p, causal, self.softmax_scale, gqa,
                               self.kernels)
            if p > 0 and not self.config.sequence_parallel:
                with tensor_parallel.get_cuda_rng_tracker().fork():
                    out = F.scaled_dot_product_attention(
                        q, k, v, attn_mask=sdpa_mask, dropout_p=p, is_causal=causal,
                        scale=self.softmax_scale, enable_gqa=gqa)
            else:
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=sdpa_mask, dropout_p=p, is_causal=causal,
                    scale=self.softmax_scale, enable_gqa=gqa)
        # [b, np, sq, hn] -> [sq, b, np·hn]: always a fresh tensor (the kernel keeps ``out``
        # for its backward; the projection keeps this one), whatever layout the kernel chose
        context = out.permute(2, 0, 1, 3).clone(memory_format=torch.contiguous_format)
        return context.view(context.size(0), context.size(1), self.hidden_size_per_partition)

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        return {}   # no parameters: checkpoints are the local spec's


def takes_gqa(q, k, v, mask, p, causal, scale) -> bool:
    """Whether a kernel enabled here (inside ``sdpa_kernel``) runs GQA on key and value as they
    are. torch's dispatcher answers: only FlashAttention-2 and the math kernel take grouped
    heads (``enable_gqa``); with neither usable it finds no kernel at all."""
    try:
        chosen = SDPBackend(torch._fused_sdp_choice(q, k, v, mask, p, causal, scale=scale,
                                                    enable_gqa=True))
    except RuntimeError:
        return False
    return chosen != SDPBackend.ERROR


def _record_choice(q, k, v, mask, p, causal, scale, gqa, kernels) -> None:
    """Which kernel torch's dispatcher takes for these inputs under ``kernels`` (the first
    forward's; every layer has the same shapes)."""
    try:
        chosen = SDPBackend(torch._fused_sdp_choice(q, k, v, mask, p, causal, scale=scale,
                                                    enable_gqa=gqa))
    except Exception as e:   # noqa: BLE001 - a record for the log; the call itself decides
        KERNEL_IN_USE.update(kernel=f"unknown ({type(e).__name__})",
                             tried=describe_kernels(kernels))
        return
    KERNEL_IN_USE.update(kernel=kernel_name(chosen), tried=describe_kernels(kernels),
                         device=q.device.type)
    from .log import logger
    logger.info(f"attention: {kernel_in_use()} at the first forward "
                f"(b={q.size(0)}, heads={q.size(1)}/{k.size(1)}, s={q.size(2)}, d={q.size(3)}, "
                f"{str(q.dtype).replace('torch.', '')}, dropout {p})")


def kernel_in_use() -> str | None:
    """After a forward: ``"flash (tried flash,cudnn,efficient)"``; None before."""
    if not KERNEL_IN_USE:
        return None
    return f"torch sdpa {KERNEL_IN_USE['kernel']} (tried {KERNEL_IN_USE['tried']})"


def kernels_by_name(names) -> tuple:
    """The SDPBackend members for names from :func:`kernel_name` (a LayerImpl's record)."""
    by_name = {v: k for k, v in KERNEL_NAMES.items()}
    return tuple(by_name[n] for n in names)
