"""Which Python runs what: the batch host's (batch steps, submitit's task runner) and the
training step's (the container's, when the profile names an image)."""

from __future__ import annotations

import sys

from ..config import ClusterProfile


def node_python(profile: ClusterProfile) -> str:
    """The Python on the batch host (runs the batch steps, and submitit's task runner locally)."""
    return profile.python or sys.executable


def step_python(profile: ClusterProfile) -> str:
    """The Python inside the training step: the container's, if the profile names an image."""
    return profile.container.python if profile.container.image else node_python(profile)
