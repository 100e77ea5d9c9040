"""Saving and resuming across the ranks and attempts of one run (``runtime.checkpoint.manager``
and ``runtime.checkpoint.state``), on real megatron-core models and optimizers over four ranks
(PP2 × VPP2 × DP2: two model chunks per rank, the distributed optimizer), from
``checkpointer_probe.py``: about twenty seconds where a training run per story would take
minutes.

The stories: a background save published by a later ``poll()`` and one by ``wait()``, one
background save at a time, a step saved twice written once, an emergency save published on
return, pruning to ``keep_last``; a resume into a fresh model and optimizer that gives back
the weights, Adam's moments and step count, every rank's RNG streams and the common state, so
that the next step equals the uninterrupted run's, in both formats of the distributed
optimizer and without it; a partial save set aside; a flipped byte caught by the load's CRC32C and the
previous checkpoint loaded; the only checkpoint damaged, which stops the attempt; the older
format's read-through, whose shares of the files every rank checks; checks that refuse a
checkpoint before reading it (a changed data setting among them); another run's folder
refused on every rank."""

from __future__ import annotations

import json

import pytest

from tests.conftest import token_corpus
from tests.runtime.helpers import job_mapping, make_run

pytestmark = pytest.mark.megatron
WORLD = 4
LAYOUT = "pp2vpp2dp2_zero1"     # two model chunks per rank, the distributed optimizer
CK = "/ck"          # the checkpoint folder's place in the messages, made comparable
RUN = "/run"        # the run folder's


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> dict:
    from tests.launch import Launch
    from tests.runtime.conftest import _explain
    tmp = tmp_path_factory.mktemp("checkpointer")
    prefix = token_corpus(tmp / "corpus", 50, 40)
    runs = tmp / "runs"
    # the format named in the job (a string read from its YAML), as a user writes it
    run = make_run(runs, "ck", job_mapping(prefix, LAYOUT, checkpoint={
        "keep_last": 2, "optimizer_format": "fully_reshardable"}), WORLD)
    other = make_run(runs, "other", job_mapping(prefix, LAYOUT), WORLD)
    dp = make_run(runs, "dp", job_mapping(prefix, LAYOUT,
                                          checkpoint={"optimizer_format": "dp_reshardable"}),
                  WORLD)
    plain = make_run(runs, "plain", job_mapping(prefix, LAYOUT, parallel={
        "use_distributed_optimizer": False}), WORLD)
    out = tmp / "out"
    out.mkdir()
    res = Launch(run.path, WORLD, module="tests.runtime.checkpointer_probe",
                 args=[str(p.path) for p in (run, other, dp, plain)] + [str(out)]).wait(600)
    assert res.ok, _explain(res)
    root = str(run.checkpoint_dir())

    def comparable(rank: int) -> dict:
        text = (out / f"rank-{rank}.json").read_text().replace(root, CK)
        text = text.replace(str(run.path), RUN)
        return json.loads(text)
    return {"ranks": [comparable(r) for r in range(WORLD)],
            "log": res.output(0).replace(root, CK).replace(str(run.path), RUN)}


def _all(probed, *keys) -> list:
    """The value at ``keys`` on every rank."""
    out = []
    for seen in probed["ranks"]:
        for k in keys:
            seen = seen[k]
        out.append(seen)
    return out


def _same(probed, *keys):
    values = _all(probed, *keys)
    assert all(v == values[0] for v in values), (keys, values)
    return values[0]


def _same_optimizer(got: dict, want: dict, when: str) -> None:
    """Adam's moments, the main parameters and the per-parameter step count of this rank's
    shard (a count megatron's state dict leaves in the param groups is not torch's Adam's)."""
    for k in ("moments", "mains", "count", "steps"):
        assert got["optimizer"][k] == want["optimizer"][k], (when, k)


