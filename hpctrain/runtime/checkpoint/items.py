"""One item of a checkpoint file as the resume reads it: whether its bytes are the bytes its
writer checksummed, and where the tensor's bytes lie inside it.

An item is the byte range torch's distributed checkpoint metadata records for one stored
chunk: for a tensor, a one-tensor ``torch.save`` zip archive, whose data is a single stored
``data/0`` record (hpctrain's writer turns torch's per-record CRC32 off, and never compresses).
Both of the resume's paths (:mod:`.reader`'s whole-item read and :mod:`.streaming`) check an
item's length and CRC32C here, so a damaged item reads the same way whichever path read it,
and find the record here: over the whole item in memory, or from its tail alone (zipfile reads
only the end record and the central directory, which end every archive), so the streaming path
knows where the data lies before it has read it.
"""

from __future__ import annotations

import io
import os
import struct
import zipfile

from .writer import crc_hex

ZIP_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")     # 30 bytes, then name and extra field
# what is read of an item's end to find its record: the end record (22 bytes) and a central
# directory of a handful of entries fit many times over (torch writes no archive comment)
TAIL_BYTES = 64 << 10


class ChecksumMismatch(RuntimeError):
    """An item's bytes are not the bytes its writer checksummed."""


def check_length(name: str, offset: int, length: int, expected) -> None:
    """Refuse an item whose length is not the one its writer recorded (``expected``: the
    manifest's ``(length, crc32c)``)."""
    if expected[0] != length:
        raise ChecksumMismatch(f"{name}: the item at byte {offset} is {length} bytes, its "
                               f"writer recorded {expected[0]}")


def check_crc(name: str, offset: int, length: int, crc: int, expected) -> None:
    """Refuse an item whose CRC32C (``crc``, over all its bytes) is not its writer's, naming the
    file, the item's place and both checksums: the resume sets the checkpoint aside with it."""
    got = crc_hex(crc)
    if got != expected[1]:
        raise ChecksumMismatch(f"{name}: the item at byte {offset} ({length} bytes) has "
                               f"CRC32C {got}, its writer recorded {expected[1]}")


def read_exactly(fd: int, view, at: int, name: str, end: int) -> None:
    """Fill ``view`` from byte ``at`` of the open file (``os.preadv``: no seek, safe to share
    the descriptor between threads). A file that ends first is damage: named with ``end``, the
    byte the item should have gone on to."""
    got, size = 0, len(view)
    while got < size:
        n = os.preadv(fd, [view[got:]], at + got)
        if n == 0:
            raise ChecksumMismatch(f"{name}: ends before byte {end}")
        got += n


class NotServed(ValueError):
    """zipfile asked a :class:`_MemoryFile` for bytes it does not hold."""


class _MemoryFile(io.RawIOBase):
    """A read-only, seekable file of ``size`` bytes (for zipfile, which reads only headers) of
    which ``view`` holds the part from ``base`` on: the whole item (``base`` 0), or its tail.
    Reading before ``base`` raises :class:`NotServed` (a ValueError, as zipfile's own errors on
    a broken archive are caught)."""

    def __init__(self, view: memoryview, base: int = 0, size: int | None = None) -> None:
        super().__init__()
        self.view, self.base, self.pos = view, base, 0
        self.size = base + len(view) if size is None else size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b) -> int:
        n = max(0, min(len(b), self.size - self.pos))
        if n and self.pos < self.base:
            raise NotServed(f"byte {self.pos} is before the {len(self.view)} bytes held")
        at = self.pos - self.base
        b[:n] = self.view[at:at + n]
        self.pos += n
        return n


def record_start(archive: _MemoryFile, nbytes: int, read_at) -> int | None:
    """Where the tensor data of a one-tensor ``torch.save`` archive starts: the offset of its
    single stored ``data/0`` record of ``nbytes`` bytes; None when the archive is not of that
    form, or its headers are not among the bytes at hand. ``read_at(offset, n)``: up to ``n``
    bytes of the archive at ``offset`` (for the record's local header)."""
    try:
        with zipfile.ZipFile(archive) as z:
            data = [i for i in z.infolist() if "/data/" in i.filename]
    except (zipfile.BadZipFile, ValueError, KeyError):
        return None
    if len(data) != 1 or data[0].compress_type != zipfile.ZIP_STORED or \
            data[0].file_size != nbytes or not data[0].filename.endswith("/data/0"):
        return None
    head = data[0].header_offset
    local = read_at(head, ZIP_LOCAL_HEADER.size)
    if len(local) != ZIP_LOCAL_HEADER.size:
        return None
    fields = ZIP_LOCAL_HEADER.unpack(local)
    if fields[0] != b"PK\x03\x04":
        return None
    start = head + ZIP_LOCAL_HEADER.size + fields[9] + fields[10]
    return start if start + nbytes <= archive.size else None


def raw_record(view: memoryview, nbytes: int) -> int | None:
    """:func:`record_start` of an item held whole in ``view``."""
    return record_start(_MemoryFile(view), nbytes, lambda at, n: bytes(view[at:at + n]))


def record_from_tail(fd: int, name: str, offset: int, length: int, nbytes: int) -> int | None:
    """:func:`record_start` of the item at ``offset`` of the open file, from its last
    :data:`TAIL_BYTES` and the record's local header (two small reads): None where that is
    not enough (an archive with a larger directory, or not of the expected form; the caller
    then reads it whole). These bytes are read again, and checksummed, with the rest of the
    item: a record found from damaged bytes fails the item's CRC32C."""
    tail = bytearray(min(length, TAIL_BYTES))
    read_exactly(fd, memoryview(tail), offset + length - len(tail), name, offset + length)

    def read_at(at: int, n: int) -> bytes:
        return os.pread(fd, max(0, min(n, length - at)), offset + at)
    return record_start(_MemoryFile(memoryview(tail), length - len(tail), length), nbytes,
                        read_at)


def check_size(req, target, tensor) -> None:
    """The loaded tensor has its target's size: torch's own reader's check and words (an
    ``AssertionError``, which torch's load reports on every rank)."""
    if target.size() != tensor.size():
        raise AssertionError(f"req {req.storage_index} mismatch sizes "
                             f"{target.size()} vs {tensor.size()}")
