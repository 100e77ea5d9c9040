"""Tokenizers for ``hpctrain data prepare``, by Megatron-LM's families, all local files:

* ``byte`` (built in);
* a folder holding ``tokenizer.json`` (Hugging Face, the ``tokenizers`` package);
* a SentencePiece ``.model`` file (Llama 2 style; the ``sentencepiece`` package);
* a tiktoken BPE ranks file, ``.tiktoken`` or any file of ``<base64 token> <rank>`` lines
  (Llama 3's ``tokenizer.model`` is one; the ``tiktoken`` package).

The packages are optional extras (``pip install 'hpctrain[sentencepiece]'``, ``[tiktoken]``,
``[hf-tokenizers]``); a missing one is one error line naming the extra. Nothing is downloaded.

``byte`` maps UTF-8 bytes to ids 0-255 and ends every document with id 256, so its
vocabulary is 257 and it needs nothing installed: the examples and tests use it. A folder
holding ``tokenizer.json`` is loaded with the ``tokenizers`` package, offline (nothing is
ever downloaded). Its end-of-document id comes from ``tokenizer_config.json``'s
``eos_token`` when present, else from the usual special tokens.

numpy is imported when text is encoded, not before: ``hpctrain validate`` loads a tokenizer
to check its vocabulary and must start fast.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..config.loader import not_utf8
from ..errors import UsageError
from . import files

if TYPE_CHECKING:
    import numpy as np

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "[SEP]")
_HF_FIX = ("give a folder holding the tokenizer.json that `tokenizer.save_pretrained(folder)` "
           "writes, or --tokenizer byte")


class ByteTokenizer:
    name = "byte"
    vocab_size = 257
    eod = 256

    def encode(self, text: str) -> np.ndarray:
        import numpy as np
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


class HuggingFaceTokenizer:
    """A ``tokenizer.json`` from a local folder, through the ``tokenizers`` package."""

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder).expanduser()
        self.name = str(folder)
        if not folder.exists():
            raise UsageError(f"tokenizer folder {folder} does not exist (give `byte` or a local "
                             f"folder with tokenizer.json; nothing is downloaded)")
        path = folder / "tokenizer.json" if folder.is_dir() else folder
        if not os.path.lexists(path):
            raise UsageError(f"{folder} has no tokenizer.json (save one with "
                             f"`tokenizer.save_pretrained(folder)` or use --tokenizer byte)")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise UsageError("the `tokenizers` package is needed for a Hugging Face tokenizer: "
                             "pip install tokenizers") from None
        # read through the data's door (a FIFO, a device, a huge or binary file is one line)
        text = files.read_text(path, _HF_FIX, files.TOKENIZER_BYTES, "data.tokenizer")
        if text is None:
            raise UsageError(f"data.tokenizer: {files.show(path)} does not exist (a dangling "
                             f"link?); {_HF_FIX}")
        try:
            self._tok = Tokenizer.from_str(text)
        except BaseException as e:  # plain Exceptions on bad files, or a Rust panic
            if not _library_failure(e):
                raise
            raise UsageError(f"{files.show(path)} is not a valid tokenizer.json: "
                             f"{_first_line(e)}") from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eod = self._find_eod(path.parent)

    def _find_eod(self, folder: Path) -> int:
        names = []
        cfg = folder / "tokenizer_config.json"
        config = files.read_json_object(
            cfg, "fix it or remove it (hpctrain reads only its eos_token)",
            files.SIDECAR_BYTES, "data.tokenizer") or {}
        eos = config.get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str):
            if not_utf8(eos):
                raise UsageError(f"data.tokenizer: {files.show(cfg)}: eos_token {ascii(eos)[:60]} "
                                 f"is not text (a lone surrogate escape); fix it")
            names.append(eos)
        names += EOS_CANDIDATES
        for name in names:
            tid = self._tok.token_to_id(name)
            if tid is not None:
                return int(tid)
        shown = ", ".join(n if n.isprintable() and len(n) <= 60 else ascii(n)[:60] for n in names)
        raise UsageError(f"{folder}: cannot find an end-of-document token (looked for "
                         f"{shown}); set eos_token in tokenizer_config.json")

    def encode(self, text: str) -> np.ndarray:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        import numpy as np
        try:
            out = self._tok.encode_batch(texts, add_special_tokens=False)
        except BaseException as e:   # a tokenizer.json that loads but cannot encode this text
            if not _library_failure(e):
                raise
            raise UsageError(f"data.tokenizer: {files.show(self.name)} cannot encode the text "
                             f"({_first_line(e)}); its tokenizer.json is damaged or incomplete: "
                             f"{_HF_FIX}") from None
        return [np.asarray(e.ids, dtype=np.int64) for e in out]

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids])


def _missing(module: str, what: str) -> UsageError:
    """The one error line for an optional tokenizer package that is not installed (the extra
    has the package's name)."""
    return UsageError(f"data.tokenizer: {what} needs the `{module}` package: "
                      f"pip install 'hpctrain[{module}]'")


class SentencePieceTokenizer:
    """A SentencePiece ``.model`` (Llama 2 style): ids as the model gives them, end of document
    its ``eos`` id (``</s>``)."""

    def __init__(self, path: Path, data: bytes | None = None) -> None:
        try:
            import sentencepiece as spm
        except ImportError:
            raise _missing("sentencepiece", "a SentencePiece .model") from None
        self.name = str(path)
        if data is None:
            data = _read_tokenizer_file(path)
        if not data:
            raise UsageError(f"data.tokenizer: {files.show(path)} is empty, not a SentencePiece "
                             f"model")
        try:
            self._sp = spm.SentencePieceProcessor(model_proto=data)
        except (OSError, RuntimeError) as e:
            raise UsageError(f"data.tokenizer: {files.show(path)} is not a SentencePiece model "
                             f"({_first_line(e)})") from None
        self.vocab_size = int(self._sp.vocab_size())
        self.eod = int(self._sp.eos_id())
        if self.eod < 0:
            raise UsageError(f"data.tokenizer: {path} has no end-of-sentence piece (eos_id -1); "
                             f"train it with eos_id set")

    def encode(self, text: str) -> np.ndarray:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        import numpy as np
        return [np.asarray(ids, dtype=np.int64) for ids in self._sp.encode(texts)]

    def decode(self, ids) -> str:
        return self._sp.decode([int(i) for i in ids])


# Llama 3's pre-tokenizer pattern and special tokens (256 of them, after the ranks)
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                  "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
                  "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
                  "<|eot_id|>", "<|python_tag|>"]
