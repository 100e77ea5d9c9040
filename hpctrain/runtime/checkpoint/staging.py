"""Host memory for checkpoint bytes: allocated once per process, reused by every save and the
resume, and never handed out while a writer still reads it.

megatron-core's asynchronous save copies every tensor to freshly allocated pinned memory on
the training thread (``tensor.to("cpu", non_blocking=True)``: torch's pinned-memory cache,
cudaHostAlloc the first time), forks the writer, and drops its references as soon as the
writer has started. Two costs follow: the allocation stalls training on every save whose
sizes the cache cannot serve, and the released blocks go back to the cache while the writer
is still reading them, so the next pinned allocation (the data loader's batches, a flag
tensor) may be given the same memory and overwrite bytes not yet written (pinned memory is a
shared mapping: a forked child sees the parent's later writes).

:class:`HostArena` owns the memory instead:

* segments of anonymous ``MAP_SHARED`` memory (the same sharing across ``fork`` as pinned
  memory, so the CPU rehearsal runs the same code path and the same lifetime rules), on CUDA
  page-locked with ``cudaHostRegister`` so that copies to and from the GPU are asynchronous
  DMA; sized to exactly what is placed in them (torch's pinned cache rounds every block up to
  a power of two);
* allocated when the model is built (:meth:`reserve`: anonymous memory, mapped lazily, so
  this costs nothing), and page-locked by a background thread (on the rank's CUDA device)
  that starts only after the attempt's first step (:meth:`lock_pages`), so the training
  thread does not pay for it; a save that needs more than was reserved grows the arena once
  and keeps it;
* page-locking is slow (about 1.4 GB/s on an H100 host: 10.5 s for 14.7 GB) and holds a
  driver-wide lock that the CUDA memory calls of every process on the node wait for. So it
  never runs while a resume builds its optimizer state and copies the checkpoint to the GPU
  (the resume reads the items it reads whole into the memory as it is: a copy from pageable
  memory is synchronous, and still far faster than locking the pages first; the items it
  streams go through a small ring of their own, :mod:`.streaming`), nor during the first
  step, when the
  caching allocator is still asking CUDA for memory. A save's placement waits for it (a save
  before the first step starts it);
* :meth:`acquire` places tensors in it for one owner (a save, or the resume) and refuses to
  place anything while another owner holds it: a save's bytes stay untouched until
  :meth:`release`, which the save calls after its writer finished;
* every placed tensor has a storage of its own (``torch.frombuffer`` over its slice), so
  ``torch.save`` writes that tensor's bytes, not the whole segment.
"""

from __future__ import annotations

import mmap
import threading
import time
from dataclasses import dataclass

SEGMENT_BYTES = 256 << 20
GROW_BYTES = 16 << 20       # the least a save that outgrows the reservation adds
ALIGN = 64


class ArenaBusy(RuntimeError):
    """The arena's memory is held by a writer (or a load) that has not finished."""


@dataclass
class Slot:
    segment: int
    offset: int
    nbytes: int


class CudaPageLock:
    """``cudaHostRegister`` for the CUDA device of the thread that made it. A new thread's
    CUDA device is device 0: page-locking from it would open a CUDA context on GPU 0 for every
    rank of the node; this works on the rank's own device from any thread."""

    def __init__(self) -> None:
        import torch
        self.device = torch.cuda.current_device()

    def __call__(self, data_ptr: int, nbytes: int) -> str | None:
        """Page-lock ``nbytes`` at ``data_ptr``; None, or why not."""
        import torch
        torch.cuda.set_device(self.device)
        rc = torch.cuda.cudart().cudaHostRegister(data_ptr, nbytes, 0)
        return None if int(getattr(rc, "value", rc)) == 0 else f"cudaHostRegister returned {rc}"


