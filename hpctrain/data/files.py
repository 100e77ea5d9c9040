"""The one door through which the data code reads its small files: the ``PREFIX.meta.json``
sidecar, tokenizer files (``tokenizer.json``, ``tokenizer_config.json``, a SentencePiece
``.model``, a tiktoken ranks file).

These are files a user points hpctrain at, so anything can be there: a FIFO (a plain ``open``
blocks forever), a link to ``/dev/zero`` (a plain ``read`` never ends), a file of gigabytes,
binary bytes, JSON nested 200,000 deep. They are read through the run-folder reader's door
(:func:`hpctrain.record.reader.read_from`: opened non-blocking, ``fstat``-checked to be a
regular file before a byte is read, at most ``limit`` bytes read), after symbolic links are
resolved (a tokenizer in a Hugging Face cache is a link into ``blobs/``: a link is followed,
what it leads to must be a regular file). Whatever is wrong is one :class:`UsageError` line
naming the file, what is wrong and the fix; a missing file is None.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .. import limits
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


def show(path: Path | str) -> str:
    text = str(path)
    return text if len(text) <= 300 and text.isprintable() else repr(text[:300])


def read_bytes(path: Path | str, fix: str, limit: int, what: str = "") -> bytes | None:
    """The bytes of ``path`` (None when it does not exist); UsageError ``[what: ]PATH <what
    is wrong>; <fix>`` when it is not a regular file, cannot be read or is over ``limit``."""
    from ..record.reader import DamagedFile, read_from
    head = f"{what}: {show(path)}" if what else show(path)
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError) as e:        # a NUL in the name, a loop on some systems
        raise UsageError(f"{head} cannot be resolved ({e}); {fix}") from None
    if real != os.path.abspath(path):
        head += f" (-> {show(real)})"
    too_big = f"{head} is over {limit:,} bytes, more than any such file holds; {fix}"
    try:
        if os.stat(real).st_size > limit:     # a regular file's size: refused before reading
            raise UsageError(too_big)
    except OSError:
        pass                                  # the door says what is wrong
    try:
        data = read_from(real, 0, limit + 1)
    except DamagedFile as e:
        # the door's reason without its words for run folders: "is a FIFO, not a regular file"
        raise UsageError(f"{head} {e.why.split(';')[0]}; {fix}") from None
    if data is not None and len(data) > limit:    # grew since the stat
        raise UsageError(too_big)
    return data


def read_text(path: Path | str, fix: str, limit: int, what: str = "") -> str | None:
    data = read_bytes(path, fix, limit, what)
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        head = f"{what}: {show(path)}" if what else show(path)
        raise UsageError(f"{head} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                         f"{e.start}); {fix}") from None


def read_json_object(path: Path | str, fix: str, limit: int = SIDECAR_BYTES,
                     what: str = "") -> dict | None:
    """One JSON object (None when the file does not exist): not JSON (nested past Python's
    recursion limit included) or not an object is a UsageError naming the file."""
    text = read_text(path, fix, limit, what)
    if text is None:
        return None
    head = f"{what}: {show(path)}" if what else show(path)
    try:
        data = json.loads(text)
    except RecursionError:
        raise UsageError(f"{head} is JSON nested too deeply to read; {fix}") from None
    except ValueError as e:
        raise UsageError(f"{head} is not JSON ({str(e).splitlines()[0][:120]}); {fix}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{head} holds a JSON {_json_kind(data)}, expected an object; {fix}")
    return data


def _json_kind(value: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


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
        return f"a JSON {_json_kind(value)}"
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
