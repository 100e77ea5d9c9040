"""Which bad nodes a requeue may exclude, on real `scontrol show partition|node` output
(tests/fixtures/slurm/README.md): n1 draining (MIXED+DRAIN), n2 running a job (MIXED), n3 DOWN."""

import pytest

from hpctrain.scheduler.slurm.commands import (parse_node_states, parse_partition_nodes,
                                               parse_scontrol_record)
from hpctrain.scheduler.slurm.node_exclusion import (exclusion_that_fits, job_node_count, node_usable,
                                                     nodes_to_ask, plan_exclusion)
from tests.conftest import REPO

FIX = REPO / "tests" / "fixtures" / "slurm"


def test_usable_nodes_from_captured_partition_and_node_output():
    assert parse_partition_nodes((FIX / "scontrol_show_partition.txt").read_text()) == "n[1-3]"
    states = parse_node_states((FIX / "scontrol_show_nodes_drain_down.txt").read_text())
    assert states == {"n1": "MIXED+DRAIN", "n2": "MIXED", "n3": "DOWN"}
    assert [n for n, s in states.items() if node_usable(s)] == ["n2"]
    single = parse_node_states((FIX / "scontrol_show_node.txt").read_text())
    assert list(single) == ["n1"] and node_usable(single["n1"])


def test_states_on_which_slurm_starts_no_job():
    for state in ("IDLE+DRAIN", "DOWN*", "IDLE*", "ALLOCATED+DRAIN", "IDLE+FAIL", "FUTURE",
                  "DOWN+NOT_RESPONDING"):
        assert not node_usable(state), state
    for state in ("IDLE", "ALLOCATED", "MIXED", "IDLE+COMPLETING", "IDLE+POWERED_DOWN"):
        assert node_usable(state), state


def test_job_node_count_from_captured_job_and_a_pending_range():
    job = (FIX / "scontrol_show_job.txt").read_text()
    assert job_node_count(parse_scontrol_record(job)) == 2
    assert job_node_count({"NumNodes": "3-3"}) == 3
    assert job_node_count({}) is None


def test_a_node_the_job_cannot_do_without_stays_in():
    plan = plan_exclusion(["n2"], [], {"n1", "n2", "n3"}, needed=3, partition="debug")
    assert plan.exclude == [] and plan.not_excluded == ["n2"]
    assert plan.note == ("not excluding n2: the partition debug would have 2 usable nodes "
                         "and the job needs 3")


def test_bad_nodes_are_excluded_in_order_while_enough_remain():
    usable = {"n1", "n2", "n3", "n4"}
    plan = plan_exclusion(["n3", "n1", "n4"], [], usable, needed=2, partition="gpu")
    assert plan.exclude == ["n3", "n1"] and plan.not_excluded == ["n4"]
    assert "would have 1 usable node and the job needs 2" in plan.note
    assert plan_exclusion(["n3", "n1"], [], usable, needed=2, partition="gpu").note is None


def test_nodes_already_out_cost_nothing_and_the_current_exclusions_count():
    # n3 is down (not usable): excluding it leaves as many usable nodes as before
    plan = plan_exclusion(["n3"], [], {"n1", "n2"}, needed=2, partition="debug")
    assert plan.exclude == ["n3"] and plan.note is None
    # n1 is already excluded: n2 is then the job's last usable node but one
    plan = plan_exclusion(["n2"], ["n1"], {"n1", "n2", "n3"}, needed=2, partition="debug")
    assert plan.exclude == [] and plan.not_excluded == ["n2"]
    assert "would have 1 usable node" in plan.note


def test_a_job_on_several_partitions_uses_the_one_that_can_spare_the_bad_node():
    """The job may start in ``debug`` (the captured nodes: only n2 usable) or ``spare`` (n2, n4,
    n5). Leaving n2 out of ``debug`` would leave the job nowhere to run there, ``spare`` can do
    without it: n2 is excluded, whichever partition the job lists first."""
    states = parse_node_states((FIX / "scontrol_show_nodes_drain_down.txt").read_text())
    debug = {n for n, s in states.items() if node_usable(s)}
    usable = {"debug": debug, "spare": {"n2", "n4", "n5"}}.__getitem__
    for partitions in ("debug,spare", "spare,debug"):
        plan = exclusion_that_fits({"NumNodes": "1", "Partition": partitions}, ["n2"], [], usable)
        assert plan.exclude == ["n2"] and plan.not_excluded == [] and plan.note is None, partitions
    # a job that needs all three of spare's nodes can spare n2 nowhere: the first partition's
    # note says why
    plan = exclusion_that_fits({"NumNodes": "3", "Partition": "spare,debug"}, ["n2"], [], usable)
    assert plan.exclude == [] and plan.not_excluded == ["n2"]
    assert plan.note == ("not excluding n2: the partition spare would have 2 usable nodes and "
                         "the job needs 3")

    # the partition's last usable node is the bad one: nothing would be left
    plan = plan_exclusion(["n2"], [], debug, needed=1, partition="debug")
    assert plan.note == ("not excluding n2: the partition debug would have 0 usable nodes and "
                         "the job needs 1")


def test_a_job_record_without_node_count_or_partition_is_refused_not_guessed():
    usable = {"debug": {"n1", "n2"}}.__getitem__
    for info in ({"Partition": "debug"}, {"NumNodes": "1"}, {"NumNodes": "1", "Partition": ""}):
        with pytest.raises(ValueError, match="NumNodes or Partition is missing"):
            exclusion_that_fits(info, ["n2"], [], usable)


def test_a_job_with_spares_gives_spares_up_to_leave_both_blamed_nodes_out():
    """N=2 training nodes and 1 spare on a 4-node partition: the node that failed first and
    the spare that failed after it are both excluded (the job needs only its N), and the
    requeued job asks for N + the spares that remain, here none; never fewer than N."""
    usable = {"n1", "n2", "n3", "n4"}.copy
    plan = exclusion_that_fits({"NumNodes": "3", "Partition": "debug"}, ["n2", "n3"], [],
                               lambda p: usable(), needed=2)
    assert plan.exclude == ["n2", "n3"] and plan.note is None and plan.usable_left == 2
    assert nodes_to_ask(3, 2, plan.usable_left) == 2
    # held to its 3 nodes, the job could leave only one of them out
    held = exclusion_that_fits({"NumNodes": "3", "Partition": "debug"}, ["n2", "n3"], [],
                               lambda p: usable())
    assert held.exclude == ["n2"] and held.not_excluded == ["n3"]
    # room for the spare: it stays asked for; too little room: never below N
    assert nodes_to_ask(3, 2, 5) == 3 and nodes_to_ask(3, 2, 1) == 2
    assert nodes_to_ask(3, 2, None) == 3
