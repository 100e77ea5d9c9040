"""The batch shell's steps as stories of one job, with Slurm's commands answering from a state
(``fake_slurm``) in their captured formats: the signal passed on or held back, the attempt's
rendezvous and nodes, a failed step restarted on the spare or requeued without its nodes, the
preflight gate's requeue, and every command that acted on the job, in order. The same paths
run against the real dev cluster in the drills (``tests/resilience``, ``test_gate_release``),
minutes each; here each takes a second, so that a planted bug in any branch is caught."""

from __future__ import annotations

import datetime as dt
import json
import os
import time

import pytest

from hpctrain import exit_codes
from hpctrain.config import load_job, load_profile, resolve, yamlio
from hpctrain.exit_codes import ExitReason
from hpctrain.health.hang import Verdict, claim_verdict
from hpctrain.record.attempt_end import write_result
from hpctrain.record.attempt_records import AttemptResult
from hpctrain.scheduler.slurm import batch_steps as bs
from hpctrain.submission import prepare_run
from tests.conftest import REPO
from tests.scheduler.fake_slurm import FakeSlurm

JOB = "51"


def slurm_time(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch).strftime("%Y-%m-%dT%H:%M:%S")


def assignments(text: str) -> dict[str, str]:
    """What the batch shell's ``eval`` of a step's output assigns (``export`` lines aside)."""
    import shlex
    out = {}
    for line in text.splitlines():
        if not line.startswith("export "):
            key, _, value = line.partition("=")
            (out[key],) = shlex.split(value) or [""]
    return out


def shell_eval(monkeypatch, out: str) -> dict[str, str]:
    """The batch shell's ``eval`` of a step's output: its assignments, the exported ones in
    the environment of the steps that follow."""
    got = assignments(out)
    exported = [line.split()[1:] for line in out.splitlines() if line.startswith("export ")]
    for name in (exported[0] if exported else []):
        monkeypatch.setenv(name, got[name])
    return got


def make_run(folder, *, spares: int = 1, restarts: int | None = 2):
    """tiny.yaml on dev-slurm training on two nodes, with ``spares`` spare nodes and failures
    requeued (the requeue policy then decides on progress and budget)."""
    data = yamlio.read_mapping(REPO / "cluster_profiles" / "dev-slurm.yaml")
    data["slurm"].update(nodes=2)
    data["preemption"].update(requeue_on_failure=True)
    data["resilience"] = {"spare_nodes": spares, "max_in_job_restarts": restarts}
    path = folder / "profile.yaml"
    yamlio.write_atomic(path, yamlio.dump(data))
    return prepare_run(resolve(load_job(REPO / "examples" / "tiny.yaml"), load_profile(str(path))),
                       folder / "runs")


