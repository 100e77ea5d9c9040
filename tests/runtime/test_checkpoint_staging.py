"""The save path's host memory and checksums, on their own (hpctrain.runtime.checkpoint.staging,
.writer, .reader): the staging memory is allocated once and reused, never handed out while a
writer holds it, shared with a forked writer exactly as CUDA pinned memory is (which is why
holding it matters), and the checksum recorded for the bytes written catches one flipped byte.
The same code runs in every save and resume of the runtime tests; the end-to-end check (the
weights loaded equal the digest taken at the save, with memory of the staged sizes filled
while the writer ran) is in test_checkpoint_io_runs.py."""

from __future__ import annotations

import io
import json
import os
import queue

import crc32c
import pytest

torch = pytest.importorskip("torch")

from hpctrain.record import checkpoint_store as store  # noqa: E402
from hpctrain.runtime.checkpoint import reader, staging, writer  # noqa: E402


def test_staging_memory_is_reused_by_every_save_and_sized_exactly():
    arena = staging.HostArena(pin=False, segment_bytes=1 << 20)
    arena.reserve(3 << 20)
    assert arena.wait_ready() >= 0 and arena.capacity == 3 << 20
    sizes = [1000, 4096, 700_000, 0]
    first = arena.acquire("save 1", sizes)
    ptrs = [arena.tensor(s, torch.uint8, (n,)).data_ptr() for s, n in zip(first, sizes) if n]
    arena.release("save 1")
    second = arena.acquire("save 2", sizes)
    assert [arena.tensor(s, torch.uint8, (n,)).data_ptr() for s, n in zip(second, sizes)
            if n] == ptrs                                   # the same memory, again
    assert arena.capacity == 3 << 20 and arena.grown_bytes == 0
    # each placed tensor has a storage of its own: torch.save writes its bytes, not a segment
    t = arena.tensor(second[0], torch.uint8, (1000,))
    assert t.untyped_storage().nbytes() == 1000
    buf = io.BytesIO()
    torch.save(t, buf)
    assert len(buf.getvalue()) < 1000 + 2048


def test_a_save_larger_than_the_reservation_grows_the_memory_once():
    arena = staging.HostArena(pin=False, segment_bytes=1 << 20)
    arena.reserve(1 << 20)
    arena.acquire("save 1", [900_000, 900_000, 20 << 20])
    grown = arena.grown_bytes
    assert grown == staging.GROW_BYTES + (20 << 20)
    arena.release("save 1")
    arena.acquire("save 2", [900_000, 900_000, 20 << 20])
    assert arena.grown_bytes == grown                       # kept, not allocated again


def test_memory_held_by_a_writer_is_not_given_out():
    arena = staging.HostArena(pin=False, segment_bytes=1 << 20)
    arena.acquire("the save of step 20", [4096])
    with pytest.raises(staging.ArenaBusy, match="held by the save of step 20"):
        arena.acquire("the data loader", [4096])
    arena.release("the data loader")                        # not the holder: nothing happens
    with pytest.raises(staging.ArenaBusy):
        arena.acquire("the data loader", [4096])
    arena.release("the save of step 20")
    arena.acquire("the data loader", [4096])


class PageLocks:
    """A stand-in for cudaHostRegister (the CPU has none): records the bytes each call
    page-locks and the thread it ran on, taking ``seconds`` (or failing with ``error``)."""

    def __init__(self, seconds: float = 0.0, error: str | None = None, gate=None) -> None:
        import threading
        self.seconds, self.error, self.gate = seconds, error, gate
        self.calls: list[tuple[int, str]] = []
        self.main = threading.current_thread().name

    def __call__(self, data_ptr: int, nbytes: int):
        import threading
        import time
        if self.gate is not None:
            self.gate.wait()
        time.sleep(self.seconds)
        self.calls.append((nbytes, threading.current_thread().name))
        return self.error


