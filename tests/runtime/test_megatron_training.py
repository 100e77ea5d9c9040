"""Real megatron-core training on CPU/gloo, in real processes: layouts, resume, preemption,
faults. Every run starts from the same exported initial weights and reads the real example
corpus (prepared by ``hpctrain data prepare``), so losses are comparable across runs."""

from __future__ import annotations

import shutil
import signal
import time

import pytest

from hpctrain import exit_codes
from hpctrain.record import checkpoint_store as store
from tests.conftest import flip_byte, wait_until
from tests.launch import Launch, launch
from tests.runtime.conftest import _explain
from tests.runtime.helpers import losses, result, world_of

pytestmark = pytest.mark.megatron
TOL = 1e-5


def _max_diff(a: dict, b: dict, steps) -> float:
    return max(abs(a[s] - b[s]) for s in steps)


def _copy_checkpoint(src_run, step: int, dst_run):
    """``src_run``'s checkpoint of ``step`` as if ``dst_run`` had saved it: a run resumes only
    from checkpoints whose manifest names it."""
    name = store.step_name(step)
    dst = dst_run.path / "checkpoints"
    dst.mkdir(exist_ok=True)
    shutil.copytree(src_run.path / "checkpoints" / name, dst / name)
    manifest = store.read_manifest(dst / name)
    store.write_json_atomic(dst / name / store.MANIFEST, {**manifest, "run": dst_run.id})
    return dst / name


def test_single_process_reference_learns_the_corpus(ws):
    run = ws.reference("single")
    loss = losses(run)
    assert sorted(loss) == list(range(1, 13))
    assert loss[12] < loss[1] - 0.8, loss                 # ln(257) ≈ 5.55 falls on real text
    res = result(run, 1)
    assert res["exit_reason"] == "finished" and res["end_step"] == 12
    assert res["checkpoint_saved"].endswith("step-00000012")
    rec = run.metrics()[-1]
    assert rec["tokens_per_s"] > 0 and rec["lr"] == pytest.approx(3e-4) and rec["mfu"] is None
    assert (run.path / "tensorboard").is_dir()


@pytest.mark.parametrize("layout", ["tp2pp2", "tp2pp2vpp2", "pp2vpp2dp2_zero1", "tp2dp2_zero1"])
def test_layouts_match_the_single_process_run(ws, layout):
    ref = losses(ws.reference("single"))
    run = ws.reference(layout)
    got = losses(run)
    assert sorted(got) == list(range(1, 13))
    assert _max_diff(got, ref, range(1, 13)) < TOL, (got, ref)


def test_resume_is_bitwise_identical_to_an_uninterrupted_run(ws):
    ref = ws.reference("pp2vpp2dp2_zero1")        # saved step 6 in the background, finished 12
    run = ws.new_run("resume-same-layout", "pp2vpp2dp2_zero1")
    _copy_checkpoint(ref, 6, run)
    res = launch(run.path, 4)
    assert res.codes == [0] * 4, _explain(res)
    r = result(run, 1)
    assert r["start_step"] == 6 and r["checkpoint_loaded"].endswith("step-00000006")
    a, b = losses(ref), losses(run)
    assert sorted(b) == list(range(7, 13))
    assert [a[s] for s in range(7, 13)] == [b[s] for s in range(7, 13)]   # bitwise
    assert r["weights_digest"] == result(ref, 1)["weights_digest"]


@pytest.mark.parametrize("layout", ["single", "tp2"])
def test_a_resume_with_dropout_draws_the_masks_the_uninterrupted_run_drew(ws, layout):
    """Dropout makes every step depend on the RNG streams (megatron's tracker for attention
    dropout, one state per TP rank; the default generator for hidden dropout): a resume that
    restored them wrongly or not at all, or that drew from them before its first step (the
    data reader's seed once did), would draw other masks and lose bit-equality."""
    dropout = {"model": {"attention_dropout": 0.2, "hidden_dropout": 0.2}}
    ref, _ = ws.train(f"dropout-ref-{layout}", layout, checkpoint={"interval_steps": 6},
                      **dropout)
    plain = losses(ws.reference("single"))
    a = losses(ref)
    assert all(abs(a[s] - plain[s]) > TOL for s in range(1, 13))   # the masks are in the loss
    run = ws.new_run(f"dropout-resume-{layout}", layout, **dropout)
    _copy_checkpoint(ref, 6, run)
    res = launch(run.path, world_of(layout))
    assert set(res.codes) == {0}, _explain(res)
    assert result(run, 1)["start_step"] == 6
    b = losses(run)
    assert [a[s] for s in range(7, 13)] == [b[s] for s in range(7, 13)]   # bitwise