class StillClock:
    """The ``time`` module as the batch steps see it, its wall clock standing at ``now`` (a
    whole second, as Slurm's times are): how long a step takes to ask Slurm (a process
    started on a loaded machine) does not move the time it decides by."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


@pytest.fixture
def still_clock(monkeypatch) -> StillClock:
    clock = StillClock(float(int(time.time())))
    monkeypatch.setattr(bs, "time", clock)
    return clock


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """Job 51 on n1-n3 (two train, one spare), an hour left; n4 idle in the partition."""
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_JOB_ID", JOB)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-3]")
    return FakeSlurm(
        tmp_path, monkeypatch,
        jobs={JOB: {"NodeList": "n[1-3]", "EndTime": slurm_time(time.time() + 3600),
                    "NumNodes": "3", "NumCPUs": "12", "NumTasks": "6", "Partition": "debug"}},
        nodes={n: {"State": "MIXED" if n != "n4" else "IDLE", "NodeAddr": "127.0.0.1"}
               for n in ("n1", "n2", "n3", "n4")},
        partitions={"debug": "n[1-4]"})


def failed_attempt(run, attempt: int, *, node="n2", start=0, end=7):
    """Rank 0 recorded the attempt as failed at ``end``; srun saw the task on ``node`` killed
    first (the OOM killer's SIGKILL), then tore the rest down."""
    write_result(run, attempt, AttemptResult(attempt=attempt, start_step=start, end_step=end,
                                             exit_reason="failed", start_time=time.time() - 60))
    lines = [f"srun: error: {node}: task 1: Killed", "srun: error: n1: task 0: Terminated"]
    (run.attempt_dir(attempt) / "batch.log").write_text("\n".join(lines) + "\n")


def events(run, kind):
    return [e for e in run.events() if e.get("event") == kind]


# ---- the signal ------------------------------------------------------------------------------


def test_the_signal_waits_only_for_slurms_early_time_limit_warning_by_its_exact_bounds():
    end = 10_000.0
    lead = 30.0
    assert bs.signal_action(end - lead - 5.0, end, lead, False, "USR1") == ("now", 0.0)
    assert bs.signal_action(end - lead - 5.5, end, lead, False, "USR1") == ("defer", 5.5)
    warning = bs.EARLY_WARNING_S
    assert bs.signal_action(end - lead - warning, end, lead, False, "USR1") == ("defer", warning)
    assert bs.signal_action(end - lead - warning - 0.5, end, lead, False, "USR1") == ("now", 0.0)
    # the delay is said to a tenth of a second (the shell sleeps whole seconds of it)
    assert bs.signal_action(end - lead - 10.25, end, lead, False, "USR1") == ("defer", 10.2)


def test_the_batch_shell_holds_back_a_time_limit_warning_and_passes_a_preemption_on(
        slurm, tmp_path, still_clock):
    run = make_run(tmp_path)
    slurm.state["jobs"][JOB]["EndTime"] = slurm_time(still_clock.now + 60)   # lead 30: 30 s early
    slurm.save()
    held = assignments(bs.cmd_signal(run, "USR1"))
    assert held["HPCTRAIN_SIGNAL_ACTION"] == "defer"
    assert held["HPCTRAIN_SIGNAL_DELAY"] == "30"
    slurm.state["jobs"][JOB]["PreemptTime"] = slurm_time(still_clock.now + 30)
    slurm.save()
    assert assignments(bs.cmd_signal(run, "USR1")) == {"HPCTRAIN_SIGNAL_ACTION": "now",
                                                       "HPCTRAIN_SIGNAL_DELAY": "0"}
    said = events(run, "signal")
    assert [(e["action"], e["preempting"]) for e in said] == [("defer", False), ("now", True)]


def test_a_signal_outside_a_job_goes_on_at_once_without_asking_slurm(slurm, tmp_path,
                                                                      monkeypatch):
    run = make_run(tmp_path)
    monkeypatch.setenv("SLURM_JOB_ID", "")
    assert assignments(bs.cmd_signal(run, "USR1"))["HPCTRAIN_SIGNAL_ACTION"] == "now"
    assert slurm.calls() == []


# ---- an attempt begins -----------------------------------------------------------------------


def test_an_attempt_with_spares_trains_on_the_first_nodes_until_the_jobs_end(slurm, tmp_path,
                                                                              monkeypatch):
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    run = make_run(tmp_path)
    out = bs.cmd_begin(run)
    got = assignments(out)
    end = bs.parse_slurm_time(slurm.state["jobs"][JOB]["EndTime"])
    assert got["HPCTRAIN_ATTEMPT"] == "1" and got["HPCTRAIN_STEP_NODES"] == "n1,n2"
    assert got["HPCTRAIN_DEADLINE"] == str(int(end)) and got["MASTER_ADDR"] == "127.0.0.1"
    assert got["HPCTRAIN_SIGNAL_FLAG"] == str(run.attempt_dir(1) / "signal.flag")
    assert out.splitlines()[-1] == "export " + " ".join(got)
    (started,) = events(run, "attempt_start")
    assert (started["job_id"], started["restart_count"], started["nodes"]) == (JOB, 2, "n[1-3]")
    assert slurm.acted() == []                 # beginning asks Slurm, it changes nothing


def test_without_spares_the_step_takes_the_whole_allocation(slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_RESTART_COUNT", "")
    run = make_run(tmp_path, spares=0, restarts=None)
    got = assignments(bs.cmd_begin(run))
    assert "HPCTRAIN_STEP_NODES" not in got and got["HPCTRAIN_ATTEMPT"] == "1"
    assert events(run, "attempt_start")[0]["restart_count"] == 0


def test_a_sweeps_task_is_its_array_id_and_a_lone_array_id_is_not(slurm, monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "50")
    assert bs.job_id_of_run() == JOB
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert bs.job_id_of_run() == "50_3"


def test_a_first_node_whose_address_does_not_resolve_is_named(slurm, tmp_path):
    slurm.state["nodes"]["n2"]["NodeAddr"] = "no-such-host.invalid"
    slurm.state["nodes"]["n1"]["NodeAddr"] = "127.0.0.2"
    slurm.save()
    assert bs.first_node_address() == "127.0.0.2"        # the first node's, not another's
    slurm.state["nodes"]["n1"]["NodeAddr"] = "no-such-host.invalid"
    slurm.save()
    with pytest.raises(SystemExit, match="first node 'n1' has address 'no-such-host.invalid'"):
        bs.first_node_address()
    with pytest.raises(Exception, match="'n1' has address 'no-such-host.invalid'"):
        bs.node_ip("n1")


def test_the_steps_nodes_are_its_own_or_the_allocations(slurm, monkeypatch):
    assert bs._scheduler_facts() == {"scheduler": "slurm", "job_id": JOB, "restart_count": 0,
                                     "nodes": ["n1", "n2", "n3"]}
    monkeypatch.setenv("SLURM_RESTART_COUNT", "")
    assert bs._scheduler_facts()["restart_count"] == 0
    monkeypatch.setenv("HPCTRAIN_STEP_NODES", "n1,n3")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "4")
    assert bs._scheduler_facts() == {"scheduler": "slurm", "job_id": JOB, "restart_count": 4,
                                     "nodes": ["n1", "n3"]}
    monkeypatch.setenv("PATH", "/nonexistent")      # no scontrol: the list as it was given
    assert bs._step_nodes() == ["n1,n3"]
    monkeypatch.delenv("HPCTRAIN_STEP_NODES")
    assert bs._scheduler_facts()["nodes"] == ["n[1-3]"]


# ---- a step ends -----------------------------------------------------------------------------


def test_a_failed_rank_restarts_on_the_spare_then_the_next_failure_requeues_without_both(
        slurm, tmp_path, monkeypatch):
    """n2's rank fails: the step restarts on n1 and the spare n3 inside the allocation, once
    the spare passed the node check. n3's rank fails next: no spare is left, so the job is
    requeued through Slurm without n2 and n3, asking for the two nodes it trains on (the
    partition has only n1 and n4 besides them), its tasks and CPUs in proportion."""
    run = make_run(tmp_path)
    shell_eval(monkeypatch, bs.cmd_begin(run))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")       # the job was requeued once before
    slurm.state["nodes"]["n3"]["NodeAddr"] = "127.0.0.3"  # the rendezvous stays on n1
    slurm.save()
    failed_attempt(run, 1, node="n2", end=7)
    ended = time.time()
    got = shell_eval(monkeypatch, bs.cmd_end(run, 1, 1, time.time() - 60))
    assert got == {"HPCTRAIN_ATTEMPT": "2", "HPCTRAIN_ATTEMPT_DIR": str(run.attempt_dir(2)),
                   "HPCTRAIN_SIGNAL_FLAG": str(run.attempt_dir(2) / "signal.flag"),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": got["MASTER_PORT"],
                   "HPCTRAIN_STEP_NODES": "n1,n3", "HPCTRAIN_STEP_OVERLAP": "",
                   "HPCTRAIN_RESTART": "1", "HPCTRAIN_REQUEUE": "0"}
    (check,) = slurm.acted()
    assert check[0] == "srun" and "--nodelist=n3" in check and "--overlap" not in check
    (first,) = run.ledger()
    assert first["exit_reason"] == "failed" and first["decision"]["requeue"] is False
    assert [(t["node"], t["signal"]) for t in first["task_exits"]] == [("n2", "Killed"),
                                                                      ("n1", "Terminated")]
    assert first["decision"]["reason"].endswith("in-job restart 1 of 2")
    restart = json.loads((run.attempt_dir(2) / "restart.json").read_text())
    assert (restart["after_attempt"], restart["excluded"], restart["spares"]) == (1, ["n2"], ["n3"])
    # a rank killed without a heartbeat left no time of its own: it failed when it was found
    assert ended <= restart["failed_at"] <= time.time()
    assert events(run, "node_check")[0]["nodes"] == ["n3"]
    restarted = events(run, "attempt_start")[-1]
    assert (restarted["attempt"], restarted["job_id"], restarted["restart_count"],
            restarted["nodes"]) == (2, JOB, 1, "n1,n3")
    assert restarted["in_job_restart"]["spares"] == ["n3"]

    failed_attempt(run, 2, node="n3", start=7, end=9)
    slurm.state = slurm.load()
    slurm.state["after_hold"] = {"NumNodes": "1"}    # what Slurm shows once the job is held
    slurm.save()
    got = assignments(bs.cmd_end(run, 2, 1, time.time() - 30))
    assert got == {"HPCTRAIN_REQUEUE": "0"}          # requeued here, not by the shell
    assert [c[1:3] for c in slurm.acted()[1:]] == [
        ["requeuehold", JOB], ["update", f"JobId={JOB}"], ["update", f"JobId={JOB}"],
        ["release", JOB]]
    assert slurm.acted()[2][3:] == ["ExcNodeList=n2,n3"]
    assert slurm.acted()[3][3:] == ["NumNodes=2", "NumTasks=4", "NumCPUs=8"]
    second = run.ledger()[1]
    assert second["decision"]["requeue"] is True and second["excluded_nodes"] == ["n2", "n3"]
    (requeue,) = events(run, "requeue")
    assert (requeue["excluded"], requeue["nodes"]) == (["n2", "n3"], 2)
    (refused,) = events(run, "in_job_restart_refused")
    assert refused["attempt"] == 2 and refused["reason"].startswith("no healthy spare left for n3")


def test_a_node_slurm_is_late_to_hear_from_is_not_blamed_when_srun_heard_its_task_end(
        slurm, tmp_path, monkeypatch):
    """n1's slurmd missed a ping (MIXED*), but srun reported its task's end: n1 answered, and
    only n2, whose task was killed first, is replaced."""
    run = make_run(tmp_path)
    shell_eval(monkeypatch, bs.cmd_begin(run))
    slurm.state["nodes"]["n1"]["State"] = "MIXED*"
    slurm.save()
    failed_attempt(run, 1, node="n2")
    got = assignments(bs.cmd_end(run, 1, 1, None))
    assert got["HPCTRAIN_RESTART"] == "1" and got["HPCTRAIN_STEP_NODES"] == "n1,n3"
    assert json.loads((run.attempt_dir(2) / "restart.json").read_text())["excluded"] == ["n2"]


def test_a_spare_that_fails_the_node_check_sends_the_failure_to_the_requeue_path(
        slurm, tmp_path, monkeypatch):
    said = "".join(f"n3: check {i} passed\n" for i in range(60)) + "n3: GPU 2 missing"
    slurm.state["srun"] = {"rc": 1, "out": said}
    slurm.save()
    run = make_run(tmp_path)
    shell_eval(monkeypatch, bs.cmd_begin(run))
    failed_attempt(run, 1, node="n2")
    assert assignments(bs.cmd_end(run, 1, 1, None)) == {"HPCTRAIN_REQUEUE": "0"}
    (refused,) = events(run, "in_job_restart_refused")
    assert refused["reason"] == "node check failed" and refused["nodes"] == ["n3"]
    assert refused["output"] == said[-500:]                  # its end, where the failure is
    # requeued without the culprit; it may keep its spare (n4 is free)
    assert [c[1] for c in slurm.acted() if c[0] == "scontrol"] == ["requeuehold", "update",
                                                                   "release"]
    assert slurm.acted()[2][3:] == ["ExcNodeList=n2"]


def test_an_old_step_on_a_lost_node_is_left_to_slurm_and_the_new_one_overlaps(slurm, tmp_path,
                                                                               monkeypatch):
    from hpctrain.scheduler.slurm import in_job_restart as ijr
    monkeypatch.setattr(ijr, "LOST_STEP_GRACE_S", 0.0)
    slurm.state["nodes"]["n2"]["State"] = "DOWN*"
    slurm.state["steps"] = {f"{JOB}.0": "n[1-2]"}
    slurm.state["stuck"] = [f"{JOB}.0"]               # its part on n2 cannot end
    slurm.save()
    run = make_run(tmp_path)
    shell_eval(monkeypatch, bs.cmd_begin(run))
    failed_attempt(run, 1, node="n2")
    got = assignments(bs.cmd_end(run, 1, 1, None))
    assert got["HPCTRAIN_RESTART"] == "1" and got["HPCTRAIN_STEP_OVERLAP"] == "1"
    kill, check = slurm.acted()
    assert kill == ["scancel", "--signal", "KILL", f"{JOB}.0"] and "--overlap" in check
    (left,) = events(run, "old_step_left")
    assert (left["steps"], left["nodes"]) == ([f"{JOB}.0"], ["n2"])


def test_a_step_that_finished_neither_restarts_nor_requeues(slurm, tmp_path):
    run = make_run(tmp_path)
    bs.cmd_begin(run)
    begun = len(slurm.calls())
    write_result(run, 1, AttemptResult(attempt=1, start_step=0, end_step=60,
                                       exit_reason="finished", start_time=time.time() - 60))
    assert assignments(bs.cmd_end(run, 1, 0, None)) == {"HPCTRAIN_REQUEUE": "0"}
    assert slurm.acted() == [] and run.ledger()[0]["exit_reason"] == "finished"
    # nobody failed: the nodes' states are not asked for
    assert not [c for c in slurm.calls()[begun:] if c[1:3] == ["show", "node"]]


def test_a_batch_log_that_is_not_a_file_is_passed_over_and_the_attempt_still_recorded(
        slurm, tmp_path):
    run = make_run(tmp_path, spares=0, restarts=None)
    bs.cmd_begin(run)
    failed_attempt(run, 1)
    (run.attempt_dir(1) / "batch.log").unlink()
    (run.attempt_dir(1) / "batch.log").mkdir()
    assert assignments(bs.cmd_end(run, 1, 1, None)) == {"HPCTRAIN_REQUEUE": "1"}
    (record,) = run.ledger()
    assert record["exit_reason"] == "failed" and not record.get("task_exits")


def test_a_crash_after_rank_0_said_finished_is_a_failure_not_a_finish(slurm, tmp_path):
    run = make_run(tmp_path)
    bs.cmd_begin(run)
    write_result(run, 1, AttemptResult(attempt=1, start_step=0, end_step=60,
                                       exit_reason="finished", start_time=time.time()))
    assert bs._ended_reason(run, 1, 1, None) == ExitReason.FAILED
    assert bs._ended_reason(run, 1, 0, None) == ExitReason.FINISHED
    # rank 0 saved on the preemption; a peer's teardown gave the step its code: preempted
    write_result(run, 1, AttemptResult(attempt=1, start_step=0, end_step=60,
                                       exit_reason="preempted", start_time=time.time()))
    assert bs._ended_reason(run, 1, 1, None) == ExitReason.PREEMPTED
    failed_attempt(run, 1)
    verdict = Verdict(rank=1, node="n2", pid=1, step=5, phase="step", idle_s=99.0,
                      limit_s=60.0, why="it stopped", detected_at=time.time())
    assert bs._ended_reason(run, 1, 1, verdict) == ExitReason.HUNG


def test_without_a_restart_budget_slurm_is_not_asked_and_a_cancelled_run_never_restarts(
        slurm, tmp_path, monkeypatch):
    run = make_run(tmp_path, spares=0, restarts=0)
    bs.cmd_begin(run)
    calls = len(slurm.calls())
    assert bs.consider_restart(run, 1, 1, None, None, bs._scheduler_facts()) is None
    assert len(slurm.calls()) == calls + 1          # only the facts' hostname expansion
    run = make_run(tmp_path / "b")
    shell_eval(monkeypatch, bs.cmd_begin(run))
    failed_attempt(run, 1)
    # a step that exited 0 finished, whatever else its ranks or srun said
    killed = {"task_exits": [{"node": "n2", "tasks": "1", "exit_code": None,
                              "signal": "Killed"}]}
    assert bs.consider_restart(run, 1, exit_codes.FINISHED, None, killed,
                               bs._scheduler_facts()) is None
    run.event("cancel", jobs=[JOB], by="someone")
    assert bs.consider_restart(run, 1, 1, None, {}, bs._scheduler_facts()) is None
    assert slurm.acted() == []


def test_a_restart_that_cannot_be_planned_says_why_and_leaves_the_requeue_path(
        slurm, tmp_path, monkeypatch, capsys):
    """Slurm no longer lists the job's nodes (``NodeList=(null)``): the plan has only the
    step's own nodes, so no spare, and says so. Slurm's commands gone from the batch host:
    the restart is given up with the reason, never a traceback."""
    run = make_run(tmp_path)
    bs.cmd_begin(run)
    failed_attempt(run, 1)
    slurm.state["jobs"][JOB]["NodeList"] = "(null)"
    slurm.save()
    facts = {**bs._scheduler_facts(), "nodes": ["n1", "n2"]}
    killed = {"task_exits": [{"node": "n2", "tasks": "1", "exit_code": None,
                              "signal": "Killed"}]}
    assert bs.consider_restart(run, 1, 1, None, killed, facts) is None
    assert "no in-job restart: no healthy spare left for n2" in capsys.readouterr().err
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    assert bs.consider_restart(run, 1, 1, None, killed, facts) is None
    assert "no in-job restart: `scontrol` is not on PATH" in capsys.readouterr().err


def test_a_hung_rank_is_left_out_and_its_node_replaced_by_the_spare(slurm, tmp_path,
                                                                   monkeypatch):
    run = make_run(tmp_path)
    shell_eval(monkeypatch, bs.cmd_begin(run))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "")
    detected = time.time() - 5
    claim_verdict(run.attempt_dir(1), Verdict(
        rank=1, node="n2", pid=1, step=5, phase="step", idle_s=99.0, limit_s=60.0,
        why="its heartbeat stopped", start_step=0, end_step=5, detected_at=detected))
    got = assignments(bs.cmd_end(run, 1, 143, None))
    assert got["HPCTRAIN_RESTART"] == "1" and got["HPCTRAIN_STEP_NODES"] == "n1,n3"
    (record,) = run.ledger()
    assert record["exit_reason"] == "hung"
    assert "(n2 -> n3: hung rank)" in record["decision"]["reason"]
    assert events(run, "attempt_start")[-1]["restart_count"] == 0    # SLURM_RESTART_COUNT=""
    restart = json.loads((run.attempt_dir(2) / "restart.json").read_text())
    assert restart["failed_at"] == detected and restart["excluded"] == ["n2"]


