"""A checkpoint folder's own files (``latest``, ``owner.json``, manifests) are written through
the write door (``hpctrain.outputs.write_atomic``): a symbolic link, a FIFO, a device or a
folder planted where one goes, or at a temporary name a writer once used, never redirects a
write out of the folder or blocks the rank that writes; a special file in a target's place is
refused in one line naming it; and a write that the storage stops half-way (the kernel's own
``EFBIG`` past ``ulimit -f``) leaves the previous ``latest``, owner record and published
checkpoints as they were, with no temporary file that a later listing or resume trips over."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from hpctrain.errors import HpcTrainError, NotRegularFileError, from_os_error
from hpctrain.record import checkpoint_store as store
from hpctrain.runtime.checkpoint.save_faults import SaveFault, save_faults_in_one_line
from tests.safety.test_run_file_writes import KINDS, _make

RUN = "tiny-20260101-000000-ab12"
# A write that blocks never returns; a FIFO opened for writing waits for a reader forever.
# The verdict is whether the write returned at all: the limit only keeps a hang from hanging
# the suite, it is far above any machine's time for these few small files.
BLOCKED_AFTER_S = 300


def _partial(root: Path, step: int) -> tuple[Path, dict]:
    """A save's partial folder with one shard, and its manifest (not written yet)."""
    p = store.partial_dir(root, step, 1)
    p.mkdir(parents=True)
    (p / "__0_0.distcp").write_bytes(bytes([step]) * 1000)
    files = store.checksum_files(p, store.list_files(p))
    return p, store.build_manifest(step, files, kind="full", run=RUN)


def _saved(root: Path, step: int) -> Path:
    partial, manifest = _partial(root, step)
    return store.publish(partial, root, step, manifest)


def _returns(fn):
    """``fn()`` run in a thread: its result, or the exception it raised; the test fails (it
    does not hang) when ``fn`` never returns."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:   # noqa: BLE001 - handed back to the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(BLOCKED_AFTER_S)
    assert not t.is_alive(), "the write blocked"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _litter(root: Path) -> list[str]:
    """Temporary files the door left anywhere in the checkpoint folder."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.tmp*"))


def _publish_in_one_line(root: Path, partial: Path, step: int, manifest: dict):
    """publish as the runtime does it: a fault is the save's one line."""
    with save_faults_in_one_line(step=step, path=partial, run_id=RUN, log=lambda _: None,
                                 newest=lambda: str(root / store.step_name(3))):
        return store.publish(partial, root, step, manifest)


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(KINDS), target=st.sampled_from(["latest", "manifest"]))
def test_a_special_file_in_a_checkpoint_files_place_is_refused_never_written_through(
        tmp_path_factory, kind, target):
    base = tmp_path_factory.mktemp("ck")
    root = base / "ck"
    outside = base / "outside.txt"
    outside.write_bytes(b"not the run's\n")
    _saved(root, 3)
    partial, manifest = _partial(root, 6)
    path = root / store.LATEST if target == "latest" else partial / store.MANIFEST
    if kind != "regular" or target == "manifest":
        path.unlink(missing_ok=True)
    if kind != "absent":
        _make(path, kind, outside)
    try:
        _returns(lambda: _publish_in_one_line(root, partial, 6, manifest))
    except SaveFault as e:
        assert kind not in ("absent", "regular"), e
        line = str(e)
        assert "\n" not in line and f"{path} is " in line and "not a regular file; move it " \
            "away" in line, line
        assert f"the newest complete checkpoint, {root}/step-00000003, is intact" in line
    else:
        assert kind in ("absent", "regular"), kind
        assert store.read_latest(root) == "step-00000006"
        assert path.is_file() and not path.is_symlink() or target == "manifest"
    assert outside.read_bytes() == b"not the run's\n"          # never written through a link
    assert _litter(root) == []
    if target == "manifest" and kind not in ("absent", "regular"):
        assert store.partial_checkpoints(root) == [partial]   # never published
        assert store.read_latest(root) == "step-00000003"
    assert [s for s, _ in store.verified_checkpoints(root, RUN)][-1] == 3


