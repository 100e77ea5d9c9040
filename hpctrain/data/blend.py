"""Samples drawn from several corpora in proportion to their weights, by position alone.

A blend maps a position in the visiting order (the number of samples consumed so far, the
one integer a checkpoint keeps) to (corpus, position in that corpus's own order), with no
index built or stored: positions come in blocks of ``B`` samples; after ``k`` blocks corpus
``i`` has had ``C_i(k) = floor(w_i · k · B)`` samples, except the heaviest corpus, which has
the rest (``k · B − Σ`` of the others). Every ``C_i`` grows with ``k`` (the heaviest one too,
since ``B ≥ n(n−1)``), so block ``k`` holds ``C_i(k+1) − C_i(k)`` samples of corpus ``i``,
spread evenly over the block (the ``t``-th of ``m`` at ``(t + ½)/m``). Every corpus stays
within ``n`` samples of its share at every block end, each corpus is read in its own order
without gaps or repeats, and a resumed run at position ``p`` reads the next sample of every
corpus — whatever the layout, since the global batch is positions ``[b·G, (b+1)·G)``.

Why not megatron-core's ``BlendedDataset``: its blending index is an array over every sample
of the run, built by a C++ helper and cached on disk; this one is computed per block on
demand (a few microseconds per block), needs no cache to build, share or keep consistent,
and is the same on every rank by construction.
"""

from __future__ import annotations

import numpy as np

from ..errors import UsageError
from .gpt_dataset import GPTSamples
from .indexed import IndexedDataset
from .splits import Corpus, corpora, split_ranges

MIN_BLOCK = 1024


