"""What a person does to a run by hand (``ops.control``: cancel, requeue, resume), in process
against Slurm's commands answering in their captured formats (``tests/scheduler/fake_slurm.py``):
each story checks what was recorded in the run folder, in which order, and every command that
acted on Slurm. The same actions run against the real dev cluster in ``test_cancel_resume.py``,
``test_requeue_and_follow.py`` and ``test_preempted_run.py``, minutes each; here a story takes
a fraction of a second."""

from __future__ import annotations

import getpass

import pytest

from hpctrain.errors import UsageError
from hpctrain.ops.control import cancel_run, requeue_run, resume_run
from hpctrain.record import checkpoint_store as store
from hpctrain.record.files import RunFileError
from tests.ops.helpers import crafted_run, ops_profile, record
from tests.scheduler.fake_slurm import FakeSlurm

USER = getpass.getuser()


@pytest.fixture
def slurm(tmp_path, monkeypatch) -> FakeSlurm:
    return FakeSlurm(tmp_path, monkeypatch)


def _jobs(run, slurm: FakeSlurm, *jobs) -> None:
    """Jobs of the run as Slurm has them: (id, state[, reason[, kind]]); state None: a job
    Slurm has forgotten (squeue does not list it, sacct has no row)."""
    for job_id, state, *rest in jobs:
        reason = rest[0] if rest else "None"
        run.add_job_id(job_id, kind=rest[1] if len(rest) > 1 else "train")
        if state is not None:
            slurm.state["jobs"][job_id] = {"JobState": state, "Reason": reason}
    slurm.save()


def _events(run, since: int = 0) -> list[dict]:
    return [{k: v for k, v in e.items() if k != "time"} for e in run.events()[since:]]


def _refused(call, *args, **kwargs) -> str:
    with pytest.raises(UsageError) as e:
        call(*args, **kwargs)
    return str(e.value)


def _finished(tmp_path, **kwargs):
    run = crafted_run(tmp_path, ledger=[record(1, 0, 30, "finished", False, saved=30)],
                      metrics=[{"step": 30, "loss": 2.5}], **kwargs)
    run.event("attempt_end", attempt=1, exit_reason="finished")
    return run


# ---- cancel ----------------------------------------------------------------------------------


def test_cancel_records_the_cancel_then_cancels_every_live_job_of_every_kind(tmp_path, slurm):
    run = crafted_run(tmp_path, checkpoints=[10])
    _jobs(run, slurm, ("38", None), ("39", "PENDING", "Priority", "preflight"),
          ("41", "RUNNING"), ("42", "PENDING", "Dependency"), ("43", "COMPLETED"))
    assert cancel_run(run) == ["39", "41", "42"]
    assert _events(run) == [{"event": "cancel", "jobs": ["39", "41", "42"], "by": USER}]
    assert slurm.acted() == [["scancel", "39", "41", "42"]]
    assert run.cancelled()
    assert (run.checkpoint_dir() / "step-00000010").is_dir()     # nothing deleted


def test_cancel_with_nothing_live_records_and_does_nothing(tmp_path, slurm):
    run = crafted_run(tmp_path)
    _jobs(run, slurm, ("41", "COMPLETED"), ("42", None))
    assert cancel_run(run) == []
    assert _events(run) == [] and slurm.acted() == []


def test_the_cancel_is_recorded_before_slurm_is_asked(tmp_path, slurm):
    """The batch shell reads the event: a job ending because of the cancel must find it, and
    it is there even when scancel fails."""
    run = crafted_run(tmp_path)
    _jobs(run, slurm, ("41", "RUNNING"))
    slurm.state["fail"]["scancel"] = [1, "scancel: error: Access/permission denied"]
    slurm.save()
    with pytest.raises(Exception) as e:
        cancel_run(run)
    assert "Access/permission denied" in str(e.value)
    assert [e["event"] for e in run.events()] == ["cancel"]


# ---- requeue ---------------------------------------------------------------------------------


