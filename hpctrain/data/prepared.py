"""The one door where data already prepared is taken for a job: ``submit``'s preparation
(:func:`.prepare.ensure_prepared`) and the checks of ``validate`` and dry runs
(:func:`hpctrain.submission.checks.check_data`) both pass each existing corpus through
:func:`check_prepared`.

A prefix's ``.bin``/``.idx`` say nothing of how they were made: a job that changed
``data.tokenizer`` or ``prepare_from`` after its data was prepared would train on the old
tokens without a word (byte ids read as a 32k vocabulary's). ``PREFIX.meta.json``, written by
``hpctrain data prepare``, records the tokenizer and the source files; where it does, they must
be the job's. Data without that record (Megatron's own, another tool's) is taken as it is.
The record holds absolute paths, yet a project folder copied or moved (``$HOME`` to
``$SCRATCH``, another automount path) is the same data: a path is the same file when both
name one (``samefile``), and a recorded path that no longer exists is matched by name (and, for
the sources, their total size).
Light on purpose (json and paths; no numpy, no torch): ``hpctrain validate`` runs it.
"""

from __future__ import annotations

import filecmp
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
    _check_record_is_of_the_files(field, prefix, sources, meta)
    _check_tokenizer(job, field, prefix, sources, meta.get("tokenizer"))
    _check_sources(field, prefix, sources, meta.get("sources"), meta.get("input_bytes"))
    check_vocab(job, meta.get("vocab_size"))


def _check_record_is_of_the_files(field: str, prefix: str, sources: list, meta: dict) -> None:
    """``PREFIX.meta.json`` is written after ``.bin``/``.idx`` are published: a ``data prepare``
    stopped between them (Ctrl-C, a kill), or two at once into one prefix, leaves the new
    files beside the previous record, which would vouch for data made from other files. The
    counts the record holds must be the files' (``.idx`` header, ``.bin`` size)."""
    from .fingerprint import corpus_shape
    recorded = (meta.get("documents"), meta.get("tokens"))
    if not all(type(v) is int for v in recorded):
        return
    shape = corpus_shape(prefix)
    if shape is None or (shape["documents"], shape["tokens"]) == recorded:
        return
    fix = (_prepare_again(field, prefix) if sources else
           f"prepare it again with `hpctrain data prepare FILES --output {show(prefix)}`")
    raise UsageError(f"{field}: {show(prefix)}.meta.json does not describe "
                     f"{show(prefix)}.bin/.idx ({recorded[0]:,} documents and {recorded[1]:,} "
                     f"tokens recorded, {shape['documents']:,} and {shape['tokens']:,} there): "
                     f"a `data prepare` stopped between its files, or two wrote that prefix at "
                     f"once; {fix}")


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
    folder unknown now: only ``byte`` against a file can be told apart then. A folder and the
    ``tokenizer.json`` in it are one tokenizer (``load_tokenizer`` reads the same file); two
    paths that both exist are the same when they name one file; a recorded path that no longer
    exists (the project was moved) is matched by its name, the folder's or the file's."""
    if recorded == "byte" or wanted == "byte":
        return recorded == wanted
    if not Path(recorded).is_absolute():
        return True
    mine, theirs = _tokenizer_unit(recorded_tokenizer(recorded)), _tokenizer_unit(wanted)
    return _same_path(mine, theirs) or _same_tokenizer_copy(mine, theirs)


def _tokenizer_unit(path: str) -> Path:
    """The folder of a ``tokenizer.json`` named as the file itself, else the path."""
    p = Path(path)
    return p.parent if p.name == "tokenizer.json" else p


def _same_path(recorded: Path, wanted: Path) -> bool:
    """Equal, or the same file when both exist; when the recorded one is gone, the same name."""
    if recorded == wanted:
        return True
    if not os.path.exists(recorded):
        return recorded.name == wanted.name
    try:
        return os.path.exists(wanted) and os.path.samefile(recorded, wanted)
    except (OSError, ValueError):
        return False


def _tokenizer_file(unit: Path) -> Path:
    """The file a tokenizer is read from: a folder's ``tokenizer.json``, else the path."""
    return unit / "tokenizer.json" if unit.is_dir() else unit


