"""The checkpoint folder without torch: publish, verify, quarantine, prune, ``latest``."""

from __future__ import annotations

import os

from hpctrain.runtime.checkpoint import store


def _partial(root, step, attempt=1, files=None):
    p = store.partial_dir(root, step, attempt)
    (p / "sub").mkdir(parents=True)
    for name, data in (files or {"__0_0.distcp": b"a" * 1000, "sub/common.pt": b"xyz"}).items():
        (p / name).write_bytes(data)
    return p


def _publish(root, step, **info):
    p = _partial(root, step)
    files = store.checksum_files(p, store.list_files(p))
    return store.publish(p, root, step, store.build_manifest(step, files, **info))


def test_publish_writes_manifest_renames_and_moves_latest(tmp_path):
    final = _publish(tmp_path, 50, reason="periodic")
    assert final.name == "step-00000050" and store.read_latest(tmp_path) == "step-00000050"
    m = store.read_manifest(final)
    assert m["step"] == 50 and m["reason"] == "periodic" and m["total_bytes"] == 1003
    assert set(m["files"]) == {"__0_0.distcp", os.path.join("sub", "common.pt")}
    assert store.manifest_problems(final, m) == []
    assert store.checksum_problems(final, m, sorted(m["files"])) == []
    assert not store.partial_checkpoints(tmp_path)
    _publish(tmp_path, 100)
    assert store.read_latest(tmp_path) == "step-00000100"
    assert [s for s, _ in store.complete_checkpoints(tmp_path)] == [100, 50]


def test_verification_catches_missing_resized_and_corrupted_files(tmp_path):
    final = _publish(tmp_path, 7)
    m = store.read_manifest(final)
    blob = final / "__0_0.distcp"
    blob.write_bytes(b"a" * 999 + b"b")                 # same size, other bytes
    assert store.manifest_problems(final, m) == []
    (problem,) = store.checksum_problems(final, m, ["__0_0.distcp"])
    assert problem.startswith("__0_0.distcp: CRC32")
    blob.write_bytes(b"a" * 10)
    assert store.manifest_problems(final, m) == ["__0_0.distcp has 10 bytes, the manifest says 1000"]
    blob.unlink()
    assert store.manifest_problems(final, m) == ["__0_0.distcp is missing"]
    (final / store.MANIFEST).unlink()
    assert store.manifest_problems(final, store.read_manifest(final)) == [
        "manifest.json is missing or unreadable"]


def test_quarantine_keeps_everything_with_a_note(tmp_path):
    partial = _partial(tmp_path, 9)
    where = store.quarantine(tmp_path, partial, "incomplete")
    assert where.parent == tmp_path / store.QUARANTINE and not partial.exists()
    assert (where / "__0_0.distcp").read_bytes() == b"a" * 1000
    assert "incomplete" in (where / "QUARANTINED.txt").read_text()
    again = store.quarantine(tmp_path, _partial(tmp_path, 9), "again")
    assert again != where and again.exists()


def test_same_step_saved_twice_keeps_the_first_aside(tmp_path):
    first = _publish(tmp_path, 5)
    (first / "marker").write_text("first")
    second = _publish(tmp_path, 5)
    assert second == first and not (second / "marker").exists()
    (aside,) = (tmp_path / store.QUARANTINE).iterdir()
    assert (aside / "marker").read_text() == "first"


def test_prune_keeps_the_newest_and_never_counts_unverifiable_folders(tmp_path):
    for step in (10, 20, 30, 40):
        _publish(tmp_path, step)
    broken = tmp_path / "step-00000050"
    broken.mkdir()                                      # no manifest: not counted, not deleted
    removed = store.prune(tmp_path, keep_last=2, log=lambda m: None)
    assert sorted(d.name for d in removed) == ["step-00000010", "step-00000020"]
    assert [s for s, _ in store.complete_checkpoints(tmp_path)] == [50, 40, 30]
    store.prune(tmp_path, keep_last=0, log=lambda m: None)   # at least one is always kept
    assert [s for s, _ in store.complete_checkpoints(tmp_path)] == [50, 40]


def test_share_spreads_files_over_ranks():
    names = [f"f{i}" for i in range(7)]
    shares = [store.share(names, r, 3) for r in range(3)]
    assert sorted(sum(shares, [])) == sorted(names)
    assert [len(s) for s in shares] == [3, 2, 2]
