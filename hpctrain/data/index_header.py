"""The fixed header of a Megatron ``.idx`` file (the format is in :mod:`.indexed`), read without
numpy: the memory-mapped reader and the data fingerprint (:mod:`.fingerprint`, which the CLI
reads) share this one parser, so a header means the same to both."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from ..errors import UsageError

HEADER = b"MMIDIDX\x00\x00"
VERSION = 1
FIXED = len(HEADER) + 8 + 1 + 8 + 8     # magic, version, dtype code, sequence and document counts
# bytes per token of each dtype code (indexed.DTYPES names the numpy dtypes)
ITEMSIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}
FLOAT_CODES = {6: "float64", 7: "float32"}      # Megatron's format allows them; no tokenizer does


@dataclass(frozen=True)
class IndexHeader:
    dtype_code: int
    sequences: int
    document_entries: int       # the document index's length: documents + 1

    @property
    def documents(self) -> int:
        return max(0, self.document_entries - 1)

    @property
    def itemsize(self) -> int:
        return ITEMSIZES[self.dtype_code]

    def index_bytes(self) -> int:
        """The size the header promises for the whole ``.idx``."""
        return FIXED + self.sequences * 4 + self.sequences * 8 + self.document_entries * 8


def parse_header(raw: bytes, ip: str | os.PathLike) -> IndexHeader:
    """The header in ``raw`` (the first :data:`FIXED` bytes of ``ip``); a UsageError naming the
    file and the fix when it is not one this reader knows."""
    if len(raw) < FIXED or raw[:len(HEADER)] != HEADER:
        raise UsageError(f"{ip} is not a Megatron index file (bad header); re-create it with "
                         f"`hpctrain data prepare`")
    (version,) = struct.unpack_from("<Q", raw, len(HEADER))
    if version != VERSION:
        raise UsageError(f"{ip}: index version {version} is not supported (expected {VERSION})")
    (code,) = struct.unpack_from("<B", raw, len(HEADER) + 8)
    if code not in ITEMSIZES:
        raise UsageError(f"{ip}: unknown token dtype code {code}")
    if code in FLOAT_CODES:        # token ids are integers: floats would be cut silently
        raise UsageError(f"{ip}: token dtype {FLOAT_CODES[code]} (code {code}) holds no token "
                         f"ids; re-create the dataset with `hpctrain data prepare`")
    seqs, docs = struct.unpack_from("<QQ", raw, len(HEADER) + 9)
    return IndexHeader(code, seqs, docs)
