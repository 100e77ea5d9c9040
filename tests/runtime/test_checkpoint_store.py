"""The checkpoint folder without torch: publish, verify, quarantine, prune, ``latest``."""

from __future__ import annotations

import os
import re
import time

import pytest

from hpctrain.record import checkpoint_store as store


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


def test_prune_counts_only_checkpoints_that_verify_and_that_this_run_saved(tmp_path):
    for step in (10, 20, 30):
        _publish(tmp_path, step, run="run-a")
    damaged = _publish(tmp_path, 40, run="run-a")
    (damaged / "__0_0.distcp").write_bytes(b"short")   # newest, but fails the cheap check
    _publish(tmp_path, 50, run="run-b")                 # another run's: never counted or deleted
    removed = store.prune(tmp_path, keep_last=1, log=lambda m: None, run_id="run-a")
    assert sorted(d.name for d in removed) == ["step-00000010", "step-00000020"]
    # the newest verified one (30) survives a damaged newer one; 40 and run-b's 50 untouched
    assert [s for s, _ in store.complete_checkpoints(tmp_path)] == [50, 40, 30]
    assert [s for s, _ in store.verified_checkpoints(tmp_path, "run-a")] == [30]


def test_claim_writes_the_owner_record_once_in_a_private_folder(tmp_path):
    root = tmp_path / "ck"
    assert store.claim(root, "run-a", tmp_path / "runs" / "run-a") is True
    assert oct(root.stat().st_mode & 0o777) == "0o700"
    owner = store.read_owner(root)
    assert owner["run"] == "run-a" and owner["run_dir"].endswith("runs/run-a")
    _publish(root, 10, run="run-a")
    assert store.claim(root, "run-a") is False           # resume, requeue: the same run
    assert store.read_owner(root)["run"] == "run-a"
    shared = tmp_path / "shared"
    store.claim(shared, "run-c", mode=0o750)
    assert oct(shared.stat().st_mode & 0o777) == "0o750"


def test_another_runs_folder_is_refused_with_the_fix_and_left_as_it_was(tmp_path):
    root = tmp_path / "ck"
    store.claim(root, "run-a")
    _publish(root, 10, run="run-a")
    partial = _partial(root, 20)                          # run-a's save in progress
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    with pytest.raises(store.ForeignCheckpointsError) as e:
        store.claim(root, "run-b")
    msg = str(e.value)
    assert msg.startswith(f"checkpoint.dir: {root} holds another run's checkpoints "
                          "(owner.json names run run-a)")
    assert "`hpctrain resume run-a`" in msg and f"train.init_from: {root}" in msg
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before
    assert partial.is_dir() and store.read_owner(root)["run"] == "run-a"
    with pytest.raises(store.ForeignCheckpointsError, match="a new run must not load"):
        store.check_owner(root, "")                       # submit, before the run exists


def test_a_folder_without_owner_record_is_taken_only_when_every_checkpoint_names_the_run(tmp_path):
    mine = tmp_path / "mine"
    _publish(mine, 10, run="run-a")
    assert store.claim(mine, "run-a") is True             # checkpoints saved before owner.json
    theirs = tmp_path / "theirs"
    _publish(theirs, 10, run="run-x")
    with pytest.raises(store.ForeignCheckpointsError, match="step-00000010 was saved by run run-x"):
        store.claim(theirs, "run-a")
    unknown = tmp_path / "unknown"
    _partial(unknown, 30)
    with pytest.raises(store.ForeignCheckpointsError, match="belongs to no known run"):
        store.claim(unknown, "run-a")
    assert not (theirs / store.OWNER).exists() and not (unknown / store.OWNER).exists()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / store.OWNER).write_bytes(b"\xff\xfe not json")
    with pytest.raises(store.ForeignCheckpointsError, match="owner.json cannot be read"):
        store.claim(bad, "run-a")
    other_tool = tmp_path / "other-tool"
    other_tool.mkdir()
    (other_tool / store.OWNER).write_text('{"format": "another-launcher", "run": "run-a"}')
    with pytest.raises(store.ForeignCheckpointsError, match="is not an hpctrain owner record"):
        store.claim(other_tool, "run-a")


