"""The one door through which the data code reads its small files: the ``PREFIX.meta.json``
sidecar, tokenizer files (``tokenizer.json``, ``tokenizer_config.json``, a SentencePiece
``.model``, a tiktoken ranks file).

These are files a user points hpctrain at, so anything can be there: a FIFO (a plain ``open``
blocks forever), a link to ``/dev/zero`` (a plain ``read`` never ends), a file of gigabytes,
binary bytes, JSON nested 200,000 deep. They are read through :mod:`hpctrain.file_door`
(opened non-blocking, ``fstat``-checked to be a regular file before a byte is read, at most
``limit`` bytes read), following symbolic links (a tokenizer in a Hugging Face cache is a link
into ``blobs/``: what the link leads to must be a regular file). Whatever is wrong is one
:class:`UsageError` line naming the file, what is wrong and the fix; a missing file is None.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .. import file_door, limits
from ..config.loader import not_utf8
from ..errors import UsageError

# PREFIX.meta.json and tokenizer_config.json: a few hundred bytes when hpctrain or Hugging Face
# writes them
SIDECAR_BYTES = limits.RUN_SMALL_BYTES
# tokenizer.json, a SentencePiece .model, a tiktoken ranks file: the largest in use are tens of
# MB (Gemma 3's tokenizer.json is 33 MB, Llama 3's ranks file 2 MB)
TOKENIZER_BYTES = 256 << 20

META_FIX = ("re-create the dataset with `hpctrain data prepare`, or remove the file (the "
            ".bin/.idx do not need it)")


show = file_door.show


def _head(path: Path | str, what: str) -> str:
    return f"{what}: {show(path)}" if what else show(path)


def read_bytes(path: Path | str, fix: str, limit: int, what: str = "") -> bytes | None:
    """The bytes of ``path``, links followed (None when it does not exist); UsageError
    ``[what: ]PATH [(-> TARGET)] <what is wrong>; <fix>`` when it is not a regular file, cannot
    be read or is over ``limit``."""
    head = _head(path, what)
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError) as e:        # a NUL in the name, a loop on some systems
        raise UsageError(f"{head} cannot be resolved ({e}); {fix}") from None
    if real != os.path.abspath(path):
        head += f" (-> {show(real)})"
    try:
        return file_door.read_file(path, limit, follow_links=True)
    except file_door.TooBig:
        raise UsageError(f"{head} is over {limit:,} bytes, more than any such file holds; "
                         f"{fix}") from None
    except file_door.Refused as e:
        raise UsageError(f"{head} {e.why}; {fix}") from None


def read_text(path: Path | str, fix: str, limit: int, what: str = "") -> str | None:
    data = read_bytes(path, fix, limit, what)
    try:
        return None if data is None else file_door.decode_utf8(data)
    except file_door.Refused as e:
        raise UsageError(f"{_head(path, what)} {e.why}; {fix}") from None


def read_json_object(path: Path | str, fix: str, limit: int = SIDECAR_BYTES,
                     what: str = "") -> dict | None:
    """One JSON object (None when the file does not exist): not JSON (nested past Python's
    recursion limit included) or not an object is a UsageError naming the file."""
    text = read_text(path, fix, limit, what)
    try:
        return None if text is None else file_door.json_object(text)
    except file_door.Refused as e:
        raise UsageError(f"{_head(path, what)} {e.why}; {fix}") from None


# ---- PREFIX.meta.json ------------------------------------------------------------------------

def meta_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{prefix}.meta.json")


def _meta_problem(meta: dict) -> str | None:
    """The first field of a meta record hpctrain uses that is not what ``prepare`` writes."""
    for name, low in (("vocab_size", 1), ("eod", 0)):
        value = meta.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value < 2**31:
            return f"{name}: expected an integer from {low} to {2**31 - 1:,}, got {_short(value)}"
    tok = meta.get("tokenizer")
    if tok is not None and not (isinstance(tok, str) and tok.isprintable()
                                and not not_utf8(tok) and len(tok) <= 4096):
        return f"tokenizer: expected the tokenizer's name, got {_short(tok)}"
    return None


def _short(value: Any) -> str:
    if isinstance(value, (list, dict)):
        return f"a JSON {file_door.json_kind(value)}"
    text = ascii(value) if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_meta(prefix: str | os.PathLike) -> dict:
    """``PREFIX.meta.json`` (``{}`` when there is none, as for data Megatron prepared); a
    sidecar that is there but damaged is one UsageError line naming it and the fix."""
    path = meta_path(prefix)
    meta = read_json_object(path, META_FIX)
    if meta is None:
        return {}
    problem = _meta_problem(meta)
    if problem:
        raise UsageError(f"{show(path)}: {problem}; {META_FIX}")
    return meta