def test_a_running_job_is_requeued_in_place_from_its_newest_checkpoint(tmp_path, slurm):
    run = crafted_run(tmp_path, checkpoints=[10, 20])
    _jobs(run, slurm, ("40", None), ("41", "RUNNING"))
    profile = run.resolved_profile()
    got = requeue_run(run)
    assert (got.submitted, got.job_id, got.how, got.from_step, got.profile, got.world_size) == \
        (None, "41", "scontrol requeue", 20, profile.name, profile.world_size)
    assert _events(run) == [{"event": "requeue", "job_id": "41", "how": "scontrol requeue",
                             "by": USER}]
    assert slurm.acted() == [["scontrol", "requeue", "41"]]


def test_a_requeue_whose_checkpoints_cannot_be_read_still_requeues(tmp_path, slurm):
    """What the requeue says it resumes from is read from the checkpoint folder; a folder
    that cannot be read (here: a name longer than the file system allows, ENAMETOOLONG; a
    permission error stops no test run as root) says nothing, and the job still goes back to
    the queue (its ranks find what they can)."""
    run = crafted_run(tmp_path)
    run.update_meta(checkpoint_dir=str(tmp_path / ("c" * 300)))
    _jobs(run, slurm, ("41", "RUNNING"))
    got = requeue_run(run)
    assert (got.job_id, got.how, got.from_step) == ("41", "scontrol requeue", None)
    assert slurm.acted() == [["scontrol", "requeue", "41"]]


@pytest.mark.parametrize("reason, said", [("Priority", "is pending (Priority); it will start"),
                                          ("None", "is pending; it will start")])
def test_a_pending_job_is_not_requeued(tmp_path, slurm, reason, said):
    run = crafted_run(tmp_path)
    _jobs(run, slurm, ("41", "PENDING", reason))
    message = _refused(requeue_run, run)
    assert message == f"run {run.shown}'s job 41 {said} by itself, there is nothing to requeue"
    assert _events(run) == [] and slurm.acted() == []


@pytest.mark.parametrize("state", ["SUSPENDED", "CONFIGURING", "REQUEUED"])
def test_a_job_that_is_not_running_is_not_requeued_in_place(tmp_path, slurm, state):
    run = crafted_run(tmp_path)
    _jobs(run, slurm, ("41", state))
    assert _refused(requeue_run, run) == (
        f"run {run.shown}'s job 41 is {state.lower()}; only a running job is requeued in "
        f"place: wait until it runs, or `hpctrain cancel {run.shown}` then `hpctrain resume "
        f"{run.shown}`")
    assert _events(run) == [] and slurm.acted() == []


def test_a_finished_run_is_neither_requeued_nor_resumed(tmp_path, slurm):
    run = _finished(tmp_path)
    _jobs(run, slurm, ("41", "COMPLETED"))
    before = len(run.events())
    fix = f"(to train further: `hpctrain resume {run.shown} --steps N`, N > 30)"
    assert _refused(requeue_run, run) == \
        f"run {run.shown} finished at step 30; nothing to requeue {fix}"
    assert _refused(resume_run, run) == \
        f"run {run.shown} finished at step 30; nothing to resume {fix}"
    assert len(run.events()) == before and slurm.acted() == []


def test_an_ended_run_is_requeued_by_a_new_job_with_a_fresh_budget(tmp_path, slurm):
    run = crafted_run(tmp_path, checkpoints=[10, 20],
                      ledger=[record(1, 0, 12, "preempted", True, saved=10),
                              record(2, 10, 22, "failed", False, saved=20)])
    _jobs(run, slurm, ("41", None))
    profile = run.resolved_profile()
    got = requeue_run(run)
    assert (got.job_id, got.how, got.from_step, got.next_attempt) == \
        ("100", "resubmitted", 20, 3)
    assert (got.profile, got.world_size) == (profile.name, profile.world_size)
    events = _events(run)
    assert events[0] == {"event": "requeue", "how": "resubmitted", "by": USER,
                         "profile": profile.name, "world_size": profile.world_size,
                         "from_step": 20, "ledger_records": 2}
    assert events[1]["event"] == "submitted" and events[1]["job_id"] == "100"
    assert [c[0] for c in slurm.acted()] == ["sbatch"]
    assert [j["job_id"] for j in run.meta()["jobs"]] == ["41", "100"]
    assert run.ledger_for_budget() == []            # the requeue budget starts again


