"""Train/validation/test splits and the corpora of each, from a job's ``data`` section.

A split (Megatron-LM's ``--split 969,30,1``) cuts every corpus's *documents* into three
contiguous ranges, in proportion to the three numbers, exactly as megatron-core's
``BlendedMegatronDatasetBuilder`` does; separate ``valid_blend``/``test_blend`` corpora are
used whole. Pure Python: the submit checks and the CLI import this without numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.split import parse_split

SPLITS = ("train", "valid", "test")
__all__ = ["SPLITS", "Corpus", "all_prefixes", "corpora", "parse_split", "split_ranges"]


def split_ranges(num_documents: int, shares) -> list[tuple[int, int]]:
    """The ``[first, last)`` document range of each split: megatron-core 0.16's arithmetic
    (``convert_split_vector_to_split_matrix`` book-ends, each rounded to a document)."""
    ends, total = [0.0], 0.0
    for share in shares:
        total += share
        ends.append(total)
    return [(int(round(ends[i] * float(num_documents))),
             int(round(ends[i + 1] * float(num_documents)))) for i in range(3)]


@dataclass(frozen=True)
class Corpus:
    """One corpus of one split: its dataset prefix, normalised weight, the share of its
    documents (``None``: all of them) and the config field that names it, for errors."""

    path: str
    weight: float
    field: str
    index: int
    shares: tuple | None = None
    part: int = 0              # which split of the documents (0 train, 1 valid, 2 test)


def corpora(data, split: str) -> list[Corpus]:
    """The corpora of ``split`` ("train", "valid" or "test"), weights normalised; an empty
    list when the job has no data for it."""
    part = SPLITS.index(split)
    separate = {"valid": "valid_blend", "test": "test_blend"}.get(split)
    if separate and getattr(data, separate):
        entries = [(e.path, e.weight, f"data.{separate}[{i}]")
                   for i, e in enumerate(getattr(data, separate))]
        return _normalised(entries, None, 0)
    shares = parse_split(data.split) if data.split is not None else (1.0, 0.0, 0.0)
    if shares[part] <= 0:
        return []
    if data.blend:
        entries = [(e.path, e.weight, f"data.blend[{i}]") for i, e in enumerate(data.blend)]
    else:
        entries = [(data.path, 1.0, "data.path")]
    return _normalised(entries, None if data.split is None else shares, part)


def _normalised(entries, shares, part) -> list[Corpus]:
    total = sum(w for _, w, _ in entries)
    return [Corpus(path=p, weight=w / total, field=f, index=i, shares=shares, part=part)
            for i, (p, w, f) in enumerate(entries)]


def all_prefixes(data) -> list[tuple[str, str, list]]:
    """Every corpus the job names: (field, prefix, prepare_from), each prefix once."""
    out, seen = [], set()
    if data.path:
        out.append(("data.path", data.path, list(data.prepare_from or [])))
        seen.add(data.path)
    for name in ("blend", "valid_blend", "test_blend"):
        for i, e in enumerate(getattr(data, name) or []):
            if e.path not in seen:
                seen.add(e.path)
                out.append((f"data.{name}[{i}].path", e.path, list(e.prepare_from or [])))
    return out
