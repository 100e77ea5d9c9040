"""Typed, validated configuration: cluster profiles, job files, and the layout they imply."""

from .job import JobConfig
from .layout import Layout, layout_problems
from .loader import (DEFAULT_PROFILE, Resolved, find_profile, job_from_mapping, list_profiles,
                     load_job, load_profile, profile_from_mapping, resolve)
from .profile import ClusterProfile, time_limit_seconds

__all__ = ["ClusterProfile", "DEFAULT_PROFILE", "JobConfig", "Layout", "Resolved", "find_profile",
           "job_from_mapping", "layout_problems", "list_profiles", "load_job", "load_profile",
           "profile_from_mapping", "resolve", "time_limit_seconds"]
