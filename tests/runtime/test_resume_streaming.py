"""The resume's streaming path (hpctrain.runtime.checkpoint.streaming, through the reader), on
the CPU: items read in chunks, each item's CRC32C continued over every chunk, the tensor's
bytes copied on as they come, straight into a CPU target or through the ring of buffers that
CUDA targets use (here with plain memory and synchronous copies).

Checkpoints are written by hpctrain's staging and writer as a save writes them
(``_write_with_hpctrain``, shared with test_resume_reader.py) and read back against
megatron-core's own reader (``CachedMetadataFileSystemReader``, what megatron loads with when
hpctrain's reader is not installed), bit for bit. The chunk size is made small so that items
span many chunks, of sizes that are not multiples of it. Nothing here depends on the
machine's speed: where threads must overlap, events order them."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import threading
import warnings

import crc32c
import pytest
from hypothesis import given, strategies as st

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner  # noqa: E402

from hpctrain.runtime.checkpoint import items, reader, staging, streaming, writer  # noqa: E402
from tests.runtime.test_resume_reader import _equal, _write_with_hpctrain  # noqa: E402

pytestmark = pytest.mark.megatron


def _state() -> dict:
    """Tensors of sizes that are not multiples of any chunk size below, four dtypes, a
    scalar; and objects (read whole)."""
    g = torch.Generator().manual_seed(5)
    return {"w": torch.randn(97, 61, generator=g), "b": torch.randn(1001, generator=g).bfloat16(),
            "ids": torch.arange(-300, 477, dtype=torch.int64), "h": torch.randn(3, 5, 7).half(),
            "scalar": torch.tensor(2.5), "step": 77, "name": "streamed"}


def _blank(state: dict) -> dict:
    return {k: torch.zeros_like(v) if torch.is_tensor(v) else type(v)() for k, v in state.items()}


def _serial(folder, state: dict, planner=None) -> dict:
    """What megatron-core's own reader loads (one thread, torch.load per item)."""
    from megatron.core.dist_checkpointing.strategies.cached_metadata_filesystem_reader import \
        CachedMetadataFileSystemReader
    got = _blank(state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(got, storage_reader=CachedMetadataFileSystemReader(str(folder)),
                 planner=planner, no_dist=True)
    return got


def _streamed(folder, manifest, state: dict, threads=3, planner=None, into=None):
    r = reader._reader_class()(str(folder), reader.manifest_items(manifest),
                               staging.HostArena(pin=False, segment_bytes=1 << 16), threads,
                               True)
    got = _blank(state) if into is None else into
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(got, storage_reader=r, planner=planner, no_dist=True)
    return got, r.stats


@pytest.fixture()
def written(tmp_path):
    state = _state()
    folder = tmp_path / "ckpt"
    return folder, _write_with_hpctrain(folder, state, files=2), state


@pytest.fixture(params=[True, False], ids=["direct", "ring"])
def landing(request, monkeypatch):
    """Both landings of a CPU target: straight into it, or through the ring CUDA uses."""
    monkeypatch.setattr(streaming, "DIRECT_TO_HOST", request.param)
    return request.param


TENSORS = 5          # w, b, ids, h, scalar


@pytest.mark.parametrize("chunk", [64, 1000, 4096, 1 << 20])
@pytest.mark.parametrize("threads", [1, 4])
def test_a_streamed_resume_loads_what_megatrons_own_reader_loads_bit_for_bit(
        written, landing, monkeypatch, chunk, threads):
    folder, manifest, state = written
    monkeypatch.setattr(streaming, "CHUNK_BYTES", chunk)
    got, stats = _streamed(folder, manifest, state, threads)
    assert _equal(got, _serial(folder, state)) and _equal(got, state)
    assert stats["streamed"] == TENSORS and stats["zero_copy"] == 0
    assert stats["items"] == stats["verified"] == TENSORS + 2
    workers = min(threads, TENSORS)
    assert stats["ring_bytes"] == (0 if landing else workers * streaming.BUFFERS_PER_THREAD
                                   * chunk)


def _largest(manifest) -> tuple[str, int, int, str]:
    """(file, offset, length, recorded crc) of the largest item (``w``'s)."""
    return max(((name, o, n, c) for name, info in manifest["files"].items()
                for o, n, c in info["items"]), key=lambda i: i[2])


def _flip(folder, name: str, at: int) -> None:
    path = folder / name
    data = bytearray(path.read_bytes())
    data[at] ^= 0x04
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["first byte", "archive header", "record start",
                                   "record middle", "record end", "after the record",
                                   "central directory", "last byte"])
