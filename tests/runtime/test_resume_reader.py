"""The resume's parallel reader on its own (hpctrain.runtime.checkpoint.reader), in one process:
a checkpoint written by torch's distributed checkpoint writer, its items' CRC32C recorded as
hpctrain's writer records them, loaded through :class:`ParallelReader` and through torch's own
reader; and a checkpoint planned by torch's planner and written by hpctrain's own staging and
writer (hpctrain.runtime.checkpoint.writer), as a save does, read back. The real runs' resumes (several ranks, megatron-core's plans) are in
test_checkpoint_io_runs.py; these stories pin what each read must do, quickly enough for
mutation testing (``tools/mutation resume_reader``)."""

from __future__ import annotations

import io
import os
import warnings
import zipfile

import crc32c
import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

from hpctrain.runtime.checkpoint import reader, staging, writer  # noqa: E402

pytestmark = pytest.mark.megatron


def _state() -> dict:
    """Tensors of three dtypes (one empty), and values torch stores as bytes."""
    g = torch.Generator().manual_seed(3)
    return {"w": torch.randn(64, 33, generator=g), "b": torch.randn(5, generator=g).bfloat16(),
            "ids": torch.arange(-3, 9, dtype=torch.int64), "none": torch.empty(0),
            "step": 1234, "name": "résumé"}


def _blank() -> dict:
    return {"w": torch.zeros(64, 33), "b": torch.zeros(5).bfloat16(),
            "ids": torch.zeros(12, dtype=torch.int64), "none": torch.empty(0),
            "step": 0, "name": ""}


@pytest.fixture()
def saved(tmp_path):
    """(folder, manifest, storage items) of a checkpoint of ``_state()`` in two files."""
    folder = tmp_path / "ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(_state(), storage_writer=dcp.FileSystemWriter(str(folder), thread_count=2),
                 no_dist=True)
    storage = dcp.FileSystemReader(str(folder)).read_metadata().storage_data
    files: dict = {}
    for info in storage.values():
        data = (folder / info.relative_path).read_bytes()[info.offset:info.offset + info.length]
        files.setdefault(info.relative_path, {"items": []})["items"].append(
            [info.offset, info.length, writer.crc_hex(crc32c.crc32c(data))])
    return folder, {"checksum": writer.CHECKSUM, "files": files}, storage


def _load(folder, manifest, threads=3, zero_copy=True, arena=None, streamed=True):
    """``streamed``: the streaming path for the items it takes (False: every item whole)."""
    if arena is None:
        arena = staging.HostArena(pin=False, segment_bytes=1 << 16)
    r = reader._reader_class()(str(folder), reader.manifest_items(manifest), arena, threads,
                               zero_copy, streamed)
    got = _blank()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(got, storage_reader=r, no_dist=True)
    return got, r.stats


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype if torch.is_tensor(a[k])
        else a[k] == b[k] for k in a)


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("threads", [1, 2, 8])
def test_a_parallel_read_loads_what_torchs_own_reader_loads_bit_for_bit(saved, threads,
                                                                         streamed):
    folder, manifest, storage = saved
    own = _blank()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(own, storage_reader=dcp.FileSystemReader(str(folder)), no_dist=True)
    got, stats = _load(folder, manifest, threads, streamed=streamed)
    assert _equal(got, _state()) and _equal(got, own)
    state = _state()
    read = [k for k in storage if not torch.is_tensor(state[k.fqn]) or state[k.fqn].numel()]
    tensors = sum(1 for k in read if torch.is_tensor(state[k.fqn]))
    assert stats["items"] == stats["verified"] == len(read) == 5     # an empty tensor: no read
    assert stats["bytes"] == sum(storage[k].length for k in read)
    # every tensor streamed into its target, or taken from the item's bytes where it lies
    # without torch.load; the objects (bytes) always read whole
    assert (stats["streamed"], stats["zero_copy"]) == ((3, 0) if streamed else (0, 3))
    assert tensors == 3


def test_without_recorded_checksums_the_same_state_loads_through_torch_load(saved):
    """A checkpoint from another writer (no CRC32C items in its manifest): nothing to verify
    in the pass (the store verified the files before), every tensor through torch.load."""
    folder, manifest, storage = saved
    got, stats = _load(folder, {"files": manifest["files"]}, zero_copy=False)
    assert _equal(got, _state())
    assert stats["verified"] == stats["zero_copy"] == stats["streamed"] == 0
    assert stats["items"] == len(storage) - 1


