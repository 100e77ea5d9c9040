"""hpctrain from Python: the calls behind ``hpctrain.submit``, ``hpctrain.plan`` and
``hpctrain.runs``, and ``hpctrain.Run``, the handle on one run.

Each does what its command does, through the same library functions, and returns objects
instead of printing: ``submit`` a :class:`Run` (a list of them for a sweep), ``plan`` the data
``hpctrain plan --json`` prints, ``runs`` the run folders ``hpctrain runs`` lists. Errors are
the CLI's: :class:`hpctrain.errors.UsageError` (bad input, with the field and the fix),
:class:`hpctrain.errors.SubmissionError` (sbatch refused), both :class:`HpcTrainError`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Mapping
from pathlib import Path

from .caller_data import plain
from .config import DEFAULT_PROFILE, ClusterProfile, JobConfig
from .errors import RunNotFoundError, UsageError
from .record.folder import RUN_FILE, RunFolder, is_run_folder
from .record.reader import DamagedFile


class Run(RunFolder):
    """A run, and the object ``hpctrain.submit`` returns (``hpctrain.Run``).

    Everything the run folder holds (:class:`~hpctrain.record.folder.RunFolder`: ``meta``,
    ``ledger``, ``events``, ``metrics``, ...) and what is known only by also asking the
    scheduler: ``state``, ``summary``, ``status`` and ``wait``. Cheap to create: it only holds
    the path, and every question reads the folder when it is asked.
    ``Run("runs/tiny-gpt-...")`` opens an existing run folder.
    """

    def __post_init__(self) -> None:
        # the API's door for a run's path: ``Run(None)`` or ``Run(5)`` would be a TypeError
        # from pathlib, and ``Run("")`` would be the current folder
        self.path = _path_or_text("path", self.path)
        super().__post_init__()

    def _require(self) -> None:
        """The door of every question about the run's files: its path is a run folder (named
        in the one printable form: a path may hold a line feed or an escape code)."""
        if not is_run_folder(self.path):
            from .file_door import show
            raise RunNotFoundError(f"{show(self.path)} is not a run folder (no {RUN_FILE}); "
                                   "`hpctrain runs` lists the run folders")

    def state(self) -> str:
        """RUNNING, PENDING, ... (Slurm's word) while a job is active; else FINISHED, CANCELLED,
        STOPPED, NOT SUBMITTED or the last job's final state (the STATE of ``hpctrain runs``);
        DAMAGED when a file of its folder cannot be read (``summary()["damaged"]`` names it)."""
        from .view.runview import build_view
        self._require()
        return build_view(self, damaged_ok=True).state

    def summary(self) -> dict:
        """The run's row in ``hpctrain runs --json``."""
        from .view.runview import build_view
        self._require()
        return build_view(self, damaged_ok=True).summary()

    def status(self) -> dict:
        """What ``hpctrain status RUN --json`` prints: live job state, step and loss, the
        attempts, the checkpoints."""
        from .ops.status import run_status
        self._require()
        return run_status(self)

    def wait(self, *, echo=None, poll_s: float = 2.0, timeout_s: float | None = None) -> str:
        """Block until none of the run's training jobs is pending or running (requeues and
        chained jobs included) and return its final :meth:`state`. ``echo`` (e.g. ``print``)
        gets the progress lines ``hpctrain submit --wait`` shows; past ``timeout_s``,
        TimeoutError (the jobs go on)."""
        from . import limits
        from .view.follow import follow_run
        poll_s = limits.number("poll_s", poll_s, optional=False)
        timeout_s = limits.number("timeout_s", timeout_s)
        if echo is not None and not callable(echo):
            raise UsageError(f"echo: expected a function taking one line (e.g. print) or None, "
                             f"got {limits.shown(echo)}")
        self._require()
        start = time.monotonic()
        try:
            follow_run(self, echo, poll_s=poll_s, timeout_s=timeout_s, last_record=False)
        except DamagedFile:
            # a file the progress lines come from cannot be read: wait on without them (only
            # run.yaml, which says what to wait for, is read: damaged, it is this error again),
            # and the state says DAMAGED, as summary()["damaged"] says which file
            left = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - start))
            follow_run(self, None, poll_s=poll_s, timeout_s=left, last_record=False)
        return self.state()


# What a Run inherits from RunFolder that reads or writes the run's files: each first checks that
# the path is a run folder (``Run._require``, the door ``state`` and ``status`` already had).
# A RunFolder reads a missing file as "nothing yet" (a folder being created has none), so
# ``Run("runs/typo").metrics()`` was [] and ``job_ids()`` [] (a run that never logged nor
# submitted), and ``Run("/tmp").event("x")`` wrote /tmp/events.jsonl. The rest of RunFolder
# only names paths (``attempt_dir``, ``rank_log``, the ``*_file`` properties), which a caller
# may ask about a run folder that is not there yet.
FOLDER_METHODS = ("meta", "update_meta", "add_job_id", "job_ids", "ledger", "append_ledger",
                  "update_ledger_record", "events", "event", "metrics", "latest_metrics",
                  "cancelled", "attempt_records", "ledger_for_budget", "finished",
                  "attempts_started", "begin_attempt", "resolved_job", "resolved_profile",
                  "checkpoint_dir", "lock")


