"""Does the model's vocabulary hold every token id the data can contain?

One check for ``validate``, ``submit`` (dry run or not) and ``data prepare`` on submit: the ids
come from the prepared data's own record (``PREFIX.meta.json``) when the data exists, else from
the tokenizer it would be prepared with. Light on purpose (json and the tokenizer's size, no
numpy): ``hpctrain validate`` runs it and must start fast.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError


def recorded_vocab_size(prefix: str) -> int | None:
    """The vocabulary ``hpctrain data prepare`` recorded beside ``prefix``'s .bin/.idx (None
    when there is no record, as for data Megatron prepared). The record is read through the
    data's door (:func:`.files.read_meta`): a FIFO, a device, a huge or damaged file there is
    one UsageError line naming it, never a hang."""
    from .files import read_meta
    return read_meta(prefix).get("vocab_size")


def data_vocab_size(job) -> int | None:
    """The vocabulary the job's data was (or will be) tokenized with; None when unknown."""
    prefix = job.data.path
    if Path(f"{prefix}.bin").is_file() and Path(f"{prefix}.idx").is_file():
        return recorded_vocab_size(prefix)
    from .tokenizers import load_tokenizer
    return int(load_tokenizer(job.data.tokenizer).vocab_size)


def check_vocab(job, tokenizer_vocab: int | None) -> None:
    """Refuse a ``model.vocab_size`` smaller than the tokenizer's vocabulary."""
    if tokenizer_vocab and tokenizer_vocab > job.model.vocab_size:
        raise UsageError(f"model.vocab_size: {job.model.vocab_size} is smaller than the "
                         f"tokenizer's vocabulary ({tokenizer_vocab}); set it to at least "
                         f"{tokenizer_vocab}")
