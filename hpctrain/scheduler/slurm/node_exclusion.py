"""Which bad nodes a requeue may leave out without leaving the job unschedulable.

A requeue leaves a bad node out by adding it to the job's exclude list (``ExcNodeList``). If
the partition is then left with fewer usable nodes than the job needs, Slurm keeps the job
pending forever and says only ``ReqNodeNotAvail``. So before excluding, the partition's nodes
are counted: its ``Nodes=`` (``scontrol show partition``) less the nodes that cannot take a
job (down, drained or draining, failed, not responding, future) less the exclude list the job
would have. Bad nodes are excluded in the order they were reported while enough usable nodes
remain; the rest are kept in, and the plan says which and why. A job that lands on a bad node
again is caught again (the gate or the watcher) and uses up its requeue budget; a job that
never starts is worse.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from . import commands

# Base states and flags of ``scontrol show node``'s State= (``IDLE+DRAIN``, ``MIXED+DRAIN``,
# ``DOWN*``: "*" is not responding) on which Slurm starts no new job.
UNUSABLE_STATE_PARTS = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING",
                                  "FUTURE", "NOT_RESPONDING", "INVALID_REG", "INVAL"})


def node_usable(state: str) -> bool:
    """Whether a node in ``state`` (scontrol's State=) can start a job."""
    if "*" in state:
        return False
    return not any(part in UNUSABLE_STATE_PARTS for part in state.upper().split("+"))


def job_node_count(info: dict) -> int | None:
    """The job's (minimum) node count from ``scontrol show job``'s ``NumNodes`` (``3`` or ``3-4``)."""
    m = re.match(r"\d+", info.get("NumNodes", ""))
    return int(m.group()) if m else None


@dataclass
class ExclusionPlan:
    exclude: list[str]                       # bad nodes to add to the exclude list
    not_excluded: list[str] = field(default_factory=list)
    note: str | None = None                  # why some bad nodes stay in
    usable_left: int | None = None           # the partition's usable nodes left to the job


def plan_exclusion(bad: list[str], already_excluded: list[str], usable: set[str], needed: int,
                   partition: str) -> ExclusionPlan:
    """Exclude ``bad`` nodes in their order while the partition keeps ``needed`` usable nodes.

    A bad node that is not usable anyway (down, drained, already excluded, not in the
    partition) costs nothing to exclude and always is."""
    available = set(usable) - set(already_excluded)
    exclude, kept = [], []
    for node in dict.fromkeys(bad):
        if node not in available:
            exclude.append(node)
        elif len(available) - 1 >= needed:
            available.discard(node)
            exclude.append(node)
        else:
            kept.append(node)
    note = None
    if kept:
        left = len(available) - 1        # what excluding the first kept node would leave
        note = (f"not excluding {', '.join(kept)}: the partition {partition} would have "
                f"{left} usable node{'' if left == 1 else 's'} and the job needs {needed}")
    return ExclusionPlan(exclude, kept, note, usable_left=len(available))


def nodes_to_ask(asked: int, least: int, usable_left: int | None) -> int:
    """How many nodes a requeued job holding spares asks for: as many as it asked (N + S)
    while the partition has them besides the excluded nodes, fewer spares when it has not,
    never fewer than ``least`` (N, the nodes it trains on): a job that gave up its spares
    still starts, one that asks for more nodes than remain never would."""
    if usable_left is None:
        return asked
    return max(least, min(asked, usable_left))


def usable_partition_nodes(partition: str) -> set[str]:
    """The partition's nodes that can start a job now (reads ``scontrol``; raises on failure)."""
    hostlist = commands.partition_hostlist(partition)
    if not hostlist:
        return set()
    states = commands.node_states(hostlist)
    return {n for n in commands.expand_hostlist(hostlist) if node_usable(states.get(n, "DOWN"))}


def exclusion_that_fits(info: dict, bad: list[str], already_excluded: list[str],
                        usable_in: Callable[[str], set[str]] = usable_partition_nodes,
                        needed: int | None = None) -> ExclusionPlan:
    """The plan for a job (``info``: its ``scontrol show job`` record). With several partitions
    the job can start in any of them: the one that lets the most bad nodes out is used.
    ``usable_in(partition)``: its usable nodes (``scontrol`` by default); ``needed``: the
    fewest nodes the job can start on (default: its ``NumNodes``; a job with spare nodes can
    give them up, see :func:`nodes_to_ask`).
    Raises when the job's node count or partitions cannot be read."""
    needed = needed if needed is not None else job_node_count(info)
    partitions = [p for p in info.get("Partition", "").split(",") if p]
    if needed is None or not partitions:
        raise ValueError("the job's NumNodes or Partition is missing from `scontrol show job`")
    plans = [plan_exclusion(bad, already_excluded, usable_in(p), needed, p)
             for p in partitions]
    return max(plans, key=lambda plan: len(plan.exclude))   # first of the best on a tie
