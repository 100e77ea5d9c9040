"""Who caused a failed attempt (``hpctrain.record.culprit``): the rank that died first on its
own, over the peers that failed because it vanished. Pure: records, srun's lines, beats."""

from __future__ import annotations

from hpctrain.health.heartbeat import Beat, read_beats, write_beat
from hpctrain.record.attempt_records import FailureRecord
from hpctrain.record.culprit import culprit, peer_vanished, task_ranks
from hpctrain.scheduler.slurm.commands import parse_srun_task_exits

# srun's lines in the batch log of a SIGKILL drill on the dev cluster (4 ranks on 2 nodes,
# captured): rank 3 on n2 killed, its peers then fail
SIGKILL_LOG = """\
srun: cluster configuration lacks support for cpu binding
srun: error: n2: task 3: Killed
srun: launch/slurm: _step_signal: Terminating StepId=1.0
srun: error: n1: task 0: Exited with exit code 1
srun: error: n2: task 2: Exited with exit code 1
srun: error: n1: task 1: Exited with exit code 1
srun: Force Terminated StepId=1.0
"""

BEATS = {0: ("n1", 100.0), 1: ("n1", 101.0), 2: ("n2", 102.0), 3: ("n2", 99.5)}


# the peers' own records in that drill (gloo's words)
RESET = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] "
         "Read error [127.0.0.1]:16294: Connection reset by peer. This is typically caused by a "
         "remote worker hanging or bugs in the application.")
CLOSED = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
          "Connection closed by peer [127.0.0.1]:33921. This is typically caused by a remote "
          "worker crashing.")


def peer(rank, node, at, message=RESET):
    return FailureRecord(rank=rank, node=node, time=at, message=message)


def test_a_killed_rank_is_named_over_the_peers_that_noticed_first():
    exits = parse_srun_task_exits(SIGKILL_LOG)
    # the peers' records are the only ones written, and the earliest is rank 2's
    found = culprit([peer(2, "n2", 103.0), peer(0, "n1", 103.1), peer(1, "n1", 115.0, CLOSED)],
                    exits, BEATS)
    assert (found.rank, found.node, found.cause) == (3, "n2", "signal")
    assert found.time == 99.5 and "Killed" in found.message
    assert found.failure().to_dict()["cause"] == "signal"


def test_without_the_schedulers_view_the_first_record_is_named_as_before():
    found = culprit([peer(2, "n2", 103.2), peer(1, "n1", 103.0)], [], BEATS)
    assert (found.rank, found.cause, found.message) == (1, "peer", RESET)


def test_a_ranks_own_error_beats_peers_that_noticed_it_even_when_written_later():
    own = FailureRecord(rank=2, node="n2", time=104.0, message="ValueError: loss is nan")
    found = culprit([peer(1, "n1", 103.0), own], [], BEATS)
    assert (found.rank, found.cause) == (2, "error")


def test_the_earlier_of_an_own_error_and_a_kill_is_named():
    own = FailureRecord(rank=0, node="n1", time=90.0, message="OSError: disk full")
    exits = parse_srun_task_exits(SIGKILL_LOG)
    assert culprit([own], exits, BEATS).rank == 0
    late = FailureRecord(rank=0, node="n1", time=120.0, message="OSError: disk full")
    assert culprit([late], exits, BEATS).rank == 3


def test_the_teardown_signal_srun_sends_to_survivors_names_no_one():
    exits = parse_srun_task_exits("srun: error: n1: task 0: Terminated\n"
                                  "srun: error: n2: task 2: Exited with exit code 1\n")
    found = culprit([peer(2, "n2", 103.0)], exits, BEATS)
    assert (found.rank, found.cause) == (2, "peer")