def test_the_memory_read_into_is_given_back_whether_the_load_succeeds_or_fails(saved):
    folder, manifest, storage = saved
    arena = staging.HostArena(pin=False, segment_bytes=1 << 16)
    _load(folder, manifest, arena=arena)
    assert arena.holder is None
    _damage(folder, next(iter(storage.values())))
    with pytest.raises(CheckpointException):
        _load(folder, manifest, arena=arena)
    assert arena.holder is None
    arena.acquire("a save", [10])             # the next save is not refused
    with pytest.raises(CheckpointException, match="held by a save"):   # (a holder is one)
        _load(folder, manifest, arena=arena)


def _damage(folder, info, at: int | None = None) -> None:
    path = folder / info.relative_path
    data = bytearray(path.read_bytes())
    data[info.offset + (info.length // 2 if at is None else at)] ^= 0x10
    path.write_bytes(bytes(data))


def _mismatch(folder, manifest, streamed=True) -> str:
    """What the load raised: torch wraps the reader's exception, with its text."""
    with pytest.raises(CheckpointException) as raised:
        _load(folder, manifest, streamed=streamed)
    return str(raised.value)


BOTH_PATHS = pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])


@BOTH_PATHS
@pytest.mark.parametrize("which", ["w", "ids", "step", "name"])
def test_one_flipped_byte_in_any_item_stops_the_load_naming_the_file_and_byte(saved, which,
                                                                              streamed):
    folder, manifest, storage = saved
    (info,) = [i for k, i in storage.items() if k.fqn == which]
    recorded = {o: c for o, _, c in manifest["files"][info.relative_path]["items"]}[info.offset]
    _damage(folder, info)
    text = _mismatch(folder, manifest, streamed)
    assert (f"{info.relative_path}: the item at byte {info.offset} ({info.length} bytes) has "
            f"CRC32C ") in text and f"its writer recorded {recorded}" in text, text


@BOTH_PATHS
def test_a_flip_in_an_items_first_or_last_byte_is_caught(saved, streamed):
    folder, manifest, storage = saved
    (info,) = [i for k, i in storage.items() if k.fqn == "w"]
    _damage(folder, info, at=0)
    assert "its writer recorded" in _mismatch(folder, manifest, streamed)
    _damage(folder, info, at=0)               # mended
    _damage(folder, info, at=info.length - 1)
    assert "its writer recorded" in _mismatch(folder, manifest, streamed)


@BOTH_PATHS
def test_a_file_cut_short_is_refused_naming_where_it_should_have_gone_on(saved, streamed):
    folder, manifest, storage = saved
    state = _state()
    last = max((i for k, i in storage.items() if not torch.is_tensor(state[k.fqn])
                or state[k.fqn].numel()), key=lambda i: (i.relative_path, i.offset))
    path = folder / last.relative_path
    path.write_bytes(path.read_bytes()[:last.offset + last.length - 1])
    text = _mismatch(folder, manifest, streamed)
    assert f"{last.relative_path}: ends before byte {last.offset + last.length}" in text, text


@BOTH_PATHS
def test_an_item_whose_length_is_not_the_recorded_one_is_refused(saved, streamed):
    folder, manifest, storage = saved
    unread = {(i.relative_path, i.offset) for k, i in storage.items() if k.fqn == "none"}
    for name, info in manifest["files"].items():
        for entry in info["items"]:           # every item read: tensors and objects
            if (name, entry[0]) in unread:    # (the empty tensor: nothing to read)
                continue
            entry[1] += 1
            offset, length = entry[0], entry[1] - 1
            assert (f"{name}: the item at byte {offset} is {length} bytes, its writer "
                    f"recorded {length + 1}") in _mismatch(folder, manifest, streamed)
            entry[1] -= 1


def test_a_manifest_as_read_from_disk_is_verified(saved):
    """The manifest rank 0 wrote, read back from its JSON: its checksum name is equal to,
    not the same object as, the writer's."""
    import json
    folder, manifest, storage = saved
    from_disk = json.loads(json.dumps(manifest))
    assert from_disk["checksum"] is not writer.CHECKSUM
    _, stats = _load(folder, from_disk)
    assert stats["verified"] == 5