def test_the_next_attempt_follows_the_last_one_started_or_recorded(tmp_path, slurm):
    run = crafted_run(tmp_path, ledger=[record(1, 0, 12, "preempted", True)])
    (run.attempt_dir(4)).mkdir(parents=True)          # begun, never recorded (killed)
    assert run.attempts_started() == [4]
    assert requeue_run(run).next_attempt == 5


# ---- resume ----------------------------------------------------------------------------------


def test_a_running_run_is_resumed_only_with_force(tmp_path, slurm):
    run = crafted_run(tmp_path, checkpoints=[10])
    _jobs(run, slurm, ("41", "RUNNING"))
    assert _refused(resume_run, run) == (
        f"run {run.shown} is still running (job 41); a preempted job resumes by itself. "
        f"`hpctrain cancel {run.shown}` first, or pass --force if the scheduler's view is wrong")
    assert _events(run) == [] and slurm.acted() == []
    got = resume_run(run, force=True)
    assert (got.job_id, got.from_step) == ("100", 10)
    resumed = _events(run)[0]
    assert resumed["event"] == "resume" and resumed["force"] is True
    assert resumed["previous_world_size"] == run.resolved_profile().world_size


def test_a_finished_run_is_extended_by_more_steps_and_its_old_job_kept(tmp_path, slurm):
    run = _finished(tmp_path, checkpoints=[30])
    old_job = run.job_file.read_text()
    got = resume_run(run, overrides={"train.steps": 45})
    assert got.from_step == 30
    assert (run.path / "job.1.yaml").read_text() == old_job
    assert run.resolved_job().train.steps == 45
    meta = run.meta()
    assert meta["total_steps"] == 45 and meta["overrides"] == {"train.steps": 45}
    assert [(h["file"], h["overrides"]) for h in meta["job_history"]] == \
        [("job.1.yaml", {"train.steps": 45})]
    resumed = [e for e in _events(run) if e["event"] == "resume"]
    assert len(resumed) == 1 and resumed[0]["extended_to"] == 45 and "force" not in resumed[0]
    assert not run.finished()                        # reopened for the new job
    assert not (run.path / "profile.1.yaml").exists()   # the same profile: nothing to keep
    assert "profile_history" not in meta
    # the new job ran to step 45; a second extension keeps its job as job.2.yaml
    slurm.load()["jobs"]["100"]["JobState"] = "COMPLETED"
    slurm.save()
    run.append_ledger(record(2, 30, 45, "finished", False, saved=45))
    run.event("attempt_end", attempt=2, exit_reason="finished")
    assert run.finished()
    assert resume_run(run, overrides={"train.steps": 60}).job_id == "101"
    assert (run.path / "job.2.yaml").is_file() and run.resolved_job().train.steps == 60


def test_more_steps_must_be_more_than_the_run_reached(tmp_path, slurm):
    run = _finished(tmp_path)
    before = run.job_file.read_text()
    for fewer in (30, 20):
        assert _refused(resume_run, run, overrides={"train.steps": fewer}) == (
            f"train.steps: run {run.shown} already reached step 30; give more than 30 "
            f"(e.g. --steps 60)")
    # other values changed, not the steps: still nothing to resume
    assert _refused(resume_run, run, overrides={"train.lr": 1e-3}).startswith(
        f"run {run.shown} finished at step 30; nothing to resume")
    assert run.job_file.read_text() == before and not (run.path / "job.1.yaml").exists()
    early = crafted_run(tmp_path, ledger=[record(1, 0, 1, "failed", False)],
                        metrics=[{"step": 1, "loss": 5.0}])
    assert _refused(resume_run, early, overrides={"train.steps": 1,
                                                  "train.warmup_steps": 0}) == (
        f"train.steps: run {early.shown} already reached step 1; give more than 1 "
        f"(e.g. --steps 2)")
    assert slurm.acted() == []


