"""Where a run's jobs run, behind one interface: :class:`Backend`.

A profile's ``scheduler`` picks the backend once (:func:`hpctrain.scheduler.choose.backend_for`,
as submitit's ``AutoExecutor`` picks an executor); a run keeps the backend it was created on
(``run.yaml``'s ``scheduler``: :func:`~hpctrain.scheduler.choose.backend_of`). Everything above
asks the backend, never which one it is: to submit a job, to know the state of a run's jobs, to
cancel or requeue them, and what a job's node list is. What a backend can do is said by its
class attributes (``chains``, ``arrays``, ``requeues_in_place``, ...), so a caller refuses a
request the backend cannot serve with the backend's own words.

Two backends implement it: ``slurm`` (:mod:`.slurm.backend`: sbatch scripts rendered from
``sbatch_templates/``, Slurm's commands) and ``local`` (:mod:`.local.backend`: the ranks on this
machine, under submitit's local executor).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..config import ClusterProfile
from ..record.folder import RunFolder

# Slurm's words for a job that still holds or waits for an allocation (the local backend uses
# RUNNING and ENDED only).
ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "COMPLETING",
          "CONFIGURING", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "PREEMPTED"}


@dataclass
class JobState:
    """One job of a run as its backend sees it now."""

    job_id: str
    state: str            # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ... (Slurm's words)
    reason: str = ""
    nodes: str = ""
    elapsed: str = ""
    time_limit: str = ""
    end_time: str = ""
    kind: str = "train"
    start_time: str = ""  # actual start, or Slurm's expected start while pending
    partition: str = ""

    @property
    def active(self) -> bool:
        return self.state.split()[0] in ACTIVE


@dataclass(frozen=True)
class JobRef:
    """A job a run recorded in its ``run.yaml``: which run, which id, what kind of job."""

    run: RunFolder
    job_id: str
    kind: str = "train"


class Backend(ABC):
    """The one interface to where jobs run. Stateless: create one per use."""

    name: str = ""                 # what ``run.yaml`` and the profile's ``scheduler`` say
    on_this_machine = False        # the ranks run here: ``submit`` follows the run by default
    max_nodes: int | None = None   # the most nodes a job can have (None: the cluster's)
    batch_script = False           # a job is a batch script written into the run folder
    chains = False                 # a job can wait for another to end (``--chain``)
    arrays = False                 # many runs as one job array (``--sweep``, ``--max-parallel``)
    requeues_in_place = False      # a running job can be requeued (``hpctrain requeue``)

    @abstractmethod
    def submit(self, run: RunFolder, profile: ClusterProfile, function: Callable, args: tuple,
               *, script: str | None = None, env: dict | None = None) -> Any:
        """``function(*args)`` in every rank of ``profile``'s allocation; submitit's job
        object (its ``job_id`` is what ``run.yaml`` records). ``script``: the batch script
        written for it (backends with ``batch_script``); ``env``: extra variables."""

    def submit_array(self, folder: Path, profile: ClusterProfile, script: str,
                     calls: list[Callable], task_folders: list[Path]) -> list[Any]:
        """Many calls as one job array (backends with ``arrays``); call i's files in
        ``task_folders[i]``."""
        raise NotImplementedError(f"the {self.name} backend has no job arrays")

    @abstractmethod
    def job_states(self, jobs: list[JobRef]) -> dict[str, JobState]:
        """The state of each job now (by job id), asking once for all of them."""

    @abstractmethod
    def cancel(self, run: RunFolder, job_ids: list[str]) -> None:
        """Stop these jobs of ``run`` (the ranks get the backend's usual stop signal)."""

    def accounted_gpu_seconds(self, ranks_of_job: dict[str, int]) -> dict[str, float]:
        """GPU-seconds each job has used by the scheduler's own accounting (every incarnation
        of a requeued job, a running one up to now), asking once for all of them; ``ranks_of_job``
        is what a job that allocates no GPU resource counts. {} without accounting."""
        return {}

    def requeue(self, job_id: str) -> None:
        """Requeue a running job in place (backends with ``requeues_in_place``)."""
        raise NotImplementedError(f"the {self.name} backend cannot requeue a job in place")

    @abstractmethod
    def elapsed_and_limit(self, run: RunFolder, job: JobState,
                          events: list[dict]) -> tuple[float | None, float | None]:
        """Seconds the active ``job`` has run and its time limit (None where unknown)."""

    @abstractmethod
    def node_list(self, job: JobState) -> str | None:
        """The nodes ``job`` holds now, as the backend writes them (Slurm's hostlist,
        ``n[1-2]``); None while it holds none."""

    def check_nodes(self, nodes: int | None) -> None:
        """Refuse ``--nodes`` beyond what one of this backend's jobs can have."""
        from ..errors import UsageError
        if nodes is not None and self.max_nodes is not None and not 1 <= nodes <= self.max_nodes:
            raise UsageError(f"--nodes: a {self.name} profile runs {self.where()} only; use "
                             f"--nodes {self.max_nodes}")

    def check_profile(self, profile: ClusterProfile) -> None:
        """Refuse a profile asking for more nodes than one of this backend's jobs can have (a
        local profile: this machine alone). Here, not in the profile's own checks: what a
        scheduler can give is the backend's to say."""
        from ..errors import UsageError
        nodes = profile.slurm.nodes
        if isinstance(nodes, int) and self.max_nodes is not None and \
                not 1 <= nodes <= self.max_nodes:
            raise UsageError(f"profile {profile.name!r}: slurm.nodes: a {self.name} profile runs "
                             f"{self.where()} only; set it to {self.max_nodes}")
        spares = profile.resilience.spare_nodes     # the job's own, once resolved
        if isinstance(spares, int) and spares and isinstance(nodes, int) and \
                self.max_nodes is not None and nodes + spares > self.max_nodes:
            raise UsageError(f"profile {profile.name!r}: resilience.spare_nodes: a {self.name} "
                             f"profile runs {self.where()} only and has no spare nodes; set it "
                             "to 0")

    def where(self) -> str:
        """Where this backend's jobs run, for messages that refuse what it cannot do."""
        return "on this machine" if self.on_this_machine else f"through {self.name}"
