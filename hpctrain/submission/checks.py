"""What is checked before anything is created: the job on its profile, the memory fit, the data.

``load_resolved`` is the one way a job file meets a profile for validate, render, plan's fit
check, submit and sweeps alike; ``check_fits`` and ``check_data`` are the two refusals a
submission makes before it creates a run folder, together ``check_offline`` (what ``validate``
runs too); ``check_sweep`` runs the same for every point of a sweep.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Callable, Union

from ..config import (ClusterProfile, JobConfig, Resolved, job_from_mapping, load_job,
                      load_profile, resolve)
from ..config.loader import resolve_job_paths
from ..errors import UsageError
from ..scheduler.choose import backend_for, backend_named


def load_profile_for(profile: str | Path | ClusterProfile, nodes: int | None = None) -> ClusterProfile:
    """A profile by name, by file, or as given, with ``nodes`` applied (a local profile runs on
    this machine only)."""
    p = profile if isinstance(profile, ClusterProfile) else load_profile(str(profile))
    backend_named(p.scheduler).check_nodes(nodes)     # the flag named when it asks too much
    p = p.with_nodes(nodes)
    backend_for(p)
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


JobInput = Union[str, Path, Mapping, JobConfig]


def job_source(job: JobInput) -> str:
    """How a job is named in errors and in the run's ``job_source``."""
    if isinstance(job, (str, Path)):
        return str(job)
    if isinstance(job, JobConfig):   # a JobConfig built in Python may hold any name
        from ..config.safety import short
        return f"job {short(job.name)}" if isinstance(job.name, str) else "job (no name)"
    return "job mapping"


def load_job_input(job: JobInput, overrides: Mapping | None = None) -> tuple[JobConfig, Path]:
    """A job given as a file, a mapping (what a job file holds) or a loaded job, with
    ``overrides`` (``{"train.lr": 3e-4}``, the ``--set`` values) applied and checked; and the
    folder its relative paths are relative to (the job file's, else the current one)."""
    from .sweep_values import with_overrides
    if isinstance(job, JobConfig):    # checked again as a file would be: it may have been edited
        from ..config.schema import to_dict
        folder = Path.cwd()
        loaded = resolve_job_paths(job_from_mapping(to_dict(job), job_source(job)), folder,
                                   job_source(job))
    elif isinstance(job, Mapping):
        folder = Path.cwd()
        loaded = resolve_job_paths(job_from_mapping(dict(job), job_source(job)), folder,
                                   job_source(job))
    elif isinstance(job, (str, Path)):
        loaded, folder = load_job(str(job)), Path(job).resolve().parent
    else:
        raise UsageError(f"job: expected a job file, a mapping or a JobConfig, got "
                         f"{type(job).__name__}")
    return with_overrides(loaded, overrides or {}, folder, job_source(job)), folder


def load_resolved(job_file: JobInput, profile: str | Path | ClusterProfile,
                  nodes: int | None = None, overrides: Mapping | None = None) -> Resolved:
    """Job (a file, a mapping or a loaded job; ``overrides`` applied) + profile (+ ``nodes``)
    checked together and decided (:func:`resolve_job`)."""
    job, _ = load_job_input(job_file, overrides)
    return resolve_job(job, load_profile_for(profile, nodes), source=job_source(job_file))


def launch_warnings(resolved: Resolved) -> list[str]:
    """What can be said now about the layers the ranks will pick (no torch import)."""
    from ..runtime.layers import launch_warnings as layer_warnings
    return layer_warnings(resolved.job, resolved.profile)


def check_fits(resolved: Resolved, force: bool = False) -> None:
    """Refuse a layout that does not fit the GPUs' memory (the planner says why), unless forced."""
    from ..planner import check_fits as plan_check_fits
    fit = plan_check_fits(resolved.job, resolved.profile)
    if fit.fits is False and not force:
        raise UsageError(f"{fit.message.rstrip('.')}; refusing to submit a layout that does not "
                         "fit: change it as said, or pass --force to submit anyway")