def _claim_in_process(root, run_id, go, out):
    go.wait()
    try:
        store.claim(root, run_id)
        out.put(run_id)
    except store.ForeignCheckpointsError:
        out.put(None)


def test_runs_claiming_one_folder_at_once_get_exactly_one_owner(tmp_path):
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    root, go, out = tmp_path / "ck", ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_claim_in_process, args=(root, f"run-{i}", go, out))
             for i in range(6)]
    [p.start() for p in procs]
    go.set()
    winners = [out.get(timeout=60) for _ in procs]
    [p.join(60) for p in procs]
    assert len([w for w in winners if w]) == 1
    assert store.read_owner(root)["run"] == next(w for w in winners if w)


def test_release_undoes_a_claim_only_while_the_folder_holds_nothing(tmp_path):
    root = tmp_path / "ck"
    store.claim(root, "run-a")
    store.release(root, "run-b")                          # not the owner: nothing happens
    assert store.read_owner(root)["run"] == "run-a"
    store.release(root, "run-a")
    assert store.read_owner(root) is None and store.claim(root, "run-b")
    _publish(root, 5, run="run-b")
    store.release(root, "run-b")                          # holds a checkpoint: stays claimed
    assert store.read_owner(root)["run"] == "run-b"


def test_a_damaged_manifest_does_not_cost_a_run_its_own_folder_nor_hand_over_a_strange_one(
        tmp_path):
    """Attempt 1 of run-a claimed its folder and saved step 10, whose manifest was then damaged
    (a full disk). Attempt 2 still owns the folder (verification sets that checkpoint aside
    later). A folder without an owner record whose only checkpoint has no readable manifest
    belongs to no known run: a new run is refused it."""
    mine = tmp_path / "mine"
    store.claim(mine, "run-a")
    saved = _publish(mine, 10, run="run-a")
    (saved / store.MANIFEST).write_text("{ torn")
    assert store.foreign_checkpoints(mine, "run-a") is None
    assert store.claim(mine, "run-a") is False
    strange = tmp_path / "strange"
    (_publish(strange, 10, run="run-x") / store.MANIFEST).write_text("{ torn")
    with pytest.raises(store.ForeignCheckpointsError,
                       match="step-00000010 has no readable manifest naming its run"):
        store.claim(strange, "run-a")
    assert not (strange / store.OWNER).exists()


def test_manifest_checksums_are_standard_crcs_that_other_tools_agree_with(tmp_path):
    """An operator who copied a checkpoint checks it with any CRC tool: a manifest holds each
    file's size and its standard CRC-32C (check value of b"123456789": e3069283); an older
    manifest's standard CRC-32 (cbf43926) is computed the same way when it is verified."""
    (tmp_path / "f").write_bytes(b"123456789")
    assert store.file_checksum(tmp_path / "f") == (9, "e3069283")
    assert store.file_checksum(tmp_path / "f", "crc32") == (9, "cbf43926")


def test_a_folder_with_another_tools_manifest_is_not_a_checkpoint(tmp_path):
    """A step-* folder whose manifest.json was written by another tool (its own format) is not
    read as an hpctrain checkpoint: verification finds no manifest of ours."""
    final = _publish(tmp_path, 10, run="run-a")
    (final / store.MANIFEST).write_text('{"format": "dcp-metadata", "step": 10, "files": {}}')
    assert store.read_manifest(final) is None
    assert store.verified_checkpoints(tmp_path, "run-a") == []


def test_whichever_run_prunes_the_other_runs_checkpoints_are_never_counted(tmp_path):
    """run-b prunes a folder that also holds run-a's checkpoints (taken over from a run whose
    weights it started from): only run-b's own are counted and deleted."""
    for step in (10, 20):
        _publish(tmp_path, step, run="run-a")
    for step in (50, 60):
        _publish(tmp_path, step, run="run-b")
    removed = store.prune(tmp_path, keep_last=1, log=lambda m: None, run_id="run-b")
    assert [d.name for d in removed] == ["step-00000050"]
    assert [s for s, _ in store.complete_checkpoints(tmp_path)] == [60, 20, 10]


