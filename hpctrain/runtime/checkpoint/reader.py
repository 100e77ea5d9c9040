"""Resume at disk speed: read a checkpoint in parallel into the host arena, verify every item's
CRC32C in the same pass, copy to the device asynchronously.

megatron-core loads through torch's ``FileSystemReader``: one thread, each item read into
pageable memory, ``torch.load`` into a new tensor, a synchronous copy to the GPU; and
hpctrain used to verify every file in a separate full read before that. :class:`ParallelReader`
(a ``CachedMetadataFileSystemReader``, megatron's own reader for torch_dist checkpoints)
replaces ``read_data`` only:

* the items this rank loads are placed in the process's :class:`~.staging.HostArena`
  (page-locked on CUDA) and read by a pool of threads (``os.preadv`` straight into the arena);
* each item's CRC32C is computed as it arrives and compared with the one its writer recorded
  in the manifest (:mod:`.writer`): a damaged item raises :class:`ChecksumMismatch`, which
  torch's load reports on every rank, and the resume sets the checkpoint aside;
* the tensor is taken from the item's bytes without a copy where hpctrain's writer wrote it
  (one stored, contiguous record of the expected size: ``torch.frombuffer`` over the arena),
  else through ``torch.load``; its copy into the model is ``non_blocking`` (asynchronous from
  page-locked memory), with one synchronize before the arena is let go.

Everything else (planning, metadata, resharding, megatron's fully parallel exchange) is
megatron's. :func:`installed` puts the reader in place of the one megatron's torch_dist load
strategy makes, for one checkpoint folder, for the duration of a load.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor

import crc32c

from .writer import CHECKSUM, crc_hex

DEFAULT_THREADS = 8
ZIP_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")     # 30 bytes, then name and extra field


class ChecksumMismatch(RuntimeError):
    """An item's bytes are not the bytes its writer checksummed."""


def read_threads() -> int:
    """Reading is I/O and checksumming (both outside the GIL): more threads than cores still
    keep the storage busy."""
    return DEFAULT_THREADS


class _MemoryFile(io.RawIOBase):
    """A read-only, seekable file over a memoryview (for zipfile, which reads only headers)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self.view, self.pos = view, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: len(self.view) + offset}[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b) -> int:
        n = max(0, min(len(b), len(self.view) - self.pos))
        b[:n] = self.view[self.pos:self.pos + n]
        self.pos += n
        return n


def raw_record(view: memoryview, nbytes: int) -> int | None:
    """Where the tensor data of a one-tensor ``torch.save`` archive starts in ``view``: the
    offset of its single stored ``data/0`` record of ``nbytes`` bytes; None when the archive
    is not of that form (then ``torch.load`` reads it)."""
    try:
        with zipfile.ZipFile(_MemoryFile(view)) as z:
            data = [i for i in z.infolist() if "/data/" in i.filename]
    except (zipfile.BadZipFile, ValueError, KeyError):
        return None
    if len(data) != 1 or data[0].compress_type != zipfile.ZIP_STORED or \
            data[0].file_size != nbytes or not data[0].filename.endswith("/data/0"):
        return None
    head = data[0].header_offset
    fields = ZIP_LOCAL_HEADER.unpack_from(view, head)
    if fields[0] != b"PK\x03\x04":
        return None
    start = head + ZIP_LOCAL_HEADER.size + fields[9] + fields[10]
    return start if start + nbytes <= len(view) else None


def _reader_class():
    from megatron.core.dist_checkpointing.strategies.cached_metadata_filesystem_reader import \
        CachedMetadataFileSystemReader

    class ParallelReader(CachedMetadataFileSystemReader):
        """megatron's reader for one checkpoint, with :func:`read_data` replaced."""

        def __init__(self, path, items: dict, arena, threads: int, zero_copy: bool) -> None:
            super().__init__(path)
            self.items = items            # file -> {offset: (length, crc32c)} from the manifest
            self.arena = arena
            self.threads = threads
            self.zero_copy = zero_copy
            self.stats = {"bytes": 0, "items": 0, "verified": 0, "zero_copy": 0,
                          "read_seconds": 0.0}
            self._metadata = None

        def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
            self._metadata = metadata
            return super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)

        def read_data(self, plan, planner):
            from torch.futures import Future
            read_data(self, plan, planner)
            fut = Future()
            fut.set_result(None)
            return fut

    return ParallelReader


def _chunk(metadata, index):
    """(dtype, shape) of the stored chunk ``index`` names (None when not found)."""
    md = metadata.state_dict_metadata.get(index.fqn) if metadata is not None else None
    for chunk in getattr(md, "chunks", ()) or ():
        if tuple(chunk.offsets) == tuple(index.offset):
            return md.properties.dtype, tuple(chunk.sizes)
    return None


