"""Recovery inside the allocation: when a training step ends abnormally, restart it on healthy
nodes of the same job instead of going back through the queue.

The batch shell already outlives every training step (``batch_steps end``); with
``resilience.spare_nodes: S`` the job holds N + S nodes (``--no-kill``: a failing node leaves
the allocation instead of ending it) and trains on N. When a step ends because a rank crashed
or was killed, hung (the hang watcher), or its node was named a straggler, ``batch_steps end``
asks :func:`plan` here, before it writes the ledger record:

1. the culprit node(s): the node of the rank that failed first (``record.culprit``: a rank
   killed outright, not a peer that noticed), the hung rank's, the straggler's, and any of the
   step's nodes Slurm no longer hears from;
2. replacements: the allocation's nodes that are in no step, were not excluded before, and
   that Slurm calls usable. Without spares (S = 0) a crashed rank whose node is still usable
   restarts in place, once per allocation;
3. time: the job's end must leave the restart's cost (the last in-job restart measured:
   ``record.attempt_end.newest_recovery_s``, else ``DEFAULT_RESTART_S``) plus
   ``preemption.lead_time_s`` for the emergency save; a preemption signal already received,
   or the restart budget spent (it counts the restarts of this allocation), sends the job
   down the requeue path.

Then (:func:`stop_old_step`, :func:`quick_check`) every task step of the job must be gone
(killed if it lingers: no process of the old step survives into the new one) and each
replacement passes preflight's node check (``python -m hpctrain.preflight.node_check``: GPUs visible and
healthy, InfiniBand, NCCL environment, storage, software) in a one-task step on it. Only then is
the restart recorded and a new attempt of the same job begun on the new node list, resuming
from the newest verified checkpoint as a requeued attempt would.

Why not nvidia-resiliency-ext's in-job restart (``inprocess``/``fault_tolerance``): it keeps
the ranks' processes (or a launcher around them) alive and restarts inside them, with its own
rendezvous and its own heartbeat service; hpctrain's ranks are plain ``srun`` tasks whose
health the batch shell already watches, so a new ``srun`` step on Slurm's own node list is
the smaller change, and the new step is a fresh process world that no state of the failed one
can leak into.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from ...exit_codes import ExitReason
from .node_exclusion import node_usable

# What a restart is assumed to cost before one was measured (the ranks' start-up, the
# checkpoint load, the first step): the time guard's estimate.
DEFAULT_RESTART_S = 120.0
STEP_GONE_WAIT_S = 60.0
LOST_STEP_GRACE_S = 5.0     # after the kill, for the answering nodes' tasks to be gone
RESTART_REASONS = (ExitReason.FAILED, ExitReason.KILLED, ExitReason.HUNG, ExitReason.STRAGGLER)
IN_PLACE_REASONS = (ExitReason.FAILED, ExitReason.KILLED)


@dataclass
class RestartPlan:
    """The new step's nodes and why they changed."""

    nodes: list[str]                 # the N nodes the next step trains on
    excluded: list[str]              # culprit nodes left out of it
    why: str                         # what the culprit did
    spares: list[str] = field(default_factory=list)   # brought in for the excluded
    in_place: bool = False           # same nodes (no spares, node healthy)

    def to_dict(self) -> dict:
        return {"nodes": self.nodes, "excluded": self.excluded, "why": self.why,
                "spares": self.spares, "in_place": self.in_place}

    def describe(self) -> str:
        if self.in_place:
            return f"restart in place on {', '.join(self.nodes)} ({self.why})"
        swap = ", ".join(f"{a} -> {b}" for a, b in zip(self.excluded, self.spares))
        return f"restart in the allocation on {', '.join(self.nodes)} ({swap}: {self.why})"


def restarts_in_job(ledger: list, job_id: str | None) -> list[dict]:
    """The in-job restarts already made in this allocation of ``job_id`` (the ledger records
    since the job last started from the queue that restarted inside it).

    A requeue keeps the job's id, so the walk stops at the newest requeued record: that
    attempt ended the allocation before this one, and the restarts it and its predecessors
    made were that allocation's (an attempt begun by a restart and then requeued among them:
    its budget was spent there, not here)."""
    found = []
    for r in reversed(ledger):
        if r.job_id != job_id or r.requeued:
            break
        if r.in_job_restart:
            found.append(r.in_job_restart)
    return found


def culprit_nodes(reason, first_failure: dict | None, excluded: list[str] | None,
                  silent_nodes: dict | None, step_nodes: list[str],
                  answered: set[str] | frozenset = frozenset()) -> tuple[list[str], str]:
    """The step's nodes to leave out, and why, in words. A node Slurm reported silent after
    the step counts only when srun did not hear from its tasks either (``answered``: the
    nodes of srun's task exits): a loaded node's slurmd is often late for a moment, and its
    ranks are not why the step failed."""
    nodes, why = [], []
    if excluded:
        nodes += excluded
        why.append("hung rank" if reason == ExitReason.HUNG else
                   "straggler node" if reason == ExitReason.STRAGGLER else "excluded")
    elif first_failure and first_failure.get("node"):
        nodes.append(first_failure["node"])
        msg = first_failure.get("message") or "failed"
        why.append(f"rank {first_failure.get('rank')} failed first: {msg}")
    for node, state in (silent_nodes or {}).items():
        if node in step_nodes and node not in answered:   # blamed already: one more reason
            if node not in nodes:
                nodes.append(node)
            why.append(f"{node} not responding ({state})")
    return [n for n in dict.fromkeys(nodes) if n in step_nodes], "; ".join(why)


