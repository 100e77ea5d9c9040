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

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:
    import numpy as np

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "[SEP]")


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
        if not path.is_file():
            raise UsageError(f"{folder} has no tokenizer.json (save one with "
                             f"`tokenizer.save_pretrained(folder)` or use --tokenizer byte)")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise UsageError("the `tokenizers` package is needed for a Hugging Face tokenizer: "
                             "pip install tokenizers") from None
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:  # the package raises plain Exceptions on bad files
            raise UsageError(f"{path} is not a valid tokenizer.json: {e}") from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eod = self._find_eod(path.parent)

    def _find_eod(self, folder: Path) -> int:
        names = []
        cfg = folder / "tokenizer_config.json"
        if cfg.is_file():
            try:
                eos = json.loads(cfg.read_text()).get("eos_token")
            except (json.JSONDecodeError, AttributeError):
                eos = None
            if isinstance(eos, dict):
                eos = eos.get("content")
            if isinstance(eos, str):
                names.append(eos)
        names += EOS_CANDIDATES
        for name in names:
            tid = self._tok.token_to_id(name)
            if tid is not None:
                return int(tid)
        raise UsageError(f"{folder}: cannot find an end-of-document token (looked for "
                         f"{', '.join(names)}); set eos_token in tokenizer_config.json")

    def encode(self, text: str) -> np.ndarray:
        import numpy as np
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        import numpy as np
        out = self._tok.encode_batch(texts, add_special_tokens=False)
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

    def __init__(self, path: Path) -> None:
        try:
            import sentencepiece as spm
        except ImportError:
            raise _missing("sentencepiece", "a SentencePiece .model") from None
        self.name = str(path)
        try:
            self._sp = spm.SentencePieceProcessor(model_file=str(path))
        except (OSError, RuntimeError) as e:
            raise UsageError(f"data.tokenizer: {path} is not a SentencePiece model ({e})") from None
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


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """``<base64 token> <rank>`` lines (tiktoken's own format), read without tiktoken's
    loader, which may try to download."""
    import base64
    import binascii
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except (ValueError, binascii.Error):
                raise UsageError(f"data.tokenizer: {path}:{n}: not a tiktoken ranks line "
                                 f"(expected `<base64 token> <rank>`)") from None
    if not ranks:
        raise UsageError(f"data.tokenizer: {path} holds no tiktoken ranks")
    return ranks


class TikTokenTokenizer:
    """A tiktoken BPE ranks file with Llama 3's pattern and special tokens: the 256 special
    tokens follow the ranks, end of document is ``<|end_of_text|>``."""

    def __init__(self, path: Path) -> None:
        try:
            import tiktoken
        except ImportError:
            raise _missing("tiktoken", "a tiktoken ranks file") from None
        self.name = str(path)
        ranks = read_tiktoken_ranks(path)
        first = len(ranks)
        names = LLAMA3_SPECIAL + [f"<|reserved_special_token_{i}|>"
                                  for i in range(2, LLAMA3_NUM_SPECIAL - len(LLAMA3_SPECIAL) + 2)]
        special = {name: first + i for i, name in enumerate(names)}
        try:
            self._enc = tiktoken.Encoding(name=path.name, pat_str=LLAMA3_PATTERN,
                                          mergeable_ranks=ranks, special_tokens=special)
        except ValueError as e:
            raise UsageError(f"data.tokenizer: {path}: {e}") from None
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


def _looks_like_tiktoken(path: Path) -> bool:
    import re
    try:
        with open(path, "rb") as f:
            head = f.readline(4096)
    except OSError:
        return False
    return re.fullmatch(rb"[A-Za-z0-9+/=]+ \d+\r?\n?", head) is not None


def load_tokenizer(spec: str):
    """``byte``, a local folder holding tokenizer.json (or the file itself), a SentencePiece
    ``.model`` or a tiktoken ranks file (told apart by content: Llama 3 names its tiktoken
    file ``tokenizer.model`` too)."""
    if spec == "byte":
        return ByteTokenizer()
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix != ".json":
        if _looks_like_tiktoken(path):
            return TikTokenTokenizer(path)
        if path.suffix == ".model":
            return SentencePieceTokenizer(path)
        raise UsageError(f"data.tokenizer: {path} is neither a SentencePiece .model, a tiktoken "
                         f"ranks file nor a tokenizer.json; give `byte` or one of those")
    return HuggingFaceTokenizer(spec)
