"""The one door where data already prepared is taken for a job: ``submit``'s preparation
(:func:`.prepare.ensure_prepared`) and the checks of ``validate`` and dry runs
(:func:`hpctrain.submission.checks.check_data`) both pass each existing corpus through
:func:`check_prepared`.

A prefix's ``.bin``/``.idx`` say nothing of how they were made: a job that changed
``data.tokenizer`` or ``prepare_from`` after its data was prepared would train on the old
tokens without a word (byte ids read as a 32k vocabulary's). ``PREFIX.meta.json``, written by
``hpctrain data prepare``, records the tokenizer and the source files; where it does, they must
be the job's. Data without that record (Megatron's own, another tool's) is taken as it is.
Light on purpose (json and paths; no numpy, no torch): ``hpctrain validate`` runs it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UsageError
from ..file_door import show
from .files import read_meta
from .vocabulary import check_vocab

SHOWN_SOURCES = 3      # source files named in a message; the rest are counted


def recorded_tokenizer(spec: str) -> str:
    """The name ``PREFIX.meta.json`` records for tokenizer ``spec``: ``byte``, else its
    absolute path (links resolved), so that a job's ``data.tokenizer`` (made absolute against
    its job file) compares with it whatever folder either was named from."""
    return spec if spec == "byte" else str(Path(os.path.expanduser(spec)).resolve())


def recorded_source(path: str) -> str:
    """The name ``PREFIX.meta.json`` records for a source file: its absolute path."""
    return str(Path(os.path.expanduser(path)).resolve())


def check_prepared(job, field: str, prefix: str, sources: list) -> None:
    """Refuse ``prefix`` (the corpus of ``field``, to be prepared from ``sources`` when it is
    missing) when its record says it was prepared with another tokenizer or from other files
    than the job names, or with a vocabulary ``model.vocab_size`` cannot hold."""
    meta = read_meta(prefix)
    _check_tokenizer(job, field, prefix, sources, meta.get("tokenizer"))
    _check_sources(field, prefix, sources, meta.get("sources"))
    check_vocab(job, meta.get("vocab_size"))


def _check_tokenizer(job, field: str, prefix: str, sources: list, recorded) -> None:
    """The job's tokenizer says how its data is made only when the job prepares the corpus
    (``prepare_from``) or names one other than the default: a job that points at data
    prepared by ``data prepare -t ./tok`` need not repeat the tokenizer."""
    wanted = job.data.tokenizer
    if recorded is None or not (sources or wanted != "byte"):
        return
    if _same_tokenizer(recorded, recorded_tokenizer(wanted)):
        return
    if sources:
        fix = _prepare_again(field, prefix)
    else:
        fix = (f"set data.tokenizer to '{show(recorded)}', or prepare it again with `hpctrain "
               f"data prepare FILES --output {show(prefix)} --tokenizer {show(wanted)}`")
    raise UsageError(f"data.tokenizer: {show(prefix)} was prepared with '{show(recorded)}', the "
                     f"job names '{show(wanted)}'; {fix}")


def _same_tokenizer(recorded: str, wanted: str) -> bool:
    """Records written before the path was made absolute may hold a relative one, from a
    folder unknown now: only ``byte`` against a file can be told apart then."""
    if recorded == "byte" or wanted == "byte":
        return recorded == wanted
    if not Path(recorded).is_absolute():
        return True
    return recorded_tokenizer(recorded) == wanted


def _check_sources(field: str, prefix: str, sources: list, recorded) -> None:
    """The files the job would prepare the corpus from, in order (the order is the documents'),
    against those it was prepared from; only where the job names some."""
    if not (sources and isinstance(recorded, list) and all(isinstance(s, str) for s in recorded)):
        return                   # nothing to compare (another tool's record: not ours to judge)
    wanted = [recorded_source(s) for s in sources]
    if recorded == wanted:       # prepare records them as recorded_source() gives them
        return
    name = ("data.prepare_from" if field == "data.path"
            else field.replace(".path", ".prepare_from"))
    raise UsageError(f"{name}: {show(prefix)} was prepared from {_files(recorded)}, the job "
                     f"names {_files(wanted)}; {_prepare_again(field, prefix)}")


def _files(paths: list) -> str:
    shown = ", ".join(show(str(p)) for p in paths[:SHOWN_SOURCES])
    more = len(paths) - SHOWN_SOURCES
    return f"{shown} and {more} more" if more > 0 else shown


def _prepare_again(field: str, prefix: str) -> str:
    return (f"point {field} at a new prefix to prepare it there, or remove "
            f"{show(prefix)}.bin/.idx/.meta.json to prepare it again")