def test_a_hung_rank_with_no_spare_left_requeues_the_job_without_its_node(slurm, tmp_path):
    run = make_run(tmp_path, spares=0, restarts=None)
    bs.cmd_begin(run)
    claim_verdict(run.attempt_dir(1), Verdict(
        rank=1, node="n2", pid=1, step=5, phase="step", idle_s=99.0, limit_s=60.0,
        why="its heartbeat stopped", start_step=0, end_step=5, detected_at=time.time()))
    assert assignments(bs.cmd_end(run, 1, 143, None)) == {"HPCTRAIN_REQUEUE": "0"}
    (record,) = run.ledger()
    assert record["exit_reason"] == "hung" and record["excluded_nodes"] == ["n2"]
    assert slurm.acted()[1][3:] == ["ExcNodeList=n2"]
    assert events(run, "requeue")[0]["reason"] == "hung rank"


def test_a_requeue_without_bad_nodes_is_left_to_the_shell(slurm, tmp_path, capsys):
    run = make_run(tmp_path, spares=0, restarts=None)
    bs.cmd_begin(run)
    capsys.readouterr()
    failed_attempt(run, 1)
    assert assignments(bs.cmd_end(run, 1, 1, None)) == {"HPCTRAIN_REQUEUE": "1"}
    assert slurm.acted() == []
    # one line says what happened (the failure's message is the hang's or straggler's alone)
    (said,) = capsys.readouterr().err.splitlines()
    assert said.startswith("[hpctrain] attempt 1: failed at step 7; requeue: failed; requeue 1")
    failed_attempt(run, 2, start=7, end=7)                  # no progress: it stops
    bs.cmd_end(run, 2, 1, None)
    assert "; stop: no progress" in capsys.readouterr().err