def _in_a_run_folder(method):
    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        self._require()
        return method(self, *args, **kwargs)
    return checked


for _name in FOLDER_METHODS:
    setattr(Run, _name, _in_a_run_folder(getattr(RunFolder, _name)))
del _name


def submit(job: str | Path | Mapping | JobConfig,
           profile: str | Path | ClusterProfile = DEFAULT_PROFILE, *,
           nodes: int | None = None, chain: int = 1, sweep: Mapping | list[str] | None = None,
           max_parallel: int | None = None, dry_run: bool = False, force: bool = False,
           runs_dir: str | Path | None = None,
           overrides: Mapping | None = None) -> Run | list[Run]:
    """Submit a training run of ``job`` (a job file, a mapping holding what a job file holds,
    or a loaded :class:`hpctrain.config.JobConfig`; relative paths of the last two are relative
    to the current folder) on ``profile`` (a name, a file, or a loaded profile), as
    ``hpctrain submit`` does, and return its :class:`Run` without waiting (``run.wait()``
    follows it). ``overrides`` (``{"train.lr": 3e-4}``) changes values as ``--set`` does.

    ``nodes`` resizes the profile; ``chain`` K submits K jobs of the run, each after the
    previous one ended (Slurm); ``sweep`` (``{"train.lr": [1e-4, 3e-4]}`` or
    ``["train.lr=1e-4,3e-4"]``) submits one run per combination and returns their list (one
    job array on Slurm; on a local profile the runs train one after another before this
    returns); ``max_parallel`` caps a sweep's runs at once; ``dry_run`` creates the run folder
    and script and submits nothing; ``force`` submits a layout the planner says does not fit;
    ``runs_dir`` is where run folders go (default as the CLI's ``--runs-dir``).
    """
    from . import limits
    from .submission import submit as submit_job
    nodes = limits.integer("nodes", nodes, argument=True)
    chain = limits.integer("chain", chain, optional=False, argument=True)
    max_parallel = limits.integer("max_parallel", max_parallel, argument=True)
    limits.boolean("dry_run", dry_run, optional=False)
    limits.boolean("force", force, optional=False)
    if sweep is not None and not isinstance(sweep, (Mapping, list, tuple)):
        raise UsageError(f"sweep: expected a mapping {{'train.lr': [1e-4, 3e-4]}} or a list of "
                         f"'KEY=V1,V2' strings, got {limits.shown(sweep)}")
    if overrides is not None and not isinstance(overrides, (Mapping, list, tuple, str)):
        # asked whether it is empty before its type: a numpy array of "KEY=VALUE" strings was
        # numpy's ValueError ("truth value ... ambiguous"), an object whose __bool__ raises that
        raise UsageError(f"overrides: expected a mapping {{'train.lr': 3e-4}} or a list of "
                         f"'KEY=VALUE' strings, got {limits.shown(overrides)}")
    job = _path_or_text("job", job)
    sweep = plain("sweep", sweep, sweep=True)
    overrides = plain("overrides", overrides)
    profile = _profile_argument(profile)
    if runs_dir is not None:
        runs_dir = _path_or_text("runs_dir", runs_dir)
    with _os_errors_worded():
        done = submit_job(job, profile, nodes=nodes, runs_dir=runs_dir, chain=chain,
                          sweep=sweep, max_parallel=max_parallel, dry_run=dry_run, force=force,
                          overrides=overrides)
    if done.sweep_dir is not None:
        return [Run(r.path) for r in done.runs]
    return Run(done.run.path)


def plan(job: str | Path | Mapping | JobConfig,
         profile: str | Path | ClusterProfile | None = None, *, nodes: int | None = None,
         gpus: int | None = None, tp: int | None = None, pp: int | None = None,
         vpp: int | None = None, micro_batch_size: int | None = None,
         sequence_parallel: bool | None = None, recompute: str | None = None) -> dict:
    """What ``hpctrain plan JOB --json`` prints: every valid layout of ``job`` (a job file, a
    mapping or a JobConfig, as ``submit`` takes it) on ``profile``
    (default: the local profile; none with ``gpus`` alone) ranked by estimated step time among
    those that fit, each with its memory per GPU, and why every other candidate was rejected.
    Pinning any of ``tp``, ``pp``, ``vpp`` (0: none), ``micro_batch_size``,
    ``sequence_parallel``, ``recompute`` ("none", "selective", "full") explains that one layout
    (``layouts`` is then empty and ``rejected`` says why, when it is not valid)."""
    from . import limits
    from .planner.request import plan_data
    nodes, gpus, tp, pp, vpp, micro_batch_size = (
        limits.integer(name, value, argument=True)
        for name, value in (("nodes", nodes), ("gpus", gpus), ("tp", tp), ("pp", pp),
                            ("vpp", vpp), ("micro_batch_size", micro_batch_size)))
    limits.boolean("sequence_parallel", sequence_parallel)
    recompute = limits.choice("recompute", recompute, ("none", "selective", "full"))
    from .submission.checks import load_job_input
    job = _path_or_text("job", job)
    if profile is not None:
        profile = _profile_argument(profile)
    with _os_errors_worded():
        # a mapping or a JobConfig is checked as its file would be (a JobConfig changed in
        # Python with num_layers=10**6 would keep the planner busy for hours): submit's door
        job, _ = load_job_input(job)
        return plan_data(job, profile, nodes=nodes, gpus=gpus, tp=tp, pp=pp, vpp=vpp,
                         mbs=micro_batch_size, sp=sequence_parallel, recompute=recompute)


