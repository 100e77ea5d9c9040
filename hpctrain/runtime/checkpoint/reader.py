"""Resume at disk speed: read a checkpoint in parallel, verify every item's CRC32C in the same
pass, copy to the device asynchronously.

megatron-core loads through torch's ``FileSystemReader``: one thread, each item read into
pageable memory, ``torch.load`` into a new tensor, a synchronous copy to the GPU; and
hpctrain used to verify every file in a separate full read before that. :class:`ParallelReader`
(a ``CachedMetadataFileSystemReader``, megatron's own reader for torch_dist checkpoints)
replaces ``read_data`` only. Each item this rank loads takes one of two paths:

* **streamed** (:mod:`.streaming`), the common case: an item that loads whole into one plain
  contiguous tensor of its dtype and shape (no narrowing or resharding), whose writer recorded
  its CRC32C. A pool of threads reads each such item in chunks, continues its CRC32C over every
  chunk as it arrives and copies the tensor's bytes on as they come: on the CPU straight into
  the target's memory, on CUDA through a small ring of page-locked buffers with asynchronous
  copies (:mod:`.streaming_cuda`). The host arena is not used for them;
* **whole** (the fallback: narrowed or resharded requests, objects stored as bytes, other
  targets, checkpoints without per-item checksums): the items are placed in the process's
  :class:`~.staging.HostArena` and read by a pool of threads (``os.preadv`` straight into it),
  each item's CRC32C computed as it arrives; the tensor is taken from the item's bytes without
  a copy where hpctrain's writer wrote it (one stored, contiguous record of the expected size:
  ``torch.frombuffer`` over the arena), else through ``torch.load``; its copy into the model is
  ``non_blocking`` (from the arena as it is: pageable at the resume, see :mod:`.staging`).

A damaged item raises :class:`ChecksumMismatch` (naming the file, the item's place and both
CRC32Cs), which torch's load reports on every rank, and the resume sets the checkpoint aside.
Both paths write the model's tensors as they go, so a load that fails has overwritten part of
the model: the resume then loads the previous checkpoint over all of it, or stops the attempt
(:meth:`.manager.Checkpointer.resume`). Before ``read_data`` returns or raises, every worker is
joined and every copy it started is complete (one synchronize per stream): no byte of a failed
load lands after it, and ``commit_tensor`` is called for a streamed tensor only after its copy
completed.

Everything else (planning, metadata, resharding, megatron's fully parallel exchange) is
megatron's. :func:`installed` puts the reader in place of the one megatron's torch_dist load
strategy makes, for one checkpoint folder, for the duration of a load.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import crc32c

from . import streaming
# ChecksumMismatch: what the resume catches (as reader.ChecksumMismatch); raised in .items
from .items import (ChecksumMismatch, check_crc, check_length, check_size, raw_record,  # noqa: F401
                    read_exactly)
from .writer import CHECKSUM

DEFAULT_THREADS = 8

def read_threads() -> int:
    """Reading is I/O and checksumming (both outside the GIL): more threads than cores still
    keep the storage busy."""
    return DEFAULT_THREADS


def _reader_class():
    from megatron.core.dist_checkpointing.strategies.cached_metadata_filesystem_reader import \
        CachedMetadataFileSystemReader

    class ParallelReader(CachedMetadataFileSystemReader):
        """megatron's reader for one checkpoint, with :func:`read_data` replaced."""

        def __init__(self, path, items: dict, arena, threads: int, zero_copy: bool,
                     streamed: bool = True) -> None:
            super().__init__(path)
            self.items = items            # file -> {offset: (length, crc32c)} from the manifest
            self.arena = arena            # for the items read whole
            self.threads = threads
            self.zero_copy = zero_copy
            self.streaming = streamed     # False: every item read whole (a test's reference)
            self.stats = {"bytes": 0, "items": 0, "verified": 0, "zero_copy": 0,
                          "streamed": 0, "ring_bytes": 0}
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
    """torch's ``read_data`` contract (``planner.load_bytes`` for each object,
    ``resolve_tensor``, the copy, ``commit_tensor`` for each tensor), over both paths at once:
    the streaming workers start, this thread reads the other items meanwhile, then the
    streamed tensors are committed once every copy is complete (:meth:`.Streaming.finish`).

    The order on CUDA: a streamed copy is enqueued on its worker's stream, which first waited
    for this thread's stream; ``finish`` waits on every worker's stream from the host, so
    when ``commit_tensor`` runs every byte is in place, for any stream that reads it next
    (megatron's, the model's). The whole path copies on this thread's stream and synchronizes
    before it lets the arena go. Nothing is committed after a failure."""
    jobs, rest = _streaming_jobs(reader, plan, planner)
    run = streaming.Streaming(jobs, reader.threads)
    try:
        _read_whole(reader, rest, planner)
    except BaseException:
        run.finish(cancel=True)
        raise
    error = run.finish()
    if error is not None:
        raise error
    reader.stats["ring_bytes"] = max(reader.stats["ring_bytes"], run.ring_bytes)
    for job in jobs:
        _count(reader, job.length, verified=True, streamed=job.streamed)
        planner.commit_tensor(job.req, job.target)


def _count(reader, length: int, verified: bool, streamed: bool = False) -> None:
    reader.stats["items"] += 1
    reader.stats["bytes"] += length
    reader.stats["verified"] += int(verified)
    reader.stats["streamed"] += int(streamed)