# ---- the preflight gate and the requeue without bad nodes -------------------------------------


def gate_report(run, attempt, bad):
    folder = run.path / "preflight"
    folder.mkdir(exist_ok=True)
    (folder / f"attempt-{attempt}.json").write_text(json.dumps({"bad_nodes": bad}))


def test_a_failed_gate_is_recorded_as_such_and_requeues_without_the_bad_node(slurm, tmp_path):
    run = make_run(tmp_path, spares=0, restarts=None)
    bs.cmd_begin(run)
    gate_report(run, 1, ["n2"])
    assert bs.cmd_gate_failed(run, 1, 1, None) == 0
    (record,) = run.ledger()
    assert record["exit_reason"] == "preflight_failed"
    assert record["exit_code"] == exit_codes.PREFLIGHT_FAILED
    assert record["excluded_nodes"] == ["n2"]
    assert record["preflight_report"] == str(run.path / "preflight" / "attempt-1.json")
    assert [c[1] for c in slurm.acted()] == ["requeuehold", "update", "release"]


def test_a_gate_without_a_readable_report_requeues_without_excluding(slurm, tmp_path, capsys):
    run = make_run(tmp_path, spares=0, restarts=None)
    bs.cmd_begin(run)
    (run.path / "preflight" / "attempt-1.json").mkdir(parents=True)   # not a file
    assert bs.cmd_gate_failed(run, 1, exit_codes.PREFLIGHT_FAILED, None) == 0
    assert "preflight failed on unknown nodes" in capsys.readouterr().err
    assert [c[1] for c in slurm.acted()] == ["requeuehold", "release"]