LLAMA3_NUM_SPECIAL = 256


# the highest rank a ranks file may give: its ids and the 256 special tokens after them fit the
# largest model.vocab_size (2**24)
MAX_TIKTOKEN_RANK = 2**24 - LLAMA3_NUM_SPECIAL - 1
_RANK = re.compile(rb"-?[0-9]+")


def read_tiktoken_ranks(path: Path, data: bytes | None = None) -> dict[bytes, int]:
    """``<base64 token> <rank>`` lines (tiktoken's own format), read without tiktoken's
    loader, which may try to download, and checked before tiktoken sees them (it panics on a
    rank given twice, overflows on a rank out of range, and panics when encoding a byte that
    has no rank): every token base64, every rank from 0 to MAX_TIKTOKEN_RANK, no token nor
    rank twice, every one of the 256 bytes ranked. ``data``: the file's bytes, when read."""
    import base64
    import binascii
    if data is None:
        data = _read_tokenizer_file(path)
    where = files.show(path)
    ranks: dict[bytes, int] = {}
    line_of_rank: dict[int, int] = {}
    for n, line in enumerate(data.split(b"\n"), 1):
        fields = line.split()
        if not fields:
            continue
        try:
            token, rank = fields
            if not _RANK.fullmatch(rank):
                raise ValueError(rank)
            token = base64.b64decode(token, validate=True)
        except (ValueError, binascii.Error):
            raise UsageError(f"data.tokenizer: {where}:{n}: not a tiktoken ranks line "
                             f"(expected `<base64 token> <rank>`)") from None
        value = int(rank) if len(rank) <= 20 else -1     # past Python's digit limit too
        if not 0 <= value <= MAX_TIKTOKEN_RANK:
            shown = rank.decode() if len(rank) <= 24 else rank[:20].decode() + "..."
            raise UsageError(f"data.tokenizer: {where}:{n}: rank {shown} is out of "
                             f"range; a rank is from 0 to {MAX_TIKTOKEN_RANK:,} (its id and the "
                             f"{LLAMA3_NUM_SPECIAL} special tokens after the ranks fit "
                             f"model.vocab_size's 2**24)")
        if not token:
            raise UsageError(f"data.tokenizer: {where}:{n}: an empty token; every ranked token "
                             f"is at least one byte")
        if token in ranks:
            raise UsageError(f"data.tokenizer: {where}:{n}: the token {ascii(token)[:40]} is "
                             f"ranked already (rank {ranks[token]}, line "
                             f"{line_of_rank[ranks[token]]}); each token has one rank")
        if value in line_of_rank:
            raise UsageError(f"data.tokenizer: {where}:{n}: rank {value} is given already on "
                             f"line {line_of_rank[value]}; each rank belongs to one token")
        ranks[token] = value
        line_of_rank[value] = n
    if not ranks:
        raise UsageError(f"data.tokenizer: {where} holds no tiktoken ranks")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise UsageError(f"data.tokenizer: {where}: no rank for the byte 0x{missing[0]:02x}"
                         f"{more}; a byte-level BPE ranks file ranks all 256 bytes, so that any "
                         f"text can be encoded")
    return ranks