def read_data(reader, plan, planner) -> None:
    import torch
    from torch.distributed.checkpoint.planner import LoadItemType
    from torch.distributed._shard._utils import narrow_tensor_by_index   # as torch's reader

    started = time.monotonic()
    ranges: dict[tuple, int] = {}        # (file, offset, length) -> position in `order`
    order: list[tuple] = []
    requests = []
    for req in plan.items:
        info = reader.storage_data[req.storage_index]
        key = (info.relative_path, info.offset, info.length)
        if key not in ranges:
            ranges[key] = len(order)
            order.append(key)
        requests.append((req, ranges[key]))
    owner = "the resume"
    # the memory as it is: page-locking it first would cost more than it saves (staging)
    slots = reader.arena.acquire(owner, [length for _, _, length in order], page_locked=False)
    root = str(reader.path)

    def fetch(i: int) -> None:
        name, offset, length = order[i]
        buf = reader.arena.buffer(slots[i])
        fd = os.open(os.path.join(root, name), os.O_RDONLY)
        try:
            got = 0
            while got < length:
                n = os.preadv(fd, [buf[got:]], offset + got)
                if n == 0:
                    raise ChecksumMismatch(f"{name}: ends before byte {offset + length}")
                got += n
        finally:
            os.close(fd)
        expected = reader.items.get(name, {}).get(offset)
        if expected is None:
            return False
        if expected[0] != length:
            raise ChecksumMismatch(f"{name}: the item at byte {offset} is {length} bytes, its "
                                   f"writer recorded {expected[0]}")
        crc = crc_hex(crc32c.crc32c(buf))
        if crc != expected[1]:
            raise ChecksumMismatch(f"{name}: the item at byte {offset} ({length} bytes) has "
                                   f"CRC32C {crc}, its writer recorded {expected[1]}")
        return True

    cuda = False
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(reader.threads, len(order) or 1)),
                                thread_name_prefix="hpctrain-read") as pool:
            done = [pool.submit(fetch, i) for i in range(len(order))]
            verified = [None] * len(order)
            for req, i in requests:
                if verified[i] is None:
                    verified[i] = done[i].result()      # raises ChecksumMismatch
                    reader.stats["verified"] += int(verified[i])
                    reader.stats["bytes"] += order[i][2]
                buf = reader.arena.buffer(slots[i])
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, io.BytesIO(bytes(buf)))
                    continue
                tensor = _tensor(reader, req, buf, slots[i])
                tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
                target = planner.resolve_tensor(req).detach()
                if target.size() != tensor.size():
                    raise AssertionError(f"req {req.storage_index} mismatch sizes "
                                         f"{target.size()} vs {tensor.size()}")
                target.copy_(tensor, non_blocking=True)
                cuda = cuda or target.device.type == "cuda"
                planner.commit_tensor(req, target)
            reader.stats["items"] += len(order)
    finally:
        if cuda:
            torch.cuda.synchronize()      # every copy out of the arena is done
        reader.arena.release(owner)
        reader.stats["read_seconds"] += time.monotonic() - started


def _tensor(reader, req, buf: memoryview, slot):
    import torch
    chunk = _chunk(reader._metadata, req.storage_index) if reader.zero_copy else None
    if chunk is not None:
        dtype, shape = chunk
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        start = raw_record(buf, nbytes)
        if start is not None:
            reader.stats["zero_copy"] += 1
            flat = reader.arena.tensor(type(slot)(slot.segment, slot.offset + start, nbytes),
                                       dtype, (nbytes // torch.empty((), dtype=dtype)
                                               .element_size(),))
            return flat.view(shape)
    return torch.load(io.BytesIO(bytes(buf)), map_location="cpu", weights_only=True)


def manifest_items(manifest: dict) -> dict:
    """file -> {offset: (length, crc32c)} from a manifest written by :mod:`.writer`."""
    out = {}
    if manifest.get("checksum") != CHECKSUM:
        return out
    for name, info in manifest.get("files", {}).items():
        out[name] = {int(o): (int(n), c) for o, n, c in info.get("items", ())}
    return out


def files_read_unverified(manifest: dict) -> list[str]:
    """The files of a manifest with per-item checksums that the in-read verification never
    sees: megatron's ``common.pt`` (the step, the data position), ``.metadata`` and
    ``metadata.json``, which ``torch.load`` and megatron read themselves. They are small, and
    a flipped byte in them would resume at a wrong step or data position with no error, so
    they are checksummed whole before loading."""
    return sorted(name for name, items in manifest_items(manifest).items() if not items)


@contextlib.contextmanager
def installed(folder, manifest: dict, arena, threads: int | None = None):
    """megatron's torch_dist loads of ``folder`` use a :class:`ParallelReader` (yielded, for
    its statistics) while the block runs."""
    from megatron.core.dist_checkpointing.strategies import torch as torch_strategy
    original = torch_strategy._get_filesystem_reader
    reader_class = _reader_class()
    made = []
    items = manifest_items(manifest)
    zero_copy = bool(items)    # hpctrain's writer stages contiguous tensors

    def get_reader(checkpoint_dir, cache_metadata: bool = False):
        if os.path.realpath(str(checkpoint_dir)) != os.path.realpath(str(folder)):
            return original(checkpoint_dir, cache_metadata)
        reader = reader_class(checkpoint_dir, items, arena, threads or read_threads(),
                              zero_copy)
        made.append(reader)
        return reader

    if threads == 0:          # megatron-core's own reader (a test's serial reference)
        yield made
        return
    torch_strategy._get_filesystem_reader = get_reader
    try:
        yield made
    finally:
        torch_strategy._get_filesystem_reader = original