def test_background_saves_are_published_by_poll_and_wait_one_at_a_time(probed):
    assert _same(probed, "first", "resume") == {
        "loaded": None, "phases": ["load: verifying checkpoints"]}   # an empty folder
    scheduled = _same(probed, "first", "after_schedule")
    assert (scheduled["pending"], scheduled["published"], scheduled["stall"]) == ([1], None, True)
    polled = _same(probed, "first", "after_poll")       # every rank polls as often
    assert polled["pending"] == [] and polled["published"] == 1 and polled["polls"] >= 1
    assert polled["path"] == "step-00000001"
    assert polled["phases"] == ["save: step 1 (periodic)", "save: publishing step 1"]
    # the same step again: nothing written, the published one named
    assert _same(probed, "first", "again") == {"skipped": "already saved",
                                               "path": "step-00000001"}
    # an emergency save is published when it returns; its writing is progress for the watchdog
    assert _same(probed, "first", "sync") == {
        "pending": [], "published": 2, "path": "step-00000002",
        "phases": ["save: publishing step 2", "save: step 2 (emergency)",
                   "save: writing step 2 (emergency)"]}
    # a background save scheduled while one is pending waits for it first
    assert _same(probed, "first", "pending_3") == [3]
    assert _same(probed, "first", "pending_4") == [4]
    assert _same(probed, "first", "published_before_wait") == 3
    assert _same(probed, "first", "after_wait") == {"pending": [], "published": 4}
    # waiting for a background writer that writes slowly is progress for the hang watchdog
    # while the writer's items advance (a long write on a busy file system is not a hang)
    for phases in _all(probed, "first", "wait_phases"):
        assert phases[-1] == "save: publishing step 4"
        assert set(phases[:-1]) == {"save: writing step 4 (periodic) in the background"}
    assert [[{k: s[k] for k in ("step", "reason", "sync")} for s in saves]
            for saves in _all(probed, "first", "saves")] == [[
        {"step": 1, "reason": "periodic", "sync": False},
        {"step": 2, "reason": "emergency", "sync": True},
        {"step": 3, "reason": "periodic", "sync": False},
        {"step": 4, "reason": "periodic", "sync": False}]] * WORLD
    # rank 0 alone commits the metrics, once per published step
    assert _all(probed, "first", "on_published") == [[1, 2, 3, 4], [], [], []]
    assert _all(probed, "second", "on_published") == [[5], [], [], []]
    # keep_last: 2
    assert _same(probed, "first", "folders") == ["latest", "owner.json", "step-00000003",
                                                 "step-00000004"]


def test_a_resume_gives_back_the_state_and_the_next_step_of_the_uninterrupted_run(probed):
    for seen in probed["ranks"]:
        first, second = seen["first"], seen["second"]
        # the optimizer really moved between saves (else the comparisons below prove little)
        assert first["at_1"]["weights"] != first["at_2"]["weights"]
        assert first["at_1"]["optimizer"]["moments"] != first["at_2"]["optimizer"]["moments"]
        resumed = second["resume"]
        assert resumed["loaded"] == 4 and resumed["path"] == "step-00000004"
        assert resumed["common"] == {"step": 4, "consumed_samples": 64, "optimizer_updates": 4,
                                     "lr_schedule": {"num_steps": 4}, "guard": {"skipped": 0}}
        assert resumed["same_layout"] is True and resumed["manifest_attempt"] == 1
        read = resumed["read"]
        assert read["items"] > 0 and read["verified"] == read["items"]
        assert read["digest_checked"] is True
        assert resumed["phases"] == ["load: verifying checkpoints", "load: step-00000004"]
        # weights, Adam's moments, the main parameters and Adam's count, on this rank's shard
        for when in ("at_4", "at_5"):
            assert second[when]["weights"] == first[when]["weights"], when
            _same_optimizer(second[when], first[when], when)
        assert first["at_4"]["optimizer"]["steps"] == [4.0]
        # this rank's RNG streams as they were at the save (the probe reseeded them)
        assert second["draws"] == first["draws_after_4"]
    # DP replicas hold the same weights (one update all-gathered) and each its own shard of
    # the optimizer; the RNG streams are seeded per stage (the comparisons above are per rank)
    ranks = probed["ranks"]
    by_stage = {}
    for seen in ranks:
        by_stage.setdefault(seen["stage"], []).append(seen)
    assert sorted(by_stage) == [0, 1]
    for replicas in by_stage.values():
        a, b = (r["first"] for r in replicas)
        assert a["at_4"]["weights"] == b["at_4"]["weights"]
        assert a["at_4"]["optimizer"]["moments"] != b["at_4"]["optimizer"]["moments"]
        assert a["draws_after_4"] == b["draws_after_4"]
    assert by_stage[0][0]["first"]["draws_after_4"] != by_stage[1][0]["first"]["draws_after_4"]