def test_the_cli_says_a_refused_target_in_one_line(tmp_path):
    """The same refusal reaching a command: the path and what is there, exit 2."""
    os.mkfifo(tmp_path / store.LATEST)
    with pytest.raises(NotRegularFileError) as e:
        _returns(lambda: store.set_latest(tmp_path, "step-00000001"))
    err = from_os_error(e.value)
    assert str(err) == f"{tmp_path}/latest: is a FIFO, not a regular file; move it away"
    assert err.exit_code == 2


def test_links_and_fifos_at_the_temporary_names_writers_once_used_are_left_alone(tmp_path):
    """``latest``, the manifest and ``owner.json`` were written through fixed temporary names
    (``.latest.tmp-PID``): a link or a FIFO planted there is neither followed nor opened."""
    outside = tmp_path / "outside"
    outside.write_text("mine")
    root = tmp_path / "ck"
    root.mkdir()
    pid = os.getpid()
    (root / f".{store.LATEST}.tmp-{pid}").symlink_to(outside)
    os.mkfifo(root / f".{store.OWNER}.tmp-{pid}")
    assert _returns(lambda: store.claim(root, RUN)) is True
    _saved(root, 3)
    partial, manifest = _partial(root, 6)
    (partial / f".{store.MANIFEST}.tmp-{pid}").symlink_to(outside)
    final = _returns(lambda: store.publish(partial, root, 6, manifest))
    assert store.read_latest(root) == "step-00000006" and store.read_owner(root)["run"] == RUN
    assert store.manifest_problems(final, store.read_manifest(final)) == []
    assert outside.read_text() == "mine"
    assert (root / f".{store.LATEST}.tmp-{pid}").is_symlink()
    assert (final / f".{store.MANIFEST}.tmp-{pid}").is_symlink()


@contextlib.contextmanager
def storage_stops_writes_past(limit: int):
    """The kernel refuses (``EFBIG``) every write of this process past ``limit`` bytes of a
    file (``ulimit -f``): a write that fails half-way, for real, on any file system."""
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # the error, not the signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, handler)


def test_a_write_stopped_half_way_keeps_latest_the_owner_and_every_checkpoint(tmp_path):
    root = tmp_path / "ck"
    with storage_stops_writes_past(16):            # an owner record is ~150 bytes
        with pytest.raises(HpcTrainError) as e:    # a full disk: a failure, not a usage error
            store.claim(root, RUN)
    assert type(e.value) is HpcTrainError and str(e.value).startswith(
        f"{root / store.OWNER}: File too large; {root} cannot be made this run's checkpoint")
    assert store.read_owner(root) is None and _litter(root) == []
    assert store.claim(root, RUN) is True          # room again: the claim goes through
    owner = (root / store.OWNER).read_bytes()
    _saved(root, 3)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}

    partial, manifest = _partial(root, 6)
    with storage_stops_writes_past(64):            # a manifest is a few hundred bytes
        with pytest.raises(SaveFault) as fault:
            _publish_in_one_line(root, partial, 6, manifest)
    line = str(fault.value)
    assert f"(EFBIG: {partial / store.MANIFEST})" in line and "\n" not in line
    assert store.partial_checkpoints(root) == [partial] and not (partial / store.MANIFEST).exists()
    with storage_stops_writes_past(4):             # "step-00000003\n" is 14 bytes
        with pytest.raises(OSError):
            store.set_latest(root, "step-00000006")
    assert store.read_latest(root) == "step-00000003"
    assert _litter(root) == []
    assert {p: p.read_bytes() for p in before} == before and (root / store.OWNER).read_bytes() \
        == owner
    # what a resume sees: the newest verified checkpoint is still this run's step 3
    assert store.foreign_checkpoints(root, RUN) is None
    assert [s for s, _ in store.verified_checkpoints(root, RUN)] == [3]
    final = store.publish(partial, root, 6, manifest)      # and the save can be done again
    assert store.read_latest(root) == final.name == "step-00000006"
