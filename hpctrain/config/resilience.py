"""``resilience``: recovery inside the job's own allocation (hot spare nodes, in-job restart).

Both the cluster profile and the job may set it; a job's value wins over its profile's (a
profile says what a cluster's jobs usually hold in reserve, a job that it needs more or none).
What the batch shell does with it is :mod:`hpctrain.scheduler.slurm.in_job_restart`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import doc

MAX_SPARE_NODES = 1024
MAX_IN_JOB_RESTARTS = 1000
DEFAULT_WITH_SPARES = 2


@dataclass(kw_only=True)
class ResilienceSection:
    spare_nodes: int = doc("Nodes the job holds beyond slurm.nodes as hot spares: it asks Slurm "
                           "for nodes + spare_nodes (with --no-kill, so a failing node does not "
                           "end the allocation), trains on slurm.nodes and, when a step ends "
                           "abnormally, restarts on a quick-checked spare in place of the "
                           "culprit node without going back through the queue. 0: no "
                           "spares; with max_in_job_restarts set, a crashed rank whose node "
                           "is still healthy restarts in place once.",
                           default=0, at_least=0, at_most=MAX_SPARE_NODES)
    max_in_job_restarts: int | None = doc(
        "Restarts inside one allocation before falling back to the requeue path (within "
        "preemption.max_requeues); 0: every failure goes through the queue. null: "
        f"{DEFAULT_WITH_SPARES} with spare nodes, 0 without (set it to 1 or more without spares "
        "to restart a crashed rank in place once when its node is still healthy).",
        default=None, at_least=0, at_most=MAX_IN_JOB_RESTARTS)


@dataclass(kw_only=True)
class JobResilienceSection:
    spare_nodes: int | None = doc("The job's own resilience.spare_nodes (null: the profile's).",
                                  default=None, at_least=0, at_most=MAX_SPARE_NODES)
    max_in_job_restarts: int | None = doc("The job's own resilience.max_in_job_restarts (null: "
                                          "the profile's).", default=None, at_least=0,
                                          at_most=MAX_IN_JOB_RESTARTS)


def effective(job, profile) -> ResilienceSection:
    """The profile's ``resilience`` with the job's values, where it sets them, in their place,
    and ``max_in_job_restarts`` resolved: a job without spares and without its own setting
    behaves as before in-job restarts existed (every failure takes the requeue path)."""
    base = profile.resilience
    own = getattr(job, "resilience", None) if job is not None else None
    pick = (lambda name: getattr(own, name) if own is not None and getattr(own, name) is not None
            else getattr(base, name))
    spares = pick("spare_nodes")
    restarts = pick("max_in_job_restarts")
    if restarts is None:
        restarts = DEFAULT_WITH_SPARES if spares > 0 else 0
    return ResilienceSection(spare_nodes=spares, max_in_job_restarts=restarts)
