"""The resume's streaming path: each item read in chunks by a worker thread, checksummed as the
chunks arrive and copied into its target as they go, instead of read whole into host memory
first.

:mod:`.reader` hands a :class:`Job` here for every item that loads whole into one tensor (the
request covers the stored chunk: no narrowing, no resharding; the target is a plain contiguous
tensor of the chunk's dtype and shape, on the CPU or this rank's GPU; its writer recorded its
CRC32C). For each, a worker:

1. finds where the tensor's bytes lie in the item (a one-tensor ``torch.save`` archive) from
   the item's last bytes (:func:`.items.record_from_tail`); where that is not enough it reads
   the item whole, verifies it and copies the tensor (:func:`_whole`);
2. reads the item from its first byte to its last in :func:`pieces` of at most
   :data:`CHUNK_BYTES`, each within the archive's headers, the record or what follows it;
3. continues the item's CRC32C over each piece as it arrives (every byte, in order), and
   copies a piece of the record into the matching bytes of the target;
4. compares the CRC32C with its writer's once the last piece is in: a damaged item raises
   :class:`~.items.ChecksumMismatch`, which stops every worker at its next piece.

Where the pieces land (a :class:`Landing`):

* a CPU target: straight into its memory (:class:`DirectLanding`; the archive's headers, a few
  KB, into a buffer of their own), so the item is read once and copied never;
* a CUDA target: into a ring of :data:`BUFFERS_PER_THREAD` buffers per worker
  (:class:`RingLanding`), from which each record piece is copied to the GPU; the memory and
  the copies are :mod:`.streaming_cuda`'s (page-locked memory allocated once per process,
  a stream per worker, an event per buffer guarding its reuse, copies asynchronous). The same
  ring runs on the CPU with plain memory and synchronous copies (:class:`HostCopies`), which
  is how the tests run it (``DIRECT_TO_HOST = False``).

Nothing a worker copied is handed on before :meth:`Streaming.finish` has joined every worker
and waited for every copy (one synchronize of each worker's stream), whether the load succeeds
or fails: the reader commits the tensors after it, and a failed load never has a copy of the
damaged checkpoint land after the next checkpoint's load began.
"""

from __future__ import annotations

import io
import os
import threading
from dataclasses import dataclass

import crc32c

from .items import (check_crc, check_length, check_size, raw_record, read_exactly,
                    record_from_tail)

# the largest piece read at once; reading and copying overlap across workers, so larger
# buffers buy nothing once a read is many times a syscall's cost, and the CUDA ring is
# page-locked once per process (at about 1.4 GB/s: 8 workers x 2 x 16 MiB in about 0.2 s)
CHUNK_BYTES = 16 << 20
BUFFERS_PER_THREAD = 2
DIRECT_TO_HOST = True      # a CPU target's record read straight into it (False: through a ring)


def pieces(length: int, start: int, nbytes: int, chunk: int):
    """``(position in the item, bytes, position in the record or None)`` covering the item's
    ``length`` bytes in order, each at most ``chunk`` bytes and each within one of the three
    parts: before the record (``start``), the record (``nbytes``), after it."""
    for lo, hi, in_record in ((0, start, False), (start, start + nbytes, True),
                              (start + nbytes, length, False)):
        for pos in range(lo, hi, chunk):
            yield pos, min(chunk, hi - pos), (pos - start if in_record else None)


def plain(tensor) -> bool:
    """A tensor whose memory is its bytes in order (no subclass with data of its own, such as
    Transformer Engine's FP8 tensors; contiguous)."""
    import torch
    return type(tensor) in (torch.Tensor, torch.nn.Parameter) and tensor.is_contiguous()


def streamable(target) -> bool:
    """A target the streaming path writes: plain, on the CPU or this rank's current GPU."""
    import torch
    if not plain(target):
        return False
    if target.device.type == "cuda":
        return target.device.index == torch.cuda.current_device()
    return target.device.type == "cpu"


def target_bytes(target):
    """The target's memory as a flat uint8 tensor (it is contiguous)."""
    import torch
    return target.reshape(-1).view(torch.uint8)


