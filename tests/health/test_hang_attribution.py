"""Who stopped first: the hang verdict from heartbeats, as the batch shell's watcher and the
ranks' own watchdogs decide it (pure: beats and a clock, no processes)."""

from __future__ import annotations

import json

from hpctrain.health.hang import (STACKS_PATTERN, HangMonitor, claim_verdict, read_verdict,
                                  stacks_path)
from hpctrain.health.heartbeat import EXITING, Beat, read_beats, write_beat
from hpctrain.runtime.watchdog import hang_limit


def beat(rank, step, progress_at, beat_at, node=None, limit=30.0, **kw) -> Beat:
    return Beat(rank=rank, node=node or f"n{1 + rank // 2}", pid=1000 + rank, step=step,
                start_step=0, phase="step", progress_at=progress_at, beat_at=beat_at,
                limit_s=limit, **kw)


def test_no_verdict_while_any_rank_still_progresses():
    m = HangMonitor(beat_s=5)
    # rank 3 idle for 40 s, rank 0 progressed a second ago: someone works, not a hang
    m.update({0: beat(0, 12, 99.0, 100.0), 3: beat(3, 11, 60.0, 100.0)}, now=1000.0)
    assert m.check(1000.0) is None


def test_a_stopped_rank_is_blamed_before_the_ranks_waiting_for_it():
    """SIGSTOP: rank 3's beats stop; ranks 0-2 keep beating while they wait in a collective."""
    m = HangMonitor(beat_s=5)
    beats = {r: beat(r, 10, 100.0, 101.0) for r in range(4)}
    m.update(beats, now=1000.0)
    for t in range(5, 41, 5):       # ranks 0-2 beat every 5 s without progress, rank 3 is silent
        beats = {**beats, **{r: beat(r, 10, 100.0, 101.0 + t) for r in range(3)}}
        m.update(beats, now=1000.0 + t)
    verdict = m.check(1040.0)
    assert verdict is not None and verdict.rank == 3 and verdict.node == "n2"
    assert verdict.silent_s == 40.0 and "heartbeat stopped 40 s ago" in verdict.why
    assert verdict.step == 10 and verdict.end_step == 10 and verdict.start_step == 0
    assert verdict.message.startswith("rank 3 on n2 made no progress for 41 s; last step 10")


def test_a_rank_that_never_issued_the_collective_its_peers_wait_in_is_blamed():
    m = HangMonitor(beat_s=5)
    seqs = {0: 58, 1: 58, 2: 57, 3: 58}          # rank 2 never issued the 58th collective
    beats = {r: beat(r, 10, 100.0, 140.0, collectives={"3": seqs[r], "0": 4}) for r in range(4)}
    m.update(beats, now=500.0)
    verdict = m.check(500.0)
    assert verdict is not None and verdict.rank == 2
    assert "group 3 wait in a collective it never issued (57 of their 58" in verdict.why
    assert verdict.ranks["2"]["behind"] == ["3", 57, 58]


def test_the_rank_at_the_lowest_step_is_blamed():
    m = HangMonitor(beat_s=5)
    m.update({0: beat(0, 10, 100.0, 140.0), 1: beat(1, 9, 101.0, 140.0)}, now=0.0)
    verdict = m.check(0.0)
    assert verdict.rank == 1 and "at step 9, the others at up to 10" in verdict.why


def test_the_limit_is_the_largest_a_rank_reports():
    m = HangMonitor(beat_s=5)
    m.update({0: beat(0, 5, 100.0, 140.0, limit=30.0), 1: beat(1, 5, 100.0, 140.0, limit=60.0)},
             now=0.0)
    assert m.check(0.0) is None                 # 40 s idle: under rank 1's 60 s
    assert m.check(25.0).limit_s == 60.0        # 65 s


def test_the_first_verdict_stands(tmp_path):
    m = HangMonitor(beat_s=5)
    m.update({0: beat(0, 5, 0.0, 100.0), 1: beat(1, 4, 0.0, 100.0)}, now=0.0)
    first = m.check(0.0, decided_by="batch shell")
    second = m.check(0.0, decided_by="rank 0")
    assert claim_verdict(tmp_path, first).decided_by == "batch shell"
    assert claim_verdict(tmp_path, second).decided_by == "batch shell"
    assert read_verdict(tmp_path).rank == 1
    assert not list(tmp_path.glob(".*tmp"))


def test_heartbeat_files_round_trip(tmp_path):
    b = beat(3, 7, 1.0, 2.0, collectives={"0": 3}, members={"0": [0, 1, 2, 3]}, where="f (x.py:1)")
    write_beat(tmp_path, b)
    (tmp_path / "heartbeat" / "rank-9.json").write_text("{half a beat")
    assert read_beats(tmp_path) == {3: b}


