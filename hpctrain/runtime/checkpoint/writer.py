"""Staging a save's tensors into the host arena, and writing them with the checksum of the bytes
meant to be written.

megatron-core plans the save (``dist_checkpointing.save`` with ``async_sharded_save``) and
returns an ``AsyncRequest`` whose ``preload_fn`` copies the tensors to new pinned memory and
whose ``async_fn`` (in a forked process) writes them. hpctrain keeps megatron's plan, file
layout, metadata and finalization, and replaces those two functions:

* :func:`stage` (the training thread, before the fork): each tensor of each write bucket is
  copied into its place in the process's :class:`~.staging.HostArena` (asynchronous
  device-to-host copies into page-locked memory, one synchronize at the end);
* :func:`write_buckets` (the writer): one thread per bucket file writes it through
  :class:`ChecksumStream`, which computes CRC32C over every byte as it is handed to the
  file — per item (the byte range torch's metadata records for it) and per file — and
  fsyncs. The checksums go to a sidecar that rank 0 merges into the manifest. Nothing is read
  back: the checksum is of what was meant to be written, so any difference between the state
  and the file (a torn write, a bad disk, a page changed under the writer) fails
  verification at resume.

The writer turns off the CRC32 that ``torch.save`` computes for each zip record: it is a
second, slower checksum of the same bytes that ``torch.load`` never checks.

CRC32C comes from the ``crc32c`` package (hardware CRC instructions, SSE4.2 or ARMv8, with a
software fallback; it releases the GIL for large buffers, so the writer threads and the
reader threads of a resume checksum in parallel). zlib's CRC32 (the format-1 manifests') runs
at about a fifth of its speed on one core and is kept only to verify old checkpoints.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import threading
import time
from pathlib import Path

import crc32c

from ...outputs import write_atomic

CHECKSUM = "crc32c"


def crc_hex(value: int) -> str:
    return f"{value & 0xFFFFFFFF:08x}"


class ChecksumStream(io.RawIOBase):
    """A file opened for writing that CRC32Cs every byte written, per file and per item."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.file = open(path, "wb", buffering=0)
        self.position = 0
        self.crc = 0
        self.item_crc = 0
        self.items: list[list] = []      # [offset, length, crc32c hex]
        self._item_start: int | None = None

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        self.crc = crc32c.crc32c(view, self.crc)
        if self._item_start is not None:
            self.item_crc = crc32c.crc32c(view, self.item_crc)
        written = 0
        try:
            while written < len(view):
                written += self.file.write(view[written:])
        except OSError as e:
            self._raise_named(e)
        self.position += written
        return written

    def _raise_named(self, error: OSError):
        """A write's or fsync's OSError names no file (ENOSPC, EIO, EFBIG): raise it naming
        this one, so the save fault says which file the storage refused."""
        if error.filename is not None or error.errno is None:
            raise error
        raise type(error)(error.errno, error.strerror, self.path) from error

    def tell(self) -> int:
        return self.position

    def begin_item(self) -> None:
        self._item_start, self.item_crc = self.position, 0

    def end_item(self, offset: int, length: int) -> None:
        if offset != self._item_start or offset + length != self.position:
            raise RuntimeError(f"checkpoint item at {offset}+{length} does not match the bytes "
                               f"written ({self._item_start}..{self.position})")
        self.items.append([offset, length, crc_hex(self.item_crc)])
        self._item_start = None

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass     # torch's stream wrappers close their view of it; finish() closes the file

    def finish(self) -> dict:
        try:
            os.fsync(self.file.fileno())
        except OSError as e:
            self._raise_named(e)
        self.file.close()
        return {"size": self.position, CHECKSUM: crc_hex(self.crc), "items": self.items}


def stage(arena, owner: str, write_buckets: list, page_locked: bool = True) -> list:
    """Copy every tensor of megatron's write buckets into ``arena`` (held for ``owner`` until
    the writer finished); returns the buckets with the staged tensors in their place.
    ``page_locked``: :meth:`.staging.HostArena.acquire`'s (False: the memory as it is, now)."""
    import torch
    tensors = [t for _, _, (_, tensor_data) in write_buckets for _, t in tensor_data]
    slots = iter(arena.acquire(owner, [t.numel() * t.element_size() for t in tensors],
                               page_locked=page_locked))
    cuda = False
    staged_buckets = []
    for file_name, storage_key, (bytes_data, tensor_data) in write_buckets:
        staged = []
        for item, tensor in tensor_data:
            tensor = tensor.detach()
            copy = arena.tensor(next(slots), tensor.dtype, tensor.shape)
            copy.copy_(tensor, non_blocking=True)
            cuda = cuda or tensor.device.type == "cuda"
            staged.append((item, copy))
        staged_buckets.append((file_name, storage_key, (bytes_data, staged)))
    if cuda:
        torch.cuda.synchronize()
    return staged_buckets


def _write_item_fn():
    from torch.distributed.checkpoint.filesystem import _write_item
    extra = {}
    if "serialization_format" in inspect.signature(_write_item).parameters:
        from torch.distributed.checkpoint.filesystem import SerializationFormat
        extra["serialization_format"] = SerializationFormat.TORCH_SAVE
    return _write_item, extra


def _write_bucket(transform_list, bucket, progress=None) -> tuple[list, str, dict]:
    write_item, extra = _write_item_fn()
    file_name, storage_key, (bytes_data, tensor_data) = bucket
    stream = ChecksumStream(file_name)
    results = []
    try:
        for item, data in list(bytes_data) + list(tensor_data):
            stream.begin_item()
            result = write_item(*transform_list, stream, data, item, storage_key, **extra)
            info = result.storage_data
            stream.end_item(info.offset, info.length)
            results.append(result)
            if progress is not None:
                progress()
    except BaseException:
        stream.file.close()
        raise
    return results, os.path.basename(file_name), stream.finish()


def write_buckets(transform_list, rank: int, buckets: list, results_queue, *, folder: str,
                  sidecar: str, progress=None) -> None:
    """megatron's ``async_fn`` contract: write ``buckets``, put ``{index: [WriteResult]}`` (or
    the exception) in ``results_queue``. Also writes this rank's checksums to ``sidecar``.
    ``progress()`` is called from the writer threads after each item written: a synchronous
    save (emergency, final) runs here on the rank, and the hang watchdog must see a long write
    advance rather than a rank gone silent."""
    from torch.serialization import get_crc32_options, set_crc32_options
    started = time.monotonic()
    zip_crc = get_crc32_options()
    set_crc32_options(False)
    outcome: dict | Exception = {}
    sums: dict[str, dict] = {}
    errors: list[BaseException] = []

    def one(i, bucket):
        try:
            results, name, info = _write_bucket(transform_list, bucket, progress)
            outcome[i] = results
            sums[name] = info
        except BaseException as e:   # noqa: BLE001 - handed to megatron's finalize, as it does
            errors.append(e)

    try:
        threads = [threading.Thread(target=one, args=(i, b), name=f"hpctrain-write-{i}")
                   for i, b in enumerate(buckets)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        set_crc32_options(zip_crc)
    if errors:
        outcome = errors[0] if isinstance(errors[0], Exception) else RuntimeError(str(errors[0]))
    else:
        record = {"files": sums, "write_seconds": round(time.monotonic() - started, 3)}
        try:    # read by rank 0 before the manifest is written; the manifest is what is fsynced
            write_atomic(Path(folder) / sidecar, json.dumps(record), durable=False)
        except OSError as e:    # megatron's finalize raises it (else it would wait for it)
            outcome = e
    if results_queue is not None:
        results_queue.put(outcome)
