"""What a tracker is sent, from the run's own records: pure functions, no tracker imported.

- :func:`final_records`: the records of ``metrics.jsonl`` a tracker has not received, each step
  as it was finally trained (the newest attempt's record of a step wins: a step an attempt
  trained again after resuming from an older checkpoint replaces the earlier attempt's).
- :func:`metric_values`: one record as ``{"train/loss": ..., "validation/loss": ...}``.
- :func:`flat_params`: the resolved job and profile as dotted parameters (MLflow's params).
- :func:`event_label`: a run event as the tag a tracker shows (preemption, requeue, in-job
  restart, hang, ...).
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable

from ..record.files import record_kind

# Fields of a training record that are not measurements of the step.
_NOT_METRICS = {"kind", "step", "attempt", "time", "skipped", "skip_reason", "stragglers",
                "iters", "samples", "seconds"}


def final_records(records: Iterable[dict], after_step: int, upto_step: int | None) -> list[dict]:
    """Records with ``after_step < step <= upto_step`` (no upper bound when None), one per
    (kind, step): the last one written, i.e. the attempt that trained the step for good."""
    chosen: dict[tuple[str, int], dict] = {}
    for rec in records:
        step = rec.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step <= after_step:
            continue
        if upto_step is not None and step > upto_step:
            continue
        chosen[(record_kind(rec), step)] = rec
    return sorted(chosen.values(), key=lambda r: (r["step"], record_kind(r) != "train"))


def metric_values(rec: dict) -> dict[str, float]:
    """The finite numbers of one record, named ``<kind>/<field>`` (``train/loss``,
    ``validation/loss``, ``train/tokens_per_s``, ``train/mfu``, ...)."""
    kind = record_kind(rec)
    out = {}
    for key, value in rec.items():
        if key in _NOT_METRICS or isinstance(value, bool):
            continue
        if kind != "train" and key != "loss":
            continue
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[f"{kind}/{key}"] = float(value)
    return out


def flat_params(tree: Any, prefix: str = "") -> dict[str, str]:
    """A nested mapping as ``{"job.model.hidden_size": "64", ...}`` (lists as JSON)."""
    out: dict[str, str] = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flat_params(v, f"{prefix}.{k}" if prefix else str(k)))
    else:
        out[prefix] = json.dumps(tree) if isinstance(tree, (list, type(None), bool)) else str(tree)
    return out


def event_label(event: dict) -> str | None:
    """The tag a run event gives its tracker run (None: not shown)."""
    kind = event.get("event")
    if kind == "signal":
        return "preemption" if event.get("preempting") else None
    if kind == "checkpoint_saved":
        reason = event.get("reason")
        if reason in ("emergency", "deadline", "straggler"):
            return "emergency-checkpoint"
        return None
    if kind == "in_job_restart":   # which node left out and why, its spare, the cost
        return "in-place-restart" if event.get("in_place") else "in-job-restart"
    if kind == "requeue":
        return "requeue+excluded-node" if event.get("excluded") else "requeue"
    return {"hang": "hang", "straggler": "straggler", "resume": "resume", "cancel": "cancel",
            "requeue_failed": "requeue-failed", "step_skipped": "skipped-step",
            "attempt_end": None}.get(kind)


def shown_events(events: Iterable[dict]) -> list[tuple[str, dict]]:
    """(label, event) for the events a tracker shows, in order."""
    out = []
    for e in events:
        label = event_label(e)
        for one in (label.split("+") if label else []):
            out.append((one, e))
    return out


def describe_event(event: dict) -> str:
    """One line for a tracker's tag value: the event's fields, without the bulky ones."""
    data = {k: v for k, v in event.items() if k not in ("event", "path") and v not in (None, [])}
    return json.dumps(data, sort_keys=True, default=str)[:5000]