def test_more_steps_for_a_run_that_stopped_early_is_a_resume_not_an_extension(tmp_path, slurm):
    """Only a finished run is reopened by more steps (``extended_to``): a run stopped at step
    12 of 30 resumes as any other, with its new total."""
    run = crafted_run(tmp_path, checkpoints=[10],
                      ledger=[record(1, 0, 12, "failed", False, saved=10)],
                      metrics=[{"step": 12, "loss": 3.0}])
    resume_run(run, overrides={"train.steps": 45})
    resumed = _events(run)[0]
    assert resumed["event"] == "resume" and "extended_to" not in resumed
    assert run.resolved_job().train.steps == 45 and run.meta()["total_steps"] == 45


def test_a_resume_on_another_profile_keeps_the_old_one_and_says_what_changed(tmp_path, slurm):
    run = crafted_run(tmp_path, checkpoints=[20], profile=ops_profile(ranks_per_node=1))
    old = run.resolved_profile()
    old_text = run.profile_file.read_text()
    got = resume_run(run, "dev-slurm", nodes=1)       # one node of 2 ranks, from one rank
    new = run.resolved_profile()
    assert new.name == "dev-slurm" and new.world_size != old.world_size
    assert (got.profile, got.world_size, got.from_step) == ("dev-slurm", new.world_size, 20)
    assert (run.path / "profile.1.yaml").read_text() == old_text
    meta = run.meta()
    assert (meta["profile"], meta["world_size"]) == ("dev-slurm", new.world_size)
    assert [(h["file"], h["profile"], h["world_size"]) for h in meta["profile_history"]] == \
        [("profile.1.yaml", old.name, old.world_size)]
    resumed = _events(run)[0]
    assert (resumed["event"], resumed["previous_world_size"], resumed["world_size"]) == \
        ("resume", old.world_size, new.world_size)


def test_a_resume_the_layout_cannot_use_or_on_another_scheduler_changes_nothing(tmp_path, slurm):
    run = crafted_run(tmp_path, checkpoints=[20])
    files = {p.name: p.read_text() for p in (run.profile_file, run.job_file, run.run_file)}
    message = _refused(resume_run, run, nodes=2)
    assert message.startswith(f"run {run.shown} cannot run on 'dev-slurm' with 4 ranks "
                              f"(2 node(s) × 2): ")
    assert message.endswith(f"Pick a --nodes count that fits the run's layout (in "
                            f"{run.job_file})")
    assert _refused(resume_run, run, "local").startswith(
        f"--profile: run {run.shown} ran with scheduler 'slurm' and 'local' uses 'local'")
    assert {p.name: p.read_text() for p in (run.profile_file, run.job_file, run.run_file)} \
        == files
    assert _events(run) == [] and slurm.acted() == []


def test_a_run_whose_checkpoint_folder_another_run_owns_is_refused_before_anything(tmp_path,
                                                                                  slurm):
    run = crafted_run(tmp_path)
    store.claim(run.checkpoint_dir(), "someone-else")
    for act in (requeue_run, resume_run):
        with pytest.raises(UsageError) as e:
            act(run)
        assert "someone-else" in str(e.value)
    assert _events(run) == [] and slurm.acted() == []


def test_a_damaged_run_folder_is_named_not_acted_on(tmp_path, slurm):
    run = crafted_run(tmp_path)
    _jobs(run, slurm, ("41", "RUNNING"))
    run.run_file.write_text("jobs: [unclosed\n")
    for act in (requeue_run, resume_run):
        with pytest.raises(RunFileError) as e:
            act(run)
        assert "run.yaml" in str(e.value)
    assert slurm.acted() == []
