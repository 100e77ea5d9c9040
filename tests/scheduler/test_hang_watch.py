"""The batch shell's hang watcher, driven by a fake clock over real heartbeat files: it waits
while any rank progresses, then claims the verdict, has every rank dump its stacks (SIGQUIT)
and stopped ranks continue (SIGCONT), and kills the step only if the ranks do not exit."""

from __future__ import annotations

from hpctrain.health.hang import read_verdict
from hpctrain.health.heartbeat import Beat, write_beat
from hpctrain.record.attempt_end import finish_attempt, hang_details
from hpctrain.scheduler.slurm import hang_watch
from tests.runtime.helpers import job_mapping, make_run


class Cluster:
    """Four ranks on n1/n2 writing heartbeats; rank 3 is stopped at t=20, the others block
    at t=25 (they keep beating, without progress). Ranks exit once told, unless stubborn."""

    def __init__(self, folder, stubborn: bool = False) -> None:
        self.folder, self.stubborn = folder, stubborn
        self.t, self.signals, self.killed, self.exited = 0.0, [], False, False

    def sleep(self, s: float) -> None:
        self.t += s
        assert self.t < 3600, "the watch never ended"
        for r in range(4):
            if r == 3 and self.t > 20:
                continue
            progress = min(self.t, 25.0 if r < 3 else 20.0)
            write_beat(self.folder, Beat(rank=r, node=f"n{1 + r // 2}", pid=100 + r,
                                         step=int(progress // 2), start_step=0, phase="step",
                                         progress_at=progress, beat_at=self.t, limit_s=30.0))

    def clock(self) -> float:
        return self.t

    def alive(self, pid: int) -> bool:
        return not (self.exited or self.killed)

    def signal(self, sig: str) -> None:
        self.signals.append((round(self.t), sig))
        if sig == "CONT" and not self.stubborn:
            self.exited = True

    def kill(self) -> None:
        self.killed = True


def watch(tmp_path, cluster=None, stubborn=False, cluster_class=None, exit_wait_s=None,
          **health):
    run = make_run(tmp_path, "run", job_mapping(tmp_path / "data", steps=100,
                                                health={"hang_timeout_s": 30, **health}),
                   world=4)
    run.begin_attempt()
    cluster = (cluster_class or Cluster)(run.attempt_dir(1), stubborn)
    verdict = hang_watch.watch(run, 1, "77", srun_pid=1, clock=cluster.clock, sleep=cluster.sleep,
                               is_alive=cluster.alive, signal_steps=cluster.signal,
                               kill_steps=cluster.kill,
                               exit_wait_s=exit_wait_s or hang_watch.EXIT_WAIT_S)
    return run, cluster, verdict


def test_the_stopped_rank_is_named_its_peers_dump_and_the_ranks_exit(tmp_path):
    run, cluster, verdict = watch(tmp_path)
    # no rank made progress since t=25: hung once that is 30 s old; rank 3 is silent
    assert 55 <= cluster.t <= 60, cluster.t
    assert (verdict.rank, verdict.node, verdict.step) == (3, "n2", 10)
    assert verdict.decided_by == "batch shell"
    assert verdict.stacks == "logs/attempt-1/stacks-rank-*.txt"
    assert [s for _, s in cluster.signals] == ["QUIT", "CONT"] and not cluster.killed
    assert read_verdict(run.attempt_dir(1)).message == verdict.message
    (event,) = [e for e in run.events() if e.get("event") == "hang"]
    assert event["rank"] == 3 and event["node"] == "n2"
    # the end step's record: hung, rank 3 on n2 first, its node left out, the steps seen
    record, decision = finish_attempt(run, 1, 137, scheduler="slurm", job_id="77",
                                      **hang_details(verdict))
    assert record.exit_reason == "hung" and record.excluded_nodes == ["n2"]
    assert (record.start_step, record.end_step) == (0, 12)
    assert record.first_failure["rank"] == 3 and record.message == verdict.message
    assert decision.requeue


def test_ranks_that_do_not_exit_are_killed(tmp_path):
    _, cluster, verdict = watch(tmp_path, stubborn=True)
    assert verdict.rank == 3 and cluster.killed
    # killed once the ranks had EXIT_WAIT_S to exit after the signals, not before nor later
    assert cluster.t - cluster.signals[-1][0] == hang_watch.EXIT_WAIT_S


def test_a_wait_for_the_ranks_that_the_clock_steps_past_still_ends(tmp_path):
    _, cluster, verdict = watch(tmp_path, stubborn=True, exit_wait_s=29.8)
    assert verdict.rank == 3 and cluster.killed
    assert cluster.t - cluster.signals[-1][0] == 30.0         # the first look past 29.8 s


def test_a_hang_under_the_local_executor_is_recorded_but_not_requeued(tmp_path):
    run, _, verdict = watch(tmp_path)
    record, decision = finish_attempt(run, 1, 5, scheduler="local", refuse_requeue="no other "
                                      "node to move to", **hang_details(verdict))
    assert record.exit_reason == "hung" and not decision.requeue
    assert decision.reason == "hung; not requeued: no other node to move to"


class EndingCluster(Cluster):
    """Ranks that keep training and whose step ends by itself at t=40."""

    def sleep(self, s: float) -> None:
        self.t += s
        for r in range(4):
            write_beat(self.folder, Beat(rank=r, node=f"n{1 + r // 2}", pid=100 + r,
                                         step=int(self.t), start_step=0, phase="step",
                                         progress_at=self.t, beat_at=self.t, limit_s=30.0))

    def alive(self, pid: int) -> bool:
        return self.t < 40


def test_a_step_that_ends_without_a_hang_is_left_alone(tmp_path):
    run, cluster, verdict = watch(tmp_path, cluster_class=EndingCluster)
    assert verdict is None and cluster.signals == [] and not cluster.killed
    assert read_verdict(run.attempt_dir(1)) is None
    assert not [e for e in run.events() if e.get("event") == "hang"]
    assert 40 <= cluster.t < 40 + hang_watch.POLL_S


class RankDecidedCluster(Cluster):
    """A rank's own watchdog claims a verdict at t=10, before any rank is idle for the limit."""

    def sleep(self, s: float) -> None:
        super().sleep(s)
        if self.t >= 10 and read_verdict(self.folder) is None:
            from hpctrain.health.hang import Verdict, claim_verdict
            claim_verdict(self.folder, Verdict(rank=1, node="n1", pid=101, step=5, phase="step",
                                               idle_s=31.0, limit_s=30.0, why="it is behind",
                                               decided_by="rank 0", stacks="elsewhere/*.txt"))


def test_a_verdict_a_rank_claimed_first_stands_and_the_watcher_acts_on_it(tmp_path):
    run, cluster, verdict = watch(tmp_path, cluster_class=RankDecidedCluster)
    assert 10 <= cluster.t < 10 + 2 * hang_watch.POLL_S      # at its next look, not the limit
    assert (verdict.rank, verdict.decided_by, verdict.stacks) == (1, "rank 0", "elsewhere/*.txt")
    assert [s for _, s in cluster.signals] == ["QUIT", "CONT"]
    (event,) = [e for e in run.events() if e.get("event") == "hang"]
    assert event["rank"] == 1 and event["message"] == verdict.message


def test_without_stack_dumps_the_ranks_only_continue(tmp_path):
    _, cluster, verdict = watch(tmp_path, dump_stacks=False)
    assert verdict.rank == 3 and verdict.stacks == ""
    assert [s for _, s in cluster.signals] == ["CONT"]


class RefusingCluster(Cluster):
    """scancel fails for every signal and for the kill: the stubborn step still runs."""

    def signal(self, sig: str) -> None:
        self.signals.append((round(self.t), sig))
        raise RuntimeError(f"scancel --signal {sig}: Invalid job id specified")

    def kill(self) -> None:
        self.killed = True
        raise RuntimeError("scancel --signal KILL: Invalid job id specified")


def test_failing_signals_and_kill_are_said_and_the_watch_still_ends(tmp_path, capsys):
    _, cluster, verdict = watch(tmp_path, cluster_class=RefusingCluster)
    assert verdict.rank == 3 and cluster.killed
    assert [s for _, s in cluster.signals] == ["QUIT", "CONT"]    # CONT tried after QUIT failed
    err = capsys.readouterr().err
    assert "scancel --signal QUIT failed: scancel --signal QUIT: Invalid job id" in err
    assert "killing the step failed: scancel --signal KILL: Invalid job id" in err


def test_a_process_is_alive_until_it_is_reaped():
    import os
    import subprocess
    assert hang_watch.alive(os.getpid())
    child = subprocess.Popen(["true"])
    child.wait()
    assert not hang_watch.alive(child.pid)