def test_a_busy_slurmctld_is_asked_again_to_release_and_a_refusal_leaves_the_job_held(
        slurm, tmp_path, capsys):
    run = make_run(tmp_path, spares=0, restarts=None)
    bs.cmd_begin(run)
    slurm.state["fail"] = {"release": [bs.RELEASE_TRIES - 1, "Socket timed out"]}
    slurm.save()
    assert bs.requeue_excluding(run, 1, JOB, [], pause_s=0.0) == 0
    assert [c[1] for c in slurm.acted()] == ["requeuehold"] + ["release"] * bs.RELEASE_TRIES
    slurm.state = slurm.load()
    slurm.state["fail"] = {"release": [bs.RELEASE_TRIES, "Access denied"]}
    slurm.save()
    assert bs.requeue_excluding(run, 1, JOB, [], pause_s=0.0) == 1
    (failed,) = events(run, "requeue_failed")
    assert "release failed: scontrol failed: Access denied" in failed["error"]
    assert f"`scontrol release {JOB}`" in capsys.readouterr().err


def test_a_release_is_waited_for_between_tries(slurm, tmp_path, monkeypatch):
    import types
    slept = []
    monkeypatch.setattr(bs, "time", types.SimpleNamespace(sleep=slept.append))
    slurm.state["fail"] = {"release": [2, "busy"]}
    slurm.save()
    assert bs._release(JOB, 1.5) == (True, None)
    assert slept == [1.5, 1.5]
    slurm.state = slurm.load()
    slurm.state["fail"] = {"release": [99, "busy"]}
    slurm.save()
    slept.clear()
    assert bs._release(JOB, 1.5) == (False, "scontrol failed: busy")
    assert slept == [1.5] * (bs.RELEASE_TRIES - 1)


