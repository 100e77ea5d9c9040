"""Submitting a training run: the one home of the submit use case.

``submit()`` is what ``hpctrain submit`` and ``hpctrain.submit()`` do: load the job on its
profile (``checks``), refuse a layout that does not fit or data that is missing, create the run
folder (``folders``), render its batch script (``scripts``) and hand the job to the scheduler
(``jobs``: one job or a chain; ``sweep_jobs``: a job array, or the runs one after another on
this machine, one run per combination of ``sweep_values``). With ``dry_run`` everything up to the script is done and nothing is submitted: the
script written is the one a real submission would have handed to sbatch; the data is not
prepared, and data this machine cannot see is a warning (a dry run off the cluster).

Following a submitted run to its end is ``hpctrain.view.follow``'s; a run folder is a
``hpctrain.record.folder.RunFolder``. Nothing here imports torch: the ranks import it, in their
own processes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..config import DEFAULT_PROFILE, ClusterProfile, JobConfig, Resolved
from ..config.safety import short
from ..errors import SubmissionError, UsageError
from ..limits import MAX_SWEEP_POINTS
from ..record.folder import RunFolder
from ..scheduler.choose import backend_for
from .checks import (check_data, check_fits, check_offline, check_sweep, decided, job_source,
                     launch_warnings, load_job_input, load_profile_for, load_resolved, resolve_job)
from .folders import (SweepRun, prepare_preflight_run, prepare_run, prepare_sweep,
                      remove_refused_run, remove_refused_sweep, runs_root_for, write_sweep_file)
from .jobs import (Submitted, chain_dependency, check_chain, claim_checkpoints,
                   release_checkpoints, submit_chain, submit_function, submit_preflight,
                   submit_training)
from .scripts import render_script, script_inputs, script_path, write_script
from .sweep_jobs import (SweepSubmission, check_max_parallel, run_sweep_locally, submit_sweep_array,
                         write_array_script)

__all__ = ["Submission", "Submitted", "SweepRun", "SweepSubmission", "chain_dependency",
           "check_chain", "check_data", "check_fits", "check_max_parallel", "check_offline",
           "claim_checkpoints", "decided", "job_source", "launch_warnings", "load_job_input",
           "load_profile_for", "load_resolved",
           "prepare_preflight_run", "prepare_run", "prepare_sweep", "release_checkpoints",
           "render_script", "resolve_job", "run_sweep_locally", "runs_root_for", "script_inputs",
           "script_path", "submit", "submit_chain", "submit_function", "submit_preflight",
           "submit_sweep_array", "submit_training", "sweep_specs", "write_array_script",
           "write_script", "write_sweep_file"]


@dataclass
class Submission:
    """What one ``submit()`` did: the runs it created (one, or one per sweep combination), the
    jobs it submitted (none for a dry run), and where the script is."""

    resolved: Resolved                 # the job on its profile (a sweep's first combination)
    runs: list[RunFolder]
    submitted: list[Submitted] = field(default_factory=list)   # one job, or a chain's
    dry_run: bool = False
    script: Path | None = None         # the batch script written (Slurm profiles)
    sweep_dir: Path | None = None
    sweep_runs: list[SweepRun] = field(default_factory=list)
    array_job_id: str | None = None

    @property
    def run(self) -> RunFolder:
        return self.runs[0]

    @property
    def job_ids(self) -> list[str]:
        if self.sweep_runs:
            return [r.job_id for r in self.sweep_runs if r.job_id]
        return [s.job_id for s in self.submitted]


def sweep_specs(sweep: Mapping | list[str] | tuple[str, ...] | None) -> list[str]:
    """``--sweep`` specs (``KEY=V1,V2``) from specs, or from ``{"train.lr": [1e-4, 3e-4]}``."""
    if not sweep:
        return []
    if isinstance(sweep, str):
        return [sweep]
    if not isinstance(sweep, Mapping):
        specs = list(sweep)
        for spec in specs:
            if not isinstance(spec, str):
                raise UsageError(f"sweep: expected 'KEY=V1,V2' strings (e.g. 'train.lr=1e-4,3e-4')"
                                 f" or a mapping {{'train.lr': [1e-4, 3e-4]}}, got "
                                 f"{short(spec)} (a {type(spec).__name__}) in the list")
        return specs
    specs = []
    for key, values in sweep.items():
        if not isinstance(key, str):
            raise UsageError(f"sweep: a key is a dotted job-file key (e.g. 'train.lr'), got "
                             f"{short(key)} (a {type(key).__name__})")
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            values = [values]
        texts = []
        for n, v in enumerate(values):
            if n == MAX_SWEEP_POINTS:   # range(10**9) or itertools.count(): refuse, do not list
                raise UsageError(f"sweep {key}: more than {MAX_SWEEP_POINTS:,} values; a sweep "
                                 f"may have at most {MAX_SWEEP_POINTS:,} runs")
            # YAML reads JSON scalars
            text = v if isinstance(v, str) else json.dumps(sweep_scalar(key, v))
            if "," in text and isinstance(v, str) and not any(c in v for c in "\"\\"):
                text = f'"{v}"'         # quoted: a comma inside is the value's (data.split)
            elif "," in text or not text.strip():
                raise UsageError(f"sweep {key}: {short(v)} cannot be a sweep value (empty, or "
                                 "holds a comma beside a quote or a backslash)")
            texts.append(text)
        specs.append(f"{key}=" + ",".join(texts))
    return specs


def sweep_scalar(key: str, value):
    """A sweep value given in Python as the one scalar its text will be: text, a number (a
    numpy or ``fractions`` number included: ``np.linspace`` gives ``np.float64``,
    ``np.arange`` ``np.int64``), true/false or None. A list, a mapping or any other object is
    one UsageError naming the key, never a TypeError from ``json``."""
    import numbers
    import operator
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        value = operator.index(value)
        if abs(value) >= 10**100:    # past any field's range, and json.dumps fails at 4,300 digits
            raise UsageError(f"sweep {key}: {short(value)} is past the range of every job field")
        return value
    if isinstance(value, numbers.Real):
        return float(value)
    raise UsageError(f"sweep {key}: {short(value)} (a {type(value).__name__}) cannot be a sweep "
                     "value; give text, numbers, true/false or None (one run per value)")


def submit(job_file: str | Path | Mapping | JobConfig,
           profile: str | Path | ClusterProfile = DEFAULT_PROFILE, *,
           nodes: int | None = None, runs_dir: str | Path | None = None, chain: int = 1,
           sweep: Mapping | list[str] | None = None, max_parallel: int | None = None,
           dry_run: bool = False, force: bool = False,
           overrides: Mapping | list[str] | None = None,
           follow_local_run: Callable[[Submitted], str] | None = None,
           warn: Callable[[str], None] | None = None) -> Submission:
    """Validate, plan, prepare the data, create the run folder(s), write the script, submit.

    ``chain`` K > 1 submits K jobs of the run, each after the previous one ended (Slurm).
    ``sweep`` submits one run per combination of values: one Slurm job array, or on a local
    profile the runs one after another, each followed by ``follow_local_run`` (default: quietly
    to its end), so a local sweep returns when its runs ended. ``force`` submits a layout the
    planner says does not fit. What can be said now about the layers the ranks will pick goes
    to ``warn`` (default: Python's ``warnings``). ``job_file`` may also be a mapping (what a
    job file holds) or a loaded ``JobConfig``; ``overrides`` (``{"train.lr": 3e-4}`` or
    ``--set`` specs) change values of it, recorded in the run's resolved job and ``run.yaml``.
    """
    if not isinstance(chain, int) or isinstance(chain, bool) or chain < 1:
        raise UsageError(f"--chain: expected a number of jobs, at least 1, got {chain!r}")
    from .sweep_values import override_mapping, typed_overrides
    warn = warn or _python_warning
    overrides = override_mapping(overrides)
    resolved = load_resolved(job_file, profile, nodes, overrides)
    overrides = typed_overrides(resolved.job, overrides)
    for message in launch_warnings(resolved):
        warn(message)
    specs = sweep_specs(sweep)
    if specs:
        if chain > 1:
            raise UsageError("--chain with --sweep: submit the sweep, then extend a run with "
                             "`hpctrain resume RUN`")
        return _submit_sweep(job_file, overrides, resolved.profile, specs, runs_dir=runs_dir,
                             max_parallel=max_parallel, dry_run=dry_run, force=force,
                             follow_local_run=follow_local_run, warn=warn)
    if max_parallel is not None:
        raise UsageError("--max-parallel limits a sweep; add --sweep KEY=V1,V2 or drop it")
    check_chain(chain, resolved.profile)
    backend = backend_for(resolved.profile)
    # a dry run writes nothing outside its run folder and may run off the cluster: what it
    # cannot see here (data on the cluster's file system) is a warning
    check_offline(resolved, force=force, prepare=not dry_run, warn=warn if dry_run else None,
                  dry_run=dry_run)
    run = prepare_run(resolved, runs_root_for(runs_dir, resolved.profile),
                      source=job_source(job_file))
    try:
        if overrides:
            run.update_meta(overrides=overrides)
        if dry_run:
            script = None
            if backend.batch_script:
                write_script(run, script_inputs(run, resolved.profile), resolved=resolved)
                script = run.script_file
            run.update_meta(dry_run=True)
            return Submission(resolved, [run], dry_run=True, script=script)
        subs = submit_chain(resolved, run, chain)
    except SubmissionError as e:
        # sbatch refused the first job: the run never reached the scheduler
        raise refusal(e, remove_refused_run(run), "the run folder prepared for it") from None
    except BaseException:
        # Interrupted or refused before a job reached the scheduler (the claim of the
        # checkpoint folder refused: another submission claimed checkpoint.dir after
        # prepare_run checked it, or the folder cannot be made): remove the run folder this
        # call created, and nothing else (a run that records a job is kept); no half run is left
        remove_refused_run(run)
        raise
    script = run.script_file if backend.batch_script else None
    return Submission(resolved, [run], subs, script=script)


def _submit_sweep(job_file, overrides: dict, profile: ClusterProfile, specs: list[str], *,
                  runs_dir, max_parallel,
                  dry_run: bool, force: bool,
                  follow_local_run: Callable[[Submitted], str] | None,
                  warn: Callable[[str], None]) -> Submission:
    from .sweep_values import expand, parse_axes
    backend = backend_for(profile)
    check_max_parallel(max_parallel, backend)
    both = sorted({a.key for a in parse_axes(specs)} & set(overrides))
    if both:
        raise UsageError(f"--set and --sweep both give {', '.join(both)}; keep one of them")
    job, folder = load_job_input(job_file, overrides)
    points = expand(job, profile, specs, folder=folder, source=job_source(job_file))
    check_sweep([p.resolved for p in points], force=force, prepare=not dry_run,
                warn=warn if dry_run else None, dry_run=dry_run)
    sweep_dir, sweep_runs = prepare_sweep(points, runs_root_for(runs_dir, profile),
                                          source=job_source(job_file))
    out = Submission(points[0].resolved, [r.run for r in sweep_runs], dry_run=dry_run,
                     sweep_dir=sweep_dir, sweep_runs=sweep_runs)
    if backend.arrays:
        out.script = sweep_dir / "sbatch.sh"
    try:
        if overrides:
            for r in sweep_runs:
                r.run.update_meta(overrides=overrides)
        if dry_run:
            if backend.arrays:
                write_array_script(sweep_dir, sweep_runs, max_parallel=max_parallel)
            for r in sweep_runs:
                r.run.update_meta(dry_run=True)
            return out
    except BaseException:
        remove_refused_sweep(sweep_dir, sweep_runs)   # interrupted or refused before any job
        raise
    if backend.arrays:
        try:
            out.array_job_id = submit_sweep_array(sweep_dir, sweep_runs,
                                                  max_parallel=max_parallel).array_job_id
        except SubmissionError as e:
            raise refusal(e, remove_refused_sweep(sweep_dir, sweep_runs),
                          f"the sweep's folder and its {len(sweep_runs)} run folders",
                          "were") from None
        except BaseException:     # a claim refused, or stopped before the array was queued
            remove_refused_sweep(sweep_dir, sweep_runs)
            raise
        return out
    run_sweep_locally(sweep_dir, sweep_runs, follow_local_run or _follow_quietly)
    return out


def refusal(error: SubmissionError, removed: bool, what: str,
            verb: str = "was") -> SubmissionError:
    """sbatch's refusal as it said it, and what became of the folders made for the job: removed
    (nothing was queued, so nothing is lost; ``--dry-run`` prepares them to look at), or kept
    (they hold something else, or removing them failed) for ``runs rm``."""
    fate = (f"{what} {verb} removed (`hpctrain submit --dry-run` prepares the same, to look at "
            "the script)" if removed else
            f"{what} {verb} kept: more than this submission wrote is there, or removing failed "
            "(`hpctrain runs rm` removes a run)")
    return SubmissionError(f"{error}\nNothing was queued: {fate}.")


def _python_warning(message: str) -> None:
    import warnings
    warnings.warn(message, UserWarning, stacklevel=3)


def _follow_quietly(sub: Submitted) -> str:
    from ..view.follow import follow_to_end
    follow_to_end(sub.run, job=sub.job)
    return "finished"
