"""GPT training samples from an indexed dataset: fixed-length windows in a seeded order.

The token stream is every document back to back (end-of-document ids included), exactly
the ``.bin`` file. Sample ``j`` is the window ``tokens[j·s : j·s + s + 1]`` (inputs are the
first s, labels the last s, so neighbouring samples share one token, as in Megatron-LM).
Samples are visited in a random order per epoch, drawn from ``(seed, epoch)`` and computed
position by position (:mod:`.order`: nothing is built at start, whatever the corpus size); the
position in that order is the number of samples consumed so far, a single integer a checkpoint
saves and restores exactly, whatever the layout.

Global batch ``b`` is the samples at positions ``[b·G, (b+1)·G)``; data-parallel rank ``r``
of ``D`` takes the ``r``-th contiguous ``G/D`` of them, cut into microbatches. The global
batch is the same on every layout, which is what makes losses comparable across layouts.
"""

from __future__ import annotations

import numpy as np

from ..errors import UsageError
from .indexed import IndexedDataset
from .order import FEISTEL, make_order


class GPTSamples:
    """The samples of one corpus (or of one split of it: ``tokens`` is then the token range of
    that split's documents). ``stream`` is added to the order's seed so every corpus and split
    has its own order; the whole of one corpus keeps the empty stream (the order it always had)."""

    def __init__(self, dataset: IndexedDataset, seq_length: int, seed: int,
                 vocab_size: int | None = None, tokens=None, stream: tuple = (),
                 field: str = "data.path") -> None:
        self.dataset = dataset
        self.tokens = dataset.tokens if tokens is None else tokens
        self.seq_length = seq_length
        self.seed = seed
        self.stream = tuple(stream)
        self.field = field
        self.vocab_size = vocab_size
        n = int(self.tokens.size)
        self.num_samples = (n - 1) // seq_length if n else 0
        if self.num_samples < 1:
            raise UsageError(f"{field}: {dataset.prefix} holds {n} tokens"
                             f"{' in this split' if tokens is not None else ''}, fewer than one "
                             f"sample of model.seq_length + 1 = {seq_length + 1}; use more data, "
                             f"a larger share of data.split or a shorter seq_length")
        self.use_order(FEISTEL)

    def use_order(self, kind: str) -> None:
        """Visit the samples in the order ``kind`` (:data:`.order.KINDS`; a checkpoint says
        which one its run used)."""
        self._order = make_order(kind, self.num_samples, self.seed, self.stream)

    @property
    def order_kind(self) -> str:
        return self._order.kind

    def sample_index(self, position: int) -> int:
        epoch, within = divmod(position, self.num_samples)
        return self._order.index(epoch, within)

    def sample(self, position: int, check: bool = True) -> np.ndarray:
        """The ``seq_length + 1`` tokens of the sample at ``position`` in the visiting order
        (``check``: refuse token ids beyond the vocabulary, see :meth:`check_tokens`)."""
        j = self.sample_index(position)
        start = j * self.seq_length
        window = np.asarray(self.tokens[start:start + self.seq_length + 1], dtype=np.int64)
        if check and window.size:
            self.check_tokens(int(window.max()), int(window.min()))
        return window

    def check_tokens(self, largest: int, smallest: int = 0) -> None:
        """A UsageError when ``largest`` (a token id read) is beyond ``vocab_size``, or
        ``smallest`` is negative (a signed or float dtype in the index)."""
        if smallest < 0:
            raise UsageError(f"{self.field}: {self.dataset.prefix} holds token id {smallest}; "
                             f"token ids are 0 or more: the data is damaged or was not written "
                             f"by a tokenizer (re-create it with `hpctrain data prepare`)")
        if self.vocab_size is not None and largest >= self.vocab_size:
            raise UsageError(f"{self.field}: {self.dataset.prefix} holds token id {largest}, "
                             f"beyond model.vocab_size ({self.vocab_size}); the data was prepared "
                             f"with another tokenizer, or raise model.vocab_size")


def rank_microbatches(samples: GPTSamples, consumed_samples: int, global_batch_size: int,
                      dp_rank: int, dp_size: int, micro_batch_size: int) -> list[np.ndarray]:
    """This DP rank's microbatches of the global batch that starts at ``consumed_samples``.

    Returns ``global_batch_size / (dp_size · micro_batch_size)`` arrays of shape
    ``[micro_batch_size, seq_length + 1]``.
    """
    rows = [np.stack([samples.sample(p) for p in positions]) for positions in
            rank_microbatch_positions(consumed_samples, global_batch_size, dp_rank, dp_size,
                                      micro_batch_size)]
    return rows


def rank_microbatch_positions(consumed_samples: int, global_batch_size: int, dp_rank: int,
                              dp_size: int, micro_batch_size: int) -> list[list[int]]:
    """The sample positions of :func:`rank_microbatches`: one list per microbatch."""
    per_rank = global_batch_size // dp_size
    first = consumed_samples + dp_rank * per_rank
    return [list(range(first + i, first + i + micro_batch_size))
            for i in range(0, per_rank, micro_batch_size)]