def test_page_locking_waits_for_the_first_step_and_never_for_the_resume():
    """Page-locking holds a driver-wide lock that CUDA memory calls wait for: the resume
    (which builds the optimizer's state on the GPU) reads into the memory as it is, and
    locking starts after the first step, in the background, once."""
    import threading
    gate = threading.Event()             # every page-lock call waits here until it opens
    locks = PageLocks(seconds=0.05, gate=gate)
    arena = staging.HostArena(pin=True, segment_bytes=1 << 20, page_lock=locks)
    arena.reserve(3 << 20)
    assert arena.capacity == 3 << 20 and not locks.calls and not arena.locking_started
    sizes = [900_000, 900_000, 900_000, 4 << 20]            # the last one grows the arena
    arena.acquire("the resume", sizes, page_locked=False)
    assert not locks.calls and arena.pinned_bytes == 0 and not arena.locking_started
    # nothing to wait for: page-locking begun by the resume would hold this wait at the gate
    # (a bound on the wait's seconds would also fail on a machine too busy to return in time)
    waiting = threading.Thread(target=arena.wait_ready)
    waiting.start()
    waiting.join(timeout=60)
    returned = not waiting.is_alive()
    gate.set()
    waiting.join()
    assert returned
    arena.release("the resume")
    arena.lock_pages(after_step=1)
    arena.lock_pages(after_step=2)                          # once
    arena.wait_ready()
    assert sorted(n for n, _ in locks.calls) == sorted(s.nbytes for s in arena.segments)
    assert all(thread == "hpctrain-host-arena" for _, thread in locks.calls)
    assert arena.pinned_bytes == arena.capacity
    assert arena.lock_record()["after_step"] == 1 and "after step 1" in arena.describe()
    slots = arena.acquire("the save of step 2", sizes + [0])
    assert len(locks.calls) == len(arena.segments)          # nothing locked again
    assert all(arena.is_pinned(s) for s in slots[:-1]) and not arena.is_pinned(slots[-1])


def test_a_save_before_the_first_step_starts_page_locking_and_waits_for_it():
    locks = PageLocks(seconds=0.05)
    arena = staging.HostArena(pin=True, segment_bytes=1 << 20, page_lock=locks)
    arena.reserve(2 << 20)
    slots = arena.acquire("an emergency save", [1 << 20, 1 << 20, 3 << 20])
    # every placed byte is page-locked when the save gets it: the reserved segments by the
    # background thread, the one it grew by the save's own thread
    assert arena.pinned_bytes == arena.capacity and all(arena.is_pinned(s) for s in slots)
    assert [t for _, t in locks.calls] == ["hpctrain-host-arena"] * 2 + [locks.main]
    assert arena.lock_record()["after_step"] is None


def test_a_synchronous_save_does_not_wait_for_page_locking_in_progress(tmp_path):
    """An emergency save right after a resume stages on the training thread anyway: it takes
    the memory as it is while page-locking (held here until the save is done) goes on."""
    import threading
    gate = threading.Event()
    locks = PageLocks(gate=gate)
    arena = staging.HostArena(pin=True, segment_bytes=1 << 20, page_lock=locks)
    arena.reserve(2 << 20)
    arena.lock_pages(after_step=1)
    tensor = torch.arange(1000, dtype=torch.float32)
    staged = []
    save = threading.Thread(target=lambda: staged.append(writer.stage(
        arena, "the emergency save", [("f", "k", ([], [("item", tensor)]))], page_locked=False)))
    save.start()
    save.join(timeout=60)
    finished = not save.is_alive()
    gate.set()
    save.join()
    assert finished and not locks.calls                     # staged while the lock was held
    ((_, _, (_, ((_, copy),))),) = staged[0]
    assert torch.equal(copy, tensor)
    arena.wait_ready()
    assert arena.pinned_bytes == arena.capacity