class _Segment:
    def __init__(self, nbytes: int) -> None:
        import torch
        self.nbytes = nbytes
        self.map = mmap.mmap(-1, nbytes)       # anonymous and MAP_SHARED
        self.bytes = torch.frombuffer(self.map, dtype=torch.uint8)
        self.used = 0
        self.pinned = False
        self.pin_error: str | None = None

    def lock(self, page_lock) -> None:
        """Page-lock this segment (once: a failure is kept in ``pin_error``, not retried)."""
        if not self.pinned and self.pin_error is None:
            self.pin_error = page_lock(self.bytes.data_ptr(), self.nbytes)
            self.pinned = self.pin_error is None

    def view(self, offset: int, nbytes: int):
        """``nbytes`` at ``offset`` as a uint8 tensor with a storage of its own."""
        import torch
        if nbytes == 0:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(self.map, dtype=torch.uint8, count=nbytes, offset=offset)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class HostArena:
    """``pin``: page-lock the memory (CUDA), with ``page_lock(data_ptr, nbytes) -> error or
    None`` (default: a :class:`CudaPageLock` made on the thread that first needs it)."""

    def __init__(self, pin: bool, segment_bytes: int = SEGMENT_BYTES, page_lock=None) -> None:
        self.pin = pin
        self.page_lock = page_lock
        self.segment_bytes = segment_bytes
        self.segments: list[_Segment] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._ready.set()
        self._thread: threading.Thread | None = None
        self.holder: str | None = None
        self.lock_seconds: float | None = None     # how long page-locking took
        self.locked_after_step: int | None = None  # the step after which it started
        self.grown_bytes = 0          # allocated on the caller's thread (more than reserved)
        self.last_sizes: list[int] = []

    # ---------------------------------------------------------------- allocation
    @property
    def capacity(self) -> int:
        return sum(s.nbytes for s in self.segments)

    @property
    def pinned_bytes(self) -> int:
        return sum(s.nbytes for s in self.segments if s.pinned)

    @property
    def locking_started(self) -> bool:
        return self._thread is not None

    def reserve(self, nbytes: int) -> None:
        """Allocate ``nbytes`` (mapped lazily: instant); :meth:`lock_pages` page-locks them."""
        with self._lock:
            while self.capacity < nbytes:
                self.segments.append(_Segment(min(self.segment_bytes, nbytes - self.capacity)))

    def lock_pages(self, after_step: int | None = None) -> None:
        """Page-lock every segment in a background thread (once; nothing to do off CUDA).
        ``after_step``: the step it follows, for the record."""
        if not self.pin or self._thread is not None:
            return
        self._ready.clear()
        self.locked_after_step = after_step
        page_lock = self._page_lock()

        def work():
            started = time.monotonic()
            try:
                for segment in self._snapshot():
                    segment.lock(page_lock)
            finally:
                self.lock_seconds = time.monotonic() - started
                self._ready.set()

        self._thread = threading.Thread(target=work, name="hpctrain-host-arena", daemon=True)
        self._thread.start()

    def _page_lock(self):
        if self.page_lock is None:
            self.page_lock = CudaPageLock()
        return self.page_lock

    def _snapshot(self) -> list[_Segment]:
        with self._lock:
            return list(self.segments)

    def wait_ready(self) -> float:
        """Wait for page-locking in progress; returns the seconds waited."""
        started = time.monotonic()
        self._ready.wait()
        return time.monotonic() - started

    # ---------------------------------------------------------------- placement
    def acquire(self, owner: str, sizes: list[int], page_locked: bool = True) -> list[Slot]:
        """Places for tensors of ``sizes`` bytes, for ``owner`` alone until :meth:`release`.
        ``page_locked``: in page-locked memory where the arena pins (a save: its copies from
        the GPU are then asynchronous), waiting for page-locking in progress and starting it
        if it has not started; False (the resume) takes the memory as it is, now."""
        if page_locked:
            self.lock_pages()
            self.wait_ready()
            if self.pin:    # memory a later resume added (rare: a restart in the process)
                for segment in self._snapshot():
                    segment.lock(self._page_lock())
        with self._lock:
            if self.holder is not None and self.holder != owner:
                raise ArenaBusy(f"host staging memory is held by {self.holder}")
            self.holder = owner
            self.last_sizes = list(sizes)
            for s in self.segments:
                s.used = 0
            slots = []
            for n in sizes:
                slots.append(self._place(_aligned(n), page_locked) if n else Slot(-1, 0, 0))
            return [Slot(s.segment, s.offset, n) for s, n in zip(slots, sizes)]

    def _place(self, n: int, page_locked: bool) -> Slot:
        for i, s in enumerate(self.segments):
            if s.nbytes - s.used >= n:
                slot = Slot(i, s.used, n)
                s.used += n
                return slot
        segment = _Segment(max(n, GROW_BYTES))
        if self.pin and page_locked:
            segment.lock(self._page_lock())  # (a resume's growth is locked with the rest)
        self.grown_bytes += segment.nbytes
        self.segments.append(segment)
        segment.used = n
        return Slot(len(self.segments) - 1, 0, n)

    def release(self, owner: str | None = None) -> None:
        """``owner`` is done with its memory (None: whoever held it; the caller knows that
        every writer has finished)."""
        with self._lock:
            if owner is None or self.holder == owner:
                self.holder = None

    def tensor(self, slot: Slot, dtype, shape):
        """The placed bytes as a tensor of ``dtype`` and ``shape`` (its own storage)."""
        import torch
        if slot.nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        return self.segments[slot.segment].view(slot.offset, slot.nbytes).view(dtype).view(shape)

    def buffer(self, slot: Slot) -> memoryview:
        """The placed bytes, for reading into and checksumming."""
        if slot.nbytes == 0:
            return memoryview(b"")
        return memoryview(self.segments[slot.segment].map)[slot.offset:slot.offset + slot.nbytes]

    def is_pinned(self, slot: Slot) -> bool:
        return slot.nbytes > 0 and self.segments[slot.segment].pinned

    def lock_record(self) -> dict | None:
        """When page-locking ran (None where it did not finish, or the arena does not pin)."""
        if self.lock_seconds is None:
            return None
        return {"after_step": self.locked_after_step, "seconds": round(self.lock_seconds, 3),
                "bytes": self.pinned_bytes}

    def describe(self) -> str:
        """One line for the log; its time is the record's (rounded once, so the log and the
        run record never disagree in the last digit)."""
        record = self.lock_record()
        pinned = f", {self.pinned_bytes / 1e9:.2f} GB page-locked" if self.pin else ""
        took = f" in {record['seconds']:.2f}s" if record is not None else ""
        after = (f" after step {self.locked_after_step}" if self.locked_after_step is not None
                 else "")
        return f"{self.capacity / 1e9:.2f} GB host staging{pinned}{took}{after}"