class TikTokenTokenizer:
    """A tiktoken BPE ranks file with Llama 3's pattern and special tokens: the 256 special
    tokens follow the ranks, end of document is ``<|end_of_text|>``."""

    def __init__(self, path: Path, data: bytes | None = None) -> None:
        try:
            import tiktoken
        except ImportError:
            raise _missing("tiktoken", "a tiktoken ranks file") from None
        self.name = str(path)
        ranks = read_tiktoken_ranks(path, data)
        # after the highest rank (= the rank count for a file of ranks 0..n-1, as Llama 3's):
        # no special token shares an id with a rank, and every id is below vocab_size
        first = max(ranks.values()) + 1
        names = LLAMA3_SPECIAL + [f"<|reserved_special_token_{i}|>"
                                  for i in range(2, LLAMA3_NUM_SPECIAL - len(LLAMA3_SPECIAL) + 2)]
        special = {name: first + i for i, name in enumerate(names)}
        try:
            self._enc = tiktoken.Encoding(name=path.name, pat_str=LLAMA3_PATTERN,
                                          mergeable_ranks=ranks, special_tokens=special)
        except BaseException as e:   # checked above; a Rust panic is no Exception all the same
            if not _library_failure(e):
                raise
            raise UsageError(f"data.tokenizer: {files.show(path)}: {_first_line(e)}") from None
        self.vocab_size = first + LLAMA3_NUM_SPECIAL
        self.eod = special["<|end_of_text|>"]

    def encode(self, text: str) -> np.ndarray:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        import numpy as np
        # special tokens in the text are text (disallowed_special=()): data is never a prompt
        return [np.asarray(self._enc.encode_ordinary(t), dtype=np.int64) for t in texts]

    def decode(self, ids) -> str:
        return self._enc.decode([int(i) for i in ids])


def _looks_like_tiktoken(data: bytes) -> bool:
    head = data[:4096].split(b"\n", 1)[0]
    return re.fullmatch(rb"[A-Za-z0-9+/=]+[ \t]+-?\d+\r?", head) is not None


def _read_tokenizer_file(path: Path) -> bytes:
    data = files.read_bytes(path, "give the tokenizer file itself", files.TOKENIZER_BYTES,
                            "data.tokenizer")
    if data is None:
        raise UsageError(f"data.tokenizer: {files.show(path)} does not exist (give `byte` or a "
                         f"local tokenizer file; nothing is downloaded)")
    return data


def _library_failure(e: BaseException) -> bool:
    """An error a tokenizer library raises on a bad file: an Exception, or a Rust panic
    (pyo3's PanicException derives from BaseException, so ``except Exception`` misses it)."""
    return isinstance(e, Exception) or type(e).__name__ == "PanicException"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0][:200] if text else type(e).__name__)


def load_tokenizer(spec: str):
    """``byte``, a local folder holding tokenizer.json (or the file itself), a SentencePiece
    ``.model`` or a tiktoken ranks file (told apart by content: Llama 3 names its tiktoken
    file ``tokenizer.model`` too). A file is read once, through the data's door
    (:mod:`.files`): a FIFO, a device or a huge file is one error line."""
    if spec == "byte":
        return ByteTokenizer()
    path = Path(spec).expanduser()
    if path.suffix != ".json" and path.exists() and not path.is_dir():
        data = _read_tokenizer_file(path)
        if _looks_like_tiktoken(data):
            return TikTokenTokenizer(path, data)
        if path.suffix == ".model":
            return SentencePieceTokenizer(path, data)
        raise UsageError(f"data.tokenizer: {files.show(path)} is neither a SentencePiece .model, "
                         f"a tiktoken ranks file nor a tokenizer.json; give `byte` or one of those")
    return HuggingFaceTokenizer(spec)
