"""Run folders, the ledger, and the attempt record written when an attempt ends."""

import json
import threading

import pytest

from hpctrain import exit_codes
from hpctrain.config import load_job, load_profile, resolve
from hpctrain.errors import RunNotFoundError
from hpctrain.record.attempt_end import finish_attempt, read_result, write_failure, write_result
from hpctrain.record.attempt_records import AttemptRecord, AttemptResult
from hpctrain.record.files import append_jsonl
from hpctrain.record.reader import read_jsonl
from hpctrain.record.folder import create_run, find_run
from hpctrain.submission import prepare_run
from tests.conftest import REPO


@pytest.fixture
def run(tmp_path):
    r = resolve(load_job(REPO / "examples" / "tiny.yaml"), load_profile("dev-slurm"))
    return prepare_run(r, tmp_path / "runs")


def test_prepare_run_writes_resolved_files(run):
    assert run.resolved_job().name == "tiny-gpt"
    assert run.resolved_profile().name == "dev-slurm"
    meta = run.meta()
    assert meta["layout"] == "TP2×PP2×VPP2×DP1" and meta["world_size"] == 4
    assert meta["checkpoint_dir"] == str(run.path / "checkpoints")


def test_jsonl_appends_are_whole_lines_and_torn_lines_are_skipped(tmp_path):
    path = tmp_path / "x.jsonl"

    def writer(k):
        for i in range(200):
            append_jsonl(path, {"writer": k, "i": i, "pad": "x" * 500})
    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    with open(path, "a") as f:
        f.write('{"torn": ')           # a writer killed mid-line
    records = read_jsonl(path)
    assert len(records) == 800 and all(len(r["pad"]) == 500 for r in records)


