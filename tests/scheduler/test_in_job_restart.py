"""The batch shell's in-job restart decision (``in_job_restart.plan``) and its pieces: which
nodes are blamed, which spare replaces them, when the requeue path decides instead, and that
the old step is gone before a new one starts."""

from __future__ import annotations

from hpctrain.exit_codes import ExitReason
from hpctrain.runtime.faults import hold_release_reaches
from hpctrain.scheduler.slurm import in_job_restart as ijr

IDLE = {"n1": "MIXED", "n2": "MIXED", "n3": "IDLE"}


def plan(**changes):
    args = dict(reason=ExitReason.FAILED, spare_nodes=1, max_restarts=2, done=[],
                culprits=["n2"], why="rank 3 failed first: Killed", step_nodes=["n1", "n2"],
                allocation=["n1", "n2", "n3"], states=IDLE, time_left_s=3600.0,
                lead_time_s=30.0, restart_cost_s=None, preempting=False)
    args.update(changes)
    return ijr.plan(**args)


def test_a_failed_node_is_replaced_by_the_healthy_spare_in_its_place():
    p, _ = plan()
    assert p.nodes == ["n1", "n3"] and p.excluded == ["n2"] and p.spares == ["n3"]
    assert not p.in_place and "n2 -> n3" in p.describe()


def test_no_spare_left_goes_to_the_requeue_path():
    done = [{"excluded": ["n2"], "spares": ["n3"], "in_place": False}]
    p, why = plan(step_nodes=["n1", "n3"], culprits=["n3"], done=done)
    assert p is None and "no healthy spare left for n3" in why


def test_an_unusable_spare_is_never_chosen():
    p, why = plan(states={**IDLE, "n3": "DOWN*"})
    assert p is None and "no healthy spare" in why


def test_without_spares_a_healthy_node_restarts_in_place_once():
    p, _ = plan(spare_nodes=0)
    assert p.in_place and p.nodes == ["n1", "n2"] and p.excluded == []
    p, why = plan(spare_nodes=0, done=[p.to_dict()])
    assert p is None and "in place once" in why
    p, why = plan(spare_nodes=0, states={**IDLE, "n2": "DOWN*"})
    assert p is None and "not healthy" in why
    p, why = plan(spare_nodes=0, reason=ExitReason.HUNG, why="hung rank")
    assert p is None and "needs a spare" in why


def test_budget_preemption_time_and_reason_send_it_to_the_requeue_path():
    done = [{"excluded": ["n9"], "spares": [], "in_place": False}] * 2
    assert "budget spent (2 of" in plan(done=done)[1]
    assert "max_in_job_restarts is 0" in plan(max_restarts=0)[1]
    assert "preemption signal" in plan(preempting=True)[1]
    assert plan(reason=ExitReason.PREEMPTED)[0] is None
    assert plan(reason=ExitReason.DEADLINE)[0] is None
    # the emergency save's lead time is never spent on a restart
    p, why = plan(time_left_s=100.0, restart_cost_s=80.0, lead_time_s=30.0)
    assert p is None and "lead_time_s" in why
    assert plan(time_left_s=120.0, restart_cost_s=80.0, lead_time_s=30.0)[0] is not None
    assert plan(culprits=[])[0] is None


def test_culprits_are_the_failed_ranks_node_and_the_silent_ones_of_the_step():
    ff = {"rank": 3, "node": "n2", "message": "Killed"}
    assert ijr.culprit_nodes(ExitReason.FAILED, ff, None, None, ["n1", "n2"]) == \
        (["n2"], "rank 3 failed first: Killed")
    nodes, why = ijr.culprit_nodes(ExitReason.HUNG, None, ["n1"], {"n2": "DOWN*", "n3": "DOWN"},
                                   ["n1", "n2"])
    assert nodes == ["n1", "n2"] and "hung rank" in why and "n2 not responding" in why
    # a node srun heard its tasks end on answered: a late slurmd is not a culprit
    assert ijr.culprit_nodes(ExitReason.FAILED, ff, None, {"n1": "MIXED*"}, ["n1", "n2"],
                             {"n1", "n2"})[0] == ["n2"]