def test_memory_that_could_not_be_page_locked_is_still_used_and_not_locked_again():
    locks = PageLocks(error="cudaHostRegister returned 2")
    arena = staging.HostArena(pin=True, segment_bytes=1 << 20, page_lock=locks)
    arena.reserve(1 << 20)
    arena.lock_pages(after_step=1)
    arena.wait_ready()
    (slot,) = arena.acquire("save 1", [1000])
    arena.release("save 1")
    arena.acquire("save 2", [1000])
    assert len(locks.calls) == 1 and not arena.is_pinned(slot)
    assert arena.segments[0].pin_error == "cudaHostRegister returned 2"
    assert "0.00 GB page-locked" in arena.describe()


def test_off_cuda_nothing_is_page_locked_without_a_stand_in():
    arena = staging.HostArena(pin=False)
    arena.reserve(1 << 20)
    arena.lock_pages(after_step=1)
    assert not arena.locking_started and arena.lock_record() is None


def test_a_forked_writer_sees_what_the_rank_writes_into_staging_memory_later():
    """Why the memory must be held until the writer is done: staging memory is shared with
    the forked writer (as pinned memory is), so bytes reused by the rank after the fork are
    the bytes the writer writes. Ordinary memory would be copied on write, which is why the
    hazard cannot show on the CPU with megatron-core's own staging."""
    arena = staging.HostArena(pin=False, segment_bytes=1 << 20)
    (slot,) = arena.acquire("save", [1 << 16])
    staged = arena.tensor(slot, torch.uint8, (1 << 16,))
    staged.fill_(1)
    private = bytearray(b"\x01" * (1 << 16))
    r, w = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:                     # the writer (no torch ops: its thread pool is the parent's)
        os.read(r, 1)                                       # until the rank reused the memory
        os.write(w2, json.dumps([sum(arena.buffer(slot)), sum(private)]).encode())
        os._exit(0)
    staged.fill_(0xA5)                                      # released early and reused ...
    private[:] = b"\xa5" * (1 << 16)
    os.write(w, b"x")
    seen = json.loads(os.read(r2, 100))
    os.waitpid(pid, 0)
    assert seen[0] == 0xA5 * (1 << 16)                      # ... the writer writes the new bytes
    assert seen[1] == 1 << 16                               # copy-on-write memory would not


def _write_one(tmp_path, tensors: dict, progress=None) -> tuple[dict, dict]:
    """Write ``tensors`` as one bucket through the writer, as a save does."""
    from torch.distributed.checkpoint.filesystem import _StorageWriterTransforms

    from tests.runtime.helpers import tensor_write_item
    arena = staging.HostArena(pin=False)
    items = [(tensor_write_item(name, t), t) for name, t in tensors.items()]
    buckets = [(str(tmp_path / "__0_0.distcp"), "__0_", ([], items))]
    staged = writer.stage(arena, "save", buckets)
    q = queue.Queue()
    writer.write_buckets([_StorageWriterTransforms()], 0, staged, q, folder=str(tmp_path),
                         sidecar="sums.json", progress=progress)
    results = q.get_nowait()
    assert not isinstance(results, Exception), results
    return results, json.loads((tmp_path / "sums.json").read_text())["files"]["__0_0.distcp"]


def test_the_writer_records_the_crc32c_of_every_item_and_file_it_writes(tmp_path):
    tensors = {"a": torch.arange(1000, dtype=torch.float32), "b": torch.randn(3, 5).bfloat16()}
    sizes_on_disk = []      # what the writer had written each time it reported progress
    results, sums = _write_one(tmp_path, tensors, progress=lambda: sizes_on_disk.append(
        (tmp_path / "__0_0.distcp").stat().st_size))
    # progress after each item (the hang watchdog's, for a synchronous save), the file growing
    assert len(sizes_on_disk) == 2 and 0 < sizes_on_disk[0] < sizes_on_disk[1]
    data = (tmp_path / "__0_0.distcp").read_bytes()
    assert sums["size"] == len(data) and sums["crc32c"] == writer.crc_hex(crc32c.crc32c(data))
    written = sorted((r.storage_data.offset, r.storage_data.length) for r in results[0])
    assert [tuple(i[:2]) for i in sums["items"]] == written
    for offset, length, crc in sums["items"]:
        assert crc == writer.crc_hex(crc32c.crc32c(data[offset:offset + length]))
    # the item's bytes hold the tensor's, where the resume takes them without a copy
    offset, length, _ = sums["items"][0]
    view = memoryview(data)[offset:offset + length]
    start = reader.raw_record(view, 4000)
    assert start is not None
    assert torch.equal(torch.frombuffer(bytearray(view[start:start + 4000]), dtype=torch.float32),
                       tensors["a"])
    assert reader.raw_record(view, 3999) is None           # not the expected size: torch.load