@pytest.mark.parametrize("run, fmt, distributed", [
    ("dp_reshardable", "dp_reshardable", True),
    ("no_distributed_optimizer", "fully_reshardable", False)])
def test_the_other_formats_and_optimizers_resume_alike(probed, run, fmt, distributed):
    assert (_same(probed, run, "format"), _same(probed, run, "distributed")) == \
        (fmt, distributed)
    for seen in probed["ranks"]:
        other = seen[run]
        assert other["resume"]["loaded"] == 2
        for saved, resumed in (("at_2", "resumed_at_2"), ("at_3", "resumed_at_3")):
            assert other[resumed]["weights"] == other[saved]["weights"], resumed
            _same_optimizer(other[resumed], other[saved], resumed)
        assert other["at_3"]["optimizer"]["steps"] == [3.0]
        assert other["at_2"]["weights"] != other["at_3"]["weights"]
    assert _same(probed, run, "again_pending") == {"skipped": "already saved", "pending": [300]}
    assert _same(probed, run, "again_published") == "already saved"


def test_a_partial_save_is_set_aside_and_named(probed):
    second = _same(probed, "second", "quarantined")
    assert len(second) == 1 and second[0].startswith("partial-step-00000005-a1-")
    assert _same(probed, "second", "folders") == [
        "latest", "owner.json", "quarantine", "step-00000004", "step-00000005"]
    assert _same(probed, "second", "saved") == "step-00000005"
    events = probed["ranks"][0]["events"]
    incomplete = [e for e in events if e["reason"] == "incomplete"]
    assert len(incomplete) == 1 and f"{CK}/quarantine/partial-step-00000005-a1-" in \
        incomplete[0]["path"]
    assert "checkpoint: moved incomplete .partial-step-00000005-a1 to " in probed["log"]


def test_a_flipped_byte_is_caught_while_loading_and_the_previous_checkpoint_loaded(probed):
    for third in _all(probed, "third", "resume"):
        assert third["loaded"] == 4 and third["path"] == "step-00000004"
        assert third["phases"] == ["load: verifying checkpoints", "load: step-00000005",
                                   "load: step-00000004"]
    for seen in probed["ranks"]:
        assert seen["third"]["at_4"]["weights"] == seen["first"]["at_4"]["weights"]
        _same_optimizer(seen["third"]["at_4"], seen["first"]["at_4"], "third")
    assert _same(probed, "third", "folders") == ["latest", "owner.json", "quarantine",
                                                 "step-00000004"]
    assert any(q.startswith("step-00000005-") for q in _same(probed, "third", "quarantined"))
    flipped = probed["ranks"][0]["third"]["flipped"]
    step5 = [e for e in probed["ranks"][0]["events"]
             if e["event"] == "checkpoint_quarantined" and "/step-00000005-" in e["path"]]
    assert len(step5) == 1 and f"{flipped}: the item at byte " in step5[0]["reason"]
    assert "its writer recorded" in step5[0]["reason"]
    assert "checkpoint: step-00000005 is damaged (" in probed["log"]
    assert "and trying the previous one" in probed["log"]


