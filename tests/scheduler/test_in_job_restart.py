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


def _record(attempt: int, job_id: str, *, restarted: dict | None = None, requeue: bool = False):
    """A ledger record as the batch shell writes it: ``restarted``, how the attempt began
    (inside the allocation after the one before); ``requeue``, whether it went back to the
    queue (else the next attempt was restarted inside the job)."""
    from hpctrain.record.attempt_records import AttemptRecord
    return AttemptRecord.from_dict({
        "attempt": attempt, "job_id": job_id, "in_job_restart": restarted,
        "decision": {"requeue": requeue, "reason": "requeue" if requeue else "restart in job",
                     "in_job": not requeue}})


def test_the_restart_budget_counts_only_the_restarts_of_this_allocation():
    """Slurm keeps a job's id across requeues, so the ledger's newest requeued record is where
    this allocation began: the restarts before it, even the one that began that very record,
    were spent in an allocation the job no longer holds."""
    first = {"excluded": ["n2"], "spares": ["n3"], "in_place": False}
    second = {"excluded": ["n1"], "spares": ["n4"], "in_place": False}
    other_job = _record(1, "7", restarted={"excluded": ["n9"], "spares": ["n8"]})
    ledger = [other_job, _record(2, "8"), _record(3, "8", restarted=first)]
    assert ijr.restarts_in_job(ledger, "8") == [first]          # job 7's restart is not ours
    # ids as the ledger's JSON and the environment give them (equal, not the same object),
    # and an earlier job whose id sorts after this one's
    ledger = [_record(1, "998", restarted={"excluded": ["n9"]}), _record(2, "1000"),
              _record(3, "1000", restarted=first)]
    assert ijr.restarts_in_job(ledger, "".join(["10", "00"])) == [first]
    # attempt 3, begun by the restart, spent the budget and was requeued: a new allocation
    requeued = [_record(2, "8"), _record(3, "8", restarted=first, requeue=True)]
    assert ijr.restarts_in_job(requeued, "8") == []
    # the new allocation failed once and restarted inside itself: that restart alone counts
    later = requeued + [_record(4, "8"), _record(5, "8", restarted=second)]
    assert ijr.restarts_in_job(later, "8") == [second]
    # and the requeue path had a plain requeue (a preemption) in between
    preempted = [_record(2, "8", restarted=first), _record(3, "8", requeue=True),
                 _record(4, "8")]
    assert ijr.restarts_in_job(preempted, "8") == []
    budget, why = plan(max_restarts=1, done=ijr.restarts_in_job(later, "8"))
    assert budget is None and "budget spent (1 of" in why
    assert plan(max_restarts=1, done=ijr.restarts_in_job(requeued, "8"))[0] is not None


def test_a_straggler_or_an_excluded_node_is_named_for_what_it_did():
    assert ijr.culprit_nodes(ExitReason.STRAGGLER, None, ["n1"], None, ["n1", "n2"]) == \
        (["n1"], "straggler node")
    assert ijr.culprit_nodes(ExitReason.FAILED, None, ["n2"], None, ["n1", "n2"]) == \
        (["n2"], "excluded")
    # a node outside the step (a spare that never trained) is nobody's culprit
    assert ijr.culprit_nodes(ExitReason.HUNG, None, ["n3"], None, ["n1", "n2"]) == \
        ([], "hung rank")


def test_a_first_failure_without_a_node_blames_no_node():
    ff = {"rank": 3, "node": None, "message": "Killed"}
    assert ijr.culprit_nodes(ExitReason.FAILED, ff, None, None, ["n1", "n2"]) == ([], "")
    assert plan(culprits=[], why="")[1] == "no node to blame for the failure"


