"""Tokenizers for ``hpctrain data prepare``: bytes (built in) or a local Hugging Face folder.

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


def load_tokenizer(spec: str):
    """``byte`` or the path of a local folder holding tokenizer.json."""
    if spec == "byte":
        return ByteTokenizer()
    return HuggingFaceTokenizer(spec)