def _same_tokenizer_copy(recorded: Path, wanted: Path) -> bool:
    """A copy of the recorded tokenizer (a project copied, the original left in place): the
    same name and the same bytes in the file it is read from (small: compared whole)."""
    if recorded.name != wanted.name:
        return False
    try:
        return filecmp.cmp(_tokenizer_file(recorded), _tokenizer_file(wanted), shallow=False)
    except OSError:
        return False


def _same_source_copy(recorded: str, wanted: str) -> bool:
    """A copy of a recorded source (a project copied, the original left in place): the same
    name and size (the size a proxy for the content, as where the original is gone)."""
    try:
        return Path(recorded).name == Path(wanted).name and \
            os.path.getsize(recorded) == os.path.getsize(wanted)
    except OSError:
        return False


def _check_sources(field: str, prefix: str, sources: list, recorded, input_bytes) -> None:
    """The files the job would prepare the corpus from, in order (the order is the documents'),
    against those it was prepared from; only where the job names some (:func:`_same_sources`)."""
    if not (sources and isinstance(recorded, list) and all(isinstance(s, str) for s in recorded)):
        return                   # nothing to compare (another tool's record: not ours to judge)
    wanted = [recorded_source(s) for s in sources]
    if _same_sources(recorded, wanted, input_bytes):
        return
    name = ("data.prepare_from" if field == "data.path"
            else field.replace(".path", ".prepare_from"))
    sizes, total = "", _total_size(wanted)
    if _same_names(recorded, wanted) and isinstance(input_bytes, int) and total is not None:
        sizes = f" ({total} bytes; the data was prepared from {input_bytes} bytes)"
    raise UsageError(f"{name}: {show(prefix)} was prepared from {_files(recorded)}, the job "
                     f"names {_files(wanted)}{sizes}; {_prepare_again(field, prefix)}")


def _same_sources(recorded: list, wanted: list, input_bytes) -> bool:
    """The same list (``prepare`` records them as :func:`recorded_source` gives them), or the
    same files pair by pair: both paths name one file (``samefile``), or, where the recorded
    one no longer exists (a project moved or copied elsewhere), the names match in order and
    the job's files hold ``input_bytes`` in all, the size the record was prepared from. The
    size is a proxy for the content (reading every source to hash it would cost what
    preparing does): a file edited to another size is caught, one rewritten to the very same
    size is not."""
    if recorded == wanted:
        return True
    if len(recorded) != len(wanted):
        return False
    gone = False
    for r, w in zip(recorded, wanted):
        if os.path.exists(r):
            if not (_same_path(Path(r), Path(w)) or _same_source_copy(r, w)):
                return False
        elif Path(r).name != Path(w).name:
            return False
        else:
            gone = True
    return not gone or (isinstance(input_bytes, int) and _total_size(wanted) == input_bytes)


def _same_names(recorded: list, wanted: list) -> bool:
    return [Path(r).name for r in recorded] == [Path(w).name for w in wanted]


def _total_size(paths: list) -> int | None:
    """What ``prepare`` records as ``input_bytes``; None when a file cannot be read."""
    try:
        return sum(os.stat(p).st_size for p in paths)
    except (OSError, ValueError):
        return None


def _files(paths: list) -> str:
    shown = ", ".join(show(str(p)) for p in paths[:SHOWN_SOURCES])
    more = len(paths) - SHOWN_SOURCES
    return f"{shown} and {more} more" if more > 0 else shown


def _prepare_again(field: str, prefix: str) -> str:
    return (f"point {field} at a new prefix to prepare it there, or remove "
            f"{show(prefix)}.bin/.idx/.meta.json to prepare it again")