def test_four_ranks_verifying_together_find_a_file_damaged_in_any_ones_share(tmp_path):
    """A checkpoint of eight shard files verified by four ranks, each checksumming its share:
    a shard damaged in rank 2's share is found by rank 2 alone, and the four shares together
    report it once, whichever rank holds it."""
    shards = {f"__{i}_0.distcp": bytes([i]) * 100 for i in range(8)}
    final = store.publish(_partial(tmp_path, 20, files=shards), tmp_path, 20,
                          store.build_manifest(20, store.checksum_files(
                              store.partial_dir(tmp_path, 20, 1), sorted(shards))))
    m = store.read_manifest(final)
    names = sorted(m["files"])
    for damaged in ("__6_0.distcp", "__7_0.distcp"):
        good = (final / damaged).read_bytes()
        (final / damaged).write_bytes(b"\0" * 100)         # same size: only a checksum sees it
        found = {r: store.checksum_problems(final, m, store.share(names, r, 4)) for r in range(4)}
        holder = next(r for r in range(4) if damaged in store.share(names, r, 4))
        assert [p.split(":")[0] for p in sum(found.values(), [])] == [damaged]
        assert found[holder] and not any(found[r] for r in range(4) if r != holder)
        (final / damaged).write_bytes(good)
    assert store.checksum_problems(final, m, names) == []


def test_copies_set_aside_in_one_second_are_numbered_in_the_order_they_went(tmp_path):
    """Step 5 is saved four times in a row (a save retried after each failure): the three
    older copies are set aside, none overwrites another, and those set aside within the same
    second carry -2, -3 after the time, in the order they went."""
    for copy in range(4):
        (_publish(tmp_path, 5) / "marker").write_text(f"copy {copy}")
    _numbered_in_order(tmp_path, ["copy 0", "copy 1", "copy 2"])
    assert (tmp_path / "step-00000005" / "marker").read_text() == "copy 3"


def _numbered_in_order(root, markers: list[str]) -> dict[str, list[str]]:
    """The copies of step 5 set aside under ``root`` hold ``markers``; those of each second
    are named by it, then -2, -3 in the order they went (whichever second the copies fell
    in, and in whatever order the folder lists them): {second: [marker, ...]}."""
    aside = list((root / store.QUARANTINE).iterdir())
    assert sorted((d / "marker").read_text() for d in aside) == markers
    by_second: dict[str, list] = {}
    for d in aside:
        second = re.fullmatch(r"step-00000005-(\d{8}-\d{6})(-\d+)?", d.name).group(1)
        by_second.setdefault(second, []).append(d)
    seen = {}
    for second, copies in by_second.items():
        copies.sort(key=lambda d: (d / "marker").read_text())
        first = f"step-00000005-{second}"
        assert [d.name for d in copies] == [first] + [
            f"{first}-{n}" for n in range(2, len(copies) + 1)], copies
        seen[second] = [(d / "marker").read_text() for d in copies]
    return seen


def test_a_second_ticking_over_while_a_copy_is_named_keeps_the_copies_in_order(tmp_path,
                                                                             monkeypatch):
    """The clock reaches the next second between a name's try and its numbered one: the copy
    keeps the second it was first tried in (named as a -2 of the next second, it came before
    that second's first copy)."""
    real, stamps = time.strftime, []

    def strftime(fmt, *args):
        if fmt != "%Y%m%d-%H%M%S":
            return real(fmt, *args)
        stamps.append(fmt)
        return "20261129-120000" if len(stamps) <= 2 else "20261129-120001"

    monkeypatch.setattr(store.time, "strftime", strftime)
    for copy in range(4):
        (_publish(tmp_path, 5) / "marker").write_text(f"copy {copy}")
    assert _numbered_in_order(tmp_path, ["copy 0", "copy 1", "copy 2"]) == {
        "20261129-120000": ["copy 0", "copy 1"], "20261129-120001": ["copy 2"]}


