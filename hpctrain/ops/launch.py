"""Submitting a run's jobs: the first one, a chain of dependent ones, or a resubmission.

Every job of a run executes the run's *entry*: the training runtime (``train_main``) unless
``run.yaml`` names another ``module:function`` under ``entry`` (how a run built around a custom
task keeps running the same task when it is chained, requeued or resumed).

A chain is K jobs of the same run, each ``--dependency=afterany:<previous>``: a job starts once
the one before it has ended for good (a requeued job has not ended), resumes from the newest
checkpoint, and exits at once when the run has finished or was cancelled (the batch script's
``begin`` hook).
"""

from __future__ import annotations

import importlib
from typing import Callable

from ..config import Resolved
from ..errors import HpcTrainError, UsageError
from ..runs import Run
from ..slurm.submit import Submitted, submit_function

DEFAULT_ENTRY = "hpctrain.runtime.entry:train_main"


def entry_name(run: Run) -> str:
    return run.meta().get("entry") or DEFAULT_ENTRY


def load_entry(name: str) -> Callable:
    module_name, _, attr = name.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise UsageError(f"run entry {name!r} cannot be loaded ({e}); fix `entry` in run.yaml") from None


def submit_run_job(resolved: Resolved, run: Run, *, dependency: str | None = None,
                   env: dict | None = None) -> Submitted:
    """Submit one job of ``run`` running its entry with the run folder as argument."""
    fn = load_entry(entry_name(run))
    return submit_function(run, resolved.profile, fn, (str(run.path),), kind="train",
                           resolved=resolved, dependency=dependency, env=env)


def chain_dependency(previous_job_id: str) -> str:
    return f"afterany:{previous_job_id}"


def submit_chain(resolved: Resolved, run: Run, count: int) -> list[Submitted]:
    """``count`` jobs of one run, each waiting for the previous one to end (Slurm only)."""
    if count < 1:
        raise UsageError(f"--chain: expected at least 1 job, got {count}")
    if count > 1 and resolved.profile.scheduler != "slurm":
        raise UsageError(f"--chain needs a Slurm profile; {resolved.profile.name!r} runs on this "
                         "machine, where one job already runs to the end (drop --chain)")
    subs: list[Submitted] = []
    for i in range(count):
        dep = chain_dependency(subs[-1].job_id) if subs else None
        try:
            subs.append(submit_run_job(resolved, run, dependency=dep))
        except HpcTrainError as e:
            if not subs:
                raise
            raise HpcTrainError(f"{e}\nchain of run {run.id} stopped at job {i + 1} of {count}; jobs "
                                f"{', '.join(s.job_id for s in subs)} are submitted "
                                f"(`hpctrain cancel {run.id}` cancels them)") from None
    if count > 1:
        run.update_meta(chain=[s.job_id for s in subs])
    return subs
