"""Feeding megatron-core's pipeline schedules: microbatches, the forward step and the loss.

As Megatron-LM's ``get_batch`` does, only the model chunks that use data look at it — the
first pipeline stage embeds the tokens, the last computes the loss against the labels — and
only tensor-parallel rank 0 of those stages reads: it broadcasts each microbatch (one
``[micro_batch, seq_length + 1]`` tensor: tokens and labels are its two shifted views) to the
other ranks of its TP group. Middle stages read nothing.

Reading: a torch ``DataLoader`` walks this DP rank's slice of each global batch
(``hpctrain.data.gpt_dataset``) microbatch by microbatch, ahead of the schedule, in
``data.num_workers`` worker processes (Megatron-LM's default of 2 on GPUs) into pinned host
memory, so the copy to the GPU (``non_blocking``) overlaps compute. The CPU rehearsal reads
in the rank itself (no workers, nothing to pin) unless the job asks for workers. The reader
starts at the loop's ``consumed_samples`` and is moved whenever the loop is somewhere else
(a resume); every step consumes exactly ``num_microbatches`` microbatches, skipped or not.
"""

from __future__ import annotations

from functools import partial

from ..data.gpt_dataset import GPTSamples, rank_microbatch_positions

GPU_WORKERS = 2   # Megatron-LM's --num-workers default


def reads_data(tp_rank: int, first_stage: bool, last_stage: bool) -> bool:
    """Whether a rank reads microbatches itself (the others receive them, or need none)."""
    return tp_rank == 0 and (first_stage or last_stage)


class _Windows:
    """Map-style dataset: position in the visiting order -> the sample's tokens. Token ids are
    checked in the rank (:meth:`BatchFeeder._next_rows`), where the error stays one line."""

    def __init__(self, samples: GPTSamples) -> None:
        self.samples = samples

    def __getitem__(self, position: int):
        import torch
        return torch.from_numpy(self.samples.sample(position, check=False))


class _MicrobatchOrder:
    """Batch sampler: this DP rank's microbatches, step after step, from ``consumed``."""

    def __init__(self, consumed: int, layout, dp_rank: int) -> None:
        self.consumed, self.layout, self.dp_rank = consumed, layout, dp_rank

    def __iter__(self):
        lay, consumed = self.layout, self.consumed
        while True:
            yield from rank_microbatch_positions(consumed, lay.global_batch_size, self.dp_rank,
                                                 lay.data_parallel_size, lay.micro_batch_size)
            consumed += lay.global_batch_size