class BlendedSamples:
    """Positions -> samples of several :class:`GPTSamples` (one corpus: a plain pass-through)."""

    def __init__(self, parts: list[GPTSamples], weights: list[float]) -> None:
        if not parts or len(parts) != len(weights):
            raise ValueError("a blend needs one weight per corpus")
        self.parts = parts
        self.seq_length = parts[0].seq_length
        self.weights = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
        n = len(parts)
        self.block = max(MIN_BLOCK, n * (n - 1))
        self.heaviest = int(np.argmax(self.weights))
        self._block_k = -1
        self._block: tuple[np.ndarray, np.ndarray] | None = None

    def counts_before(self, k: int) -> np.ndarray:
        """Samples of each corpus in the first ``k`` blocks."""
        total = k * self.block
        counts = np.floor(self.weights * float(total)).astype(np.int64)
        counts[self.heaviest] = 0
        counts[self.heaviest] = total - int(counts.sum())
        return counts

    def block_order(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """For each slot of block ``k``: its corpus and its position in that corpus."""
        if k != self._block_k:
            before, after = self.counts_before(k), self.counts_before(k + 1)
            here = after - before
            corpus = np.repeat(np.arange(len(self.parts)), here)
            rank = np.concatenate([np.arange(m) for m in here])
            keys = (rank + 0.5) / np.repeat(here.astype(np.float64), here)
            order = np.lexsort((corpus, keys))
            self._block = (corpus[order], before[corpus[order]] + rank[order])
            self._block_k = k
        return self._block

    def locate(self, position: int) -> tuple[int, int]:
        """(corpus, position within that corpus's order) of the blend's ``position``."""
        if len(self.parts) == 1:
            return 0, position
        k, slot = divmod(position, self.block)
        corpus, within = self.block_order(k)
        return int(corpus[slot]), int(within[slot])

    def use_order(self, kind: str) -> None:
        """Every corpus visits its samples in the order ``kind`` (see :mod:`.order`)."""
        for part in self.parts:
            part.use_order(kind)

    @property
    def order_kind(self) -> str:
        return self.parts[0].order_kind

    def sample(self, position: int, check: bool = True) -> np.ndarray:
        corpus, within = self.locate(position)
        return self.parts[corpus].sample(within, check)

    def check_tokens(self, largest: int, smallest: int = 0) -> None:
        """A UsageError when a token id read is beyond the vocabulary or negative (naming every
        corpus of the blend: the reader does not know which one the batch's id came from)."""
        if len(self.parts) == 1:
            self.parts[0].check_tokens(largest, smallest)
            return
        if smallest < 0:
            names = ", ".join(f"{p.field} ({p.dataset.prefix})" for p in self.parts)
            raise UsageError(f"one of {names} holds token id {smallest}; token ids are 0 or "
                             f"more: a corpus is damaged (re-create it with `hpctrain data "
                             f"prepare`)")
        vocab = self.parts[0].vocab_size
        if vocab is not None and largest >= vocab:
            names = ", ".join(f"{p.field} ({p.dataset.prefix})" for p in self.parts)
            raise UsageError(f"one of {names} holds token id {largest}, beyond "
                             f"model.vocab_size ({vocab}); a corpus was prepared with another "
                             f"tokenizer, or raise model.vocab_size")

    def describe(self) -> str:
        return ", ".join(f"{p.dataset.prefix} ({w:.3g}, {p.num_samples} samples)"
                         for p, w in zip(self.parts, self.weights))


def corpus_samples(corpus: Corpus, seq_length: int, seed: int,
                   vocab_size: int | None = None, datasets: dict | None = None
                   ) -> GPTSamples | None:
    """The samples of one corpus in one split (the token range of the split's documents);
    None when the split gives this corpus no documents."""
    datasets = {} if datasets is None else datasets
    if corpus.path not in datasets:
        datasets[corpus.path] = IndexedDataset(corpus.path)
    ds = datasets[corpus.path]
    field = corpus.field if corpus.field.endswith("path") else corpus.field + ".path"
    if corpus.shares is None:
        tokens = None
        stream = () if (corpus.index, corpus.part) == (0, 0) else (corpus.index, corpus.part)
    else:
        first, last = split_ranges(ds.num_documents, corpus.shares)[corpus.part]
        if last <= first:
            return None
        tokens = ds.tokens[document_token_start(ds, first):document_token_start(ds, last)]
        stream = (corpus.index, corpus.part)
    return GPTSamples(ds, seq_length, seed, vocab_size, tokens=tokens, stream=stream,
                      field=field)


def document_token_start(ds: IndexedDataset, d: int) -> int:
    """The token offset where document ``d`` starts (the end of the stream for ``d = D``)."""
    seqs = int(ds.document_indices[d]) if d < len(ds.document_indices) else len(ds)
    if seqs >= len(ds):
        return ds.num_tokens
    return int(ds.sequence_pointers[seqs]) // ds.dtype.itemsize


def split_samples(data, split: str, seq_length: int, seed: int,
                  vocab_size: int | None = None, datasets: dict | None = None,
                  notes: list | None = None) -> BlendedSamples | None:
    """The blend of ``split`` for a job's ``data`` section (None: no data for that split).

    A corpus the split gives no documents (one long document, say) is left out of the
    validation or test blend, with a line in ``notes``; the training blend refuses it, and
    a validation or test split no corpus has documents for is refused (naming data.split)."""
    chosen = corpora(data, split)
    if not chosen:
        return None
    datasets = {} if datasets is None else datasets
    parts, weights = [], []
    for c in chosen:
        got = corpus_samples(c, seq_length, seed, vocab_size, datasets)
        if got is None:
            docs = datasets[c.path].num_documents
            if split == "train":
                raise UsageError(f"data.split: {data.split!r} gives {c.path} ({c.field}) no "
                                 f"training documents (it has {docs}); raise the training "
                                 f"share or add documents")
            if notes is not None:
                notes.append(f"{c.field}: {c.path} has no {SPLIT_WORDS[split]} documents "
                             f"under data.split {data.split!r} ({docs} in all); left out of the "
                             f"{SPLIT_WORDS[split]} blend")
            continue
        parts.append(got)
        weights.append(c.weight)
    if not parts:
        raise UsageError(f"data.split: {data.split!r} leaves no {SPLIT_WORDS[split]} documents "
                         f"in any corpus; give that part a larger share or add documents")
    return BlendedSamples(parts, weights)


SPLIT_WORDS = {"train": "training", "valid": "validation", "test": "test"}


def check_splits(job) -> None:
    """Open every split the job uses (a UsageError naming the field for a missing or empty
    corpus, or a split that leaves one empty): the submit-time check."""
    datasets: dict = {}
    seq = job.model.seq_length
    wanted = ["train"]
    if job.train.eval_interval:
        wanted.append("valid")
    if job.train.eval_at_end:
        wanted.append("test")
    for split in wanted:
        got = split_samples(job.data, split, seq, job.train.seed, datasets=datasets)
        if got is None and split != "train":
            raise UsageError(f"data.split: no {split} data for "
                             f"train.{'eval_interval' if split == 'valid' else 'eval_at_end'}")
