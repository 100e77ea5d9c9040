"""Megatron's indexed dataset format (``PREFIX.bin`` + ``PREFIX.idx``), read and written with numpy.

The format is the one Megatron-LM's ``tools/preprocess_data.py`` writes, so users point
hpctrain at data they already have. Reading it here (rather than through megatron-core's
``IndexedDataset``) keeps the CLI free of torch and needs none of megatron's C++ helpers.

``.bin``: the token ids of every sequence, back to back, in the index's dtype.
``.idx`` (little endian)::

    9 bytes   b"MMIDIDX\\x00\\x00"
    u64       version = 1
    u8        dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)
    u64       sequence count S
    u64       document count D (= number of documents + 1)
    i32[S]    sequence lengths (tokens)
    i64[S]    sequence byte offsets into .bin
    i64[D]    document indices: the sequence index where each document starts, then S

A document may span several sequences (Megatron's sentences); its last one ends with the
end-of-document token.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from .. import file_door
from ..errors import UsageError
from .index_header import FIXED, HEADER, VERSION, parse_header

DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}


def bin_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{prefix}.bin")


def idx_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{prefix}.idx")


def exists(prefix: str | os.PathLike) -> bool:
    return bin_path(prefix).is_file() and idx_path(prefix).is_file()


def token_dtype(vocab_size: int) -> np.dtype:
    """The dtype Megatron-LM picks for a vocabulary: uint16 below 65500 ids, else int32."""
    return np.dtype(np.uint16 if vocab_size < 65500 else np.int32)


class IndexedDatasetWriter:
    """Writes a dataset; files appear under their final names only when ``finalize`` succeeds.

    Both files go through the write door (``outputs.AtomicFile``): unique temporary names
    created exclusively (a link planted next to the output is never written through), fsynced,
    renamed over ``PREFIX.bin`` and ``PREFIX.idx``; ``abort`` removes them and leaves a dataset
    already there as it was."""

    def __init__(self, prefix: str | os.PathLike, dtype) -> None:
        from ..outputs import AtomicFile
        self.prefix = str(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in CODES:
            raise ValueError(f"unsupported token dtype {self.dtype}")
        self._bin_file = AtomicFile(bin_path(self.prefix))
        self._bin = self._bin_file        # its write names the file in a storage fault
        self._idx_file: AtomicFile | None = None
        self._lengths: list[int] = []
        self._doc_starts: list[int] = [0]
        self.num_tokens = 0

    def add_sequence(self, tokens) -> None:
        """Append one sequence to the current document."""
        arr = np.asarray(tokens, dtype=self.dtype)
        self._bin.write(arr.tobytes(order="C"))
        self._lengths.append(int(arr.size))
        self.num_tokens += int(arr.size)

    def end_document(self) -> None:
        self._doc_starts.append(len(self._lengths))

    def add_document(self, tokens) -> None:
        self.add_sequence(tokens)
        self.end_document()

    @property
    def num_documents(self) -> int:
        return len(self._doc_starts) - 1

    @property
    def num_sequences(self) -> int:
        return len(self._lengths)

    def finalize(self) -> None:
        from ..outputs import AtomicFile
        lengths = np.asarray(self._lengths, dtype=np.int32)
        pointers = np.zeros(len(lengths), dtype=np.int64)
        if len(lengths):
            np.cumsum(lengths[:-1].astype(np.int64) * self.dtype.itemsize, out=pointers[1:])
        self._idx_file = AtomicFile(idx_path(self.prefix))
        f = self._idx_file                # its write names the file in a storage fault
        f.write(HEADER)
        f.write(struct.pack("<Q", VERSION))
        f.write(struct.pack("<B", CODES[self.dtype]))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(self._doc_starts)))
        f.write(lengths.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(np.asarray(self._doc_starts, dtype=np.int64).tobytes(order="C"))
        self._bin_file.commit()    # both written in full before either is published
        self._idx_file.commit()

    def abort(self) -> None:
        self._bin_file.discard()
        if self._idx_file is not None:
            self._idx_file.discard()

    def __enter__(self) -> "IndexedDatasetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finalize()
        else:
            self.abort()


def _mapped(path: Path, dtype, count: int, offset: int) -> np.ndarray:
    """``count`` values of ``dtype`` at byte ``offset`` of ``path``, memory-mapped."""
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,))


class IndexedDataset:
    """Read-only, memory-mapped view of a dataset. ``tokens`` is the whole ``.bin`` as one array."""

    def __init__(self, prefix: str | os.PathLike) -> None:
        self.prefix = str(prefix)
        ip, bp = idx_path(prefix), bin_path(prefix)
        for p in (ip, bp):
            # through the file door: a FIFO, a device or a folder at the path is said to be
            # one (it was "does not exist"), and nothing blocks on it
            try:
                with file_door.open_regular(p, follow_links=True) as fd:
                    missing = fd is None
            except file_door.Refused as e:
                raise UsageError(f"dataset file {file_door.show(p)} {e.why}; give the prefix of a "
                                 f"PREFIX.bin + PREFIX.idx pair (`hpctrain data prepare` writes "
                                 f"them)") from None
            if missing:
                raise UsageError(f"dataset file {p} does not exist (data.path is the prefix of "
                                 f"PREFIX.bin + PREFIX.idx; `hpctrain data prepare` writes them)")
        with open(ip, "rb") as f:
            raw = f.read(FIXED)
        size_idx = ip.stat().st_size
        head = parse_header(raw, ip)
        self.dtype = np.dtype(DTYPES[head.dtype_code])
        seqs, docs = head.sequences, head.document_entries
        need = head.index_bytes()
        if size_idx < need:
            raise UsageError(f"{ip} is truncated ({size_idx} bytes, the header promises {need}); "
                             f"re-create the dataset")
        # memory-mapped, not read: at 10^9 documents the index is 20 GB, of which a run
        # touches a few pages (the split boundaries and the sequences it reads)
        off = FIXED
        self.sequence_lengths = _mapped(ip, np.int32, seqs, off)
        off += seqs * 4
        self.sequence_pointers = _mapped(ip, np.int64, seqs, off)
        off += seqs * 8
        self.document_indices = _mapped(ip, np.int64, docs, off)
        # the sequences lie back to back, so the last one's end is the .bin's size (summing
        # every length would read the whole index)
        itemsize = self.dtype.itemsize
        if seqs:
            first, last = int(self.sequence_pointers[0]), int(self.sequence_pointers[-1])
            length = int(self.sequence_lengths[-1])
            if first != 0 or last < 0 or last % itemsize or length < 0:
                raise UsageError(f"{ip}: its sequences do not lie back to back in {bp} (the "
                                 f"first starts at byte {first}, the last is {length} tokens "
                                 f"at byte {last}, tokens of {itemsize} bytes); re-create the "
                                 f"dataset")
        expected = last + length * itemsize if seqs else 0
        size = bp.stat().st_size
        if size % itemsize:
            raise UsageError(f"{bp} holds {size} bytes, not a whole number of {self.dtype.name} "
                             f"tokens ({itemsize} bytes each); a write was cut short or the "
                             f"pair does not belong together: re-create the dataset")
        if size != expected:
            raise UsageError(f"{bp} holds {size} bytes but {ip} describes {expected}; the pair "
                             f"does not belong together or a write was cut short")
        if seqs and docs and int(self.document_indices[-1]) != seqs:
            raise UsageError(f"{ip}: document index ends at {int(self.document_indices[-1])}, "
                             f"expected the sequence count {seqs}")
        self.tokens = (np.memmap(bp, dtype=self.dtype, mode="r") if size
                       else np.zeros(0, dtype=self.dtype))

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.size)

    @property
    def num_documents(self) -> int:
        return max(0, len(self.document_indices) - 1)

    def __getitem__(self, i: int) -> np.ndarray:
        start = int(self.sequence_pointers[i]) // self.dtype.itemsize
        return self.tokens[start:start + int(self.sequence_lengths[i])]

    def document(self, d: int) -> np.ndarray:
        first, last = int(self.document_indices[d]), int(self.document_indices[d + 1])
        if first == last:
            return self.tokens[:0]
        start = int(self.sequence_pointers[first]) // self.dtype.itemsize
        end = int(self.sequence_pointers[last - 1]) // self.dtype.itemsize + \
            int(self.sequence_lengths[last - 1])
        return self.tokens[start:end]