def test_the_checksum_catches_one_flipped_byte(tmp_path):
    _, sums = _write_one(tmp_path, {"w": torch.randn(4096)})
    manifest = {"files": {"__0_0.distcp": sums}, "checksum": "crc32c"}
    assert store.checksum_problems(tmp_path, manifest, ["__0_0.distcp"]) == []
    path = tmp_path / "__0_0.distcp"
    data = bytearray(path.read_bytes())
    offset, length, crc = sums["items"][0]
    data[offset + length // 2] ^= 0x01
    path.write_bytes(bytes(data))
    (problem,) = store.checksum_problems(tmp_path, manifest, ["__0_0.distcp"])
    assert problem.startswith("__0_0.distcp: CRC32C ") and sums["crc32c"] in problem
    items = reader.manifest_items(manifest)["__0_0.distcp"]
    view = memoryview(bytes(data))[offset:offset + length]
    assert items[offset] == (length, crc) != (length, writer.crc_hex(crc32c.crc32c(view)))


PAST_THE_LIMIT = r"""
import resource, signal, sys
from hpctrain.runtime.checkpoint.writer import ChecksumStream
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
stream = ChecksumStream(sys.argv[1])
try:
    stream.write(bytes(1 << 17))
except OSError as e:
    print(e.errno, e.filename)
"""


def test_a_write_the_storage_refuses_names_the_file_it_was_writing(tmp_path):
    """A write's OSError carries no file name (EFBIG here, ENOSPC or EIO on a cluster): the
    writer's says which file, for the save fault's one line."""
    import errno
    import subprocess
    import sys
    shard = tmp_path / "__0_0.distcp"
    out = subprocess.run([sys.executable, "-c", PAST_THE_LIMIT, str(shard)],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == [str(errno.EFBIG), str(shard)], out


def test_an_item_whose_recorded_range_is_not_the_bytes_written_is_refused(tmp_path):
    """The per-item checksum covers exactly the bytes torch's metadata says the item is."""
    stream = writer.ChecksumStream(str(tmp_path / "f"))
    stream.write(b"head")
    stream.begin_item()
    stream.write(b"0123456789")
    for offset, length in ((4, 9), (4, 11), (3, 10), (5, 10)):
        with pytest.raises(RuntimeError, match=f"item at {offset}[+]{length} does not match the "
                                               f"bytes written [(]4[.][.]14[)]"):
            stream.end_item(offset, length)
    stream.end_item(4, 10)
    assert stream.finish()["items"] == [[4, 10, writer.crc_hex(crc32c.crc32c(b"0123456789"))]]


def test_an_error_that_names_its_file_or_has_no_errno_is_passed_on_as_it_is(tmp_path):
    import errno
    stream = writer.ChecksumStream(str(tmp_path / "f"))
    named = OSError(errno.EIO, "Input/output error", "/elsewhere")
    bare = OSError("no errno")
    for error in (named, bare):
        with pytest.raises(OSError) as raised:
            stream._raise_named(error)
        assert raised.value is error
    with pytest.raises(OSError) as raised:
        stream._raise_named(OSError(errno.ENOSPC, "No space left on device"))
    assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(tmp_path / "f"))
    stream.finish()


def test_format_1_manifests_are_still_verified_with_zlib_crc32(tmp_path):
    (tmp_path / "f").write_bytes(b"hello")
    old = {"files": store.checksum_files(tmp_path, ["f"], "crc32")}
    assert old["files"]["f"] == {"size": 5, "crc32": "3610a686"}
    assert store.checksum_problems(tmp_path, old, ["f"]) == []
    (tmp_path / "f").write_bytes(b"hellO")
    assert store.checksum_problems(tmp_path, old, ["f"])[0].startswith("f: CRC32 ")
    assert reader.manifest_items(old) == {}                 # verified before loading, as before


# ------------------------------------------------------------- the arena's arithmetic and doors
def test_a_reservation_is_cut_into_segments_of_exactly_its_size_and_never_shrinks():
    arena = staging.HostArena(pin=False, segment_bytes=1 << 20)
    arena.reserve((3 << 20) + 1000)
    assert [s.nbytes for s in arena.segments] == [1 << 20] * 3 + [1000]
    arena.reserve(1 << 20)                                  # less than it has: nothing changes
    arena.reserve((3 << 20) + 1000)
    assert arena.capacity == (3 << 20) + 1000 and len(arena.segments) == 4


def test_placed_tensors_are_aligned_and_do_not_overlap():
    arena = staging.HostArena(pin=False, segment_bytes=1 << 20)
    arena.reserve(1 << 20)
    sizes = [1, 63, 64, 65, 1000, 0, 7]
    slots = arena.acquire("save", sizes)
    placed = [s for s, n in zip(slots, sizes) if n]
    assert all(s.offset % staging.ALIGN == 0 for s in placed)
    ends = [s.offset + s.nbytes for s in placed]
    assert all(end <= nxt.offset for end, nxt in zip(ends, placed[1:]))   # in order, apart
    assert placed[1].offset == staging.ALIGN and placed[3].offset == 3 * staging.ALIGN
    for slot, n in zip(slots, sizes):
        assert len(arena.buffer(slot)) == n and arena.tensor(slot, torch.uint8, (n,)).numel() == n
    assert not arena.is_pinned(slots[5])                   # the empty one holds no memory
    for s in placed:                                       # each slot's bytes are its own
        arena.buffer(s)[:] = bytes([s.offset % 251]) * s.nbytes
    assert all(bytes(arena.buffer(s)) == bytes([s.offset % 251]) * s.nbytes for s in placed)


def test_only_the_holder_releases_and_an_equal_name_is_the_same_holder():
    arena = staging.HostArena(pin=False, segment_bytes=1 << 20)
    arena.acquire("a save", [100])
    with pytest.raises(staging.ArenaBusy):                 # whatever the names' order
        arena.acquire("the resume", [100])
    same = "".join(["a ", "save"])                         # equal, not the same object
    arena.acquire(same, [100])                             # the holder again: allowed
    arena.release("Z")                                     # sorts before the holder: no effect
    arena.release("zzz")                                   # sorts after it: no effect either
    with pytest.raises(staging.ArenaBusy):
        arena.acquire("the resume", [100])
    arena.release("".join(["a ", "save"]))
    arena.acquire("the resume", [100])


def test_memory_a_resume_added_after_locking_is_locked_by_the_next_save():
    """A resume that grows the arena after page-locking ended (a restart in the process):
    the next save locks what it added before placing anything."""
    locks = PageLocks()
    arena = staging.HostArena(pin=True, segment_bytes=1 << 20, page_lock=locks)
    arena.reserve(1 << 20)
    arena.lock_pages(after_step=1)
    arena.wait_ready()
    arena.acquire("the resume", [20 << 20], page_locked=False)
    arena.release("the resume")
    assert arena.pinned_bytes == 1 << 20 < arena.capacity
    arena.acquire("the save of step 9", [100])
    assert arena.pinned_bytes == arena.capacity and locks.calls[-1] == (20 << 20, locks.main)


def test_the_locking_record_says_how_long_and_how_much():
    import time
    locks = PageLocks(seconds=0.05)
    arena = staging.HostArena(pin=True, segment_bytes=1 << 30, page_lock=locks)
    arena.reserve(2_500_000_000)                           # mapped lazily: nothing is touched
    assert arena.lock_record() is None and "page-locked in" not in arena.describe()
    started = time.monotonic()
    arena.lock_pages(after_step=7)
    arena.wait_ready()
    took = time.monotonic() - started
    record = arena.lock_record()
    # three segments, at least 0.05 s each; the record keeps milliseconds (0.1503 s is 0.15)
    assert 0.15 - 0.0005 <= record["seconds"] <= took + 0.0005
    assert record == {"after_step": 7, "seconds": record["seconds"], "bytes": 2_500_000_000}
    assert arena.describe() == (f"2.50 GB host staging, 2.50 GB page-locked in "
                                f"{record['seconds']:.2f}s after step 7")


def test_the_log_line_and_the_record_agree_on_the_locking_time_to_the_last_digit():
    # 0.1753 s is kept as 0.175, which prints as 0.17; the log line must not say 0.18
    arena = staging.HostArena(pin=True, segment_bytes=1 << 30, page_lock=PageLocks())
    arena.lock_seconds, arena.locked_after_step = 0.1753, 3
    record = arena.lock_record()
    assert record["seconds"] == 0.175
    assert arena.describe().endswith(f" in {record['seconds']:.2f}s after step 3")


def test_the_process_arena_is_one_and_page_locked_on_cuda_or_by_a_stand_in(monkeypatch):
    monkeypatch.setattr(staging, "_ARENA", None)
    plain = staging.process_arena("cpu")
    assert not plain.pin and staging.process_arena("cpu", PageLocks()) is plain   # one
    monkeypatch.setattr(staging, "_ARENA", None)
    locks = PageLocks()
    stood_in = staging.process_arena("cpu", locks)
    assert stood_in.pin and stood_in.page_lock is locks
    monkeypatch.setattr(staging, "_ARENA", None)
    cuda = staging.process_arena("cuda", locks)              # the stand-in is the CPU's only
    assert cuda.pin and cuda.page_lock is None


class _Model:
    """What staging_estimate reads of a built model: its modules (``mo.modules``)."""

    def __init__(self, *modules) -> None:
        self.modules = list(modules)


class _Layout:
    def __init__(self, dp: int) -> None:
        self.data_parallel_size = dp


def test_the_staging_estimate_is_parameters_and_adam_state_over_the_data_parallel_ranks():
    bf16 = torch.nn.Linear(100, 30).to(torch.bfloat16)      # 3030 parameters
    fp32 = torch.nn.Linear(10, 10)                          # 110 parameters
    grow = staging.GROW_BYTES
    # 16-bit weights: 2 bytes each, plus Adam's fp32 main copy and two moments (12 bytes)
    share = 3030 * (2 + 12)
    assert staging.staging_estimate(_Model(bf16), _Layout(1)) == share + share // 10 + grow
    for dp in (4, 7):                                       # a share is whole bytes
        share = (3030 * (2 + 12)) // dp
        estimate = staging.staging_estimate(_Model(bf16), _Layout(dp))
        assert estimate == share + share // 10 + grow and isinstance(estimate, int)
    # fp32 weights are their own main copy: 4 bytes each, plus two moments (8 bytes)
    share = 110 * (4 + 8)
    assert staging.staging_estimate(_Model(fp32), _Layout(1)) == share + share // 10 + grow
    both = staging.staging_estimate(_Model(bf16, fp32), _Layout(1))
    share = (3030 * 2 + 110 * 4) + 3140 * 12
    assert both == share + share // 10 + grow             # any 16-bit weight: 12 bytes each
    assert staging.staging_estimate(_Model(), _Layout(0)) == grow