def runs(runs_dir: str | Path | None = None, *, limit: int | None = None) -> list[Run]:
    """The run folders ``hpctrain runs`` lists, newest first (at most ``limit``), as
    :class:`Run` objects: ``run.summary()`` is a row of ``hpctrain runs --json``."""
    from .ops.listing import newest_runs
    from .record.folder import runs_root
    runs_dir, limit = _check_runs_arguments(runs_dir, limit)
    with _os_errors_worded():
        return [Run(r.path) for r in newest_runs(runs_root(runs_dir), limit)]


def runs_table(runs_dir: str | Path | None = None, *, limit: int | None = None) -> list[dict]:
    """The rows of ``hpctrain runs --json``, newest first (at most ``limit``), in one call,
    read as the command reads them (through the runs index, each row checked against its
    run's files): the way to rank a whole runs folder, ``pandas.DataFrame(hpctrain.runs_table())``.
    :meth:`Run.summary` builds one run's row on its own, asking the scheduler each time. A
    damaged index is ignored, rebuilt, and reported with :func:`warnings.warn`."""
    import warnings

    from .ops.runs_index import listing_rows
    from .record.folder import runs_root
    runs_dir, limit = _check_runs_arguments(runs_dir, limit)
    with _os_errors_worded():
        return listing_rows(runs_root(runs_dir), limit,
                            warn=lambda line: warnings.warn(line, stacklevel=3))


def _check_runs_arguments(runs_dir, limit):
    """``runs_dir`` as plain text (None: the default) and ``limit`` as a plain int (or None),
    after checking both arguments."""
    from . import limits
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                              or int.__index__(limit) < 0):
        # quoted by limits' words: an object whose repr raises is named by its type
        raise UsageError(f"limit: expected an integer of at least 0 or None, got "
                         f"{limits.shown(limit)}")
    limit = None if limit is None else int.__index__(limit)    # an int subclass's plain value
    return None if runs_dir is None else _path_or_text("runs_dir", runs_dir), limit


@contextlib.contextmanager
def _os_errors_worded():
    """A filesystem error inside an API call is the one line the CLI gives for it (an
    :class:`HpcTrainError`, as every other error of the API), not a raw ``OSError``."""
    from .errors import from_os_error
    try:
        yield
    except OSError as e:
        raise from_os_error(e) from None


def _profile_argument(profile):
    """``profile`` as ``submit`` and ``plan`` take it: a name or a file (checked as a path), or
    a :class:`ClusterProfile` object, checked again as its file would be
    (``config.load_profile``): one built or changed in Python skipped every check."""
    from .config import load_profile
    if isinstance(profile, ClusterProfile):
        return load_profile(profile)
    _path_or_text("profile", profile)
    return profile                      # a name or a file, as load_profile tells them apart


def _path_or_text(name: str, value):
    """The API's door for an argument naming a file or folder: a str or a ``pathlib.Path``,
    not blank, of at most the file system's lengths and without a NUL byte (``os.stat``
    raises ValueError on one); a job may also be a mapping or a loaded JobConfig. Anything
    else is one UsageError naming the argument (the value quoted by ``limits``' words: an
    object whose repr raises is named by its type). Returns the value to use: the path as a
    plain ``str`` (a subclass's own ``__str__`` or ``__fspath__`` is asked once, here), the
    mapping read once as plain data (:mod:`.caller_data`), or the loaded job as given."""
    from . import limits
    from .config import safety
    if name == "job" and isinstance(value, JobConfig):
        return value                            # a loaded job (checked again by the loader)
    if name == "job" and isinstance(value, Mapping):
        return plain("job", value)              # what a job file holds, read once
    what = ("a job file, a mapping or a JobConfig" if name == "job"
            else "a path (a str or pathlib.Path)")
    try:
        text = os.fspath(value)[:] if isinstance(value, (str, Path)) else None
    except Exception:  # noqa: BLE001 - a subclass whose __fspath__/__str__ raises
        text = None
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"{name}: expected {what}, got {limits.shown(value)}")
    why = safety.path_problem(text)
    if why:
        raise UsageError(f"{name}: the path {safety.short(text)} {why}")
    return text


__all__ = ["Run", "plan", "runs", "runs_table", "submit"]
