"""What a person does to a run by hand: cancel it, requeue it, resume it elsewhere.

Each action is recorded in the run's events before it touches the scheduler, because the batch
script reads them: a ``cancel`` event makes the attempt recorder refuse to requeue and makes
chained or requeued jobs exit at once; a later ``requeue`` or ``resume`` event reopens the run.
Nothing here deletes a checkpoint or a run folder.
"""

from __future__ import annotations

import getpass
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import limits
from ..config import ClusterProfile, Resolved, load_profile, resolve, yamlio
from ..config.schema import to_dict
from ..errors import ConfigError, UsageError
from ..record.files import RunFileError, now_iso, signals_held
from ..record.folder import RunFolder
from ..scheduler.choose import backend_for, backend_named, backend_of
from ..scheduler.state import live_jobs
from ..submission import Submitted, check_fits, submit_training
from ..view.runview import RunView, build_view
from .checkpoints import inspect_checkpoints, read_manifest
from .logs import check_submitted


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


# ---- cancel --------------------------------------------------------------------------------


def cancel_run(run: RunFolder) -> list[str]:
    """Cancel every pending or running job of the run (all kinds); return their ids.

    The ``cancel`` event is written first, so an attempt ending because of this cancel is
    recorded as cancelled and not requeued, and chained jobs skip.
    """
    jobs = live_jobs(run, kind=None)
    if not jobs:
        return []
    ids = [j.job_id for j in jobs]
    run.event("cancel", jobs=ids, by=_user())
    backend_of(run).cancel(run, ids)
    return ids


# ---- requeue / resume ------------------------------------------------------------------------


@dataclass
class Resubmitted:
    submitted: Submitted | None      # None: a running job was requeued in place
    job_id: str
    how: str                         # "scontrol requeue" | "resubmitted"
    from_step: int | None            # the newest complete checkpoint's step (None: from scratch)
    profile: str
    world_size: int
    next_attempt: int = 1            # the first attempt the new job can start (to follow it)


def _newest_step(run: RunFolder) -> int | None:
    try:
        newest = inspect_checkpoints(run).newest_complete
    except OSError:
        return None
    return newest.step if newest else None


def _refuse_finished(view: RunView, what: str) -> None:
    raise UsageError(f"run {view.run.shown} finished at step {view.step}; nothing to {what} "
                     f"(to train further: `hpctrain resume {view.run.shown} --steps N`, N > "
                     f"{view.step})")


def requeue_run(run: RunFolder) -> Resubmitted:
    """Running: ``scontrol requeue`` (Slurm stops it, the ranks save on SIGTERM, it comes back
    and resumes from the newest checkpoint). Ended: resubmit the same run on its profile. A
    dry run is refused (:func:`.logs.check_submitted`): ``submit`` submits it."""
    check_submitted(run, "so there is nothing to requeue")
    view = build_view(run)
    if view.finished:
        _refuse_finished(view, "requeue")
    if view.active_jobs:
        job = view.current_job
        backend = view.backend
        if not backend.requeues_in_place:
            raise UsageError(f"run {run.shown} is running {backend.where()}, where a job cannot be "
                             f"requeued in place; `hpctrain cancel {run.shown}` then "
                             f"`hpctrain resume {run.shown}`")
        state = job.state.split()[0]
        if state != "RUNNING":
            why = f" ({job.reason})" if job.reason not in ("", "None") else ""
            then = ("it will start by itself, there is nothing to requeue" if state == "PENDING"
                    else f"only a running job is requeued in place: wait until it runs, or "
                         f"`hpctrain cancel {run.shown}` then `hpctrain resume {run.shown}`")
            raise UsageError(f"run {run.shown}'s job {job.job_id} is {job.state.lower()}{why}; "
                             f"{then}")
        run.event("requeue", job_id=job.job_id, how="scontrol requeue", by=_user())
        backend.requeue(job.job_id)
        profile = run.resolved_profile()
        return Resubmitted(None, job.job_id, "scontrol requeue", _newest_step(run), profile.name,
                           profile.world_size)
    profile = run.resolved_profile()
    resolved = _resolve_for(run, profile)
    check_data_position(run, resolved.job)
    return _resubmit(run, resolved, "requeue", force=False)