def test_a_record_whose_local_header_is_damaged_is_left_to_torch_load():
    t = torch.arange(10, dtype=torch.float32)
    buf = io.BytesIO()
    torch.save(t, buf)
    data = bytearray(buf.getvalue())
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as z:
        (info,) = [i for i in z.infolist() if i.filename.endswith("/data/0")]
    assert reader.raw_record(memoryview(bytes(data)), 40) is not None
    for magic in (b"\0\0\0\0", b"PK\x03\x05"):     # below and above the signature
        data[info.header_offset:info.header_offset + 4] = magic
        assert reader.raw_record(memoryview(bytes(data)), 40) is None, magic


def test_the_raw_record_is_found_only_in_a_one_tensor_stored_archive_of_the_expected_size():
    t = torch.arange(10, dtype=torch.float32)
    buf = io.BytesIO()
    torch.save(t, buf)
    view = memoryview(buf.getvalue())
    start = reader.raw_record(view, 40)
    assert start is not None and bytes(view[start:start + 40]) == t.numpy().tobytes()
    assert reader.raw_record(view, 39) is None and reader.raw_record(view, 41) is None
    assert reader.raw_record(view[:start + 39], 40) is None           # cut inside the data
    two = io.BytesIO()
    torch.save([t, t + 1], two)
    assert reader.raw_record(memoryview(two.getvalue()), 40) is None
    assert reader.raw_record(memoryview(b"not an archive" * 10), 40) is None
    deflated = io.BytesIO()                    # the same names, compressed: torch.load reads it
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as src, \
            zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    assert reader.raw_record(memoryview(deflated.getvalue()), 40) is None
    assert torch.equal(torch.load(io.BytesIO(deflated.getvalue()), weights_only=True), t)


def test_the_reader_is_used_for_its_own_folder_only_and_only_while_installed(saved, tmp_path):
    from megatron.core.dist_checkpointing.strategies import torch as torch_strategy
    folder, manifest, _ = saved
    original = torch_strategy._get_filesystem_reader
    arena = staging.HostArena(pin=False)
    with reader.installed(folder, manifest, arena, threads=2) as made:
        ours = torch_strategy._get_filesystem_reader(str(folder / "." ))
        other = torch_strategy._get_filesystem_reader(str(tmp_path))
        assert made == [ours] and ours.threads == 2 and ours.zero_copy
        assert not hasattr(other, "items")
    assert torch_strategy._get_filesystem_reader is original
    with reader.installed(folder, manifest, arena, threads=0) as made:   # megatron's own
        assert torch_strategy._get_filesystem_reader is original and made == []
    with reader.installed(folder, {"files": manifest["files"]}, arena) as made:
        plain = torch_strategy._get_filesystem_reader(str(folder))
        assert plain.items == {} and not plain.zero_copy
        assert plain.threads == reader.read_threads()


# ------------------------------------------------------- hpctrain's writer, then its reader
def _write_with_hpctrain(folder, state: dict, files: int = 2) -> dict:
    """Plan ``state`` with torch's planner, stage it and write it with hpctrain's writer in
    ``files`` buckets (megatron's async save hands the writer the same tuples), then write
    torch's metadata as its writer's finish does: the manifest's files part."""
    import json
    import pickle
    import queue
    import time

    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.filesystem import _StorageWriterTransforms
    from torch.distributed.checkpoint.planner import WriteItemType
    planner = DefaultSavePlanner()
    planner.set_up_planner(state, is_coordinator=True)
    plans, metadata = planner.create_global_plan([planner.create_local_plan()])
    items = planner.finish_plan(plans[0]).items
    folder.mkdir()
    buckets = []
    for n in range(files):
        mine = items[n::files]
        buckets.append((str(folder / f"__0_{n}.distcp"), f"__0_{n}.distcp", (
            [(i, planner.resolve_data(i)) for i in mine if i.type == WriteItemType.BYTE_IO],
            [(i, planner.resolve_data(i)) for i in mine if i.type != WriteItemType.BYTE_IO])))
    arena = staging.HostArena(pin=False, segment_bytes=1 << 16)
    staged = writer.stage(arena, "save", buckets, page_locked=False)
    results = queue.Queue()
    started = time.monotonic()
    writer.write_buckets([_StorageWriterTransforms()], 0, staged, results, folder=str(folder),
                         sidecar="sums.json")
    took = time.monotonic() - started
    written = results.get_nowait()
    assert not isinstance(written, BaseException), written
    metadata.storage_data = {r.index: r.storage_data for rs in written.values() for r in rs}
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    sums = json.loads((folder / "sums.json").read_text())
    assert 0 <= sums["write_seconds"] <= took + 0.0005     # how long it wrote, in ms
    return {"checksum": writer.CHECKSUM, "files": sums["files"]}