def test_derived_hang_limit():
    # 20 × the slowest step, with a floor: 5 minutes on GPUs, 1 on the CPU rehearsal
    assert hang_limit(None, "cuda", 2.0, True, 300) == 300.0
    assert hang_limit(None, "cuda", 30.0, True, 300) == 600.0
    assert hang_limit(None, "cpu", 0.5, True, 300) == 60.0
    # before the first step is done: at least train.init_timeout_s
    assert hang_limit(None, "cpu", None, False, 300) == 300.0
    assert hang_limit(45, "cuda", 30.0, True, 300) == 45.0      # the job's own value wins
    assert hang_limit(45, "cuda", None, False, 300) == 300.0


def test_a_silent_ranks_stale_limit_does_not_count():
    """Rank 1 was stopped before its first beat after the first step: its file still carries
    the start-up limit (the rendezvous timeout); the ranks that still beat say 30 s."""
    m = HangMonitor(beat_s=5)
    beats = {0: beat(0, 10, 100.0, 101.0), 1: beat(1, None, 50.0, 60.0, limit=300.0)}
    m.update(beats, now=0.0)
    for t in range(5, 36, 5):
        beats[0] = beat(0, 10, 100.0, 101.0 + t)
        m.update(beats, now=float(t))
    verdict = m.check(35.0)
    assert verdict is not None and verdict.rank == 1 and verdict.limit_s == 30.0


def test_of_two_silent_ranks_the_one_that_stopped_first_is_blamed():
    """Rank 3's node froze first; 20 s later rank 1 stopped beating too (its node lost the
    network while it waited). Both are silent when the limit passes: rank 3 is the cause."""
    m = HangMonitor(beat_s=5)
    beats = {r: beat(r, 10, 100.0, 101.0) for r in range(4)}
    m.update(beats, now=1000.0)
    for t in range(5, 61, 5):
        alive = [0, 2] + ([1] if t <= 20 else [])
        beats = {**beats, **{r: beat(r, 10, 100.0, 101.0 + t) for r in alive}}
        m.update(beats, now=1000.0 + t)
    verdict = m.check(1060.0)
    assert verdict is not None and verdict.rank == 3 and verdict.node == "n2"
    assert verdict.silent_s == 60.0 and "heartbeat stopped 60 s ago" in verdict.why
    assert verdict.ranks["1"]["silent_s"] == 40.0      # the other silent rank, seen but not blamed


def test_a_rank_is_given_the_whole_limit_before_it_is_called_hung():
    """health.hang_timeout_s is how long a step may go without progress: two ranks idle for
    exactly the limit (a slow step that just made it) get no verdict; a second more, they do."""
    m = HangMonitor(beat_s=5)
    m.update({0: beat(0, 5, 100.0, 130.0), 1: beat(1, 5, 100.0, 130.0)}, now=0.0)
    assert m.check(0.0) is None
    assert m.check(1.0).idle_s == 31.0


def test_among_ranks_alike_the_one_longest_without_progress_is_blamed():
    """Two ranks at the same step, both still beating, neither behind in a collective: rank 1
    last progressed ten seconds before rank 0, so rank 1 is blamed, and the record gives its
    idle time to a tenth of a second."""
    m = HangMonitor(beat_s=5)
    m.update({0: beat(0, 8, 100.0, 140.0), 1: beat(1, 8, 89.97, 140.0)}, now=0.0)
    verdict = m.check(0.34)
    assert verdict.rank == 1 and "it has gone longest without progress" in verdict.why
    assert verdict.idle_s == 50.4 and verdict.ranks["0"]["idle_s"] == 40.3
    assert verdict.ranks["1"]["silent_s"] == 0.3


def test_a_rank_judged_just_past_its_limit_is_recorded_past_it():
    """Idle 30.04 s against a 30 s limit is a hang; the record, in tenths, says 30.1 s, not a
    30.0 s that would read as within the limit."""
    m = HangMonitor(beat_s=5)
    m.update({0: beat(0, 8, 110.3, 140.0), 1: beat(1, 8, 110.3, 140.0)}, now=0.0)
    verdict = m.check(0.34)
    assert verdict is not None and verdict.limit_s == 30.0
    assert verdict.idle_s == 30.1 > verdict.limit_s


def test_a_rank_still_starting_is_blamed_over_ranks_that_finished_a_step():
    """Ranks 0-2 finished step 0 and wait; rank 3 has no step yet (still loading, beating):
    rank 3 is the one the others wait for."""
    m = HangMonitor(beat_s=5)
    beats = {r: beat(r, 0, 100.0, 140.0) for r in range(3)}
    beats[3] = beat(3, None, 100.0, 140.0)
    m.update(beats, now=0.0)
    assert m.check(0.0).rank == 3


def test_a_heartbeat_a_few_seconds_late_is_not_a_stopped_process():
    """On a loaded node rank 1's heartbeat file is 14.5 s old (under three beats of 5 s): it
    is late, not stopped, so the hang is blamed on rank 0, which is a step behind. At 15.5 s
    it has missed three beats: rank 1 has stopped, and the others wait for it."""
    m = HangMonitor(beat_s=5)
    m.update({0: beat(0, 9, 100.0, 140.0), 1: beat(1, 10, 100.0, 140.0)}, now=0.0)
    m.update({0: beat(0, 9, 100.0, 154.5), 1: beat(1, 10, 100.0, 140.0)}, now=14.5)
    verdict = m.check(14.5)
    assert verdict.rank == 0 and "at step 9, the others at up to 10" in verdict.why
    m.update({0: beat(0, 9, 100.0, 155.5), 1: beat(1, 10, 100.0, 140.0)}, now=15.5)
    verdict = m.check(15.5)
    assert verdict.rank == 1 and "heartbeat stopped 16 s ago" in verdict.why


