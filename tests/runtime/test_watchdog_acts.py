"""A rank's own hang watchdog (``runtime.watchdog.Watchdog``) in one process, without a run:
when it decides by itself and when it leaves the decision to the batch shell's watcher, and
what it does on a verdict (the watcher's stack dump awaited, its peers' stacks awaited before
it exits). The multi-rank runs in ``test_health_in_ranks.py`` tell the same story end to end;
these pin its timing rules, which a real hang only shows after minutes."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from hpctrain import exit_codes
from hpctrain.health import hang as hangs
from hpctrain.health.heartbeat import Beat, read_beats, write_beat
from hpctrain.runtime import watchdog
from hpctrain.runtime.watchdog import END_OF_STACKS, WATCHER_ENV, Watchdog

LIMIT_S = 10.0


class Clock:
    """The ``time`` module as the watchdog sees it, with a monotonic clock that moves only by
    the watchdog's own naps: an idle time set by a test stays what it was set to, however long
    this machine takes to write the beats and read them back (a rank set 1 s short of its
    limit could be taken for hung when that took a second on a loaded machine). The wall clock and
    the rest are the real module's."""

    def __init__(self) -> None:
        self.now = time.monotonic()
        self.naps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.naps.append(seconds)
        self.now += seconds

    def __getattr__(self, name):
        return getattr(time, name)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(watchdog, "time", fake)
    return fake


def two_idle_ranks(folder, idle_s: float, watcher: bool | None = None) -> list[Watchdog]:
    """Ranks 0 and 1 on one node, both at step 5 and without progress for ``idle_s`` on the
    watchdog's clock (:class:`Clock`, where a test uses it), their beats written (no side
    thread: each decision is asked for)."""
    ranks = []
    for rank in (0, 1):
        w = Watchdog(folder, rank, "n1", hang_timeout_s=LIMIT_S, dump_stacks=False,
                     device="cpu", init_timeout_s=LIMIT_S, watcher=watcher, beat_s=3600)
        w.dir.mkdir(parents=True, exist_ok=True)
        w.start_step, w.step, w.phase = 0, 5, "step"
        w._progress_tick = watchdog.time.monotonic() - idle_s       # its last progress
        w._beat()
        ranks.append(w)
    return ranks


def test_without_a_watcher_a_rank_decides_once_it_is_idle_for_the_limit(tmp_path, monkeypatch,
                                                                      clock):
    monkeypatch.delenv(WATCHER_ENV, raising=False)
    assert two_idle_ranks(tmp_path / "a", idle_s=LIMIT_S - 2)[0]._decide() is None
    rank0 = two_idle_ranks(tmp_path / "b", idle_s=LIMIT_S + 5)[0]
    verdict = rank0._decide()
    assert verdict is not None and verdict.decided_by == "rank 0" and verdict.limit_s == LIMIT_S
    assert hangs.read_verdict(tmp_path / "b").rank == verdict.rank      # claimed for all


def test_under_the_batch_shells_watcher_a_rank_decides_only_when_the_watcher_seems_gone(
        tmp_path, monkeypatch, clock):
    """The watcher (``HPCTRAIN_HEALTH_WATCHER=batch``) judges first; a rank steps in after
    twice the limit and the grace, in case the watcher itself is gone."""
    monkeypatch.setenv(WATCHER_ENV, "batch")
    late = 2 * LIMIT_S + watchdog.WATCHER_GRACE_S
    for idle_s, decides in ((LIMIT_S + 5, False), (late - 1, False), (late + 1, True)):
        rank0 = two_idle_ranks(tmp_path / f"idle-{idle_s:.0f}", idle_s=idle_s)[0]
        assert rank0.watcher
        assert (rank0._decide() is not None) is decides, idle_s


@pytest.mark.parametrize("step_s", [+6 * LIMIT_S, -3600.0])
def test_a_wall_clock_stepped_forward_or_back_moves_no_rank_s_idle_time(tmp_path, monkeypatch,
                                                                        step_s, clock):
    """The wall clock of every rank on a node stepped (an NTP correction, a VM resumed) right
    after their last progress: forward by six limits, no rank is taken for hung (the job
    would be requeued for nothing); back by an hour, a rank idle for the limit is still
    judged hung (the step would hide a real hang for an hour). The beats say the same idle
    time as the monotonic clock, on the new wall clock."""
    monkeypatch.delenv(WATCHER_ENV, raising=False)
    wall = time.time
    busy = two_idle_ranks(tmp_path / "busy", idle_s=1.0)
    hung = two_idle_ranks(tmp_path / "hung", idle_s=LIMIT_S + 5)
    monkeypatch.setattr(time, "time", lambda: wall() + step_s)
    for rank in busy + hung:
        rank._beat()
    assert busy[0]._decide() is None
    verdict = hung[0]._decide()
    assert verdict is not None and verdict.limit_s == LIMIT_S
    for folder, idle_s in ((tmp_path / "busy", 1.0), (tmp_path / "hung", LIMIT_S + 5)):
        for beat in read_beats(folder).values():
            assert idle_s <= beat.idle_at_beat < idle_s + 60, (folder.name, beat)
            assert abs(beat.beat_at - (wall() + step_s)) < 60, beat