def test_a_rank_killed_by_srun_tearing_the_step_down_is_not_blamed():
    # rank 0 fails on a socket error (read as a peer's), srun tears down, rank 2 ignores
    # SIGTERM and is killed after KillWait
    exits = parse_srun_task_exits("srun: error: n1: task 0: Exited with exit code 1\n"
                                  "srun: error: n2: task 2: Killed\n")
    found = culprit([peer(0, "n1", 103.0)], exits, BEATS)
    assert (found.rank, found.cause) == (0, "peer")


def test_among_killed_ranks_srun_order_decides_not_the_coarse_heartbeats():
    exits = parse_srun_task_exits("srun: error: n1: task 1: Out Of Memory\n"
                                  "srun: error: n2: task 3: Killed\n")
    # rank 3's last beat is older than rank 1's (beats come every few seconds)
    found = culprit([], exits, BEATS)
    assert (found.rank, found.node) == (1, "n1") and "Out Of Memory" in found.message


def test_a_rank_on_a_node_slurm_no_longer_hears_from_is_named():
    found = culprit([peer(0, "n1", 103.0), peer(1, "n1", 103.1)], [], BEATS,
                    silent_nodes={"n2": "DOWN*"})
    # one candidate for the node: its lowest rank, alive up to a beat after its last one
    assert (found.rank, found.node, found.cause, found.time) == (2, "n2", "node", 107.0)
    assert "stopped responding" in found.message and "DOWN*" in found.message


def test_a_kill_on_a_node_that_is_late_to_answer_names_the_killed_rank():
    # the dev cluster, loaded: n2 went MIXED+NOT_RESPONDING for a moment after rank 3 was killed
    exits = parse_srun_task_exits(SIGKILL_LOG)
    found = culprit([peer(2, "n2", 103.0), peer(1, "n1", 115.0, CLOSED)], exits, BEATS,
                    silent_nodes={"n2": "MIXED+NOT_RESPONDING"})
    assert (found.rank, found.node, found.cause) == (3, "n2", "signal")


def test_an_own_error_within_a_beat_of_a_silent_nodes_last_beat_is_named():
    own = FailureRecord(rank=0, node="n1", time=104.0, message="OSError: disk full")
    found = culprit([own, peer(1, "n1", 104.5)], [], BEATS, silent_nodes={"n2": "IDLE*"})
    assert (found.rank, found.cause) == (0, "error")
    late = FailureRecord(rank=0, node="n1", time=108.0, message="OSError: disk full")
    assert culprit([late], [], BEATS, silent_nodes={"n2": "IDLE*"}).node == "n2"


def test_no_failure_names_no_one():
    assert culprit([], [], {}) is None


