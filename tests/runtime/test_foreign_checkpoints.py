"""A checkpoint folder belongs to one run, in real runs: another run started on it refuses to
start and leaves it exactly as it was (its in-progress save included); `train.init_from` is how
a new run starts from those checkpoints, in a folder of its own that it prunes by itself."""

from __future__ import annotations

import shutil

import pytest

from hpctrain.record import checkpoint_store as store
from tests.launch import launch
from tests.runtime.conftest import _explain
from tests.runtime.helpers import result

pytestmark = pytest.mark.megatron


def _snapshot(root):
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns)
                  for p in root.rglob("*"))


def test_another_runs_folder_is_refused_and_left_as_it_was(ws):
    owner = ws.reference("single")                 # checkpoints at steps 6 and 12
    theirs = owner.path / "checkpoints"
    assert store.read_owner(theirs)["run"] == owner.id       # claimed by its first attempt
    in_progress = store.partial_dir(theirs, 14, 2)           # as if the owner were saving now
    in_progress.mkdir()
    (in_progress / "__0_0.distcp").write_bytes(b"x" * 4096)
    before = _snapshot(theirs)
    try:
        intruder = ws.new_run("intruder", "single", steps=4)
        intruder.update_meta(checkpoint_dir=str(theirs))     # the same checkpoint.dir
        res = launch(intruder.path, 1)
        assert res.codes == [1], _explain(res)
        out = res.output(0)
        assert f"checkpoint.dir: {theirs} holds another run's checkpoints (owner.json names run " \
               f"{owner.id})" in out
        assert f"`hpctrain resume {owner.id}`" in out and f"train.init_from: {theirs}" in out
        assert result(intruder, 1)["exit_reason"] == "failed"
        assert _snapshot(theirs) == before       # nothing loaded from, set aside or pruned
    finally:
        shutil.rmtree(in_progress)


def test_init_from_starts_from_another_runs_checkpoints_in_a_folder_of_its_own(ws):
    owner = ws.reference("single")                 # checkpoints at steps 6 and 12
    theirs = owner.path / "checkpoints"
    heir = ws.new_run("heir", "single", steps=4, train={"init_from": str(theirs)},
                      checkpoint={"interval_steps": 1, "keep_last": 2})
    res = launch(heir.path, 1)
    assert res.codes == [0], _explain(res)
    assert f"initial weights from {theirs / 'step-00000012'}" in res.output(0)
    r = result(heir, 1)
    assert r["start_step"] == 0 and r["end_step"] == 4
    mine = heir.path / "checkpoints"
    assert store.read_owner(mine)["run"] == heir.id
    assert [s for s, _ in store.complete_checkpoints(mine)] == [4, 3]   # keep_last: 2
    assert all(store.read_manifest(d)["run"] == heir.id
               for _, d in store.complete_checkpoints(mine))
    assert [s for s, _ in store.complete_checkpoints(theirs)] == [12, 6]