def test_every_ranks_stack_dump_is_where_the_verdict_says(tmp_path):
    """Four ranks dump their stacks after a verdict; the verdict names one pattern in the
    attempt's folder: a user who follows it finds each rank's dump, and no other rank's."""
    attempt = tmp_path / "attempt-2"
    attempt.mkdir()
    for rank in range(4):
        stacks_path(attempt, rank).write_text(f"rank {rank}: Python stacks\n")
    found = sorted(attempt.glob(STACKS_PATTERN))
    assert [p.read_text() for p in found] == [f"rank {r}: Python stacks\n" for r in range(4)]
    assert all(p.parent == attempt for p in found)


def test_a_rank_blamed_while_still_beating_is_not_recorded_as_silent(tmp_path):
    """Rank 0 is a step behind and still beats (its process is alive, waiting): the recorded
    verdict blames it for its step, and says nowhere that its heartbeat stopped."""
    m = HangMonitor(beat_s=5)
    m.update({0: beat(0, 9, 100.0, 140.0), 1: beat(1, 10, 100.0, 140.0)}, now=0.0)
    m.update({0: beat(0, 9, 100.0, 150.0), 1: beat(1, 10, 100.0, 150.0)}, now=10.0)
    claim_verdict(tmp_path, m.check(13.0, decided_by="batch shell"))
    recorded = read_verdict(tmp_path)
    assert recorded.rank == 0 and recorded.silent_s is None
    assert "heartbeat stopped" not in recorded.message
    assert recorded.ranks["0"]["silent_s"] == 3.0


def test_a_verdict_recorded_without_its_time_does_not_claim_one(tmp_path):
    """A hang.json from an older version has no detected_at: read back, the verdict's time is
    unknown (false), so the attempt's end measures the recovery from its own end time rather
    than from a made-up moment near 1970."""
    m = HangMonitor(beat_s=5)
    m.update({0: beat(0, 5, 0.0, 100.0), 1: beat(1, 4, 0.0, 100.0)}, now=0.0)
    old = m.check(0.0).to_dict()
    del old["detected_at"], old["decided_by"]
    (tmp_path / "hang.json").write_text(json.dumps(old))
    recorded = read_verdict(tmp_path)
    assert recorded.rank == 1 and not recorded.detected_at


def exiting(b: Beat) -> Beat:
    b.phase = EXITING
    return b


def test_ranks_that_ended_their_attempt_together_are_not_hung_however_slowly_they_exit():
    """Both ranks finished and said so in their last beat; on a loaded node their interpreters
    take minutes to exit, so their beats stop: that is not a hang (a hang verdict would exclude
    the node and requeue a finished run)."""
    m = HangMonitor(beat_s=5)
    m.update({r: exiting(beat(r, 30, 100.0, 100.0)) for r in range(2)}, now=1000.0)
    assert m.check(1000.0 + 600) is None


def test_a_rank_stuck_while_its_peer_exits_is_still_blamed():
    """Rank 0 ended the attempt and exits; rank 1 never got there (stopped after step 29): the
    verdict names rank 1, and only the ranks still working are judged."""
    m = HangMonitor(beat_s=5)
    m.update({0: exiting(beat(0, 30, 100.0, 100.0)), 1: beat(1, 29, 90.0, 100.0)}, now=1000.0)
    verdict = m.check(1060.0)
    assert verdict is not None and verdict.rank == 1 and verdict.step == 29
    assert set(verdict.ranks) == {"1"} and "heartbeat stopped 60 s ago" in verdict.why


def test_the_watchdog_of_a_rank_that_ended_its_attempt_beats_exiting_last(tmp_path):
    from hpctrain.runtime.watchdog import Watchdog
    finished = Watchdog(tmp_path / "a", 0, "n1", hang_timeout_s=60, dump_stacks=False,
                        device="cpu", init_timeout_s=600, watcher=True, beat_s=3600).start(0)
    finished.step_done(30, 0.5)
    finished.stop(exiting=True)
    failed = Watchdog(tmp_path / "b", 1, "n1", hang_timeout_s=60, dump_stacks=False,
                      device="cpu", init_timeout_s=600, watcher=True, beat_s=3600).start(0)
    failed.step_done(12, 0.5)
    failed.stop()                   # a rank that failed: its last beat is where it was
    assert (read_beats(tmp_path / "a")[0].phase, read_beats(tmp_path / "a")[0].step) == \
        (EXITING, 30)
    assert read_beats(tmp_path / "b")[1].phase != EXITING
