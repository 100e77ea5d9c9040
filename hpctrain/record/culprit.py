"""Which rank caused a failed attempt: the one that died first, not the peers that noticed.

One rank's death makes every peer fail a moment later, often *before* the dead rank's own
story is known: a rank killed by SIGKILL or the OOM killer writes nothing, while each survivor
writes ``failure-rank-R.json`` with "Connection closed by peer" or an aborted collective. The
earliest record is then a survivor's. So the evidence is sorted into two kinds:

* a rank that died on its own: killed by a signal (srun's ``task 3: Killed``, ``Out Of
  Memory``, ``Segmentation fault``: the batch shell's view of the step), a rank whose own
  error is not about a peer, a rank whose node Slurm no longer hears from;
* a rank that failed because a peer vanished: its message says so (connection closed or
  reset, broken pipe, an aborted or timed-out collective).

The first of the first kind is the culprit; only when there is none is the first of the second
kind named. A rank killed by a signal left no time of its own: its last heartbeat
(``health.heartbeat``) stands for it, when it was last known alive. Heartbeats come every few
seconds, too coarse to order ranks killed one after the other, so among those srun's order
decides (it reports each task as its node's slurmstepd sees it end). Only signals srun reports
before any task exited with an error code count: after that, srun is tearing the step down
(SIGTERM, then SIGKILL after KillWait) and a killed task is its doing. A node Slurm reports
not responding names its lowest rank, unless srun reported a task there killed: then that
node answered (a loaded node's slurmd is often late for a moment) and the kill is the cause.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .attempt_records import FailureRecord

# What a rank says when the failure is a peer's: gloo ("Connection closed by peer",
# "Connection reset by peer", "Broken pipe"), NCCL ("NCCL communicator was aborted",
# "remote process exited"), torch ("ProcessGroup ... aborted", a watchdog "timed out").
PEER_VANISHED = re.compile(
    r"connection (closed|reset|refused)|broken pipe|closed by peer|reset by peer|"
    r"remote process|peer (closed|disconnected|exited)|\babort(ed)?\b|communicator was aborted|"
    r"timed? ?out|timeout|socket", re.I)

# srun's words for a task ended by a signal the step did not send: the rank died on its own.
# ("Terminated" is what srun's own --kill-on-bad-exit sends to the survivors.)
TEARDOWN_SIGNALS = {"Terminated"}

BEAT_S = 5.0    # how often a rank's heartbeat is written (runtime.watchdog.BEAT_S)


@dataclass(frozen=True)
class Culprit:
    rank: int | None
    node: str | None
    time: float | None
    message: str
    cause: str          # "signal", "node", "error" (its own), "peer" (a peer vanished)

    def failure(self) -> FailureRecord:
        return FailureRecord(rank=self.rank, node=self.node, time=self.time,
                             message=self.message, extra={"cause": self.cause})


def peer_vanished(message: str | None) -> bool:
    return bool(message) and bool(PEER_VANISHED.search(message))


def task_ranks(tasks: str) -> list[int]:
    """srun's task list (``3``, ``0-1``, ``1,3``) -> ranks."""
    out: list[int] = []
    for part in str(tasks).split(","):
        lo, _, hi = part.partition("-")
        try:
            out.extend(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            continue
    return out


def culprit(failures: list[FailureRecord], task_exits: list[dict],
            last_beats: dict[int, tuple[str, float]], silent_nodes: dict[str, str] | None = None,
            beat_s: float = BEAT_S) -> Culprit | None:
    """The rank that failed first on its own, else the first that failed at all.

    ``failures``: the ranks' own records; ``task_exits``: srun's per-task exit lines in order
    (``commands.parse_srun_task_exits``); ``last_beats``: rank -> (node, time of its last
    heartbeat); ``silent_nodes``: node -> Slurm's state, for the step's nodes Slurm no longer
    hears from (down, not responding). A silent node's ranks were alive at their last beat and
    may have been up to ``beat_s`` later: the node is placed at the latest, so that a rank's own
    error written in that gap (its node's ranks then torn down before their next beat) is not
    outweighed by a node that was only late to answer.
    """
    said = {f.rank: f for f in failures if f.rank is not None}
    own: list[Culprit] = []
    echoes: list[Culprit] = []
    for f in failures:
        if not isinstance(f.time, (int, float)):
            continue
        c = Culprit(f.rank, f.node, f.time, f.message or "", "error")
        if peer_vanished(f.message):
            echoes.append(Culprit(f.rank, f.node, f.time, f.message or "", "peer"))
        else:
            own.append(c)
    killed = []   # srun's order is the order the tasks died in: the first one counts
    for t in task_exits:
        if t.get("exit_code"):
            break   # a task exited on its error: srun tears the rest down, KILL after KillWait
        sig = t.get("signal")
        if not sig or sig in TEARDOWN_SIGNALS:
            continue
        for rank in task_ranks(t.get("tasks", "")):
            if rank in said and not peer_vanished(said[rank].message):
                continue   # its own record says more
            node, at = last_beats.get(rank, (t.get("node"), None))
            killed.append(Culprit(rank, t.get("node") or node, at,
                                  f"ended by a signal: {sig} (as srun saw it)", "signal"))
    if killed:
        own.append(killed[0])
    explained = {c.node for c in killed}
    for node, state in (silent_nodes or {}).items():
        if node in explained:
            continue   # its slurmstepd reported a task killed: the node answered, the task died
        ranks = sorted(r for r, (n, _) in last_beats.items() if n == node)
        # one candidate per node: its lowest rank, as of the last beat any of its ranks wrote
        seen = [last_beats[r][1] for r in ranks if last_beats[r][1] is not None]
        own.append(Culprit(ranks[0] if ranks else None, node,
                           max(seen) + beat_s if seen else None,
                           f"its node {node} stopped responding (Slurm: {state})", "node"))
    for pool in (own, echoes):
        if pool:
            inf = float("inf")
            return min(pool, key=lambda c: (c.time if c.time is not None else inf,
                                            c.rank if c.rank is not None else 1 << 30))
    return None
