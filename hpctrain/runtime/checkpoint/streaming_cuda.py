"""The CUDA layer of the resume's streaming path (:mod:`.streaming`): the ring's memory and its
copies to the GPU, and nothing else.

* the ring is page-locked memory (``torch.empty(..., pin_memory=True)``), allocated once per
  process on the thread that loads (the rank's device) and kept for later loads: a copy from
  it is DMA, asynchronous to the worker that enqueued it;
* each worker copies on a CUDA stream of its own, which first waits for the work already
  enqueued on the loading thread's stream (megatron zeroes the targets of tensors it loads in
  part there), so workers' copies overlap each other and the reads;
* an event per ring buffer, recorded after the copy out of it, is waited for before the buffer
  is read into again;
* :meth:`CudaCopies.finish` synchronizes every worker's stream: the reader commits the
  tensors only after it, whether the load succeeded or not, so the consumer (megatron, then
  the model on its default stream) sees every copy completed.

Untested here without a GPU: :mod:`.streaming` runs the same ring with
:class:`~.streaming.HostCopies` on the CPU.
"""

from __future__ import annotations

_PINNED = None          # the process's ring memory (page-locked), grown if a load needs more


def pinned_ring(nbytes: int):
    """``nbytes`` of page-locked memory, allocated once per process (again only to grow)."""
    import torch
    global _PINNED
    if _PINNED is None or _PINNED.numel() < nbytes:
        _PINNED = None                      # (the smaller ring goes back to torch's cache)
        _PINNED = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    return _PINNED[:nbytes]


class CudaCopies:
    """:class:`~.streaming.HostCopies`'s interface on CUDA: ``workers`` streams, ``buffers``
    events per worker, the ring in page-locked memory."""

    def __init__(self, workers: int, buffers: int, nbytes: int, device) -> None:
        import torch
        self.device = device
        self.memory = pinned_ring(nbytes)
        loading = torch.cuda.current_stream(device)
        self.streams = [torch.cuda.Stream(device=device) for _ in range(workers)]
        for stream in self.streams:
            stream.wait_stream(loading)     # after what the loading thread enqueued
        self.events = [[None] * buffers for _ in range(workers)]

    def start_worker(self, worker: int) -> None:
        """A new thread's CUDA device is device 0: work on the rank's own."""
        import torch
        torch.cuda.set_device(self.device)

    def before_reuse(self, worker: int, k: int) -> None:
        event = self.events[worker][k]
        if event is not None:
            event.synchronize()             # the copy out of buffer k is done

    def copy(self, worker: int, k: int, dst, src) -> None:
        import torch
        stream = self.streams[worker]
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        self.events[worker][k] = event

    def copy_whole(self, worker: int, dst, src) -> None:
        """A copy from pageable memory (an item read whole): done before it returns."""
        import torch
        stream = self.streams[worker]
        with torch.cuda.stream(stream):
            dst.copy_(src)
        stream.synchronize()

    def finish(self) -> None:
        for stream in self.streams:
            stream.synchronize()
