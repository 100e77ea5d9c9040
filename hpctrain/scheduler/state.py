"""Live state of a run's jobs, asked of the backend each run was created on.

A run may own several jobs (a chain, a resume, preflight jobs); ``live_jobs`` says which are
still pending or running. ``job_states_of_runs`` asks each backend once for all the runs'
jobs (one squeue and one sacct call for every Slurm run), so ``hpctrain runs`` stays quick.
"""

from __future__ import annotations

from pathlib import Path

from ..record.folder import RunFolder
from .backend import JobRef, JobState
from .choose import backend_named


def job_states(run: RunFolder, kind: str | None = "train") -> list[JobState]:
    """States of the run's jobs of ``kind`` (None: all), oldest first."""
    return job_states_of_runs([run], kind)[run.path]


def job_states_of_runs(runs: list[RunFolder], kind: str | None = "train",
                       metas: dict[Path, dict] | None = None) -> dict[Path, list[JobState]]:
    """``job_states`` of many runs, asking each backend once for all of them (``metas``: their
    run.yaml, when the caller has read it already)."""
    wanted: dict[Path, tuple[str, list[JobRef]]] = {}
    by_backend: dict[str, list[JobRef]] = {}
    for run in runs:
        meta = (metas or {}).get(run.path) or run.meta()
        backend = backend_named(meta.get("scheduler")).name
        refs = [JobRef(run, j["job_id"], j.get("kind", "train")) for j in meta.get("jobs", [])
                if kind is None or j.get("kind") == kind]
        wanted[run.path] = (backend, refs)
        by_backend.setdefault(backend, []).extend(refs)
    states = {name: backend_named(name).job_states(refs) for name, refs in by_backend.items()}
    return {path: [states[backend].get(r.job_id, JobState(r.job_id, "UNKNOWN", kind=r.kind))
                   for r in refs]
            for path, (backend, refs) in wanted.items()}


def live_jobs(run: RunFolder, kind: str | None = "train") -> list[JobState]:
    return [s for s in job_states(run, kind) if s.active]