def test_a_flipped_byte_anywhere_in_a_streamed_item_is_named(written, landing, monkeypatch,
                                                              where):
    folder, manifest, state = written
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 1000)      # the record spans many chunks
    name, offset, length, crc = _largest(manifest)
    item = memoryview((folder / name).read_bytes())[offset:offset + length]
    nbytes = state["w"].numel() * 4
    start = items.raw_record(item, nbytes)
    directory = bytes(item).rindex(b"PK\x01\x02")             # the last central entry
    at = {"first byte": 0, "archive header": 40, "record start": start,
          "record middle": start + nbytes // 2, "record end": start + nbytes - 1,
          "after the record": start + nbytes, "central directory": directory + 20,
          "last byte": length - 1}[where]
    _flip(folder, name, offset + at)
    with pytest.raises(CheckpointException) as raised:
        _streamed(folder, manifest, state)
    text = str(raised.value)
    assert f"ChecksumMismatch: {name}: the item at byte {offset} ({length} bytes) has CRC32C " \
           in text and f"its writer recorded {crc}" in text, text


def test_a_record_its_tail_does_not_locate_is_read_whole_and_verified(written, landing,
                                                                       monkeypatch):
    """An archive whose directory does not fit in the tail read (here: the tail made tiny)
    is read whole by the worker, verified, and loads the same."""
    folder, manifest, state = written
    monkeypatch.setattr(items, "TAIL_BYTES", 16)
    got, stats = _streamed(folder, manifest, state)
    assert _equal(got, state) and stats["streamed"] == 0 and stats["verified"] == TENSORS + 2
    name, offset, length, crc = _largest(manifest)
    _flip(folder, name, offset + length // 2)
    with pytest.raises(CheckpointException, match=f"its writer recorded {crc}"):
        _streamed(folder, manifest, state)


class _Rows(DefaultLoadPlanner):
    """Loads rows ``lo:hi`` of the stored ``w`` into the state's ``w`` (a resharded read:
    torch's resharding helper narrows the stored chunk), everything else as stored."""

    def __init__(self, lo: int, hi: int) -> None:
        super().__init__()
        self.lo, self.hi = lo, hi

    def create_local_plan(self):
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
        from torch.distributed.checkpoint.planner import LoadPlan
        from torch.distributed.checkpoint.planner_helpers import (
            _create_read_items, create_read_items_for_chunk_list)
        md = self.metadata.state_dict_metadata
        reads = []
        for fqn, obj in self.state_dict.items():
            if fqn == "w":
                part = ChunkStorageMetadata(offsets=torch.Size([self.lo, 0]),
                                            sizes=torch.Size(obj.size()))
                reads += create_read_items_for_chunk_list(fqn, md[fqn], [part])
            else:
                reads += _create_read_items(fqn, md[fqn], obj)
        return LoadPlan(reads)

    def lookup_tensor(self, index):
        return self.state_dict[index.fqn]      # a plain tensor standing for rows lo:hi


def test_a_narrowed_request_is_read_whole_and_loads_what_megatrons_reader_loads(written,
                                                                                landing):
    folder, manifest, state = written
    rows = dict(state, w=torch.zeros(40, 61))
    got, stats = _streamed(folder, manifest, rows, planner=_Rows(30, 70))
    serial = _serial(folder, rows, planner=_Rows(30, 70))
    assert _equal(got, serial) and torch.equal(got["w"], state["w"][30:70])
    assert stats["streamed"] == TENSORS - 1 and stats["zero_copy"] == 1


class _Twice(DefaultLoadPlanner):
    """Loads the stored ``w`` into the state's ``w`` and, from the same item, into ``w2``: two
    requests reading one item whole."""

    def create_local_plan(self):
        from torch.distributed.checkpoint.metadata import MetadataIndex
        from torch.distributed.checkpoint.planner import LoadPlan
        w2 = self.state_dict.pop("w2")       # in no checkpoint: its read is the extra one
        plan = super().create_local_plan()
        self.state_dict["w2"] = w2
        extra = [dataclasses.replace(r, dest_index=MetadataIndex("w2", r.dest_index.offset,
                                                                 r.dest_index.index))
                 for r in plan.items if r.dest_index.fqn == "w"]
        return LoadPlan(list(plan.items) + extra)

    def lookup_tensor(self, index):
        return self.state_dict[index.fqn]

    def transform_tensor(self, read_item, tensor):
        return tensor


def test_an_item_two_requests_read_is_read_once_and_loads_both(written, landing):
    """Each request's target gets the item's tensor; the item is read and verified once (the
    whole path: a streamed item would be read once per request)."""
    folder, manifest, state = written
    into = dict(_blank(state), w2=torch.zeros(97, 61))
    got, stats = _streamed(folder, manifest, state, into=into, planner=_Twice())
    assert torch.equal(got["w"], state["w"]) and torch.equal(got["w2"], state["w"])
    assert stats["streamed"] == TENSORS - 1 and stats["zero_copy"] == 2
    assert stats["items"] == stats["verified"] == TENSORS + 2


@pytest.mark.parametrize("target", ["not contiguous", "another dtype"])
def test_a_target_the_bytes_cannot_land_in_as_they_are_is_read_whole(written, landing, target):
    folder, manifest, state = written
    into = _blank(state)
    into["w"] = torch.zeros(61, 97).t() if target == "not contiguous" else \
        torch.zeros(97, 61, dtype=torch.float64)
    serial = _serial(folder, dict(into, w=into["w"].clone()))
    got, stats = _streamed(folder, manifest, state, into=into)
    assert _equal(got, serial) and torch.equal(got["w"], state["w"].to(got["w"].dtype))
    assert stats["streamed"] == TENSORS - 1


def test_a_failed_load_has_joined_every_worker_before_it_raises(written, monkeypatch):
    """The hazard of copying as the bytes come: a worker still copying after the load failed
    would write the damaged checkpoint's bytes over the previous one's as it loads. Here one
    worker is held inside its item until another item's mismatch is raised; when the load
    raises, no streaming thread is left."""
    folder, manifest, state = written
    monkeypatch.setattr(streaming, "CHUNK_BYTES", 512)
    name, offset, length, _ = _largest(manifest)
    storage = dcp.FileSystemReader(str(folder)).read_metadata().storage_data
    (b,) = [i for k, i in storage.items() if k.fqn == "b"]      # a small tensor, streamed
    small = (b.relative_path, b.offset, b.length)
    _flip(folder, small[0], small[1] + small[2] // 2)
    failed = threading.Event()
    real_check, real_read = streaming.check_crc, streaming.read_exactly

    def check_crc(*args):
        try:
            real_check(*args)
        except items.ChecksumMismatch:
            failed.set()
            raise

    def read_exactly(fd, view, at, item_name, end):
        if item_name == name and at > offset + 4096:      # the big item, well into it
            failed.wait(10)
            threading.Event().wait(0.2)                   # still busy when the other fails
        real_read(fd, view, at, item_name, end)

    monkeypatch.setattr(streaming, "check_crc", check_crc)
    monkeypatch.setattr(streaming, "read_exactly", read_exactly)
    with pytest.raises(CheckpointException, match="its writer recorded") as raised:
        _streamed(folder, manifest, state, threads=4)
    assert failed.is_set(), str(raised.value)
    assert [t.name for t in threading.enumerate() if t.name.startswith("hpctrain-stream")] == []


# ------------------------------------------------------------- the chunking, on its own
@given(st.data())
def test_pieces_cover_the_item_in_order_and_continue_its_crc(data):
    length = data.draw(st.integers(0, 3000))
    start = data.draw(st.integers(0, length))
    nbytes = data.draw(st.integers(0, length - start))
    chunk = data.draw(st.integers(1, 700))
    item = data.draw(st.binary(min_size=length, max_size=length))
    crc, pos, record = 0, 0, bytearray(nbytes)
    for at, n, dest in streaming.pieces(length, start, nbytes, chunk):
        assert at == pos and 1 <= n <= chunk
        inside = start <= at and at + n <= start + nbytes
        outside = at + n <= start or at >= start + nbytes
        assert (dest == at - start if inside else dest is None) and (inside or outside)
        if dest is not None:
            record[dest:dest + n] = item[at:at + n]
        crc = crc32c.crc32c(item[at:at + n], crc)
        pos += n
    assert pos == length and crc == crc32c.crc32c(item)
    assert bytes(record) == item[start:start + nbytes]


@given(numel=st.integers(1, 2500), chunk=st.integers(1, 3000), direct=st.booleans(),
       dtype=st.sampled_from([torch.uint8, torch.int16, torch.float32]),
       pad=st.integers(0, 100))
def test_an_item_streams_into_its_target_whatever_the_chunk_size(numel, chunk, direct, dtype,
                                                                  pad):
    """One ``torch.save`` item in a file (after ``pad`` other bytes) streamed by a worker:
    its tensor lands whole, its CRC32C continued over every chunk is its writer's."""
    import io
    tensor = (torch.arange(numel) * 7919 % 251).to(dtype)
    buf = io.BytesIO()
    torch.save(tensor, buf)
    item = buf.getvalue()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "f.distcp")
        with open(path, "wb") as f:
            f.write(os.urandom(pad) + item + os.urandom(pad))
        target = torch.zeros_like(tensor)
        job = streaming.Job(req=None, name="f.distcp", path=path, offset=pad,
                            length=len(item), expected=(len(item),
                                                        writer.crc_hex(crc32c.crc32c(item))),
                            target=target, nbytes=numel * tensor.element_size())
        landing = streaming.DirectLanding() if direct else streaming.RingLanding(
            1, chunk, streaming.HostCopies(streaming.BUFFERS_PER_THREAD * chunk))
        streaming.stream_item(job, landing, 0, chunk, threading.Event())
    assert job.streamed and torch.equal(target, tensor)


# ------------------------------------------------- what a set-aside checkpoint leaves behind
def test_a_checkpoint_that_fails_its_digest_never_restores_its_rng_streams(monkeypatch):
    """A checkpoint set aside after it was applied (its weights not the save's digest) has
    its weights and optimizer state overwritten by the previous checkpoint's load; its RNG
    streams would not be where the previous one was saved on another layout (those restart
    from the seed): they are restored only after the digest check passed."""
    from types import SimpleNamespace

    from hpctrain.runtime.checkpoint import manager
    calls = []
    monkeypatch.setattr(manager.ckstate, "load_model_state", lambda *a: calls.append("model"))
    monkeypatch.setattr(manager.ckstate, "load_optimizer_state",
                        lambda *a: calls.append("optimizer"))
    monkeypatch.setattr(manager.rng, "restore", lambda *a: calls.append("rng"))
    monkeypatch.setattr(manager, "stored_weights_digest", lambda modules: "b" * 64)
    ck = object.__new__(manager.Checkpointer)
    ck.ctx = SimpleNamespace(device="cpu", layout=SimpleNamespace(data_parallel_size=1))
    ck.mo = SimpleNamespace(model=[], optimizer=None, modules=[])
    ck.read_stats = {}

    def apply(digest: str):
        loaded = {"hpctrain": {"optimizer_updates": 3}, "optimizer": {},
                  "rng": {"device": "cpu"}}
        return ck._apply(loaded, {"device": "cpu", "weights_digest": digest}, {},
                         same_layout=True, impl="local", want_distopt=True)
    with pytest.raises(manager.CheckpointDamaged, match="are not the weights saved"):
        apply("a" * 64)
    assert calls == ["model", "optimizer"]
    calls.clear()
    assert apply("b" * 64) == (True, "") and calls == ["model", "optimizer", "rng"]
    assert ck.read_stats["digest_checked"]


# ------------------------------------------------- items of another form, read whole by a worker
PLANTED = []


def _plant(marker: str):
    """What a pickle in a damaged or planted checkpoint would run on loading: here, a note."""
    PLANTED.append(marker)
    return torch.zeros(7)


class _Planted:
    def __reduce__(self):
        return _plant, ("ran",)


def _job_for(tmp_path, obj, target) -> streaming.Job:
    """One item holding ``torch.save(obj)``, its CRC32C recorded as its writer would, to be
    loaded into ``target``."""
    import io
    buf = io.BytesIO()
    torch.save(obj, buf)
    item = buf.getvalue()
    path = tmp_path / "f.distcp"
    path.write_bytes(item)
    from types import SimpleNamespace
    return streaming.Job(req=SimpleNamespace(storage_index="f"), name="f.distcp",
                         path=str(path), offset=0, length=len(item),
                         expected=(len(item), writer.crc_hex(crc32c.crc32c(item))),
                         target=target, nbytes=target.numel() * target.element_size())


def test_an_item_that_unpickles_to_code_is_refused_never_run(tmp_path):
    """An item of another form than one stored tensor is loaded by ``torch.load`` with
    ``weights_only``: a pickle that would call a function on loading is refused, and the
    function never runs, even with the item's checksum in order."""
    job = _job_for(tmp_path, _Planted(), torch.zeros(7))
    with pytest.raises(Exception, match="[Ww]eights only load failed|weights_only"):
        streaming.stream_item(job, streaming.DirectLanding(), 0, 1 << 20, threading.Event())
    assert PLANTED == [] and not job.streamed


@pytest.mark.parametrize("stored", [5, 9])
def test_an_item_whose_tensor_is_not_the_targets_size_is_named(tmp_path, stored):
    """The stored tensor has fewer or more elements than the target's 7: torch's own reader's
    error and words (``mismatch sizes``), not a partial copy."""
    target = torch.full((7,), -1.0)
    job = _job_for(tmp_path, torch.arange(float(stored)), target)
    with pytest.raises(AssertionError, match=rf"req f mismatch sizes torch.Size\(\[7\]\) vs "
                                             rf"torch.Size\(\[{stored}\]\)"):
        streaming.stream_item(job, streaming.DirectLanding(), 0, 1 << 20, threading.Event())
    assert torch.equal(target, torch.full((7,), -1.0))


def test_only_cpu_and_this_ranks_gpu_targets_stream():
    """A target elsewhere (the meta device here: no memory to land in) takes the whole-item
    path, which torch's own rules load."""
    assert streaming.streamable(torch.zeros(4))
    assert not streaming.streamable(torch.zeros(4, device="meta"))
    assert not streaming.streamable(torch.zeros(4, 2).t())          # not contiguous