def test_resume_on_another_layout_and_fewer_ranks(ws):
    src = ws.reference("pp2vpp2dp2_zero1")        # 4 ranks: PP2 x VPP2 x DP2, ZeRO-1
    run = ws.new_run("resume-other-layout", "dp2_zero1")     # 2 ranks: DP2, ZeRO-1
    _copy_checkpoint(src, 6, run)
    res = launch(run.path, 2)
    assert res.codes == [0, 0], _explain(res)
    assert result(run, 1)["start_step"] == 6
    assert "layout changed from TP1×PP2×VPP2×DP2 to TP1×PP1×DP2" in res.output(0)
    got, ref = losses(run), losses(ws.reference("single"))
    assert sorted(got) == list(range(7, 13))
    assert _max_diff(got, ref, range(7, 13)) < TOL


def test_dp_reshardable_optimizer_resumes_on_another_dp_size_only(ws):
    src, _ = ws.train("dp-reshardable", "dp2_zero1",
                      checkpoint={"interval_steps": 6, "optimizer_format": "dp_reshardable"})
    ref = losses(ws.reference("single"))
    assert _max_diff(losses(src), ref, range(1, 13)) < TOL
    assert store.read_manifest(src.path / "checkpoints" / "step-00000006")["optimizer_format"] \
        == "dp_reshardable"
    run = ws.new_run("dp-reshardable-dp1", "single_zero1")        # DP2 -> DP1: allowed
    _copy_checkpoint(src, 6, run)
    res = launch(run.path, 1)
    assert res.codes == [0], _explain(res)
    assert result(run, 1)["start_step"] == 6
    assert _max_diff(losses(run), ref, range(7, 13)) < TOL
    run = ws.new_run("dp-reshardable-tp2", "tp2_zero1")           # TP changes: refused
    _copy_checkpoint(src, 6, run)
    # rank 0's refusal reaches every rank, and each ends by itself: left to it, as a rank
    # taken down half a second after its peer's exit would end killed, not with the refusal
    res = launch(run.path, 2, kill_on_failure=False)
    assert res.codes == [exit_codes.FAILED] * 2, _explain(res)
    assert "stores the distributed optimizer as dp_reshardable, which resumes only on the same " \
           "TP×PP×VPP (saved TP1×PP1×DP2, now TP2×PP1×DP1" in res.output(0)
    assert (run.path / "checkpoints" / "step-00000006").is_dir()   # nothing moved or lost


def test_signal_saves_exits_75_and_requeued_attempt_finishes_identically(ws):
    ref = ws.reference("tp2pp2vpp2")
    run = ws.new_run("signal", "tp2pp2vpp2")
    env = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "4242",
           "HPCTRAIN_TEST_HOLD_AFTER_STEP": "3"}     # mid-run, however fast this machine is
    first = Launch(run.path, 4, env=env)
    wait_until(lambda: any(m["step"] >= 3 for m in run.metrics()), timeout=240,
               what="step 3 of the first attempt")
    first.signal_rank(3, signal.SIGUSR1)         # one rank hears it; all must stop together
    (run.path / "hold-release").touch()          # the other ranks were not told: let them on
    res = first.wait(240)
    assert res.codes == [exit_codes.LOCAL_REQUEUE] * 4, _explain(res)
    r1 = result(run, 1)
    assert r1["exit_reason"] == "preempted" and "signal" in r1["message"]
    stopped = r1["end_step"]
    assert 3 <= stopped < 12 and r1["checkpoint_saved"].endswith(store.step_name(stopped))
    (record,) = run.ledger()
    assert record["decision"]["requeue"] and record["job_id"] == "4242"
    assert record["end_step"] == stopped

    res = launch(run.path, 4, env={"SUBMITIT_EXECUTOR": "local"})   # the local requeue
    assert res.codes == [0] * 4, _explain(res)
    r2 = result(run, 2)
    assert r2["start_step"] == stopped and r2["exit_reason"] == "finished"
    assert [r["attempt"] for r in run.ledger()] == [1, 2]
    a, b = losses(ref), losses(run)
    assert [a[s] for s in range(1, 13)] == [b[s] for s in range(1, 13)]
    assert r2["weights_digest"] == result(ref, 1)["weights_digest"]