def test_the_only_checkpoint_damaged_stops_the_attempt_on_every_rank(probed):
    fourth = _same(probed, "fourth", "resume")
    assert fourth["error"] == "CheckpointError"
    assert fourth["message"] == (
        f"checkpoint step-00000004 failed verification while loading and no older checkpoint "
        f"is left; the damaged ones are in {CK}/quarantine; the next attempt starts from the "
        f"initial weights")
    assert _same(probed, "fourth", "saved") == "step-00000006"
    assert _same(probed, "fourth", "folders") == ["latest", "owner.json", "quarantine",
                                                  "step-00000006"]


def test_the_older_formats_read_through_checks_every_ranks_share(probed):
    """With the read threads at 0, every file is read once before loading, shared out over
    the ranks: damage in a file that rank 0 does not read is found by the rank that does."""
    assert _same(probed, "fifth", "resume") == {"loaded": None,
                                                "phases": ["load: verifying checkpoints"]}
    damaged = probed["ranks"][0]["fifth"]["damaged"]
    assert damaged.endswith(".distcp")
    assert _same(probed, "fifth", "folders") == ["latest", "owner.json", "quarantine"]
    step6 = [e for e in probed["ranks"][0]["events"]
             if e["event"] == "checkpoint_quarantined" and "/step-00000006-" in e["path"]]
    assert len(step6) == 1 and step6[0]["reason"].startswith(f"{damaged}: CRC32C ")
    assert step6[0]["reason"].endswith(" in the manifest")


def test_a_flipped_byte_in_the_small_files_no_reader_checks_is_caught_before_loading(probed):
    """``common.pt`` (the step, the data position) is read by ``torch.load``, not by the reader
    that checks each item as it reads: its whole-file CRC32C is checked before loading, so a
    flipped byte sets the checkpoint aside and the previous one loads, on every rank."""
    assert _same(probed, "dp_reshardable", "damaged_common") == "common.pt"
    for seen in probed["ranks"]:
        other = seen["dp_reshardable"]
        assert other["common_damaged"]["loaded"] == 2
        assert other["common_damaged"]["phases"] == ["load: verifying checkpoints",
                                                     "load: step-00000002"]
        assert other["common_damaged_resumed_at_2"]["weights"] == other["at_2"]["weights"]
    (aside,) = _same(probed, "dp_reshardable", "common_damaged_quarantined")
    assert aside.startswith("step-00000300-")
    (note,) = _same(probed, "dp_reshardable", "common_damaged_note")
    assert "failed verification: common.pt: CRC32C " in note and " in the manifest" in note


def test_checks_refuse_a_checkpoint_before_reading_it(probed):
    refused = _same(probed, "second", "refused")
    assert refused["weights_only"] == (f"{CK}/step-00000004 holds model weights only; use it "
                                       f"as train.init_from")
    assert refused["no_distributed_optimizer"].startswith(
        f"checkpoint {CK}/step-00000004 was saved with parallel.use_distributed_optimizer=false;")
    assert refused["dp_reshardable_other_tp"].startswith(
        f"checkpoint {CK}/step-00000004 stores the distributed optimizer as dp_reshardable, "
        f"which resumes only on the same TP×PP×VPP (saved TP2, now TP1×PP2×VPP2×DP2;")
    assert refused["data_changed"] == (
        "train.seed: changed since checkpoint step-00000004 (seed 7 -> 1234): position 64 would "
        "skip or repeat samples; resume with the saved data settings, or accept the change "
        "with `hpctrain resume ck --accept-data-change`")
    assert refused["data_same"] == refused["data_accepted"] == "accepted"
    assert refused["without_digest"] == {"loaded": 4, "digest_checked": False}