def test_a_restart_that_just_fits_before_the_emergency_save_is_made():
    """time left = the restart's cost + the emergency save's lead time: it fits, exactly; a
    second less does not. Without a measured cost the default is assumed, and said."""
    assert plan(time_left_s=110.0, restart_cost_s=80.0, lead_time_s=30.0)[0] is not None
    p, why = plan(time_left_s=109.0, restart_cost_s=80.0, lead_time_s=30.0)
    assert p is None and why.startswith("109 s left") and "a restart (80 s)" in why
    default = ijr.DEFAULT_RESTART_S
    assert plan(time_left_s=default + 30.0, lead_time_s=30.0)[0] is not None
    p, why = plan(time_left_s=default + 29.0, lead_time_s=30.0)
    assert p is None and f"a restart ({default:.0f} s)" in why
    assert plan(time_left_s=None)[0] is not None        # the job's end unknown: no bound


def test_the_first_usable_spare_takes_the_place_and_the_others_wait():
    states = {"n1": "MIXED", "n2": "MIXED", "n3": "DRAIN", "n4": "IDLE", "n5": "IDLE"}
    p, how = plan(allocation=["n1", "n2", "n3", "n4", "n5"], states=states)
    assert how == "spare" and p.nodes == ["n1", "n4"] and p.spares == ["n4"]
    # two culprits, two usable spares: each takes its culprit's place, in the step's order
    p, _ = plan(allocation=["n1", "n2", "n3", "n4", "n5"], states=states,
                culprits=["n2", "n1"])
    assert p.nodes == ["n5", "n4"] and p.excluded == ["n2", "n1"] and p.spares == ["n4", "n5"]
    assert "n2 -> n4, n1 -> n5" in p.describe()
    # a spare excluded by an earlier restart of this allocation is not used again
    done = [{"excluded": ["n4"], "spares": ["n2"], "in_place": False}]
    p, _ = plan(allocation=["n1", "n2", "n3", "n4", "n5"], states=states, done=done)
    assert p.spares == ["n5"]


def test_refusals_name_the_reason_and_every_sick_node():
    p, why = plan(spare_nodes=0, reason=ExitReason.HUNG, why="hung rank")
    assert p is None and why == "a hung rank needs a spare node and the job has none"
    p, why = plan(spare_nodes=0, culprits=["n1", "n2"],
                  states={"n1": "DOWN*", "n2": "DRAIN"})
    assert p is None and why == "not healthy: n1 (DOWN*), n2 (DRAIN)"
    p, why = plan(spare_nodes=0, states={"n1": "MIXED"})
    assert p is None and why == "not healthy: n2 (unknown to Slurm)"
    # a budget already over its limit (three spent, two allowed) is spent too
    spent = [{"excluded": ["n9"], "spares": [], "in_place": False}] * 3
    assert "budget spent (3 of resilience.max_in_job_restarts=2)" in plan(done=spent)[1]


class _Clock:
    """The wait's clock and sleep: each sleep moves the clock on by ``step`` seconds."""

    def __init__(self, start: float = 1000.0, step: float = 1.0):
        self.now, self.step, self.kills = start, step, []

    def sleep(self, seconds):
        self.now += self.step

    def kill(self, ids):
        self.kills.append((self.now, ids))


def test_a_lingering_step_is_killed_at_half_the_wait_and_then_waited_for():
    c = _Clock(step=0.5)
    start = c.now
    steps = lambda: {} if c.kills and c.now >= c.kills[0][0] + 3 else {"9.0": ["n1"]}  # noqa: E731
    assert ijr.stop_old_step("9", wait_s=41, steps=steps, kill=c.kill, sleep=c.sleep,
                             clock=lambda: c.now) == (True, [])
    assert c.kills == [(start + 20.5, ["9.0"])] and c.now == start + 23.5


def test_a_clock_that_steps_past_the_marks_still_kills_gives_up_and_leaves_lost_steps():
    """The wait's marks (half the wait, the deadline, the lost step's grace) are reached by
    the first poll at or after them, not only by a poll exactly on them."""
    polls = []

    def lingering(where):
        def steps():
            polls.append(c.now)
            assert len(polls) < 100, "the wait never ended"
            return {"9.0": where}
        return steps

    c = _Clock(step=3.0)
    start = c.now
    assert ijr.stop_old_step("9", wait_s=40, steps=lingering(["n1"]), kill=c.kill,
                             sleep=c.sleep, clock=lambda: c.now) == (False, ["9.0"])
    assert c.kills == [(start + 21, ["9.0"])] and c.now == start + 42
    c, polls[:] = _Clock(step=3.0), []
    start = c.now
    assert ijr.stop_old_step("9", lost={"n2"}, wait_s=61, steps=lingering(["n2"]),
                             kill=c.kill, sleep=c.sleep, clock=lambda: c.now) == (True, ["9.0"])
    assert c.kills == [(start, ["9.0"])] and c.now == start + 6