def _streaming_jobs(reader, plan, planner) -> tuple[list, list]:
    """The requests the streaming path loads (as jobs) and the rest, in the plan's order.
    A stored item that several requests read (resharding) is read whole, once."""
    if not reader.streaming:
        return [], list(plan.items)
    readers_of = Counter(_key(reader, req) for req in plan.items)
    jobs, rest = [], []
    for req in plan.items:
        job = _job(reader, req, planner) if readers_of[_key(reader, req)] == 1 else None
        if job is None:
            rest.append(req)
        else:
            jobs.append(job)
    return jobs, rest


def _key(reader, req) -> tuple:
    info = reader.storage_data[req.storage_index]
    return info.relative_path, info.offset, info.length


def _job(reader, req, planner):
    """A :class:`.streaming.Job` for ``req``, or None: the request reads the whole stored
    chunk (no narrowing) into a target of its dtype and shape that :func:`.streaming.streamable`
    accepts, and its writer recorded the item's CRC32C (hpctrain's writer: one stored record
    per tensor, no transforms)."""
    from torch.distributed.checkpoint.planner import LoadItemType
    info = reader.storage_data[req.storage_index]
    expected = reader.items.get(info.relative_path, {}).get(info.offset)
    chunk = _chunk(reader._metadata, req.storage_index)
    if req.type == LoadItemType.BYTE_IO or expected is None or chunk is None or \
            getattr(info, "transform_descriptors", None):
        return None
    dtype, shape = chunk
    if any(req.storage_offsets) or tuple(req.lengths) != shape:
        return None
    target = _plain_target(planner, req)
    if target is None or target.dtype != dtype or tuple(target.shape) != shape or \
            not streaming.streamable(target) or target.numel() == 0:
        return None
    return streaming.Job(req=req, name=info.relative_path,
                         path=os.path.join(str(reader.path), info.relative_path),
                         offset=info.offset, length=info.length, expected=expected,
                         target=target, nbytes=target.numel() * target.element_size())


def _plain_target(planner, req):
    """``planner.resolve_tensor(req)`` where the tensor it starts from is plain and contiguous
    (else None, and resolve_tensor is not called). megatron's planner resolves a
    non-contiguous FP8 target to a stand-in that its ``commit_tensor`` must follow at once
    (it keeps one pending); looking the tensor up first (``lookup_tensor`` and
    ``transform_tensor``, torch's ``DefaultLoadPlanner``'s own steps of ``resolve_tensor``)
    leaves such a target to the whole-item path, which resolves and commits it in turn."""
    lookup = getattr(planner, "lookup_tensor", None)
    transform = getattr(planner, "transform_tensor", None)
    if lookup is None or transform is None or \
            not streaming.plain(transform(req, lookup(req.dest_index))):
        return None
    return planner.resolve_tensor(req).detach()


def _read_whole(reader, requests: list, planner) -> None:
    """The whole-item path for ``requests``: every item they read placed in the arena, read
    and verified by a pool of threads, each loaded on this thread in the plan's order (an item
    is verified before anything is taken from it)."""
    import torch
    from torch.distributed.checkpoint.planner import LoadItemType
    from torch.distributed._shard._utils import narrow_tensor_by_index   # as torch's reader

    ranges: dict[tuple, int] = {}        # (file, offset, length) -> position in `order`
    order: list[tuple] = []
    placed = []
    for req in requests:
        key = _key(reader, req)
        if key not in ranges:
            ranges[key] = len(order)
            order.append(key)
        placed.append((req, ranges[key]))
    owner = "the resume"
    # the memory as it is: page-locking it first would cost more than it saves (staging)
    slots = reader.arena.acquire(owner, [length for _, _, length in order], page_locked=False)
    cuda = False
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(reader.threads, len(order) or 1)),
                                thread_name_prefix="hpctrain-read") as pool:
            done = [pool.submit(_fetch, reader, order[i], reader.arena.buffer(slots[i]))
                    for i in range(len(order))]
            verified = [None] * len(order)
            for req, i in placed:
                if verified[i] is None:
                    verified[i] = done[i].result()      # raises ChecksumMismatch
                    _count(reader, order[i][2], verified[i])
                buf = reader.arena.buffer(slots[i])
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, io.BytesIO(bytes(buf)))
                    continue
                tensor = _tensor(reader, req, buf, slots[i])
                tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
                target = planner.resolve_tensor(req).detach()
                check_size(req, target, tensor)
                target.copy_(tensor, non_blocking=True)
                cuda = cuda or target.device.type == "cuda"
                planner.commit_tensor(req, target)
    finally:
        if cuda:
            torch.cuda.synchronize()      # every copy out of the arena is done
        reader.arena.release(owner)


def _fetch(reader, item: tuple, buf: memoryview) -> bool:
    """Read one item into ``buf`` and verify it (a pool thread); whether it had a recorded
    CRC32C to verify against."""
    name, offset, length = item
    fd = os.open(os.path.join(str(reader.path), name), os.O_RDONLY)
    try:
        read_exactly(fd, buf, offset, name, offset + length)
    finally:
        os.close(fd)
    expected = reader.items.get(name, {}).get(offset)
    if expected is None:
        return False
    check_length(name, offset, length, expected)
    check_crc(name, offset, length, crc32c.crc32c(buf), expected)
    return True


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