def a_verdict(ranks=(0,)) -> hangs.Verdict:
    return hangs.Verdict(rank=0, node="n1", pid=os.getpid(), step=5, phase="step",
                         idle_s=LIMIT_S + 1, limit_s=LIMIT_S, why="it has gone longest",
                         ranks={str(r): {"node": "n1", "step": 5} for r in ranks})


def act_under_the_watcher(folder, monkeypatch, beat_s: float, watcher_signals: bool):
    """Rank 0 acts on a verdict under the batch shell's watcher, with its stacks going to
    its file: (exit code, the naps of its wait, the file). ``watcher_signals``: the
    watcher's SIGQUIT comes while the rank waits for it (else never). No py-spy on the PATH:
    the Python stacks alone; ``os._exit`` raises SystemExit so that the test goes on."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")

    def exit_now(code):
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", exit_now)
    w = Watchdog(folder, 0, "n1", hang_timeout_s=LIMIT_S, dump_stacks=True, device="cpu",
                 init_timeout_s=LIMIT_S, watcher=True, beat_s=beat_s, log=lambda message: None)
    w.start(0)
    real_sleep, naps = time.sleep, []

    def nap(seconds):
        naps.append(seconds)
        if watcher_signals and len(naps) == 1:
            os.kill(os.getpid(), watchdog.DUMP_SIGNAL)
        real_sleep(seconds)

    monkeypatch.setattr(watchdog.time, "sleep", nap)
    try:
        with pytest.raises(SystemExit) as ended:
            w._act(a_verdict())
    finally:
        monkeypatch.undo()
        w.stop()
    return ended.value.code, naps, hangs.stacks_path(folder, 0).read_text()


def test_under_the_watcher_a_rank_waits_for_the_watchers_dump_instead_of_writing_its_own(
        tmp_path, monkeypatch):
    """The watcher's SIGQUIT makes faulthandler dump this rank's stacks: the rank waits for
    that dump (a few beats) rather than writing a second one of its own, then marks its file
    complete and exits with the hang's code."""
    code, naps, text = act_under_the_watcher(tmp_path, monkeypatch, 60.0, watcher_signals=True)
    assert code == exit_codes.HUNG and naps
    assert "most recent call first" in text                    # faulthandler's dump
    assert "Python stacks" not in text, text                    # and not the rank's own
    # of every thread: the main one and the watchdog's at least
    assert text.count("Thread 0x") + text.count("Current thread 0x") >= 2, text
    assert text.endswith(f"{END_OF_STACKS} 0\n")


def test_when_the_watchers_signal_never_comes_the_rank_dumps_its_own_stacks(tmp_path,
                                                                            monkeypatch):
    """A watcher gone with its node: the rank waits its three beats for the SIGQUIT, then
    writes its own stacks rather than exiting without any."""
    code, naps, text = act_under_the_watcher(tmp_path, monkeypatch, 1.0, watcher_signals=False)
    assert code == exit_codes.HUNG and naps                    # it waited for the watcher
    assert "rank 0 on n1" in text and ": Python stacks" in text, text
    assert "most recent call first" in text and text.endswith(f"{END_OF_STACKS} 0\n")


def test_a_rank_waits_for_its_peers_stacks_before_it_exits(tmp_path, clock):
    """The first rank to exit makes srun end the others: it waits until every rank of the
    verdict has marked its stacks complete, and no longer than ``PEERS_WAIT_S`` (on the
    watchdog's clock, which only its naps move: the wait's length is what the rank did, not
    how fast this machine went)."""
    w = Watchdog(tmp_path, 0, "n1", hang_timeout_s=LIMIT_S, dump_stacks=False, device="cpu",
                 init_timeout_s=LIMIT_S, watcher=False, beat_s=3600)
    hangs.stacks_path(tmp_path, 0).write_text(f"rank 0 stacks\n{END_OF_STACKS} 0\n")
    hangs.stacks_path(tmp_path, 1).write_text("rank 1 stacks, still being written\n")
    nap = clock.sleep

    def nap_while_rank_1_finishes(seconds):
        nap(seconds)
        if len(clock.naps) == 1:       # rank 1 finishes its dump while rank 0 waits
            with hangs.stacks_path(tmp_path, 1).open("a") as f:
                f.write(f"{END_OF_STACKS} 1\n")

    clock.sleep = nap_while_rank_1_finishes
    w._wait_for_peers_stacks(a_verdict(ranks=(0, 1)))
    assert len(clock.naps) == 1
    # a peer that never dumps (its process is gone) is waited for until the bound, not forever
    clock.naps.clear()
    w._wait_for_peers_stacks(a_verdict(ranks=(0, 1, 2)))
    waited = sum(clock.naps)
    assert len(clock.naps) > 1
    assert watchdog.PEERS_WAIT_S <= waited < watchdog.PEERS_WAIT_S + max(clock.naps), clock.naps