def gate_failed_on_n2(slurm, tmp_path, refused: str, said: str):
    """The preflight gate failed on n2, and Slurm refuses the ``refused`` subcommand once."""
    run = make_run(tmp_path, spares=0, restarts=None)
    bs.cmd_begin(run)
    gate_report(run, 1, ["n2"])
    slurm.state["fail"] = {refused: [1, said]}
    slurm.save()
    return run, bs.cmd_gate_failed(run, 1, 1, None)


def test_a_hold_that_fails_requeues_nothing_and_the_record_says_so(slurm, tmp_path):
    run, code = gate_failed_on_n2(slurm, tmp_path, "requeuehold", "Job is not requeueable")
    assert code == 1
    assert [c[1] for c in slurm.acted()] == ["requeuehold"]
    (record,) = run.ledger()
    assert record["excluded_nodes"] == [] and record["not_excluded_nodes"] == ["n2"]
    assert "scontrol requeuehold failed" in record["exclusion_note"]


def test_an_exclusion_that_fails_still_releases_the_job_and_says_so(slurm, tmp_path):
    run, code = gate_failed_on_n2(slurm, tmp_path, "update", "Invalid node name specified")
    assert code == 0
    assert [c[1] for c in slurm.acted()] == ["requeuehold", "update", "release"]
    (record,) = run.ledger()
    assert record["excluded_nodes"] == [] and record["not_excluded_nodes"] == ["n2"]
    assert record["exclusion_note"].endswith("the job was released without the exclusion")
    (requeue,) = events(run, "requeue")
    assert requeue["excluded"] == [] and "Invalid node name" in requeue["problem"]