def test_a_folder_left_with_several_killed_saves_names_each_of_them(tmp_path):
    """No owner record, no checkpoint, but two saves that jobs were killed in: the refusal
    lists both, so the operator checks each before moving them."""
    root = tmp_path / "ckpt"
    _partial(root, 30, attempt=1)
    _partial(root, 40, attempt=2)
    with pytest.raises(store.ForeignCheckpointsError) as refused:
        store.claim(root, "run-a")
    for step, attempt in ((30, 1), (40, 2)):
        assert store.partial_dir(root, step, attempt).name in str(refused.value)
    assert "belong to no known run" in str(refused.value)
    assert not (root / store.OWNER).exists()


def test_a_copy_missing_several_files_names_each_of_them(tmp_path):
    """An interrupted copy of a four-shard checkpoint lost the first and third shards and cut
    the last one short: the cheap check names all three, so one look says what to copy again."""
    shards = {f"__{i}_0.distcp": bytes([i]) * 100 for i in range(4)}
    partial = _partial(tmp_path, 30, files=shards)
    final = store.publish(partial, tmp_path, 30, store.build_manifest(
        30, store.checksum_files(partial, sorted(shards))))
    (final / "__0_0.distcp").unlink()
    (final / "__2_0.distcp").unlink()
    (final / "__3_0.distcp").write_bytes(b"\3" * 10)
    assert store.manifest_problems(final, store.read_manifest(final)) == [
        "__0_0.distcp is missing", "__2_0.distcp is missing",
        "__3_0.distcp has 10 bytes, the manifest says 100"]


def test_a_checkpoint_deleted_by_hand_while_the_run_prunes_does_not_stop_the_prune(tmp_path):
    """The run prunes to its newest checkpoint while an operator, cleaning up by hand, deletes
    step 10 just after the run deleted step 20: the prune (inside training) goes on, and
    nothing but the newest is left."""
    import shutil
    for step in (10, 20, 30):
        _publish(tmp_path, step, run="run-a")
    said = []

    def log(message):
        said.append(message)
        if "step-00000020" in message:
            shutil.rmtree(tmp_path / "step-00000010")       # the operator's rm -r

    removed = store.prune(tmp_path, keep_last=1, log=log, run_id="run-a")
    assert [d.name for d in removed] == ["step-00000020", "step-00000010"]
    assert [s for s, _ in store.complete_checkpoints(tmp_path)] == [30]


def test_small_files_are_synced_when_their_checksum_is_taken_for_a_manifest(tmp_path, monkeypatch):
    """megatron-core writes ``common.pt`` and ``metadata.json`` without fsync: rank 0 syncs
    them as it checksums them for the manifest, so a published checkpoint never vouches for a
    file still only in the page cache (os.fsync watched, not replaced)."""
    for name in ("common.pt", "metadata.json"):
        (tmp_path / name).write_bytes(b"x" * 100)
    synced = []
    real_fsync = os.fsync

    def watched(fd):
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", watched)
    plain = store.checksum_files(tmp_path, ["common.pt", "metadata.json"])
    assert synced == []
    durable = store.checksum_files(tmp_path, ["common.pt", "metadata.json"], durable=True)
    assert synced == ["common.pt", "metadata.json"] and durable == plain


@pytest.mark.parametrize("change", [
    lambda m: m["files"].update({"../../outside": {"size": 3, "crc32c": "00000000"}}),
    lambda m: m["files"].update({"/etc/passwd": {"size": 3, "crc32c": "00000000"}}),
    lambda m: m.update(total_bytes="abc"),
    lambda m: m["files"]["__0_0.distcp"].update(size=-1),
    lambda m: m.update(files=[]),
])
def test_a_manifest_that_fails_its_checks_makes_the_checkpoint_incomplete(tmp_path, change):
    """A manifest naming a file outside its folder (or with sizes that are no sizes) is not
    trusted: the checkpoint is incomplete, never verified by reading another file."""
    import json
    final = _publish(tmp_path, 5)
    assert store.read_manifest(final) is not None
    m = json.loads((final / store.MANIFEST).read_text())
    change(m)
    (final / store.MANIFEST).write_text(json.dumps(m))
    assert store.read_manifest(final) is None
    assert store.manifest_problems(final, None) == ["manifest.json is missing or unreadable"]
    assert store.verified_checkpoints(tmp_path) == []
