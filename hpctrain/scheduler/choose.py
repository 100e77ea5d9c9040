"""The one place that maps a scheduler's name to its backend: from a profile when a run is
created or submitted, from ``run.yaml`` for a run that exists (a run stays on the backend it
was created on)."""

from __future__ import annotations

from ..config import ClusterProfile
from ..record.folder import RunFolder
from .backend import Backend
from .local.backend import LocalBackend
from .slurm.backend import SlurmBackend

BACKENDS: dict[str, type[Backend]] = {b.name: b for b in (SlurmBackend, LocalBackend)}


def backend_named(name: str | None) -> Backend:
    """The backend called ``name``; a run folder that records none is a Slurm run (folders
    written before the name was recorded)."""
    return BACKENDS.get(name or SlurmBackend.name, SlurmBackend)()


def backend_for(profile: ClusterProfile) -> Backend:
    """The backend of ``profile``'s ``scheduler``, once it has accepted the profile (a local
    profile is one node: :meth:`Backend.check_profile`)."""
    backend = backend_named(profile.scheduler)
    backend.check_profile(profile)
    return backend


def backend_of(run: RunFolder, meta: dict | None = None) -> Backend:
    """The backend ``run`` was created on (its ``run.yaml``, or ``meta`` already read)."""
    return backend_named((run.meta() if meta is None else meta).get("scheduler"))
