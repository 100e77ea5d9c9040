"""What is checked before anything is created: the job on its profile, the memory fit, the data.

``load_resolved`` is the one way a job file meets a profile for validate, render, plan's fit
check, submit and sweeps alike; ``check_fits`` and ``check_data`` are the two refusals a
submission makes before it creates a run folder.
"""

from __future__ import annotations

from pathlib import Path

from ..config import ClusterProfile, JobConfig, Resolved, load_job, load_profile, resolve
from ..errors import UsageError
from ..scheduler.choose import backend_for


def load_profile_for(profile: str | Path | ClusterProfile, nodes: int | None = None) -> ClusterProfile:
    """A profile by name, by file, or as given, with ``nodes`` applied (a local profile runs on
    this machine only)."""
    p = profile if isinstance(profile, ClusterProfile) else load_profile(str(profile))
    p = p.with_nodes(nodes)
    backend_for(p).check_nodes(nodes)
    return p


def decided(resolved: Resolved) -> Resolved:
    """What is left to decide once the layout is known, decided: ``checkpoint.optimizer_format:
    auto`` becomes the format the planner picks for this layout (its save must fit)."""
    import dataclasses

    from ..planner.layouts import with_optimizer_format
    job = with_optimizer_format(resolved.job, resolved.profile, resolved.layout)
    return resolved if job is resolved.job else dataclasses.replace(resolved, job=job)


def resolve_job(job: JobConfig, profile: ClusterProfile, source: str = "job") -> Resolved:
    """``job`` on ``profile``: checked (``hpctrain.config.resolve``: every problem at once),
    then :func:`decided`."""
    return decided(resolve(job, profile, source=source))


def load_resolved(job_file: str | Path, profile: str | Path | ClusterProfile,
                  nodes: int | None = None) -> Resolved:
    """Job file + profile (+ ``nodes``) checked together and decided (:func:`resolve_job`)."""
    job = load_job(str(job_file))
    return resolve_job(job, load_profile_for(profile, nodes), source=str(job_file))


def launch_warnings(resolved: Resolved) -> list[str]:
    """What can be said now about the layers the ranks will pick (no torch import)."""
    from ..runtime.layers import launch_warnings as layer_warnings
    return layer_warnings(resolved.job, resolved.profile)


def check_fits(resolved: Resolved, force: bool = False) -> None:
    """Refuse a layout that does not fit the GPUs' memory (the planner says why), unless forced."""
    from ..planner import check_fits as plan_check_fits
    fit = plan_check_fits(resolved.job, resolved.profile)
    if fit.fits is False and not force:
        raise UsageError(f"{fit.message}\nRefusing to submit a layout that does not fit; "
                         "pass --force to submit anyway.")


def check_data(job, prepare: bool = True) -> None:
    """Prepare the example corpora on first use; refuse a job whose data is missing, a corpus
    too small for one sample, or a split that leaves the training, validation or test data
    the job uses empty (each error names its field). ``prepare=False`` (validate, which may
    run where the cluster's data is not mounted): prepare nothing, and check only when every
    corpus is there."""
    from ..data import indexed
    from ..data.blend import check_splits
    from ..data.prepare import ensure_prepared
    from ..data.splits import all_prefixes
    if prepare:
        ensure_prepared(job)
    elif any(not indexed.exists(prefix) for _, prefix, _ in all_prefixes(job.data)):
        return                                   # submit prepares or refuses it
    for field, prefix, _ in all_prefixes(job.data):
        p = Path(prefix)
        missing = [str(f) for f in (p.with_name(p.name + ".bin"), p.with_name(p.name + ".idx"))
                   if not f.exists()]
        if missing:
            raise UsageError(f"{field}: {missing[0]} does not exist; prepare it with `hpctrain "
                             f"data prepare FILES --output {prefix}` or set its prepare_from")
    check_splits(job)