def test_peer_messages_and_task_lists():
    assert peer_vanished("Connection reset by peer")
    assert peer_vanished("NCCL communicator was aborted on rank 2")
    assert not peer_vanished("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert not peer_vanished(None)
    assert task_ranks("0-2,5") == [0, 1, 2, 5] and task_ranks("x") == []


def test_a_rank_that_wrote_its_own_error_before_it_was_killed_is_named_with_its_words():
    """Rank 1 ran out of host memory half a second after its last heartbeat: it wrote its
    error, then the OOM killer ended it (srun: `Killed`). Its peers noticed after. The record
    names rank 1 with what it said itself, which tells the user more than srun's word for the
    signal (and is not placed back at its last heartbeat)."""
    exits = parse_srun_task_exits("srun: error: n1: task 1: Killed\n"
                                  "srun: error: n2: task 2: Exited with exit code 1\n")
    said = "MemoryError: Unable to allocate 12.0 GiB for the host copy of the checkpoint"
    own = FailureRecord(rank=1, node="n1", time=101.5, message=said)
    found = culprit([peer(2, "n2", 102.0), own], exits, BEATS)
    assert (found.rank, found.node, found.cause, found.message) == (1, "n1", "error", said)


def test_at_startup_before_any_heartbeat_the_rank_srun_saw_killed_is_named():
    """A 64-rank job dies while loading, before any rank wrote a heartbeat: srun saw rank 40
    killed, and node n3 stopped answering. Neither has a time; the named culprit is the rank
    srun saw die (a node without beats has no rank to name)."""
    exits = parse_srun_task_exits("srun: error: n6: task 40: Killed\n")
    found = culprit([], exits, {}, silent_nodes={"n3": "DOWN*"})
    assert (found.rank, found.node, found.cause) == (40, "n6", "signal")


def test_a_silent_node_is_placed_by_its_own_ranks_beats_not_the_other_nodes(tmp_path):
    """n1 stops answering (its ranks 0 and 1 last beat at 100 and 101, so it was gone by 106);
    rank 2 on n2 then writes its own error at 106.5. The node went first: n1 is named, not
    rank 2, whose later beats say nothing of n1. The beats are read from the ranks' heartbeat
    files, as the batch shell reads them."""
    for rank, (node, at) in BEATS.items():
        write_beat(tmp_path, Beat(rank=rank, node=node, pid=100 + rank, step=5, start_step=0,
                                  phase="step", progress_at=at, beat_at=at, limit_s=30.0))
    beats = {rank: (b.node, b.beat_at) for rank, b in read_beats(tmp_path).items()}
    late = FailureRecord(rank=2, node="n2", time=106.5, message="OSError: disk full")
    found = culprit([late], [], beats, silent_nodes={"n1": "DOWN*"})
    assert (found.rank, found.node, found.cause, found.time) == (0, "n1", "node", 106.0)


def test_a_teardown_report_that_reaches_srun_before_the_kill_does_not_hide_it():
    """Rank 3 on the loaded node n2 is killed; srun tears the step down and the fast node n1
    reports its task terminated before n2's report of the kill arrives. The kill still
    names rank 3."""
    exits = parse_srun_task_exits("srun: error: n1: task 0: Terminated\n"
                                  "srun: error: n2: task 3: Killed\n")
    found = culprit([peer(2, "n2", 103.0)], exits, BEATS)
    assert (found.rank, found.node, found.cause) == (3, "n2", "signal")


def test_two_ranks_failing_at_the_same_instant_name_the_lower_whatever_the_file_order():
    """Every rank reads the same bad batch and fails on it in the same second: the record
    names rank 1, not whichever failure file was read first."""
    same = "ValueError: token id 70000 is beyond the vocabulary"
    found = culprit([FailureRecord(rank=3, node="n2", time=100.0, message=same),
                     FailureRecord(rank=1, node="n1", time=100.0, message=same)], [], BEATS)
    assert (found.rank, found.cause) == (1, "error")


def test_ranks_killed_together_on_one_node_count_even_when_one_wrote_its_own_error():
    """n2 runs out of memory: rank 3 is killed outright (silent since its beat at 99.5), rank 2
    writes a MemoryError, then is killed too; srun reports both as one line. Rank 3 went first."""
    exits = parse_srun_task_exits("srun: error: n2: tasks 2-3: Killed\n")
    own = FailureRecord(rank=2, node="n2", time=103.0, message="MemoryError: out of host memory")
    found = culprit([own], exits, BEATS)
    assert (found.rank, found.node, found.cause) == (3, "n2", "signal")


def test_a_node_that_went_down_first_is_named_over_a_later_kill_on_a_late_node():
    """n3 went down (rank 4's last beat at 95, so gone by 100); later rank 3 on n2 is killed
    and the loaded n2 misses a state query. n2 is explained by the kill; n3 is still weighed,
    and it went first."""
    beats = {**BEATS, 3: ("n2", 103.0), 4: ("n3", 95.0)}
    exits = parse_srun_task_exits("srun: error: n2: task 3: Killed\n")
    found = culprit([], exits, beats, silent_nodes={"n2": "MIXED+NOT_RESPONDING", "n3": "DOWN*"})
    assert (found.rank, found.node, found.cause) == (4, "n3", "node")