class BatchFeeder:
    def __init__(self, samples: GPTSamples, layout, device: str,
                 num_workers: int | None = None) -> None:
        import torch
        from megatron.core import parallel_state as ps
        self.samples = samples
        self.layout = layout
        self.dp_rank = ps.get_data_parallel_rank()
        self.tp_size = ps.get_tensor_model_parallel_world_size()
        self.tp_group = ps.get_tensor_model_parallel_group() if self.tp_size > 1 else None
        self.tp_src = ps.get_tensor_model_parallel_src_rank()
        self.where = (f"TP rank {ps.get_tensor_model_parallel_rank()}, pipeline stage "
                      f"{ps.get_pipeline_model_parallel_rank()}")
        self.reads = reads_data(ps.get_tensor_model_parallel_rank(),
                                ps.is_pipeline_first_stage(ignore_virtual=True),
                                ps.is_pipeline_last_stage(ignore_virtual=True))
        self.gpu = device == "cuda"
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.gpu else None
        self.num_workers = (GPU_WORKERS if self.gpu else 0) if num_workers is None else num_workers
        seq = samples.seq_length
        self.shape = (layout.micro_batch_size, seq + 1)
        self.positions = torch.arange(seq, dtype=torch.long, device=self.device).unsqueeze(0).expand(
            layout.micro_batch_size, seq)
        self.loss_mask = torch.ones(layout.micro_batch_size, seq, dtype=torch.float32,
                                    device=self.device)
        self._it = None
        self._next_consumed: int | None = None
        self.microbatches_read = 0
        self.timer = None       # straggler_timing.ComputeTimer: times every forward pass

    def _reader(self, consumed: int):
        """A reader from sample ``consumed`` on. Its own generator: each iterator torch makes
        draws its workers' base seed from the loader's generator, which is otherwise torch's
        global one, the one dropout draws from (on the CPU rehearsal; hidden dropout on GPUs
        draws from CUDA's). A reader made at a resume would then shift every later dropout
        mask against the uninterrupted run's, whose reader was made at its first step."""
        import torch
        from torch.utils.data import DataLoader
        loader = DataLoader(_Windows(self.samples),
                            batch_sampler=_MicrobatchOrder(consumed, self.layout, self.dp_rank),
                            num_workers=self.num_workers, pin_memory=self.gpu,
                            prefetch_factor=2 if self.num_workers else None,
                            generator=torch.Generator().manual_seed(consumed))
        return iter(loader)

    def iterators(self, consumed_samples: int, chunks: int):
        """The step's data iterator for each model chunk (None where this rank reads nothing).
        At most one chunk of a rank reads: the first stage's first chunk or the last stage's
        last chunk (one rank is both only without pipelining, with one chunk)."""
        it = None
        if self.reads:
            if self._it is None or consumed_samples != self._next_consumed:
                self.close()
                self._it = self._reader(consumed_samples)
            self._next_consumed = consumed_samples + self.layout.global_batch_size
            it = self._it
        return [it] * chunks if chunks > 1 else it

    def close(self) -> None:
        """Stop the reader (and its worker processes)."""
        self._it = None
        self._next_consumed = None

    def _next_rows(self, data_iterator):
        """This microbatch on this rank's device: read, or received from TP rank 0."""
        import torch
        import torch.distributed as dist
        rows = None
        if self.reads:
            rows = next(data_iterator)
            self.microbatches_read += 1
            self.samples.check_tokens(int(rows.max()), int(rows.min()))
            if self.device is not None:
                rows = rows.to(self.device, non_blocking=True)
        if self.tp_group is not None:
            if rows is None:
                rows = torch.empty(self.shape, dtype=torch.int64, device=self.device)
            dist.broadcast(rows, src=self.tp_src, group=self.tp_group)
        return rows

    def forward_step(self, poison: bool = False):
        """The ``forward_step_func`` for this step (``poison``: make the loss NaN, tests only)."""
        from megatron.core.utils import get_attr_wrapped_model
        positions, mask = self.positions, self.loss_mask

        def step(data_iterator, model):
            embeds = get_attr_wrapped_model(model, "pre_process")
            scores = get_attr_wrapped_model(model, "post_process")
            rows = self._next_rows(data_iterator) if embeds or scores else None
            tokens = rows[:, :-1].contiguous() if embeds else None
            labels = rows[:, 1:].contiguous() if scores else None
            timer = self.timer
            if timer is not None:
                timer.start()
            output = model(tokens, positions if embeds else None, None, labels=labels)
            if timer is not None:
                timer.stop()
            return output, partial(loss_func, mask, poison)

        return step


def loss_func(loss_mask, poison, output_tensor):
    """Mean token loss of one microbatch. The schedule divides the returned loss in place by
    the number of microbatches, so what is reported is a detached copy (kept on the device:
    the loop adds the microbatches up there and reads one number per step)."""
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1)
    loss = (losses * mask).sum() / mask.sum()
    if poison:
        loss = loss * float("nan")
    return loss, {"loss": loss.detach().clone()}


def step_loss(reports: list[dict], num_microbatches: int):
    """The mean of the microbatch losses the schedule returned, as a device scalar (no host
    synchronisation); None on ranks that compute no loss."""
    import torch
    if not reports:
        return None
    return torch.stack([r["loss"] for r in reports]).double().sum() / num_microbatches