def test_begin_attempt_numbers_are_unique_under_concurrency(run):
    results = []
    threads = [threading.Thread(target=lambda: results.append(run.begin_attempt())) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(results) == list(range(1, 9))


def test_find_run_by_id_prefix_and_job_id(run, tmp_path):
    root = run.path.parent
    run.add_job_id("4242")
    assert find_run(run.id, root).path == run.path
    assert find_run("4242", root).path == run.path
    assert find_run(str(run.path), root).path == run.path
    other = create_run(root, "tiny-gpt")
    other.update_meta(name="tiny-gpt", created="2999-01-01T00:00:00+00:00")
    told = []
    assert find_run("tiny-gpt", root, note=told.append).path == other.path   # the job's newest
    assert told == [f"tiny-gpt: the newest of 2 runs of that job, {other.id}"]
    with pytest.raises(RunNotFoundError, match="matches 2 runs"):         # a partial id
        find_run("tiny-g", root)
    with pytest.raises(RunNotFoundError, match="no run 'nope'"):
        find_run("nope", root)


def test_finish_attempt_merges_result_and_decides(run):
    n = run.begin_attempt()
    write_result(run, n, AttemptResult(attempt=n, start_step=0, end_step=17,
                                       exit_reason="preempted", checkpoint_saved="step-17",
                                       last_loss=2.5))
    rec, decision = finish_attempt(run, n, exit_codes.PREEMPTED, scheduler="slurm", job_id="7",
                                   nodes=["n1", "n2"])
    assert decision.requeue
    assert rec.end_step == 17 and rec.checkpoint_saved == "step-17"
    assert run.ledger() == [rec.to_dict()]
    assert run.events()[-1]["event"] == "attempt_end"


def test_finish_attempt_without_result_uses_the_exit_code(run):
    n = run.begin_attempt()
    rec, decision = finish_attempt(run, n, 137, scheduler="slurm")
    assert rec.exit_reason == "killed" and not decision.requeue


def test_a_kill_after_the_final_checkpoint_does_not_undo_a_finished_attempt(run):
    """Killed on the way out (a late time-limit signal) after saving the last step: finished."""
    n = run.begin_attempt()
    write_result(run, n, AttemptResult(start_step=30, end_step=40, exit_reason="finished",
                                       checkpoint_saved="/ck/step-00000040"))
    rec, decision = finish_attempt(run, n, 138, scheduler="slurm")
    assert rec.exit_reason == "finished" and not decision.requeue
    assert "then ended with exit code 138 (killed)" in rec.note


def test_a_rank_failing_before_the_final_save_is_a_failure_even_if_rank_0_finished(run):
    n = run.begin_attempt()
    write_result(run, n, AttemptResult(start_step=30, end_step=40, exit_reason="finished",
                                       checkpoint_saved="/ck/step-00000035"))
    rec, _ = finish_attempt(run, n, 1, scheduler="slurm")
    assert rec.exit_reason == "failed" and "note" not in rec.to_dict()


def test_a_failed_attempt_names_the_rank_that_failed_first(run):
    """Rank 0's own error is the echo (its peer vanished); the earliest failure is the cause."""
    n = run.begin_attempt()
    write_result(run, n, AttemptResult(start_step=0, end_step=2, exit_reason="failed",
                                       message="RuntimeError: Connection closed by peer"))
    write_failure(run, n, 0, "n1", 1000.5, "RuntimeError: Connection closed by peer")
    write_failure(run, n, 3, "n2", 1000.7, "RuntimeError: Connection closed by peer")
    write_failure(run, n, 2, "n2", 1000.1, "ValueError: bad batch")
    rec, _ = finish_attempt(run, n, exit_codes.FAILED, scheduler="slurm")
    assert rec.first_failure["rank"] == 2
    assert rec.message == "rank 2 on n2 failed first: ValueError: bad batch"


def test_failure_records_do_not_rename_an_attempt_that_was_preempted(run):
    n = run.begin_attempt()
    write_result(run, n, AttemptResult(start_step=0, end_step=5, exit_reason="preempted"))
    write_failure(run, n, 1, "n1", 1.0, "RuntimeError: Connection closed by peer")
    rec, _ = finish_attempt(run, n, exit_codes.PREEMPTED, scheduler="slurm")
    assert rec.exit_reason == "preempted" and "first_failure" not in rec.to_dict()


def test_a_cancel_event_prevents_requeue(run):
    run.event("cancel", by="test")
    n = run.begin_attempt()
    write_result(run, n, AttemptResult(start_step=0, end_step=5, exit_reason="preempted"))
    rec, decision = finish_attempt(run, n, exit_codes.PREEMPTED, scheduler="slurm")
    assert rec.exit_reason == "cancelled" and not decision.requeue


def test_records_read_older_files_and_keep_what_they_do_not_know(run):
    """A ledger line or result.json from another version: missing keys are None, unknown keys
    are written back unchanged, and the JSON is what the file held."""
    old = {"attempt": 1, "exit_reason": "preempted", "end_step": 5,
           "decision": {"requeue": True, "reason": "preempted; requeue 1 of 3"},
           "from_the_future": {"x": 1}}
    rec = AttemptRecord.from_dict(old)
    assert rec.exit_reason == exit_codes.ExitReason.PREEMPTED and rec.start_step is None
    assert rec.requeued and rec.extra == {"from_the_future": {"x": 1}}
    assert {k: v for k, v in rec.to_dict().items() if v is not None} == old
    assert json.loads(json.dumps(rec.to_dict()))["exit_reason"] == "preempted"
    assert AttemptRecord.from_dict({"exit_reason": "rebooted"}).exit_reason == "rebooted"
    run.attempt_dir(3).mkdir(parents=True)
    (run.attempt_dir(3) / "result.json").write_text(json.dumps({"end_step": 9, "new_key": 1}))
    result = read_result(run, 3)
    assert (result.end_step, result.attempt, result.extra) == (9, None, {"new_key": 1})
    assert read_result(run, 4) == AttemptResult()          # no file: an empty result


def test_a_decision_and_an_exit_reason_keep_what_they_were_across_processes():
    """The ledger's decision and exit reason cross from the batch shell to every later
    attempt and the CLI: an in-job restart stays one (and a requeue does not become one), a
    reason read twice is still the same member, a reason this version does not know stays its
    text, and an unset one stays unset."""
    from hpctrain.record.attempt_records import Decision
    restarted = AttemptRecord.from_dict({"attempt": 2, "decision": {
        "requeue": False, "reason": "restarted on spare n5", "in_job": True}})
    assert restarted.decision == Decision(False, "restarted on spare n5", in_job=True)
    assert restarted.to_dict()["decision"] == {"requeue": False, "in_job": True,
                                               "reason": "restarted on spare n5"}
    assert Decision(True, "preempted; requeue 1 of 3").to_dict() == {
        "requeue": True, "reason": "preempted; requeue 1 of 3"}
    member = exit_codes.ExitReason.DEADLINE
    assert AttemptRecord.from_dict({"exit_reason": member}).exit_reason is member
    assert AttemptRecord.from_dict({"exit_reason": "deadline"}).exit_reason is member
    assert AttemptRecord.from_dict({"exit_reason": None}).exit_reason is None
    assert AttemptRecord.from_dict({}).to_dict().get("exit_reason") is None


def test_each_run_gets_its_own_folder_under_the_profiles_checkpoint_root(tmp_path, monkeypatch):
    """A cluster profile that keeps checkpoints on shared storage (``storage.checkpoint_root``,
    here under ``~``): two runs of one job get two folders there, named after the run."""
    import dataclasses
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    profile = load_profile("dev-slurm")
    profile = dataclasses.replace(profile, storage=dataclasses.replace(
        profile.storage, checkpoint_root="~/shared/ckpt"))
    job = load_job(REPO / "examples" / "tiny.yaml")
    runs = [prepare_run(resolve(job, profile), tmp_path / "runs") for _ in range(2)]
    folders = [r.checkpoint_dir() for r in runs]
    for run, folder in zip(runs, folders):
        assert folder == tmp_path / "home" / "shared" / "ckpt" / run.id
        assert run.meta()["checkpoint_dir"] == str(folder)
    assert folders[0] != folders[1]


def test_an_attempt_stopped_by_its_time_limit_is_recorded_as_such_and_requeued(run):
    """Near its one-hour time limit the attempt saves step 40 and exits 75, the code the ranks
    share with a preemption. The record keeps the reason rank 0 gave (deadline, not
    preempted) and the hour it ran, adds no note about a finished run, and the run is
    requeued."""
    import time
    n = run.begin_attempt()
    write_result(run, n, AttemptResult(start_step=30, end_step=40, exit_reason="deadline",
                                       checkpoint_saved="/ck/step-00000040"))
    rec, decision = finish_attempt(run, n, exit_codes.PREEMPTED, scheduler="slurm",
                                   started_at=time.time() - 3600)
    assert rec.exit_reason == "deadline" and "note" not in rec.to_dict()
    assert 3600 <= rec.duration_s < 7200                   # an hour, not a date
    assert decision.requeue


def test_a_hang_under_the_local_executor_is_recorded_and_not_requeued(run):
    """Rank 3 stopped (its heartbeats ceased); under the local executor rank 0's watchdog
    records the attempt itself: hung, rank 3's node named and left out, no Slurm restart, and
    no requeue whatever the policy says (there is no other node to move to), with why."""
    from hpctrain.health.hang import HangMonitor
    from hpctrain.health.heartbeat import Beat
    from hpctrain.record.attempt_end import hang_details
    monitor = HangMonitor(beat_s=5)
    monitor.update({r: Beat(rank=r, node="local", pid=100 + r, step=7 if r == 3 else 8,
                            start_step=0, phase="step", progress_at=100.0, beat_at=140.0,
                            limit_s=30.0) for r in range(4)}, now=0.0)
    verdict = monitor.check(0.0)
    n = run.begin_attempt()
    why = "a hang under the local executor: there is no other node to move to"
    rec, decision = finish_attempt(run, n, exit_codes.HUNG, scheduler="local", job_id="local-1",
                                   refuse_requeue=why, **hang_details(verdict))
    assert rec.exit_reason == "hung" and rec.first_failure["rank"] == 3
    assert rec.excluded_nodes == ["local"] and rec.restart_count == 0
    assert not decision.requeue and decision.reason == f"hung; not requeued: {why}"
    assert run.ledger()[-1]["decision"]["requeue"] is False


def test_the_recovery_is_measured_from_the_attempt_just_before(run):
    """Third attempt of a run: the first failed at step 30, the second (resumed from step 20)
    failed at step 50, 2000 s into the epoch clock; the third resumes from step 40 and starts
    its first step 100 s after that failure. Its record measures from the second attempt's
    failure, not the first's: 100 s to recover and 10 steps redone."""
    for start, end, failed_at in ((0, 30, 1000.0), (20, 50, 2000.0)):
        n = run.begin_attempt()
        write_result(run, n, AttemptResult(start_step=start, end_step=end, exit_reason="failed"))
        write_failure(run, n, 1, "n1", failed_at, "RuntimeError: NCCL error")
        finish_attempt(run, n, exit_codes.FAILED, scheduler="slurm")
    n = run.begin_attempt()
    write_result(run, n, AttemptResult(start_step=40, end_step=60, exit_reason="finished",
                                       checkpoint_saved="/ck/step-00000060",
                                       start_time=2090.0, first_step_after_s=10.0))
    rec, _ = finish_attempt(run, n, exit_codes.FINISHED, scheduler="slurm")
    assert [r["attempt"] for r in run.ledger()] == [1, 2, 3]
    assert (rec.first_step_at, rec.recovery_s, rec.steps_lost) == (2100.0, 100.0, 10)
    ends = [e for e in run.events() if e["event"] == "attempt_end"]    # the run's event log
    assert [(e["attempt"], e["exit_reason"]) for e in ends] == [
        (1, "failed"), (2, "failed"), (3, "finished")]


def test_a_half_written_failure_record_does_not_hide_the_others(run):
    """Eight ranks failed; a node died while one of them wrote its record, which is cut
    short. Whichever record the folder lists first is the damaged one, and the rank that
    failed first is listed last: the attempt still names that rank."""
    from hpctrain.record.attempt_end import FAILURE_GLOB
    n = run.begin_attempt()
    write_result(run, n, AttemptResult(start_step=0, end_step=2, exit_reason="failed"))
    for rank in range(8):
        write_failure(run, n, rank, f"n{rank // 2}", 1000.9, "RuntimeError: Connection closed")
    listed = list(run.attempt_dir(n).glob(FAILURE_GLOB))
    first = json.loads(listed[-1].read_text())           # rewritten in place: the order holds
    listed[-1].write_text(json.dumps({**first, "time": 1000.2, "message": "CUDA error"}))
    listed[0].write_text(listed[0].read_text()[:9])
    rec, _ = finish_attempt(run, n, exit_codes.FAILED, scheduler="slurm")
    assert rec.first_failure["rank"] == first["rank"]
    assert rec.message == f"rank {first['rank']} on {first['node']} failed first: CUDA error"


def test_a_rank_killed_by_srun_is_named_in_the_record_over_the_peers_that_wrote_theirs(run):
    """The SIGKILL drill's attempt: rank 3 was killed and wrote nothing; its three peers wrote
    gloo's connection errors. With srun's lines and the last heartbeats, the attempt's record
    names rank 3, and when it last beat."""
    from tests.health.test_culprit import BEATS, RESET, SIGKILL_LOG
    from hpctrain.scheduler.slurm.commands import parse_srun_task_exits
    n = run.begin_attempt()
    write_result(run, n, AttemptResult(start_step=0, end_step=3, exit_reason="failed"))
    for rank, node, at in ((2, "n2", 103.0), (0, "n1", 103.1), (1, "n1", 115.0)):
        write_failure(run, n, rank, node, at, RESET)
    rec, _ = finish_attempt(run, n, exit_codes.FAILED, scheduler="slurm", evidence={
        "task_exits": parse_srun_task_exits(SIGKILL_LOG), "last_beats": BEATS})
    assert (rec.first_failure["rank"], rec.first_failure["node"]) == (3, "n2")
    assert rec.first_failure["time"] == 99.5       # its last heartbeat: the recovery counts from it
    assert rec.message.startswith("rank 3 on n2 failed first") and "Killed" in rec.message


def test_an_in_job_restart_records_how_it_began_and_what_it_cost(run):
    """Attempt 1 fails at step 30 (rank 1's error at t=1000); the batch shell restarts the
    step in the same allocation without node n2 and writes how. Attempt 2 resumes from step 25
    and starts its first step at t=1060: its record keeps the restart with 60 s and 5 steps."""
    from hpctrain.record.attempt_end import write_restart
    n = run.begin_attempt()
    write_result(run, n, AttemptResult(start_step=0, end_step=30, exit_reason="failed"))
    write_failure(run, n, 1, "n2", 1000.0, "RuntimeError: NCCL error")
    finish_attempt(run, n, exit_codes.FAILED, scheduler="slurm")
    n = run.begin_attempt()
    write_restart(run, n, {"nodes": ["n1", "n3"], "excluded": ["n2"], "in_place": False})
    write_result(run, n, AttemptResult(start_step=25, end_step=40, exit_reason="finished",
                                       checkpoint_saved="/ck/step-00000040",
                                       start_time=1050.0, first_step_after_s=10.0))
    rec, _ = finish_attempt(run, n, exit_codes.FINISHED, scheduler="slurm")
    assert rec.in_job_restart == {"nodes": ["n1", "n3"], "excluded": ["n2"], "in_place": False,
                                  "recovery_s": 60.0, "steps_lost": 5}
    assert run.ledger()[-1]["in_job_restart"]["steps_lost"] == 5


def test_an_attempt_killed_while_writing_its_result_and_the_one_after_it(run):
    """Rank 0 was killed (137) while it wrote result.json, which is cut short: the attempt is
    recorded from its exit code, with no step known. The next attempt starts from step 0: no
    step of the first can be said to be lost."""
    n = run.begin_attempt()
    run.attempt_dir(n).mkdir(parents=True, exist_ok=True)
    (run.attempt_dir(n) / "result.json").write_text('{"start_step": 0, "end_st')
    rec, decision = finish_attempt(run, n, 137, scheduler="slurm")
    assert rec.exit_reason == "killed" and rec.end_step is None and not decision.requeue
    n = run.begin_attempt()
    write_result(run, n, AttemptResult(start_step=0, end_step=10, exit_reason="finished",
                                       checkpoint_saved="/ck/step-00000010"))
    rec, _ = finish_attempt(run, n, exit_codes.FINISHED, scheduler="slurm")
    assert rec.exit_reason == "finished" and rec.steps_lost is None
    assert [r["exit_reason"] for r in run.ledger()] == ["killed", "finished"]


def test_a_restart_that_resumes_where_the_failed_attempt_stopped_lost_no_step(run):
    """A rank crashed right after step 30 was saved: the in-job restart resumes from step 30,
    so the record says no step was lost (and the time from the failure to its first step)."""
    from hpctrain.record.attempt_end import write_restart
    n = run.begin_attempt()
    write_result(run, n, AttemptResult(start_step=0, end_step=30, exit_reason="failed",
                                       checkpoint_saved="/ck/step-00000030"))
    write_failure(run, n, 0, "n1", 2000.0, "RuntimeError: CUDA error")
    finish_attempt(run, n, exit_codes.FAILED, scheduler="slurm")
    n = run.begin_attempt()
    write_restart(run, n, {"nodes": ["n1", "n2"], "excluded": [], "in_place": True})
    write_result(run, n, AttemptResult(start_step=30, end_step=40, exit_reason="finished",
                                       checkpoint_saved="/ck/step-00000040",
                                       start_time=2010.0, first_step_after_s=5.5))
    rec, _ = finish_attempt(run, n, exit_codes.FINISHED, scheduler="slurm")
    assert (rec.in_job_restart["recovery_s"], rec.in_job_restart["steps_lost"]) == (15.5, 0)


def test_a_hung_attempts_record_names_the_checkpoint_it_published(run):
    """No rank of a hung attempt writes result.json: its record takes the newest checkpoint the
    attempt published from its events (not another attempt's), for the progress check."""
    from hpctrain.exit_codes import ExitReason
    n = run.begin_attempt()
    for attempt, step in ((n, 100), (n, 50), (n + 5, 200)):
        run.event("checkpoint_saved", step=step, reason="periodic", attempt=attempt,
                  path=str(run.checkpoint_dir() / f"step-{step:08d}"))
    rec, decision = finish_attempt(run, n, exit_codes.HUNG, scheduler="slurm",
                                   reason=ExitReason.HUNG, steps=(0, 150))
    assert rec.checkpoint_saved == str(run.checkpoint_dir() / "step-00000100")
    assert run.ledger()[-1]["checkpoint_saved"] == rec.checkpoint_saved
    assert decision.requeue
    # an attempt that published nothing keeps no checkpoint in its record
    m = run.begin_attempt()
    rec, _ = finish_attempt(run, m, exit_codes.HUNG, scheduler="slurm", reason=ExitReason.HUNG,
                            steps=(100, 120))
    assert rec.checkpoint_saved is None


@pytest.mark.parametrize("command, nothing", [
    (["logs"], "so there are no logs"), (["logs", "-f"], "so there are no logs"),
    (["requeue", "--no-wait"], "so there is nothing to requeue"),
    (["resume", "--no-wait"], "so there is nothing to resume")])
def test_a_dry_run_is_never_followed_requeued_or_resumed(tmp_path, command, nothing):
    """`logs RUN` of a dry run said "`hpctrain logs RUN -f` waits", and `logs RUN -f` ended at
    once with no output, exit 0: a dry run never gets a log. `requeue` and `resume` submitted
    it without what `submit` does first (preparing the data), and the ranks failed on a missing
    corpus. Each says it is a dry run, with how to submit it, and changes nothing."""
    from click.testing import CliRunner
    from hpctrain.cli import cli
    from hpctrain.record.folder import iter_runs
    job = str(REPO / "examples" / "tiny.yaml")
    root = tmp_path / "runs"
    assert CliRunner().invoke(cli, ["submit", job, "--dry-run", "-p", "dev-slurm",
                                    "--runs-dir", str(root)]).exit_code == 0
    (dry,) = iter_runs(root)
    before = dry.run_file.read_bytes(), sorted(p.name for p in dry.path.iterdir())
    result = CliRunner().invoke(cli, [command[0], dry.id, "--runs-dir", str(root), *command[1:]])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line == (f"Error: run {dry.id} is a dry run: nothing was submitted, {nothing} "
                    f"(its script is {dry.path / 'sbatch.sh'}); submit it with `hpctrain "
                    f"submit {job} --profile dev-slurm`")
    assert (dry.run_file.read_bytes(), sorted(p.name for p in dry.path.iterdir())) == before


def test_logs_of_a_submitted_run_not_started_yet_point_at_follow(run, tmp_path):
    from click.testing import CliRunner
    from hpctrain.cli import cli
    result = CliRunner().invoke(cli, ["logs", run.id, "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 2
    assert f"`hpctrain logs {run.id} -f` waits" in result.output