def test_a_hung_rank_on_a_node_slurm_no_longer_hears_from_gives_both_reasons():
    nodes, why = ijr.culprit_nodes(ExitReason.HUNG, None, ["n2"], {"n2": "DOWN*"},
                                   ["n1", "n2"])
    assert nodes == ["n2"] and why == "hung rank; n2 not responding (DOWN*)"


def test_the_old_step_is_waited_for_then_killed():
    left = [{"9.0": ["n1", "n2"]}] * 3 + [{}]
    killed = []
    now = [0.0]

    def sleep(s):
        now[0] += 10

    assert ijr.stop_old_step("9", wait_s=40, steps=lambda: left.pop(0) if left else {},
                             kill=killed.append, sleep=sleep, clock=lambda: now[0]) == (True, [])
    assert killed == [["9.0"]]
    assert ijr.stop_old_step("9", wait_s=20, steps=lambda: {"9.1": ["n1"]}, kill=killed.append,
                             sleep=sleep, clock=lambda: now[0]) == (False, ["9.1"])


def test_a_step_on_a_node_slurm_lost_is_killed_at_once_then_left_to_slurm():
    """Its part on the lost node (n2) cannot end until n2 answers again: killed at once,
    it is left to Slurm after the grace; a step on answering nodes only is still waited for."""
    killed = []
    now = [0.0]

    def sleep(s):
        now[0] += 1

    gone, stale = ijr.stop_old_step("9", lost={"n2"}, wait_s=60,
                                    steps=lambda: {"9.0": ["n1", "n2"]}, kill=killed.append,
                                    sleep=sleep, clock=lambda: now[0])
    assert (gone, stale, killed) == (True, ["9.0"], [["9.0"]])
    assert now[0] == ijr.LOST_STEP_GRACE_S
    assert ijr.stop_old_step("9", lost={"n2"}, wait_s=20,
                             steps=lambda: {"9.0": ["n1", "n2"], "9.1": ["n1", "n3"]},
                             kill=killed.append, sleep=sleep,
                             clock=lambda: now[0]) == (False, ["9.0", "9.1"])


def test_squeue_step_lines_name_each_task_step_and_its_nodes():
    from hpctrain.scheduler.slurm.commands import parse_step_nodes
    text = "            1.0     n[1-2]\n        1.batch     n1\n       1.extern n[1-3]\n"
    assert parse_step_nodes(text) == {"1.0": "n[1-2]"}


def test_a_hold_release_with_a_step_releases_only_the_holds_up_to_it(tmp_path):
    assert not hold_release_reaches(tmp_path, 10)
    (tmp_path / "hold-release").write_text("")
    assert hold_release_reaches(tmp_path, 12)
    (tmp_path / "hold-release").write_text("10\n")
    assert hold_release_reaches(tmp_path, 10) and not hold_release_reaches(tmp_path, 12)


def test_status_shows_the_restart_inside_the_job():
    from hpctrain.ops.status import attempts_table, restart_line
    failed = {"attempt": 1, "job_id": "8", "restart_count": 0, "nodes": ["n1", "n2"],
              "exit_reason": "failed", "decision": {"requeue": False, "in_job": True,
                                                    "reason": "restart in the allocation"}}
    restarted = {"attempt": 2, "job_id": "8", "restart_count": 0, "nodes": ["n1", "n3"],
                 "exit_reason": "finished", "decision": {"requeue": False, "reason": "done"},
                 "in_job_restart": {"after_attempt": 1, "excluded": ["n2"], "spares": ["n3"],
                                    "why": "rank 1 failed first: Killed", "in_place": False,
                                    "recovery_s": 41.0, "steps_lost": 2}}
    assert "restart in job: restart in the allocation" in attempts_table([failed, restarted])
    line = restart_line(restarted)
    assert "after attempt 1: n2 -> n3 (rank 1 failed first: Killed)" in line
    assert "2 steps redone" in line and restart_line(failed) is None
