"""Communication overlapped with compute, wired as Megatron-LM's ``training.py`` wires it.

Three overlaps, all megatron-core's own machinery; hpctrain only switches them on and connects
them the way ``megatron/training/training.py`` (core_v0.16.1) does:

* ``overlap_grad_reduce``: gradients are reduced (all-reduce, or reduce-scatter under the
  distributed optimizer) bucket by bucket while the backward pass still runs. The schedule
  suppresses the reduction until a chunk's last microbatch through ``config.no_sync_func``
  (each chunk's ``DDP.no_sync``), and with several model chunks it launches each chunk's
  reduction itself through ``config.grad_sync_func`` (``start_grad_sync``; Megatron-LM's
  default ``align_grad_reduce``).
* ``overlap_param_gather`` (distributed optimizer only): after the optimizer step the
  updated parameter shards are all-gathered lazily, bucket by bucket, by a forward pre-hook
  in the next forward pass; with several chunks the schedule dispatches each chunk's gather
  through ``config.param_sync_func`` (``start_param_sync``, ``align_param_gather``).
  Megatron-LM keeps the pre-hook off until the first successful update (a bad load or
  initialization must not spread through the first gather) and forces a synchronous gather
  before anything reads the parameters outside a forward pass: a checkpoint save, the end of
  training. :class:`ParamGatherHooks` does exactly that.
* ``overlap_p2p_comm`` (interleaved schedule): pipeline sends and receives are posted
  asynchronously and waited for only when the tensor is needed; batched p2p
  (``batch_p2p_comm``) is then off, as in Megatron-LM (``batch_p2p_comm = not
  overlap_p2p_comm``). Without a virtual pipeline the 1F1B schedule batches its p2p.

Bucket size: ``parallel.ddp_bucket_size`` parameters per bucket (Megatron-LM's
``--ddp-bucket-size``; null: megatron-core's default max(40M, 1M × DP)). The same settings
run on the CPU rehearsal (gloo supports every collective these use).
"""

from __future__ import annotations


def overlap_p2p(job, layout) -> bool:
    """Megatron-LM's rule: p2p overlap only with the interleaved schedule."""
    return bool(job.parallel.overlap_p2p_comm and layout.virtual_pipeline_model_parallel_size)


def ddp_config(job, layout, device: str):
    """megatron-core's ``DistributedDataParallelConfig`` for ``job`` on ``layout``."""
    from megatron.core.distributed import DistributedDataParallelConfig

    p, t = job.parallel, job.train
    distopt = bool(p.use_distributed_optimizer)
    grad = bool(p.overlap_grad_reduce)
    # Megatron-LM: parameter gather overlap needs the distributed optimizer and overlapped
    # gradient reduction; aligned gathers only with the interleaved schedule (with one chunk
    # the forward pre-hook must dispatch the next bucket's gather itself)
    gather = bool(p.overlap_param_gather and distopt and grad)
    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=t.grad_reduce_in_fp32 or device != "cuda",
        overlap_grad_reduce=grad, overlap_param_gather=gather,
        align_param_gather=gather and bool(layout.virtual_pipeline_model_parallel_size),
        use_distributed_optimizer=distopt, bucket_size=p.ddp_bucket_size)


def wire_schedule(config, model: list, ddp: object) -> None:
    """Set the schedule's sync hooks on ``config`` as Megatron-LM's ``train()`` does."""
    config.no_sync_func = None
    config.grad_sync_func = None
    config.param_sync_func = None
    if ddp.overlap_grad_reduce:
        config.no_sync_func = [m.no_sync for m in model]
        config.grad_sync_func = [m.start_grad_sync for m in model]   # align_grad_reduce
        if len(model) == 1:
            config.no_sync_func = config.no_sync_func[0]
            config.grad_sync_func = config.grad_sync_func[0]
    if ddp.overlap_param_gather and ddp.align_param_gather:
        config.param_sync_func = [m.start_param_sync for m in model]
        if len(model) == 1:
            config.param_sync_func = config.param_sync_func[0]


class ParamGatherHooks:
    """The forward pre-hook of ``overlap_param_gather``, managed as Megatron-LM manages it:
    off (and no ``param_sync_func``) until the first successful update, a forced synchronous
    gather before checkpoint saves, and a final one when training ends."""

    def __init__(self, model: list, config) -> None:
        self.model = model
        self.config = config
        self.used = bool(model) and getattr(model[0], "use_forward_hook", False)
        self.enabled = False
        self._param_sync_func = None
        if self.used:
            for m in model:
                m.disable_forward_pre_hook(param_sync=False)
            self._param_sync_func, config.param_sync_func = config.param_sync_func, None

    def after_update(self) -> None:
        """An update succeeded: from now on the next forward pass gathers the parameters."""
        if self.used and not self.enabled:
            for m in self.model:
                m.enable_forward_pre_hook()
            self.config.param_sync_func = self._param_sync_func
            self.enabled = True

    def sync(self) -> None:
        """Gather every parameter now (before a checkpoint save reads them)."""
        if self.used:
            for m in self.model:
                m.start_param_sync(force_sync=True)

    def close(self) -> None:
        """Training is over: hooks off, parameters gathered (Megatron-LM's end of train())."""
        if self.used and self.enabled:
            for m in self.model:
                m.disable_forward_pre_hook(param_sync=True)
            self.config.param_sync_func = self._param_sync_func
            self.enabled = False


def describe(model: list, config) -> str:
    """One log line: which overlaps this run uses."""
    ddp = model[0].ddp_config
    buckets = sum(len(b.buckets) for b in model[0].buffers)
    parts = [f"gradient reduction {'overlapped' if ddp.overlap_grad_reduce else 'after backward'}"
             f" ({buckets} bucket{'s' if buckets != 1 else ''}"
             + (f" of up to {ddp.bucket_size:,} parameters" if ddp.bucket_size else "")
             + (" in the first chunk" if len(model) > 1 else "") + ")"]
    if ddp.use_distributed_optimizer:
        parts.append("parameter gather " + ("overlapped with the next forward"
                                            if ddp.overlap_param_gather else "after the step"))
    if config.pipeline_model_parallel_size > 1:
        parts.append("pipeline p2p " + ("overlapped" if config.overlap_p2p_comm else
                                        "batched" if config.batch_p2p_comm else "one by one"))
    return "; ".join(parts)