def test_rank_killed_while_saving_resumes_from_the_previous_checkpoint(ws):
    """Rank 1 dies after writing its shards of step 6, while rank 0 is inside the save's
    collectives (the gather of the write results): rank 0 ends with the save fault's one line
    (the save aborted by a lost peer, the previous checkpoint intact), not gloo's traceback;
    the partial save is never published and the resume sets it aside."""
    run = ws.new_run("kill-during-save", "dp2_zero1",
                     checkpoint={"interval_steps": 3, "async_save": False})
    res = launch(run.path, 2, env={"HPCTRAIN_TEST_KILL_DURING_SAVE": "1@6"},
                 kill_on_failure=False)       # rank 0 must notice the lost peer itself
    assert res.codes[1] == -signal.SIGKILL and res.codes[0] == 1, _explain(res)
    root = run.path / "checkpoints"
    assert [s for s, _ in store.complete_checkpoints(root)] == [3]
    (partial,) = store.partial_checkpoints(root)
    assert partial.name.startswith(".partial-step-00000006")
    assert store.read_latest(root) == "step-00000003"
    message = result(run, 1)["message"]
    assert message.startswith(f"checkpoint save of step 6 to {root} aborted: another rank died "
                              "or stopped answering inside the save's collectives ("), message
    assert f"{root}/step-00000003, is intact" in message and "\n" not in message, message
    from hpctrain.record.culprit import peer_vanished
    assert peer_vanished(message)         # the ledger blames the rank that died, not rank 0
    out = res.output(0)
    assert out.count("checkpoint: checkpoint save of step 6") == 1, out[-3000:]
    assert "Traceback" not in out.split("rank 0: attempt 1 failed")[1], out[-3000:]

    res = launch(run.path, 2, env={"HPCTRAIN_ATTEMPT": "2"})   # as the batch script numbers it
    assert res.codes == [0, 0], _explain(res)
    r = result(run, 2)
    assert r["start_step"] == 3 and r["checkpoint_loaded"].endswith("step-00000003")
    (aside,) = (root / store.QUARANTINE).iterdir()
    assert aside.name.startswith("partial-step-00000006")
    assert "incomplete" in (aside / "QUARANTINED.txt").read_text()
    assert "moved incomplete .partial-step-00000006" in res.output(0)
    got, ref = losses(run), losses(ws.reference("single"))
    assert _max_diff(got, ref, range(1, 13)) < TOL


def test_a_save_failing_on_the_storage_ends_the_attempt_with_one_line(ws):
    """A real EFBIG mid-save (RLIMIT_FSIZE in every rank and its writer): one line naming the
    checkpoint folder, the fault and the intact previous checkpoint, in the result, the rank
    logs and the ledger's message; the tracebacks stay in the rank logs; the resume starts
    from the previous checkpoint and ends where an uninterrupted run does."""
    run = ws.new_run("save-fault", "dp2_zero1",
                     checkpoint={"interval_steps": 3, "async_save": False})
    # every rank hears of the fault and ends by itself: the launcher leaves them to it (taking
    # the others down half a second after the first exit would cut off a rank still writing
    # the lines checked below, on a machine too busy to write them in time)
    res = launch(run.path, 2, env={"HPCTRAIN_TEST_FILE_SIZE_LIMIT_AT_SAVE": f"{256 << 10}@6"},
                 kill_on_failure=False)
    assert res.codes == [exit_codes.FAILED] * 2, _explain(res)
    root = run.path / "checkpoints"
    assert [s for s, _ in store.complete_checkpoints(root)] == [3]
    assert store.read_latest(root) == "step-00000003"
    message = result(run, 1)["message"]
    assert message.startswith(f"checkpoint save of step 6 to {root} failed: "), message
    assert "EFBIG" in message or "write failed part-way" in message, message
    assert f"{root}/step-00000003, is intact" in message and "\n" not in message, message
    for rank in (0, 1):
        out = res.output(rank)
        assert out.count("checkpoint: checkpoint save of step 6") == 1, out[-3000:]
        assert "the traceback (kept in this rank's log):" in out
        assert "Traceback" not in out.split(f"rank {rank}: attempt 1 failed")[1], out[-3000:]
    from hpctrain.view.follow import Rank0Progress
    keep = Rank0Progress()
    shown = [line for line in res.output(0).splitlines() if keep(line)]
    assert not any(line.startswith("    File ") for line in shown), shown[-20:]
    # the end of the attempt (the batch shell's step) names rank 0's line in the ledger
    from hpctrain.ops.status import format_status, run_status
    from hpctrain.record.attempt_end import finish_attempt
    record, _ = finish_attempt(run, 1, res.codes[0], scheduler="slurm")
    assert record.message.startswith("rank 0 ") and record.message.endswith(message), record
    assert f"attempt 1: {record.message}" in format_status(run_status(run))

    res = launch(run.path, 2, env={"HPCTRAIN_ATTEMPT": "2"})
    assert res.codes == [0, 0], _explain(res)
    assert result(run, 2)["checkpoint_loaded"].endswith("step-00000003")
    got, ref = losses(run), losses(ws.reference("single"))
    assert _max_diff(got, ref, range(1, 13)) < TOL