@dataclass
class Job:
    req: object              # the read request (the reader commits it after finish())
    name: str                # the file, relative to the checkpoint folder
    path: str
    offset: int
    length: int
    expected: tuple          # (length, crc32c hex) its writer recorded
    target: object           # the tensor it loads into
    nbytes: int              # the target's bytes: the record's size
    streamed: bool = False   # True once streamed; False after a whole read (or not yet read)


class DirectLanding:
    """CPU targets: a record piece is read straight into the target's memory, the rest of the
    item into a buffer of its own."""

    ring_bytes = 0

    def start_worker(self, worker: int) -> None:
        pass

    def space(self, worker: int, job: Job, dest: int | None, n: int):
        if dest is None:
            return memoryview(bytearray(n))
        return memoryview(target_bytes(job.target).numpy())[dest:dest + n]

    def land(self, worker: int, view, job: Job, dest: int | None) -> None:
        pass          # already where it belongs

    def copy_whole(self, worker: int, dst, src) -> None:
        dst.copy_(src)

    def finish(self) -> None:
        pass


class HostCopies:
    """The ring's memory and copies on the CPU: plain memory, synchronous copies (what
    :class:`.streaming_cuda.CudaCopies` does with page-locked memory and streams)."""

    def __init__(self, nbytes: int) -> None:
        import torch
        self.memory = torch.empty(nbytes, dtype=torch.uint8)

    def start_worker(self, worker: int) -> None:
        pass

    def before_reuse(self, worker: int, k: int) -> None:
        pass

    def copy(self, worker: int, k: int, dst, src) -> None:
        dst.copy_(src)

    def copy_whole(self, worker: int, dst, src) -> None:
        dst.copy_(src)

    def finish(self) -> None:
        pass


class RingLanding:
    """Each piece read into the worker's next buffer of the ring (``copies.memory``: workers x
    :data:`BUFFERS_PER_THREAD` buffers of ``chunk`` bytes), checksummed there, and a record
    piece copied from it into the target. A buffer is written again only after
    ``copies.before_reuse`` (the wait for the copy out of it)."""

    def __init__(self, workers: int, chunk: int, copies) -> None:
        self.copies = copies
        n = workers * BUFFERS_PER_THREAD
        self.buffers = [copies.memory[i * chunk:(i + 1) * chunk] for i in range(n)]
        self.views = [memoryview(b.numpy()) for b in self.buffers]
        self.turn = [0] * workers
        self.ring_bytes = n * chunk

    def start_worker(self, worker: int) -> None:
        self.copies.start_worker(worker)

    def space(self, worker: int, job: Job, dest: int | None, n: int):
        k = self.turn[worker]
        self.turn[worker] = (k + 1) % BUFFERS_PER_THREAD
        self.copies.before_reuse(worker, k)
        return self.views[worker * BUFFERS_PER_THREAD + k][:n]

    def land(self, worker: int, view, job: Job, dest: int | None) -> None:
        if dest is None:
            return
        k = (self.turn[worker] - 1) % BUFFERS_PER_THREAD      # the buffer space() gave
        src = self.buffers[worker * BUFFERS_PER_THREAD + k][:len(view)]
        self.copies.copy(worker, k, target_bytes(job.target)[dest:dest + len(view)], src)

    def copy_whole(self, worker: int, dst, src) -> None:
        self.copies.copy_whole(worker, dst, src)

    def finish(self) -> None:
        self.copies.finish()


def stream_item(job: Job, landing, worker: int, chunk: int, stop: threading.Event) -> None:
    """Read, checksum and copy one item (the module's steps 1-4); returns early, leaving the
    item unread, once ``stop`` is set (another item failed: the load is over)."""
    fd = os.open(job.path, os.O_RDONLY)
    try:
        check_length(job.name, job.offset, job.length, job.expected)
        start = record_from_tail(fd, job.name, job.offset, job.length, job.nbytes)
        if start is None:
            return _whole(fd, job, landing, worker)
        crc = 0
        end = job.offset + job.length
        for pos, n, dest in pieces(job.length, start, job.nbytes, chunk):
            if stop.is_set():
                return
            view = landing.space(worker, job, dest, n)
            read_exactly(fd, view, job.offset + pos, job.name, end)
            crc = crc32c.crc32c(view, crc)
            landing.land(worker, view, job, dest)
        check_crc(job.name, job.offset, job.length, crc, job.expected)
        job.streamed = True
    finally:
        os.close(fd)