def test_a_bad_node_the_job_cannot_do_without_stays_in_and_is_named(slurm, tmp_path):
    """The partition has three usable nodes and the job needs three: n2 stays in."""
    run = make_run(tmp_path, spares=0, restarts=None)
    bs.cmd_begin(run)
    slurm.state["partitions"]["debug"] = "n[1-3]"
    slurm.save()
    gate_report(run, 1, ["n2"])
    assert bs.cmd_gate_failed(run, 1, 1, None) == 0
    assert [c[1] for c in slurm.acted()] == ["requeuehold", "release"]
    (record,) = run.ledger()
    assert record["excluded_nodes"] == [] and record["not_excluded_nodes"] == ["n2"]
    (requeue,) = events(run, "requeue")
    assert requeue["not_excluded"] == ["n2"] and requeue["note"]


def test_a_job_with_spares_keeps_them_while_the_partition_has_nodes(slurm, tmp_path):
    run = make_run(tmp_path)
    slurm.state["partitions"]["debug"] = "n[1-5]"
    slurm.state["nodes"]["n5"] = {"State": "IDLE", "NodeAddr": "127.0.0.1"}
    slurm.save()
    assert bs.requeue_excluding(run, 1, JOB, ["n2"], pause_s=0.0) == 0
    assert [c[1] for c in slurm.acted()] == ["requeuehold", "update", "release"]
    assert "nodes" not in events(run, "requeue")[0]


