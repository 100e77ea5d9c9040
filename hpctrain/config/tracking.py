"""The ``tracking:`` section: Weights & Biases and MLflow, beside TensorBoard.

A job names its trackers in ``tracking:``; a profile may name them too, for a cluster-wide
tracking server every job on the cluster reports to. A tracker the job names replaces the
profile's whole (``tracking.wandb`` of the job wins over the profile's ``tracking.wandb``), so a
job never inherits half of a project it did not ask for. What the ranks do with it:
:mod:`hpctrain.tracking`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .problems import Problems
from .schema import doc

# W&B refuses these in project, entity and group names (its own check, run at init, would
# otherwise fail on the compute node after the job waited in the queue).
_WANDB_FORBIDDEN = re.compile(r"[/\\#?%:]", re.ASCII)
_URI = re.compile(r"(https?|file|sqlite|postgresql|mysql|databricks)(\+\w+)?:.+", re.ASCII)


@dataclass(kw_only=True)
class WandbSection:
    project: str = doc("W&B project the run is logged to.")
    entity: str | None = doc("W&B team or user (null: the API key's default entity).",
                             default=None)
    group: str | None = doc("W&B group (null: the sweep's id for a sweep's runs, none "
                            "otherwise).", default=None)
    tags: list[str] = doc("W&B tags of the run (hpctrain adds the run's events: preemption, "
                          "requeue, hang, ...).", default_factory=list)
    mode: str = doc("online: stream to the W&B server; offline: write the run to `dir` only, "
                    "for air-gapped clusters (upload later with `hpctrain sync RUN`).",
                    choices=("online", "offline"), default="online")
    dir: str | None = doc("Folder W&B writes its files to (null: the run folder's wandb/).",
                          default=None)


@dataclass(kw_only=True)
class MlflowSection:
    tracking_uri: str = doc("MLflow tracking server (http://host:5000) or store (file:/path, "
                            "sqlite:////path/mlflow.db) reachable from the compute nodes.")
    experiment: str | None = doc("MLflow experiment, created when missing (null: the job's "
                                 "name).", default=None)


@dataclass(kw_only=True)
class TrackingSection:
    wandb: WandbSection | None = doc("Weights & Biases (pip install 'hpctrain[wandb]'); null: "
                                     "off.", default=None)
    mlflow: MlflowSection | None = doc("MLflow (pip install 'hpctrain[mlflow]'); null: off.",
                                       default=None)
    flush_timeout_s: float = doc("When training finishes, wait at most this long for a slow "
                                 "or unreachable tracker (at most 10 s when an attempt stops "
                                 "to be continued); what is still unsent stays in "
                                 "metrics.jsonl and is sent by the next attempt or "
                                 "`hpctrain sync`. (The profile's applies to jobs that name no "
                                 "tracker of their own.)", default=60.0, at_least=0, at_most=3600)


def effective(job_tracking: TrackingSection | None,
              profile_tracking: TrackingSection | None) -> TrackingSection:
    """The trackers a run reports to: each one the job names, else the profile's."""
    job_tracking = job_tracking or TrackingSection()
    profile_tracking = profile_tracking or TrackingSection()
    names_one = job_tracking.wandb is not None or job_tracking.mlflow is not None
    return TrackingSection(wandb=job_tracking.wandb or profile_tracking.wandb,
                           mlflow=job_tracking.mlflow or profile_tracking.mlflow,
                           flush_timeout_s=(job_tracking if names_one
                                            else profile_tracking).flush_timeout_s)


def check_tracking(t: TrackingSection | None, problems: Problems, prefix: str = "tracking") -> None:
    """Names W&B and MLflow would refuse on the node, refused here (one line per field)."""
    if t is None:
        return
    w = t.wandb
    if w is not None:
        for key in ("project", "entity", "group"):
            value = getattr(w, key)
            if isinstance(value, str) and (_WANDB_FORBIDDEN.search(value) or len(value) > 128
                                           or not value.strip()):
                problems.add(f"{prefix}.wandb.{key}", f"{value!r} is not a W&B name: at most "
                             "128 characters, none of / \\ # ? % :")
        for i, tag in enumerate(w.tags or []):
            if isinstance(tag, str) and not 1 <= len(tag) <= 64:
                problems.add(f"{prefix}.wandb.tags[{i}]", "a W&B tag has 1 to 64 characters")
    m = t.mlflow
    if m is not None:
        uri = m.tracking_uri
        if isinstance(uri, str) and not (_URI.fullmatch(uri) or uri.startswith("/")):
            problems.add(f"{prefix}.mlflow.tracking_uri", f"{uri!r} is not a tracking URI: "
                         "give http(s)://host:port, file:/path, sqlite:////path.db or an "
                         "absolute folder")
        if isinstance(m.experiment, str) and not m.experiment.strip():
            problems.add(f"{prefix}.mlflow.experiment", "empty: give a name or null (the "
                                                        "job's name)")


def requested(t: TrackingSection) -> list[tuple[str, str]]:
    """(tracker, module to import) for each tracker ``t`` names."""
    out = []
    if t.wandb is not None:
        out.append(("wandb", "wandb"))
    if t.mlflow is not None:
        out.append(("mlflow", "mlflow"))
    return out


__all__ = ["MlflowSection", "TrackingSection", "WandbSection", "check_tracking", "effective",
           "requested"]