def check_data(job, *, prepare: bool = True, warn: Callable[[str], None] | None = None,
               dry_run: bool = False) -> None:
    """The job's corpora (``data.path`` or the blends' paths): there, or preparable (the example
    corpora are prepared on first use), prepared with the job's tokenizer from its
    ``prepare_from`` where their record says (:mod:`hpctrain.data.prepared`), tokenized with a
    vocabulary the model holds, and split so that the training, validation or test data the
    job uses is not empty (each error names its field).

    A missing corpus's ``prepare_from`` files must be there too (each error names its field,
    ``data.prepare_from[0]`` or ``data.blend[1].prepare_from[0]``): submit prepares the corpus
    from them on this machine. ``prepare=False`` writes nothing (validate, dry runs); the
    splits are then checked only when every corpus is there. With ``warn``, what this
    machine cannot see (data, or a tokenizer folder, that lives on the cluster's file system)
    is a warning instead of a refusal; a vocabulary too small for the tokenizer, or data
    prepared otherwise, is always refused. A ``dry_run`` with ``warn`` only warns about
    corpora whose splits it cannot read (placeholders of the cluster's data).
    """
    from ..data.blend import check_splits
    from ..data.splits import all_prefixes
    from ..data.prepared import check_prepared
    from ..data.vocabulary import check_vocab
    missing_any = False
    for field, prefix, sources in all_prefixes(job.data):
        p = Path(prefix)
        missing = [str(f) for f in (p.with_name(p.name + ".bin"), p.with_name(p.name + ".idx"))
                   if not f.exists()]
        if not missing:
            check_prepared(job, field, prefix, sources)
            continue
        missing_any = True
        if not sources:
            hint = ("data.prepare_from" if field == "data.path"
                    else field.replace(".path", ".prepare_from"))
            message = (f"{field}: {missing[0]} does not exist; prepare it with `hpctrain data "
                       f"prepare FILES --output {prefix}` or set {hint}")
            if warn is None:
                raise UsageError(message)
            warn(f"{message} (not on this machine; the job cannot start where it is missing)")
            continue
        from ..data.sources import source_problems
        for message in source_problems(field, prefix, sources):   # what prepare would read
            if warn is None:
                raise UsageError(message)
            warn(f"{message} (not on this machine; submit prepares the corpus here, so it "
                 f"refuses the job while it is missing)")
    if missing_any:
        try:
            from ..data.tokenizers import load_tokenizer
            vocab = load_tokenizer(job.data.tokenizer).vocab_size
        except UsageError as e:
            if warn is None:
                raise
            text = str(e)
            warn(text if text.startswith("data.tokenizer") else f"data.tokenizer: {text}")
            vocab = None
        check_vocab(job, vocab)
        if not prepare:
            return                                   # submit prepares or refuses it
        from ..data.prepare import ensure_prepared
        ensure_prepared(job)
    try:
        check_splits(job)
    except UsageError as e:
        if not (dry_run and warn):
            raise
        warn(f"{e} (a dry run writes the script all the same; the job cannot start with it)")


def check_offline(resolved: Resolved, *, force: bool = False, prepare: bool = True,
                  warn: Callable[[str], None] | None = None, dry_run: bool = False) -> None:
    """Every check ``submit`` makes before it creates a run folder that needs no cluster: the
    layout fits the GPUs' memory (:func:`check_fits`) and the data fits the model
    (:func:`check_data`). ``validate`` and ``submit --dry-run`` run this same function with
    ``prepare=False`` and a ``warn``, so a job ``validate`` calls ok is one ``submit`` takes.
    A sweep of one point: :func:`check_sweep` holds the order of the checks."""
    check_sweep([resolved], force=force, prepare=prepare, warn=warn, dry_run=dry_run)


def check_sweep(points: list[Resolved], *, force: bool = False, prepare: bool = True,
                warn: Callable[[str], None] | None = None, dry_run: bool = False) -> None:
    """:func:`check_offline` for every point of a sweep, before any run folder is created (the
    layout's fit, the trackers, the data, ``train.init_from``, in that order): a
    sweep over ``data.tokenizer``, ``data.prepare_from`` or ``model.vocab_size`` is a job per
    point, each of which a single submission would check. The data is checked once per
    distinct :func:`data_key` and ``train.init_from`` once per path (a sweep over the learning
    rate opens its corpora once), each point's layout and trackers every time."""
    for resolved in points:
        check_fits(resolved, force)
    data_done, init_done = set(), set()
    for resolved in points:
        job = resolved.job
        check_trackers(resolved)
        if data_key(job) not in data_done:
            check_data(job, prepare=prepare, warn=warn, dry_run=dry_run)
            data_done.add(data_key(job))
        if job.train.init_from not in init_done:
            check_init_from(job, warn=warn)
            init_done.add(job.train.init_from)


def data_key(job) -> str:
    """Every job field :func:`check_data` reads: the whole data section (paths, blends,
    splits, tokenizer, prepare_from), the vocabulary and sequence length, and what picks the
    splits and their samples. Two jobs with the same key pass or fail it alike."""
    return repr((job.data, job.model.vocab_size, job.model.seq_length, job.train.seed,
                 job.train.eval_interval, job.train.eval_at_end))


def check_init_from(job, *, warn: Callable[[str], None] | None = None) -> None:
    """``train.init_from`` holds a checkpoint the ranks can load, by the rules they load it by
    (:mod:`..record.model_checkpoint`): a folder without one, a file or a FIFO is refused here,
    not by the ranks after the job waited for its nodes. With ``warn``, a path this machine
    cannot see (the cluster's file system) is a warning, as for data."""
    if not job.train.init_from:
        return
    from ..record.checkpoint_store import CheckpointError
    from ..record.model_checkpoint import checked
    path = Path(job.train.init_from).expanduser()
    if warn is not None and not os.path.exists(path):     # (a link to the cluster's storage)
        warn(f"train.init_from: {path} does not exist on this machine (the job cannot start "
             f"where it is missing)")
        return
    try:
        checked(path)
    except CheckpointError as e:
        raise UsageError(str(e)) from None


def check_trackers(resolved: Resolved) -> None:
    """A tracker the job (or profile) asks for is installed here, before anything is queued:
    the ranks would otherwise find out after the job waited for its nodes. (The nodes run the
    same Python unless the profile's ``python`` names another; it must have it too.)"""
    import importlib.util
    from ..config.tracking import effective, requested
    section = effective(resolved.job.tracking, resolved.profile.tracking)
    for tracker, module in requested(section):
        if importlib.util.find_spec(module) is None:
            raise UsageError(f"tracking.{tracker}: the {module} package is not installed; "
                             f"pip install 'hpctrain[{tracker}]', or remove tracking.{tracker}")