def test_a_resumed_rank_keeps_the_start_up_limit_until_its_first_step(tmp_path):
    """A resumed attempt starts at its checkpoint's step: until it completes one more, its
    limit is the start-up's (``train.init_timeout_s``: communicators, the checkpoint's load),
    not the hang limit of a rank in mid-run."""
    w = Watchdog(tmp_path, 0, "n1", hang_timeout_s=LIMIT_S, dump_stacks=False, device="cpu",
                 init_timeout_s=600, watcher=False, beat_s=3600)
    w.dir.mkdir(parents=True, exist_ok=True)
    w.start_step = w.step = 100
    assert w.limit_s == 600
    w.step_done(101, 0.5)
    assert w.limit_s == LIMIT_S
    # a fresh run, from step 0 or from no step known, alike
    for start in (0, None):
        fresh = Watchdog(tmp_path / f"fresh-{start}", 0, "n1", hang_timeout_s=LIMIT_S,
                         dump_stacks=False, device="cpu", init_timeout_s=600, watcher=False,
                         beat_s=3600)
        fresh.start(start)
        try:
            assert fresh.limit_s == 600
            fresh.step_done(1, 0.5)
            assert fresh.limit_s == LIMIT_S, start
        finally:
            fresh.stop()


def test_a_beat_names_the_main_threads_two_innermost_frames():
    """The side thread's beat says where the main thread is: here, parked in an event's
    wait, as a rank's main thread parks in a collective."""
    seen, parked = [], threading.Event()

    def side():
        for _ in range(3000):          # until the main thread is in the wait below
            where = watchdog.main_thread_where()
            if where and where.startswith("wait (threading.py:"):
                seen.append(where)
                break
            time.sleep(0.01)
        parked.set()

    helper = threading.Thread(target=side)
    helper.start()
    parked.wait(timeout=60)
    helper.join()
    frames = seen[0].split(" <- ")
    assert len(frames) == 2 and all(f.startswith("wait (threading.py:") for f in frames), seen


def process_state(pid: int) -> str:
    """The process's state letter in /proc (T: stopped)."""
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]


def test_a_rank_deciding_alone_wakes_every_stopped_rank_on_its_node(tmp_path, monkeypatch):
    """Without a watcher, rank 1 decides the hang: the stopped ranks on its node, below and
    above it, get SIGCONT (and would get SIGQUIT for their stacks: ``dump_stacks`` is off
    here, as the stand-ins are plain processes), so they run, see the verdict and exit; a
    rank on another node is its own node's business."""
    import subprocess
    monkeypatch.delenv(WATCHER_ENV, raising=False)
    folder = tmp_path / "attempt"
    stopped = {rank: subprocess.Popen(["sleep", "60"]) for rank in (0, 2, 3)}
    try:
        for p in stopped.values():
            os.kill(p.pid, signal.SIGSTOP)
        for rank, p in stopped.items():
            write_beat(folder, Beat(
                rank=rank, node="n9" if rank == 3 else "n1", pid=p.pid, step=5, start_step=0,
                phase="step", progress_at=time.time() - 200, beat_at=time.time() - 100,
                limit_s=LIMIT_S))
        decider = Watchdog(folder, 1, "n1", hang_timeout_s=LIMIT_S, dump_stacks=False,
                           device="cpu", init_timeout_s=LIMIT_S)    # silent after 15 s
        decider.start_step, decider.step, decider.phase = 0, 5, "step"
        decider._progress_tick = time.monotonic() - LIMIT_S - 5
        decider._beat()
        # this rank has seen the stopped ranks' beats unchanged for 100 s
        decider._monitor.update(read_beats(folder), time.monotonic() - 100)
        verdict = decider._decide()
        assert verdict is not None and verdict.rank in (0, 2, 3) and verdict.silent_s
        assert process_state(stopped[0].pid) != "T" and process_state(stopped[2].pid) != "T"
        assert process_state(stopped[3].pid) == "T"
    finally:
        for p in stopped.values():
            p.kill()
            p.wait()