def test_fewer_spares_are_asked_for_in_proportion_and_never_fewer_nodes_than_train(slurm,
                                                                                   capsys):
    info = {"NumNodes": "3", "NumTasks": "6", "NumCPUs": "12"}
    assert bs._ask_fewer_spares(JOB, info, 2, 3, 1) == 2
    assert slurm.acted()[-1][3:] == ["NumNodes=2", "NumTasks=4", "NumCPUs=8"]
    assert "asks for 2 node(s) instead of 3: 1 spare(s) fewer" in capsys.readouterr().err
    assert bs._ask_fewer_spares(JOB, info, 2, 3, 3) is None
    assert bs._ask_fewer_spares(JOB, info, 2, 3, None) is None
    # counts that cannot be read per node are left as they are
    assert bs._ask_fewer_spares(JOB, {"NumNodes": "3", "NumTasks": "2"}, 1, 3, 2) == 2
    assert slurm.acted()[-1][3:] == ["NumNodes=2"]
    # one task per node
    assert bs._ask_fewer_spares(JOB, {"NumNodes": "3", "NumTasks": "3"}, 1, 3, 2) == 2
    assert slurm.acted()[-1][3:] == ["NumNodes=2", "NumTasks=2"]
    assert len(slurm.acted()) == 3


# ---- the command line the batch shell runs -----------------------------------------------------


def test_each_command_of_the_batch_shell_reaches_its_step(slurm, tmp_path, capsys, still_clock):
    run = make_run(tmp_path, spares=0, restarts=None)
    assert bs.main(["begin", str(run.path)]) == 0
    assert assignments(capsys.readouterr().out)["HPCTRAIN_ATTEMPT"] == "1"
    assert bs.main(["signal", str(run.path), "--signal", "SIGusr1"]) == 0
    assert assignments(capsys.readouterr().out)["HPCTRAIN_SIGNAL_ACTION"] == "now"
    assert events(run, "signal")[0]["signal"] == "USR1"
    # near the end a USR1 waits for the lead time, a TERM (scancel, Slurm's kill) never does
    slurm.state["jobs"][JOB]["EndTime"] = slurm_time(still_clock.now + 60)
    slurm.save()
    for name, action in (("SIGUSR1", "defer"), ("SIGTERM", "now"), ("term", "now")):
        assert bs.main(["signal", str(run.path), "--signal", name]) == 0
        assert assignments(capsys.readouterr().out)["HPCTRAIN_SIGNAL_ACTION"] == action, name
    failed_attempt(run, 1)
    assert bs.main(["end", str(run.path), "--attempt", "1", "--exit-code", "1"]) == 0
    assert assignments(capsys.readouterr().out) == {"HPCTRAIN_REQUEUE": "1"}
    assert bs.main(["master-addr"]) == 0
    assert capsys.readouterr().out == "127.0.0.1\n"
    bs.cmd_begin(run)
    gate_report(run, 2, [])
    assert bs.main(["gate-failed", str(run.path), "--attempt", "2", "--exit-code", "1"]) == 0
    assert run.ledger()[-1]["exit_reason"] == "preflight_failed"
    with pytest.raises(SystemExit):
        bs.main([])