def test_a_step_that_outlives_its_kill_is_given_up_at_the_deadline():
    c = _Clock(step=10.0)
    start = c.now
    assert ijr.stop_old_step("9", wait_s=60, steps=lambda: {"9.0": ["n1"], "9.1": ["n2"]},
                             kill=c.kill, sleep=c.sleep, clock=lambda: c.now) == \
        (False, ["9.0", "9.1"])
    assert c.now == start + 60 and c.kills == [(start + 30, ["9.0", "9.1"])]


def test_a_kill_that_fails_is_said_and_the_wait_still_decides(capsys):
    c = _Clock()

    def refuse(ids):
        c.kill(ids)
        raise RuntimeError("scancel: Invalid job id specified")

    steps = lambda: {} if c.now >= 1025 else {"9.0": ["n1"]}  # noqa: E731
    assert ijr.stop_old_step("9", wait_s=40, steps=steps, kill=refuse, sleep=c.sleep,
                             clock=lambda: c.now) == (True, [])
    assert len(c.kills) == 1
    assert "killing the old step ['9.0'] failed: scancel: Invalid job id" in capsys.readouterr().err


def test_a_step_only_on_the_lost_node_is_killed_at_once_and_left_after_the_grace():
    c = _Clock()
    start = c.now
    assert ijr.stop_old_step("9", lost={"n2"}, wait_s=60, steps=lambda: {"9.0": ["n2"]},
                             kill=c.kill, sleep=c.sleep, clock=lambda: c.now) == (True, ["9.0"])
    assert c.kills == [(start, ["9.0"])] and c.now == start + ijr.LOST_STEP_GRACE_S


def test_the_node_check_of_no_node_passes_and_one_that_cannot_start_says_why(tmp_path,
                                                                          monkeypatch):
    """No replacement to check (a restart in place checks its own nodes; the plan never asks
    for none), and a batch host without Slurm's srun on its PATH: the restart is refused with
    the reason, never a traceback. The check itself runs on real nodes in the spare drills
    (tests/resilience/test_spare_drills.py)."""
    assert ijr.quick_check(str(tmp_path), [], "python3", 5.0) == (True, "")
    monkeypatch.setenv("PATH", str(tmp_path))
    ok, why = ijr.quick_check(str(tmp_path), ["n3"], "python3", 5.0)
    assert not ok and why.startswith("the node check could not start: ") and "srun" in why


def test_a_restarts_cost_is_the_newest_restart_measured_never_a_requeues_queue_wait():
    """A requeue's recovery holds the hours the job waited in the queue, which a restart
    inside the allocation never waits: taken for a restart's cost, it refused restarts that
    fit (here: 3 h left before the job's end, a restart of 95 s)."""
    from hpctrain.record.attempt_end import newest_recovery_s
    restart = {"excluded": ["n2"], "spares": ["n3"], "recovery_s": 95.0}
    ledger = [{"attempt": 1, "recovery_s": None},
              {"attempt": 2, "recovery_s": 95.0, "in_job_restart": restart},
              {"attempt": 3, "recovery_s": 4 * 3600.0},          # requeued: the queue's wait
              {"attempt": 4, "recovery_s": -0.4, "in_job_restart": restart}]   # clocks apart
    assert newest_recovery_s(ledger, restarts_only=True) == 95.0
    assert newest_recovery_s([{"recovery_s": 0.0, "in_job_restart": restart}], True) == 0.0
    assert newest_recovery_s(ledger[:1] + ledger[2:3], restarts_only=True) is None
    assert newest_recovery_s([], restarts_only=True) is None
    cost = newest_recovery_s(ledger, restarts_only=True)
    assert plan(time_left_s=3 * 3600.0, restart_cost_s=cost)[0] is not None