_ARENA: HostArena | None = None


def process_arena(device: str, cpu_page_lock=None) -> HostArena:
    """The one arena of this process (every save and the resume share it), page-locked on
    CUDA; on the CPU by ``cpu_page_lock`` when given (a test's stand-in)."""
    global _ARENA
    if _ARENA is None:
        stand_in = cpu_page_lock if device != "cuda" else None
        _ARENA = HostArena(pin=device == "cuda" or stand_in is not None, page_lock=stand_in)
    return _ARENA


def staging_estimate(mo, layout) -> int:
    """What this rank will stage for a save (and read at resume), before the first save: its
    parameters and Adam's state for them (the fp32 main copy of 16-bit parameters and two
    moments), over the data-parallel ranks, which write one share each (megatron-core's fully
    parallel save spreads the replicated tensors over them). The arena grows if it is short."""
    numel = param_bytes = 0
    for module in mo.modules:
        for p in module.parameters():
            numel += p.numel()
            param_bytes += p.numel() * p.element_size()
    sixteen_bit = param_bytes < 4 * numel
    optimizer = numel * (12 if sixteen_bit else 8)
    share = (param_bytes + optimizer) // max(1, layout.data_parallel_size)
    # slack for the small objects and padding of a save, and an uneven spread over DP ranks
    return share + share // 10 + GROW_BYTES