def resume_run(run: RunFolder, profile_name: str | None = None, nodes: int | None = None, *,
               force: bool = False, overrides: dict | None = None,
               accept_data_change: bool = False,
               warn: Callable[[str], None] | None = None) -> Resubmitted:
    """Resubmit a stopped run from its newest complete checkpoint, on its profile or another
    one (``profile_name``/``nodes``). The runtime reshards the checkpoint to the new layout.
    A new layout that does not fit the GPUs' memory is refused (as at submit) unless
    ``force``, before anything changes.

    ``overrides`` (``--set``, ``--steps``) change the run's job before it resumes: raising
    ``train.steps`` extends a finished run (the old job is kept as ``job.N.yaml``).
    ``accept_data_change``: resume although the data settings give the checkpoint's data
    position another meaning (recorded in the run's events, which the ranks read). A dry run
    is refused (:func:`.logs.check_submitted`): ``submit`` submits it."""
    check_submitted(run, "so there is nothing to resume")
    view = build_view(run)
    if view.active_jobs and not force:
        job = view.current_job
        raise UsageError(f"run {run.shown} is still {view.state.lower()} (job {job.job_id}); a "
                         f"preempted job resumes by itself. `hpctrain cancel {run.shown}` first, or "
                         "pass --force if the scheduler's view is wrong")
    new_job = _job_with(run, view, overrides or {})
    _check_checkpoint_folder(run)   # refused before anything of the run is read or changed
    accepted = check_data_position(run, new_job or run.resolved_job(),
                                   accept=accept_data_change, warn=warn)
    extends = new_job is not None and new_job.train.steps > (view.step or 0)
    if view.finished and not force and not extends:
        _refuse_finished(view, "resume")
    old = run.resolved_profile()
    new = load_profile(profile_name) if profile_name else old
    backend_named(new.scheduler).check_nodes(nodes)   # the flag named when it asks too much
    new = new.with_nodes(nodes)
    if new.scheduler != old.scheduler:
        raise UsageError(f"--profile: run {run.shown} ran with scheduler {old.scheduler!r} and "
                         f"{new.name!r} uses {new.scheduler!r}; a run stays on one kind of "
                         "scheduler (start a new run with `train.init_from` instead)")
    backend_for(new)
    resolved = _resolve_for(run, new, new_job)
    check_fits(resolved, force)
    changed = to_dict(new) != to_dict(old)
    if changed:
        _archive_profile(run, old, new, resolved)
    if new_job is not None:
        _archive_job(run, resolved.job, overrides)
    if accepted:
        from ..data.fingerprint import ACCEPTED_EVENT
        run.event(ACCEPTED_EVENT, checkpoint=accepted, by=_user())
    return _resubmit(run, resolved, "resume", force=force, previous_world_size=old.world_size,
                     extended=view.finished and extends)


def _job_with(run: RunFolder, view: RunView, overrides: dict):
    """The run's job with ``overrides`` applied and checked (None: no overrides). A
    ``train.steps`` the run has already reached is refused: there would be nothing to train."""
    if not overrides:
        return None
    from ..submission.sweep_values import with_overrides
    job = with_overrides(run.resolved_job(), overrides, run.path, str(run.job_file))
    reached = view.step or 0
    if "train.steps" in overrides and job.train.steps <= reached:
        raise UsageError(f"train.steps: run {run.shown} already reached step {reached}; give more "
                         f"than {reached} (e.g. --steps {max(2 * reached, reached + 1)})")
    return job


def check_data_position(run: RunFolder, job, *, accept: bool = False,
                        warn: Callable[[str], None] | None = None) -> str | None:
    """Refuse (UsageError) a job whose data settings (``--set``, or the run's job file edited)
    would give the newest complete checkpoint's data position another meaning: the check the
    runtime makes when it loads (:func:`hpctrain.data.fingerprint.resume_problem`), made here
    before anything is archived or submitted. A checkpoint saved before the fingerprint was
    recorded has none: accepted. A corpus this machine cannot read is compared by weight only
    here; the runtime compares it whole. A change accepted before for that checkpoint passes;
    ``accept`` (``--accept-data-change``) accepts it now: the checkpoint's name is returned,
    for the caller to record once the resume goes ahead. Changed evaluation corpora are a
    warning (``warn``), not a refusal."""
    from ..data.fingerprint import change_accepted, evaluation_note, resume_problem
    try:
        newest = inspect_checkpoints(run).newest_complete
    except OSError:
        return None
    if newest is None:
        return None
    name = Path(newest.path).name
    manifest, _ = read_manifest(Path(newest.path))
    manifest = manifest or {}
    note = evaluation_note(manifest.get("data"), job, name)
    if note and warn is not None:
        warn(note)
    problem = resume_problem(manifest.get("data"), job, name, manifest.get("consumed_samples"),
                             run.shown)
    if not problem or change_accepted(run.events(), name):
        return None
    if not accept:
        raise UsageError(problem)
    return name