def test_a_background_save_failing_on_the_storage_is_named_by_its_own_step(ws):
    """The forked writer of step 6's background save hits EFBIG after step 3's background save
    was published: the failure, found when the rank next polls, is step 6's, not step 3's."""
    run = ws.new_run("save-fault-background", "single",
                     checkpoint={"interval_steps": 3, "async_save": True})
    res = launch(run.path, 1, env={"HPCTRAIN_TEST_FILE_SIZE_LIMIT_AT_SAVE": f"{256 << 10}@6"})
    assert res.codes[0] != 0, _explain(res)
    root = run.path / "checkpoints"
    assert [s for s, _ in store.complete_checkpoints(root)] == [3]
    message = result(run, 1)["message"]
    assert message.startswith(f"checkpoint save of step 6 to {root} failed: "), message
    assert f"{root}/step-00000003, is intact" in message and "\n" not in message, message


def test_corrupt_newest_checkpoint_is_quarantined_and_the_previous_used(ws):
    src = ws.reference("single")
    run = ws.new_run("corrupt", "single", steps=8)
    _copy_checkpoint(src, 6, run)
    _copy_checkpoint(src, 12, run)
    flip_byte(sorted((run.path / "checkpoints" / "step-00000012").glob("__0_*.distcp"))[0])
    res = launch(run.path, 1)
    assert res.codes == [0], _explain(res)
    assert result(run, 1)["start_step"] == 6
    assert "step-00000012 is damaged" in res.output(0) and "CRC32C" in res.output(0)
    (aside,) = (run.path / "checkpoints" / store.QUARANTINE).iterdir()
    assert aside.name.startswith("step-00000012")


def _damage_rank1s_share(folder, names):
    """Flip a byte in the largest file of the share rank 1 of 2 checks, which rank 0 does not."""
    theirs = store.share(names, 1, 2)
    assert theirs and not set(theirs) & set(store.share(names, 0, 2))
    damaged = max((folder / n for n in theirs), key=lambda p: p.stat().st_size)
    flip_byte(damaged)
    return damaged


def test_damage_in_another_ranks_share_of_the_files_is_caught(ws):
    """Two ranks load a checkpoint together, each verifying the CRC32C of the items it reads:
    a flipped byte in a file rank 0 does not check must still set the checkpoint aside."""
    src = ws.reference("single")
    run = ws.new_run("corrupt-rank1", "single", steps=8, world=2)     # DP2
    _copy_checkpoint(src, 6, run)
    newest = _copy_checkpoint(src, 12, run)
    names = sorted(store.read_manifest(newest)["files"])
    damaged = _damage_rank1s_share(newest, names)
    res = launch(run.path, 2)
    assert res.codes == [0, 0], _explain(res)
    assert result(run, 1)["start_step"] == 6
    out = res.output(0)
    assert f"{damaged.name}: the item at byte" in out and "CRC32C" in out, out
    assert "step-00000012 is damaged" in out
    (aside,) = (run.path / "checkpoints" / store.QUARANTINE).iterdir()
    assert aside.name.startswith("step-00000012")


def test_an_older_checkpoints_files_are_verified_in_shares_by_every_rank(ws):
    """A checkpoint from before per-item checksums (one CRC32 per file, no weights digest) is
    read through once before loading, each rank checking its own share of the files: damage in
    rank 1's share, which rank 0 never reads, sets the checkpoint aside all the same."""
    src = ws.reference("single")
    run = ws.new_run("format-1-rank1", "single", steps=8, world=2)     # DP2
    _copy_checkpoint(src, 6, run)
    newest = _copy_checkpoint(src, 12, run)
    manifest = store.read_manifest(newest)
    names = sorted(manifest["files"])
    old = {k: v for k, v in manifest.items() if k not in ("checksum", "weights_digest")}
    old["files"] = store.checksum_files(newest, names, "crc32")
    store.write_json_atomic(newest / store.MANIFEST, old)
    damaged = _damage_rank1s_share(newest, names)
    res = launch(run.path, 2)
    assert res.codes == [0, 0], _explain(res)
    assert result(run, 1)["start_step"] == 6
    out = res.output(0)
    assert f"step-00000012 is damaged ({damaged.name}: CRC32 " in out, out