def _whole(fd: int, job: Job, landing, worker: int) -> None:
    """An item whose record its tail does not locate (an archive of another form): read whole,
    verified, then its tensor (the record where it is one, else ``torch.load``'s) copied."""
    import torch
    buf = bytearray(job.length)
    read_exactly(fd, memoryview(buf), job.offset, job.name, job.offset + job.length)
    check_crc(job.name, job.offset, job.length, crc32c.crc32c(buf), job.expected)
    start = raw_record(memoryview(buf), job.nbytes)
    if start is not None:
        src = torch.frombuffer(buf, dtype=torch.uint8, count=job.nbytes, offset=start)
        landing.copy_whole(worker, target_bytes(job.target), src)
        return
    tensor = torch.load(io.BytesIO(bytes(buf)), map_location="cpu", weights_only=True)
    check_size(job.req, job.target, tensor)
    landing.copy_whole(worker, job.target, tensor)


class Landings:
    """The landing of each job's target: CPU targets direct (or through a CPU ring), CUDA
    targets through the CUDA ring (made only when a job needs it)."""

    def __init__(self, jobs: list[Job], workers: int, chunk: int) -> None:
        self.host = DirectLanding() if DIRECT_TO_HOST else \
            RingLanding(workers, chunk, HostCopies(workers * BUFFERS_PER_THREAD * chunk))
        self.cuda = None
        devices = {job.target.device for job in jobs if job.target.device.type == "cuda"}
        if devices:
            from .streaming_cuda import CudaCopies
            (device,) = devices                 # streamable(): this rank's device only
            self.cuda = RingLanding(workers, chunk, CudaCopies(
                workers, BUFFERS_PER_THREAD, workers * BUFFERS_PER_THREAD * chunk, device))

    def all(self) -> list:
        return [x for x in (self.host, self.cuda) if x is not None]

    def of(self, job: Job):
        return self.cuda if job.target.device.type == "cuda" else self.host

    @property
    def ring_bytes(self) -> int:
        return sum(x.ring_bytes for x in self.all())


class Streaming:
    """The workers streaming a load's jobs (started at once: the reader reads the other items
    on its own thread meanwhile); :meth:`finish` ends them."""

    def __init__(self, jobs: list[Job], threads: int) -> None:
        self.jobs = jobs
        self.chunk = CHUNK_BYTES
        self.workers = max(1, min(threads, len(jobs)))
        self.landings = Landings(jobs, self.workers, self.chunk) if jobs else None
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self._next = iter(jobs)
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._work, args=(w,), daemon=True,
                                         name=f"hpctrain-stream-{w}")
                        for w in range(self.workers if jobs else 0)]
        for t in self.threads:
            t.start()

    @property
    def ring_bytes(self) -> int:
        return self.landings.ring_bytes if self.landings is not None else 0

    def _take(self) -> Job | None:
        with self._lock:
            return next(self._next, None)

    def _work(self, worker: int) -> None:
        try:
            for landing in self.landings.all():
                landing.start_worker(worker)
            while not self.stop.is_set() and (job := self._take()) is not None:
                stream_item(job, self.landings.of(job), worker, self.chunk, self.stop)
        except BaseException as e:  # noqa: BLE001 - handed to finish(), which raises it
            self.errors.append(e)
            self.stop.set()

    def finish(self, cancel: bool = False) -> BaseException | None:
        """Join every worker (``cancel``: at its next piece) and wait for every copy it
        started, then return the first error (None: every job loaded)."""
        if cancel:
            self.stop.set()
        for t in self.threads:
            t.join()
        for landing in self.landings.all() if self.landings is not None else ():
            landing.finish()
        return self.errors[0] if self.errors else None
