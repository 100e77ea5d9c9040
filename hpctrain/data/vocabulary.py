"""Does the model's vocabulary hold every token id the data can contain?

One check for ``validate``, ``submit`` (dry run or not) and ``data prepare`` on submit: the ids
come from the prepared data's own record (``PREFIX.meta.json``) when the data exists, else from
the tokenizer it would be prepared with. Light on purpose (json and the tokenizer's size, no
numpy): ``hpctrain validate`` runs it and must start fast.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UsageError


def recorded_vocab_size(prefix: str) -> int | None:
    """The vocabulary ``hpctrain data prepare`` recorded beside ``prefix``'s .bin/.idx."""
    try:
        value = json.loads(Path(f"{prefix}.meta.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


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
