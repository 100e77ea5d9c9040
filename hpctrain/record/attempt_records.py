"""The records an attempt leaves, as typed objects: what rank 0 says it did
(``logs/attempt-N/result.json``), what a failing rank says (``failure-rank-R.json``), and the
ledger record written when the attempt ends (one line of ``ledger.jsonl``).

They cross process boundaries (the ranks, the batch shell, the CLI) and outlive the version of
hpctrain that wrote them, so ``from_dict`` takes any older file: a missing key is None, a key
this version does not know is kept in ``extra`` and written back unchanged. ``to_dict`` gives
the JSON the files hold; the exit reason is a :class:`~hpctrain.exit_codes.ExitReason`, whose
JSON is its string.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..exit_codes import ExitReason


def _reason(value: Any) -> ExitReason | str | None:
    """The enum member for a known reason; a reason from a newer version stays a string."""
    if value is None or isinstance(value, ExitReason):
        return value
    try:
        return ExitReason(value)
    except ValueError:
        return value


class _Record:
    """to_dict/from_dict for the records below. Fields listed in ``ALWAYS`` are written even
    when None (readers expect the key); the others only when set."""

    ALWAYS: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: dict | None):
        data = dict(data or {})
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: data.pop(k) for k in list(data) if k in names}
        if "exit_reason" in known:
            known["exit_reason"] = _reason(known["exit_reason"])
        return cls(**known, extra=data)

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            v = getattr(self, f.name)
            if v is not None or f.name in self.ALWAYS:
                out[f.name] = str(v) if isinstance(v, ExitReason) else v
        out.update(self.extra)
        return out


@dataclass(kw_only=True)
class AttemptOutcome(_Record):
    """How an attempt went, as rank 0 saw it: what ``result.json`` and the ledger record share."""

    ALWAYS = ("attempt", "start_step", "end_step", "exit_reason", "exit_code", "checkpoint_loaded",
              "checkpoint_saved", "last_loss", "start_time", "end_time", "message")

    attempt: int | None = None
    start_step: int | None = None
    end_step: int | None = None
    exit_reason: ExitReason | str | None = None
    exit_code: int | None = None
    checkpoint_loaded: str | None = None
    checkpoint_saved: str | None = None
    last_loss: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    message: str | None = None
    extra: dict = field(default_factory=dict)

    def outcome(self) -> dict:
        """The shared fields, to start a record of another kind from this one."""
        return {name: getattr(self, name) for name in AttemptOutcome.ALWAYS}


@dataclass(kw_only=True)
class AttemptResult(AttemptOutcome):
    """What rank 0 did in one attempt (``result.json``), written just before it exits, with
    what the attempt measured (absent when it ended before measuring it)."""

    layers: dict | None = None
    local_parameters: int | None = None
    optimizer: Any = None
    peak_gpu_memory_bytes: int | None = None
    saves: list | None = None
    load_seconds: float | None = None
    verify_seconds: float | None = None
    resume_read: dict | None = None     # the checkpoint reader's bytes, rate, items verified
    host_staging: str | None = None     # the checkpoint host memory this attempt held
    host_staging_locked: dict | None = None   # its page-locking: after_step, seconds, bytes
    first_step_after_s: float | None = None
    weights_digest: str | None = None
    straggler: dict | None = None       # the slow node this attempt stopped to exclude


@dataclass(kw_only=True)
class FailureRecord(_Record):
    """One rank's failure (``failure-rank-R.json``): when, where, what."""

    ALWAYS = ("rank", "node", "time", "message")

    rank: int | None = None
    node: str | None = None
    time: float | None = None
    message: str | None = None
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """Whether an ended attempt is requeued, and why (:func:`.requeue_policy.decide`)."""

    requeue: bool
    reason: str
    in_job: bool = False    # restarted inside the allocation instead (no requeue)

    def to_dict(self) -> dict:
        out = {"requeue": self.requeue, "reason": self.reason}
        if self.in_job:
            out["in_job"] = True
        return out

    @classmethod
    def from_dict(cls, data: dict | None) -> "Decision | None":
        if not isinstance(data, dict):
            return None
        return cls(bool(data.get("requeue")), str(data.get("reason") or ""),
                   bool(data.get("in_job")))


@dataclass(kw_only=True)
class AttemptRecord(AttemptOutcome):
    """One attempt in the run's ledger: the outcome merged with what the scheduler knows, and
    the requeue decision."""

    ALWAYS = AttemptOutcome.ALWAYS + ("job_id", "restart_count", "scheduler", "nodes", "started",
                                      "duration_s")

    job_id: str | None = None
    restart_count: int | None = None
    scheduler: str | None = None
    nodes: list[str] | None = None
    started: str | None = None          # start_time, local time, readable
    duration_s: float | None = None
    first_failure: dict | None = None   # a FailureRecord's dict, for failed attempts
    note: str | None = None
    task_exits: list | None = None      # srun's per-task exits (Slurm)
    excluded_nodes: list[str] | None = None   # left out of the requeue: the preflight gate's
                                              # bad nodes, a hung rank's or a straggler node;
                                              # once requeued, only those really excluded
    not_excluded_nodes: list[str] | None = None   # bad nodes the requeue kept in, and why:
    exclusion_note: str | None = None             # the job could not start without them, or
                                                  # excluding failed (``requeue_excluding``)
    preflight_report: str | None = None
    hang: dict | None = None            # the hang verdict (health.hang.Verdict's dict)
    straggler: dict | None = None       # the straggler node (health.stragglers.SlowNode's dict)
    first_step_at: float | None = None  # when this attempt's first step started (epoch s)
    recovery_s: float | None = None     # from the previous attempt's failure to that first step
    steps_lost: int | None = None       # steps the previous attempt trained that this one redid
    in_job_restart: dict | None = None  # restarted inside the allocation after the previous
                                        # attempt: nodes, excluded (and why), spares, in_place
    decision: Decision | None = None

    @classmethod
    def from_dict(cls, data: dict | None) -> "AttemptRecord":
        record = super().from_dict(data)
        if record.decision is not None and not isinstance(record.decision, Decision):
            record.decision = Decision.from_dict(record.decision)
        return record

    def to_dict(self) -> dict:
        out = super().to_dict()
        if self.decision is not None:
            out["decision"] = self.decision.to_dict()
        return out

    @property
    def requeued(self) -> bool:
        return bool(self.decision and self.decision.requeue)