def test_another_runs_folder_is_refused_on_every_rank_and_left_alone(probed):
    foreign = _same(probed, "fifth", "foreign")
    assert foreign["error"] == "CheckpointError"
    assert f"{CK} holds another run's checkpoints (owner.json names run ck), which run " \
           f"other must not load, set aside or delete" in foreign["message"]
    assert _same(probed, "fifth", "folders_after_foreign") == _same(probed, "fifth", "folders")
    assert probed["ranks"][0]["other_events"] == []


def test_a_storage_fault_after_a_resume_names_the_checkpoint_resumed_from(probed):
    """Before the attempt saved anything, the newest complete checkpoint is the one the
    folder's ``latest`` names: a storage fault says it by its whole path."""
    assert _same(probed, "second", "fault_after_resume") == (
        f"checkpoint save of step 9 to {CK} failed: no space left on the device (ENOSPC: "
        f"{CK}/x); the newest complete checkpoint, {CK}/step-00000004, is intact and is what "
        f"the run resumes from; free space on that file system (or set "
        f"storage.checkpoint_root to another one), then `hpctrain resume ck`")


def test_a_storage_fault_while_a_background_save_runs_names_its_step(probed):
    """``poll()`` and ``wait()`` know no step: a fault there is the pending save's (step 3);
    a save that names its step keeps it. The newest complete checkpoint is step 2."""
    pending, given = _same(probed, "first", "fault_while_pending")
    for step, message in ((3, pending), (9, given)):
        assert message.startswith(f"checkpoint save of step {step} to {CK} failed: "), message
        assert f"the newest complete checkpoint, {CK}/step-00000002, is intact" in message


def test_a_save_whose_folder_rank_0_cannot_make_fails_on_every_rank(probed):
    """Rank 0 makes the save's folder alone: its failure reaches every rank (else the others
    would wait in the save's collectives forever), said in the one line of a storage fault."""
    blocked = _same(probed, "fifth", "blocked")
    assert blocked == {"error": "SaveFault", "message": (
        f"checkpoint save of step 7 to {RUN}/not-a-folder/checkpoints failed: a part of the "
        f"path is not a folder (ENOTDIR: {RUN}/not-a-folder/checkpoints); no complete "
        f"checkpoint was saved before it; fix the storage (free space, permissions), then "
        f"`hpctrain resume ck`")}
    assert _same(probed, "fifth", "blocked_pending") == []


def test_every_save_and_set_aside_is_an_event_of_its_attempt(probed):
    events = probed["ranks"][0]["events"]
    saved = [(e["step"], e["reason"], e["attempt"]) for e in events
             if e["event"] == "checkpoint_saved"]
    assert saved == [(1, "periodic", 1), (2, "emergency", 1), (3, "periodic", 1),
                     (4, "periodic", 1), (5, "final", 2), (6, "final", 4)]
    set_aside = [e["path"].split("/quarantine/")[1].rsplit("-", 2)[0] for e in events
                 if e["event"] == "checkpoint_quarantined"]
    assert set_aside == ["partial-step-00000005-a1", "step-00000005", "step-00000004",
                         "step-00000006"]


def test_each_manifest_says_what_was_saved_by_whom_and_how(probed):
    first, second = probed["ranks"][0]["first"], probed["ranks"][0]["second"]
    layout = {"tp": 1, "pp": 2, "vpp": 2, "dp": 2, "world_size": 4,
              "distributed_optimizer": True, "describe": "TP1×PP2×VPP2×DP2"}
    for name, step, attempt, reason, background, manifest in (
            ("step-00000003", 3, 1, "periodic", True, first["manifests"]["step-00000003"]),
            ("step-00000004", 4, 1, "periodic", True, first["manifests"]["step-00000004"]),
            ("step-00000005", 5, 2, "final", False, second["manifest"])):
        assert (manifest["step"], manifest["attempt"], manifest["reason"],
                manifest["background"]) == (step, attempt, reason, background), name
        assert manifest["consumed_samples"] == 16 * step and manifest["kind"] == "full"
        assert manifest["layout"] == layout and manifest["device"] == "cpu"
        assert manifest["optimizer_format"] == "fully_reshardable"
        assert manifest["layers"] == first["layers"]           # the model's layer record
        assert (manifest["run"], manifest["job"]) == ("ck", f"tiny-{LAYOUT}")
        assert manifest["checksum"] == "crc32c"
        assert manifest["versions"]["megatron_core"] == "0.16.1"
    step4 = first["manifests"]["step-00000004"]
    assert step4["weights_digest"] == first["digest_4"]         # taken when it was saved
    assert step4["total_bytes"] == first["sizes"] == first["saves"][-1]["bytes"]
    assert first["manifests"]["step-00000003"]["weights_digest"] != step4["weights_digest"]


