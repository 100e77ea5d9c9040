"""Feeding megatron-core's pipeline schedules: microbatches, the forward step and the loss.

Each step, this DP rank's slice of the global batch (``hpctrain.data.gpt_dataset``) becomes
``num_microbatches`` dicts of tokens/labels/positions. Every model chunk gets its own
iterator over the same list (the interleaved schedule runs each chunk once per microbatch);
stages that neither embed nor compute the loss never look at them.
"""

from __future__ import annotations

from functools import partial

from ..data.gpt_dataset import GPTSamples, rank_microbatches


class BatchFeeder:
    def __init__(self, samples: GPTSamples, layout, dp_rank: int, device: str) -> None:
        import torch
        self.samples = samples
        self.layout = layout
        self.dp_rank = dp_rank
        self.device = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else None
        seq = samples.seq_length
        self.positions = torch.arange(seq, dtype=torch.long, device=self.device).unsqueeze(0).expand(
            layout.micro_batch_size, seq)
        self.loss_mask = torch.ones(layout.micro_batch_size, seq, dtype=torch.float32,
                                    device=self.device)

    def microbatches(self, consumed_samples: int) -> list[dict]:
        import torch
        lay = self.layout
        out = []
        for rows in rank_microbatches(self.samples, consumed_samples, lay.global_batch_size,
                                      self.dp_rank, lay.data_parallel_size, lay.micro_batch_size):
            t = torch.from_numpy(rows)
            if self.device is not None:
                t = t.to(self.device, non_blocking=True)
            out.append({"tokens": t[:, :-1].contiguous(), "labels": t[:, 1:].contiguous()})
        return out

    def iterators(self, consumed_samples: int, chunks: int):
        batches = self.microbatches(consumed_samples)
        its = [iter(batches) for _ in range(chunks)]
        return its if chunks > 1 else its[0]

    def forward_step(self, poison: bool = False):
        """The ``forward_step_func`` for this step (``poison``: make the loss NaN, tests only)."""
        positions, mask = self.positions, self.loss_mask

        def step(data_iterator, model):
            batch = next(data_iterator)
            output = model(batch["tokens"], positions, None, labels=batch["labels"])
            return output, partial(loss_func, mask, poison)

        return step


def loss_func(loss_mask, poison, output_tensor):
    """Mean token loss of one microbatch. The schedule divides the returned loss in place by
    the number of microbatches, so what is reported is a detached copy."""
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1)
    loss = (losses * mask).sum() / mask.sum()
    if poison:
        loss = loss * float("nan")
    return loss, {"loss": loss.detach().clone()}