def plan(*, reason, spare_nodes: int, max_restarts: int, done: list[dict],
         culprits: list[str], why: str, step_nodes: list[str], allocation: list[str],
         states: dict[str, str], time_left_s: float | None, lead_time_s: float,
         restart_cost_s: float | None, preempting: bool) -> tuple[RestartPlan | None, str]:
    """A restart inside the allocation, or None and why not (the requeue path then decides).

    ``done``: this allocation's earlier restarts (their plans); ``states``: Slurm's state of
    each of the allocation's nodes; ``time_left_s``: until the job's end (None: unknown)."""
    if reason not in RESTART_REASONS:
        return None, f"ended with '{reason}'"
    if preempting:
        return None, "a preemption signal came: the emergency save and requeue go first"
    if max_restarts <= 0:
        return None, "resilience.max_in_job_restarts is 0"
    if len(done) >= max_restarts:
        return None, (f"in-job restart budget spent ({len(done)} of "
                      f"resilience.max_in_job_restarts={max_restarts})")
    cost = restart_cost_s if restart_cost_s is not None else DEFAULT_RESTART_S
    if time_left_s is not None and time_left_s < cost + lead_time_s:
        return None, (f"{time_left_s:.0f} s left before the job's end: a restart ({cost:.0f} s) "
                      f"and the emergency save's preemption.lead_time_s ({lead_time_s:.0f} s) "
                      "do not fit")
    if not culprits:
        return None, "no node to blame for the failure"
    if spare_nodes <= 0:
        if reason not in IN_PLACE_REASONS:
            return None, f"a {why.split(':')[0]} needs a spare node and the job has none"
        if any(d.get("in_place") for d in done):
            return None, "already restarted in place once in this allocation"
        sick = [n for n in culprits if not node_usable(states.get(n, "DOWN"))]
        if sick:
            return None, "not healthy: " + ", ".join(
                f"{n} ({states.get(n, 'unknown to Slurm')})" for n in sick)
        return RestartPlan(list(step_nodes), [], why, in_place=True), "healthy node"
    excluded_before = {n for d in done for n in d.get("excluded", [])}
    spares = [n for n in allocation if n not in step_nodes and n not in excluded_before
              and n not in culprits and node_usable(states.get(n, "DOWN"))]
    if len(spares) < len(culprits):
        return None, (f"no healthy spare left for {', '.join(culprits)} "
                      f"({len(spares)} of resilience.spare_nodes={spare_nodes} usable)")
    chosen = spares[:len(culprits)]
    swap = dict(zip(culprits, chosen))
    nodes = [swap.get(n, n) for n in step_nodes]
    return RestartPlan(nodes, list(culprits), why, chosen), "spare"


def stop_old_step(job_id: str, *, lost: set[str] | frozenset = frozenset(),
                  wait_s: float = STEP_GONE_WAIT_S, steps=None, kill=None,
                  sleep=time.sleep, clock=time.monotonic) -> tuple[bool, list[str]]:
    """Wait until none of the job's task steps runs (srun returned; slurmstepd may still be
    tearing it down), killing what lingers half-way. Returns (True, []) when none is left.

    A step that spans a node Slurm lost (``lost``: it left the allocation, or Slurm no longer
    hears from it) cannot end until that node answers again, which may be never. Once killed
    (its processes on the nodes that answer are signalled by their slurmd) and given
    ``LOST_STEP_GRACE_S``, such steps are left to Slurm: (True, their ids); the new steps
    then share their resources (``srun --overlap``), which Slurm still counts as theirs. The
    processes on the lost node cannot reach the new step: it has a new rendezvous."""
    from . import commands
    steps = steps or (lambda: commands.job_step_nodes(job_id))
    kill = kill or (lambda ids: commands.cancel(ids, signal="KILL"))
    deadline = clock() + wait_s
    killed_at = None
    while True:
        left = steps()
        if not left:
            return True, []
        if killed_at is not None and clock() - killed_at >= LOST_STEP_GRACE_S and \
                all(set(nodes) & set(lost) for nodes in left.values()):
            return True, sorted(left)
        if clock() >= deadline:
            return False, sorted(left)
        if killed_at is None and (clock() >= deadline - wait_s / 2 or
                                  any(set(nodes) & set(lost) for nodes in left.values())):
            try:
                kill(sorted(left))
            except Exception as e:  # noqa: BLE001 - the wait decides
                print(f"[hpctrain] killing the old step {sorted(left)} failed: {e}",
                      file=sys.stderr)
            killed_at = clock()
        sleep(1.0)


def quick_check(run_dir: str, nodes: list[str], python: str, timeout_s: float,
                overlap: bool = False) -> tuple[bool, str]:
    """Preflight's node check on each of ``nodes``, one task per node in a step of this job
    (``overlap``: beside an old step left to Slurm, see :func:`stop_old_step`)."""
    if not nodes:
        return True, ""
    env = dict(os.environ, HPCTRAIN_BATCH_HOST=socket.gethostname())
    argv = ["srun", "--kill-on-bad-exit=0", f"--nodes={len(nodes)}", "--ntasks-per-node=1",
            f"--ntasks={len(nodes)}"] + (["--overlap"] if overlap else []) + [
            f"--nodelist={','.join(nodes)}", python, "-m", "hpctrain.preflight.node_check", run_dir]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return False, f"the node check on {', '.join(nodes)} did not end within {timeout_s:.0f} s"
    except OSError as e:
        return False, f"the node check could not start: {e}"
    out = (proc.stdout + proc.stderr).strip()
    return proc.returncode == 0, out[-2000:]