def test_the_times_a_save_reports_lie_within_the_time_measured_around_it(probed):
    """Timings are results too (result.json, the events, the save estimate that decides when
    to stop before a time limit): each must lie within the time the probe measured around
    it, whatever this machine's speed."""
    for seen in probed["ranks"]:
        first = seen["first"]
        wall = first["saves_wall"]
        for save in first["saves"]:
            assert 0 < save["stall_seconds"] <= save["total_seconds"] or save["sync"], save
            assert 0 < save["total_seconds"] <= wall, save
            if save["sync"]:      # published inside it; the stall is all of it
                assert save["total_seconds"] <= save["seconds"] == save["stall_seconds"] <= wall
        synced = seen["second"]["save"]
        assert 0 < synced["total_seconds"] <= synced["seconds"] <= seen["second"]["save_wall"]
    first, second = probed["ranks"][0]["first"], probed["ranks"][0]["second"]
    totals = {s["step"]: s["total_seconds"] for s in first["saves"]}
    for step in (3, 4):
        save_seconds = first["manifests"][f"step-0000000{step}"]["save_seconds"]
        assert 0 < save_seconds <= round(totals[step], 3)
    assert 0 < second["manifest"]["save_seconds"] <= round(second["save"]["total_seconds"], 3)
    totals[5] = second["save"]["total_seconds"]
    totals[6] = None
    for event in probed["ranks"][0]["events"]:
        if event["event"] == "checkpoint_saved" and totals[event["step"]] is not None:
            assert event["seconds"] == round(totals[event["step"]], 3), event
    # rank 0's log line of each save: its size and whole time, the time the event keeps
    for save in first["saves"]:
        assert (f"checkpoint: saved step {save['step']} ({save['reason']}, "
                f"{'' if save['sync'] else 'background '}{save['bytes'] / 1e6:.1f} MB in "
                f"{round(save['total_seconds'], 3):.2f}s) -> {CK}/step-0000000{save['step']}") \
            in probed["log"]


def test_the_times_a_resume_reports_lie_within_the_time_measured_around_it(probed):
    for seen in probed["ranks"]:
        resumed = seen["second"]["resume"]
        stats, phases = resumed["stats"], resumed["stats"]["phases_s"]
        assert set(phases) == {"checks_s", "template_s", "read_s", "apply_s", "digest_s"}
        assert all(v >= 0 for v in phases.values()) and phases["read_s"] > 0
        assert sum(phases.values()) <= resumed["seconds"] + 0.003      # rounded to 1 ms each
        assert 0 <= resumed["verify_seconds"]
        assert resumed["verify_seconds"] + resumed["seconds"] <= resumed["wall"]
        # the read's own time is taken just before the phase's, each rounded to the millisecond
        assert stats["seconds"] <= phases["read_s"] + 0.001
        assert all(v == round(v, 3) for v in [stats["seconds"], *phases.values()])
        assert stats["bytes"] > 0 and stats["threads"] > 0
        low, high = stats["seconds"] - 0.0005, stats["seconds"] + 0.0005
        assert stats["bytes"] / 1e9 / high <= stats["gb_per_s"] <= stats["bytes"] / 1e9 / low