@pytest.mark.parametrize("files", [1, 3])
def test_what_hpctrains_writer_wrote_reads_back_bit_for_bit_without_a_copy(tmp_path, files):
    folder = tmp_path / "ckpt"
    manifest = _write_with_hpctrain(folder, _state(), files)
    assert sorted(manifest["files"]) == [f"__0_{n}.distcp" for n in range(files)]
    got, stats = _load(folder, manifest)
    assert _equal(got, _state())
    assert stats["items"] == stats["verified"] == 5 and stats["streamed"] == 3
    got, stats = _load(folder, manifest, streamed=False)
    assert _equal(got, _state())
    assert stats["items"] == stats["verified"] == 5 and stats["zero_copy"] == 3
    own = _blank()                          # torch's own reader reads the same files alike
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(own, storage_reader=dcp.FileSystemReader(str(folder)), no_dist=True)
    assert _equal(own, _state())


def test_the_state_written_is_the_state_when_it_was_staged(tmp_path):
    """The training thread goes on changing the weights once they are staged: the writer
    writes (and checksums) the staged bytes."""
    folder = tmp_path / "ckpt"
    state = _state()
    original = {k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()}

    real_stage = writer.stage

    def stage_then_train_on(arena, owner, buckets, page_locked=True):
        staged = real_stage(arena, owner, buckets, page_locked)
        state["w"].mul_(-1)                  # the next optimizer step, after staging
        state["ids"].add_(1)
        return staged

    writer.stage, saved_stage = stage_then_train_on, writer.stage
    try:
        manifest = _write_with_hpctrain(folder, state)
    finally:
        writer.stage = saved_stage
    got, stats = _load(folder, manifest)
    assert _equal(got, original) and stats["verified"] == 5


def test_a_byte_changed_in_what_hpctrains_writer_wrote_is_caught_by_the_reader(tmp_path):
    folder = tmp_path / "ckpt"
    manifest = _write_with_hpctrain(folder, _state())
    name, info = next(iter(manifest["files"].items()))
    offset, length, crc = max(info["items"], key=lambda i: i[1])
    path = folder / name
    data = bytearray(path.read_bytes())
    data[offset + length - 3] ^= 0x01
    path.write_bytes(bytes(data))
    assert f"{name}: the item at byte {offset} ({length} bytes) has CRC32C " in \
        _mismatch(folder, manifest)


def _failing_buckets(tmp_path, how):
    """Two buckets: the first written to ``tmp_path``, the second failing as ``how`` says."""
    from tests.runtime.helpers import tensor_write_item as item
    good, bad = torch.arange(8.0), torch.arange(4.0)
    target = tmp_path / ("gone" if how == "folder gone" else "") / "__0_1.distcp"

    class Interrupted(torch.Tensor):    # a tensor whose serialization is interrupted
        def __reduce_ex__(self, proto):
            raise KeyboardInterrupt("stopped while writing")
    if how == "interrupted":
        bad = bad.as_subclass(Interrupted)
    return [(str(tmp_path / "__0_0.distcp"), "__0_0.distcp", ([], [(item("good", good), good)])),
            (str(target), "__0_1.distcp", ([], [(item("bad", bad), bad)]))]


@pytest.mark.parametrize("how", ["folder gone", "interrupted"])
def test_a_bucket_that_cannot_be_written_is_handed_to_megatron_and_no_sums_are_written(
        tmp_path, how):
    """megatron's finalize raises what the queue holds: the error itself, or for what is not
    an Exception (a KeyboardInterrupt in a writer thread) a RuntimeError saying it; the other
    bucket's file is written and closed, and no checksums are recorded for a save that failed."""
    import queue

    from torch.distributed.checkpoint.filesystem import _StorageWriterTransforms
    before = len(os.listdir("/proc/self/fd"))
    results = queue.Queue()
    writer.write_buckets([_StorageWriterTransforms()], 0, _failing_buckets(tmp_path, how),
                         results, folder=str(tmp_path), sidecar="sums.json")
    outcome = results.get_nowait()
    if how == "folder gone":
        assert isinstance(outcome, FileNotFoundError) and "gone" in str(outcome), outcome
    else:
        assert type(outcome) is RuntimeError and "stopped while writing" in str(outcome)
    assert (tmp_path / "__0_0.distcp").stat().st_size > 0
    assert not (tmp_path / "sums.json").exists()
    assert len(os.listdir("/proc/self/fd")) == before          # every file closed