def test_nan_step_is_skipped_and_the_guard_stops_the_run(ws):
    run, res = ws.train("nan", "single", expect=exit_codes.UNSTABLE,
                        env={"HPCTRAIN_TEST_NAN_AT_STEP": "3,7,8"},
                        train={"stability": {"max_skipped_steps": 2}})
    by_step = {m["step"]: m for m in run.metrics()}
    assert by_step[3]["skipped"] and by_step[3]["skip_reason"] == "loss is nan"
    assert not by_step[4]["skipped"] and by_step[4]["loss"] < by_step[2]["loss"] + 0.5
    assert by_step[8]["skipped"] and by_step[8]["skipped_total"] == 3
    r = result(run, 1)
    assert r["exit_reason"] == "unstable" and r["end_step"] == 8
    assert "2 updates in a row were skipped" in r["message"]
    assert "max_skipped_steps is 2" in r["message"]
    kinds = [e["event"] for e in run.events()]
    assert kinds.count("step_skipped") == 3


def test_deadline_saves_and_exits_for_requeue(ws):
    margin = 7200.0
    run, res = ws.train("deadline", "single", expect=exit_codes.PREEMPTED,
                        env={"HPCTRAIN_DEADLINE": str(time.time() + 3600)},
                        checkpoint={"deadline_margin_s": margin})
    r = result(run, 1)
    assert r["exit_reason"] == "deadline" and "time limit" in r["message"]
    assert r["end_step"] == 1 and r["checkpoint_saved"].endswith("step-00000001")


def test_flag_file_from_the_batch_shell_counts_as_a_signal(ws, tmp_path):
    flag = tmp_path / "signal-arrived"
    flag.touch()          # the batch shell trapped the signal before the ranks were listening
    run, res = ws.train("flag-file", "single", expect=exit_codes.PREEMPTED,
                        env={"HPCTRAIN_SIGNAL_FLAG": str(flag), "HPCTRAIN_LOG_TO_FILE": "1"})
    r = result(run, 1)
    assert r["exit_reason"] == "preempted" and "flag file" in r["message"] and r["end_step"] == 1
    log = run.rank_log(1, 0).read_text()              # HPCTRAIN_LOG_TO_FILE: the rank's own log
    assert "step 1/12" in log and "saving an emergency checkpoint" in log
    assert res.output(0).strip() == ""


def test_llama_style_model_with_recomputation_trains(ws):
    from hpctrain.model_shape import ModelShape, total_parameters
    model = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 2,
             "ffn_hidden_size": 96, "activation": "swiglu", "normalization": "RMSNorm",
             "position_embedding_type": "rope", "add_bias_linear": False,
             "untie_embeddings_and_output_weights": True}
    run, res = ws.train("llama-style", "tp2", steps=6, model=model,
                        train={"init_from": None, "recompute_granularity": "full",
                               "recompute_method": "block", "recompute_num_layers": 1})
    loss = losses(run)
    assert loss[6] < loss[1] - 0.3, loss
    job = run.resolved_job()
    total = total_parameters(ModelShape.from_model(job.model), 2)
    assert f"model: {total / 1e6:.2f}M parameters" in res.output(0)
    # TP2 splits every matrix; norms are replicated on both ranks
    h, layers = 64, 2
    replicated = (2 * layers + 1) * h
    assert result(run, 1)["local_parameters"] == (total - replicated) // 2 + replicated


def test_a_crashing_rank_brings_the_whole_launch_down(ws):
    run = ws.new_run("crash", "tp2")
    res = launch(run.path, 2, env={"HPCTRAIN_TEST_CRASH_AT_STEP": "3@1"}, kill_on_failure=False,
                 timeout=180)   # gloo's own timeout is 30 minutes: finishing here means no hang
    assert all(c != 0 for c in res.codes), _explain(res)
    assert "injected crash in step 3 on rank 1" in res.output(1)
    r = result(run, 1)
    assert r["exit_reason"] == "failed" and r["end_step"] == 2


def test_wrong_world_size_and_unreachable_rendezvous_are_clear_errors(ws):
    run = ws.new_run("mismatch", "tp2pp2")
    res = launch(run.path, 1)
    assert res.codes == [1]
    assert "Error: the launcher started 1 ranks but profile 'local' describes 4" in res.output(0)
    run = ws.new_run("rendezvous", "tp2", train={"init_timeout_s": 3})
    started = time.time()
    # only rank 1 of 2 starts: rank 0, which serves the rendezvous, never comes
    res = Launch(run.path, 1, env={"RANK": "1", "WORLD_SIZE": "2"}).wait(120)
    out = res.output(0)
    assert res.codes == [1] and time.time() - started < 100, out
    assert "rank 1 of 2: the process group did not form within 3s at 127.0.0.1:" in out
    assert "could not reach rank 0's rendezvous" in out