def _keep_as_numbered(run: RunFolder, current: Path, stem: str) -> Path:
    """Copy ``current`` (the run's job or profile) to the first free ``STEM.N.yaml`` of the run
    folder, so what the run ran with so far stays readable (the caller holds the run's lock)."""
    n = 1
    while (run.path / f"{stem}.{n}.yaml").exists():
        n += 1
    kept = run.path / f"{stem}.{n}.yaml"
    yamlio.write_atomic(kept, _run_text(current), within=run.path)
    return kept


def _archive_job(run: RunFolder, job, overrides: dict) -> str:
    """Keep the job the run ran with so far as ``job.N.yaml``; write the new one and record the
    overrides in ``run.yaml`` (under the run's lock)."""
    with run.lock(), signals_held():
        kept = _keep_as_numbered(run, run.job_file, "job")
        yamlio.write_atomic(run.job_file, yamlio.dump(to_dict(job)), within=run.path)
        history = list(run.meta().get("job_history", []))
        history.append({"file": kept.name, "overrides": dict(overrides), "until": now_iso()})
        run.update_meta(job_history=history, total_steps=job.train.steps,
                        overrides={**(run.meta().get("overrides") or {}), **overrides})
    return kept.name


def _resolve_for(run: RunFolder, profile: ClusterProfile, job=None) -> Resolved:
    job = job if job is not None else run.resolved_job()
    try:
        return resolve(job, profile, source=str(run.job_file))
    except ConfigError as e:
        problems = "; ".join(f"{path}: {msg}" if path else msg for path, msg in e.problems)
        raise UsageError(f"run {run.shown} cannot run on {profile.name!r} with {profile.world_size} "
                         f"ranks ({profile.slurm.nodes} node(s) × {profile.slurm.gpus_per_node}): "
                         f"{problems}. Pick a --nodes count that fits the run's layout "
                         f"(in {run.job_file})") from None


def _archive_profile(run: RunFolder, old: ClusterProfile, new: ClusterProfile, resolved: Resolved) -> str:
    """Keep the profile the run ran on so far as ``profile.N.yaml``; write the new one (under
    the run's lock: a read-modify-write of the run's files)."""
    with run.lock(), signals_held():
        kept = _keep_as_numbered(run, run.profile_file, "profile")
        yamlio.write_atomic(run.profile_file, yamlio.dump(to_dict(new)), within=run.path)
        meta = run.meta()
        history = list(meta.get("profile_history", []))
        history.append({"file": kept.name, "profile": old.name, "world_size": old.world_size,
                        "layout": meta.get("layout"), "until": now_iso()})
        run.update_meta(profile=new.name, world_size=new.world_size,
                        layout=resolved.layout.describe(), profile_history=history)
    return kept.name


def _check_checkpoint_folder(run: RunFolder) -> None:
    """The run's checkpoint folder is its own (not another run's) and every save can rewrite
    its ``latest`` and ``owner.json``: checked before anything of the run changes, not found by
    the ranks after the queue."""
    from ..record import checkpoint_store as store
    store.check_owner(run.checkpoint_dir(), run.id)
    store.check_entries(run.checkpoint_dir())


def _resubmit(run: RunFolder, resolved: Resolved, event: str, *, force: bool,
              previous_world_size: int | None = None, extended: bool = False) -> Resubmitted:
    _check_checkpoint_folder(run)   # refused before any event is recorded
    from_step = _newest_step(run)
    data = {"how": "resubmitted", "by": _user(), "profile": resolved.profile.name,
            "world_size": resolved.profile.world_size, "from_step": from_step,
            "ledger_records": len(run.ledger())}  # a fresh requeue budget from here on
    if previous_world_size is not None:
        data["previous_world_size"] = previous_world_size
    if force:
        data["force"] = True
    if extended:   # reopens a finished run, as a forced resume does (Run.finished)
        data["extended_to"] = resolved.job.train.steps
    run.event(event, **data)  # before submitting: it reopens a cancelled run for the new job
    next_attempt = max(run.attempts_started() + [int(r.get("attempt") or 0) for r in run.ledger()]
                       + [0]) + 1
    sub = submit_training(resolved, run)
    return Resubmitted(sub, sub.job_id, "resubmitted", from_step, resolved.profile.name,
                       resolved.profile.world_size, next_attempt)


def _run_text(path: Path) -> str:
    """A run file's text, read through the run-folder door (kept as written, for history)."""
    from ..record import reader
    text = reader.read_text(path, limits.RUN_SMALL_BYTES)
    if text is None:
        raise RunFileError(f"{path} does not exist; the run folder is incomplete")
    return text
