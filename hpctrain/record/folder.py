"""Run folders: everything one training run owns, and its ledger of attempts.

A run is born at ``hpctrain submit`` and outlives any single Slurm job: a requeued, chained or
resumed job continues the same run. Layout (all paths relative to the run folder)::

    run.yaml              name, profile, created, hpctrain version, job ids submitted
    job.yaml              the job, resolved (absolute paths); what the ranks read
    profile.yaml          the profile, resolved (with --nodes applied)
    sbatch.sh             the rendered batch script of the latest submission
    submitit/             submitit's pickles and results
    logs/attempt-N/       batch.log (the batch shell) and rank-R.log (each rank) of attempt N
    ledger.jsonl          one record per attempt (appended by the batch shell or rank 0)
    events.jsonl          submissions, cancels, requeue decisions, checkpoints
    metrics.jsonl         training metrics written by rank 0
    checkpoints/          checkpoints, unless the profile puts them on other storage

JSONL files are appended with one ``write`` under an exclusive lock (:mod:`.files`), so
concurrent writers (the batch shell, rank 0, a user's ``hpctrain cancel``) never interleave
partial lines. ``run.yaml`` is read-modify-written only under the run's lock (``.lock``, ``flock``) and
replaced atomically (temporary file, fsync, rename, fsync of the folder); a ``run.yaml`` or
ledger that cannot be read is an error naming the file, never treated as empty (which would
overwrite it).

Run folders are private to their owner (0700; 0750 with ``storage.group_readable``): whoever
can write one can run code in the job, through submitit's pickles and checkpoint loading.
Nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ..config import safety, yamlio
from ..errors import HpcTrainError, RunNotFoundError, UsageError
from ..exit_codes import ExitReason
from .attempt_records import AttemptRecord
from .. import file_door, limits
from ..file_door import kind_of, show
from . import reader
from .files import (JOB_KINDS, METRIC_KINDS, REMOVING_PREFIX, RUN_FILE, RunFileError,
                    _why, append_jsonl, folder_lock, is_run_folder, now_iso, record_kind)


def checked_metric_kind(kind, *, allow_all: bool) -> str | None:
    """``kind`` as a caller asked for records by it (``Run.metrics``, ``latest_metrics``):
    one of :data:`METRIC_KINDS` (or None for all, where ``allow_all``). A typo such as "val"
    would otherwise select nothing and read as a run without evaluations."""
    if (kind is None and allow_all) or (type(kind) is str and kind in METRIC_KINDS):
        return kind
    choices = ", ".join(repr(k) for k in METRIC_KINDS) + (" or None" if allow_all else "")
    raise UsageError(f"kind: expected {choices}, got {safety.short(kind)}")


def attempt_number(attempt) -> int:
    """``attempt`` as a caller names an attempt of a run (``Run.attempt_dir``, ``rank_log``,
    ``update_ledger_record``): a whole number from 1 up to the bound of ``hpctrain logs
    --attempt`` (``limits.INTEGERS["log_attempt"]``). The one door of attempt numbers: the
    number is written into a path (``logs/attempt-N``), so anything else (``-1``, ``True``,
    ``1.5``, ``"../.."``) would name a folder no attempt has, or one outside the logs folder."""
    return limits.integer("log_attempt", attempt, optional=False, label="attempt",
                          fix="attempts are numbered from 1; run.attempts_started() lists them")


def rank_number(rank) -> int:
    """``rank`` as a caller names a rank of an attempt (``Run.rank_log``): a whole number from 0
    below the largest world size (``limits.INTEGERS["log_rank"]``, the bound of ``hpctrain logs
    --rank``). The one door of rank numbers, for the same reason as :func:`attempt_number`."""
    return limits.integer("log_rank", rank, optional=False, label="rank",
                          fix="ranks are numbered from 0")


def checked_job_kind(kind, *, allow_all: bool) -> str | None:
    """``kind`` as a caller asks for a run's jobs by it (``Run.job_ids``) or records one
    (``add_job_id``): one of :data:`JOB_KINDS` (or None for all, where ``allow_all``). Any other
    value selected no job, and read as a run that never submitted one."""
    if (kind is None and allow_all) or (type(kind) is str and kind in JOB_KINDS):
        return kind
    choices = ", ".join(repr(k) for k in JOB_KINDS) + (" or None" if allow_all else "")
    raise UsageError(f"kind: expected {choices}, got {limits.shown(kind)}")


def checked_records(name: str, records, reader_name: str) -> list[dict] | None:
    """``records`` as a caller hands in what it has already read of a run (``cancelled``'s
    events, ``finished``'s ledger and events), to spare a second read: None (read them here)
    or a list of dicts as ``reader_name`` returns. Anything else was a TypeError or an
    AttributeError from inside, or a string read as no record at all."""
    if records is None or (type(records) is list and all(type(r) is dict for r in records)):
        return records
    raise UsageError(f"{name}: expected the list of records {reader_name} returns, or None to "
                     f"read them, got {limits.shown(records)}")


LOCK_FILE = ".lock"
PRIVATE_MODE = 0o700
GROUP_READABLE_MODE = 0o750


def folder_mode(group_readable: bool = False) -> int:
    """Mode of the folders hpctrain creates for a run: private, or readable by the group
    (``storage.group_readable``); never writable by anyone else."""
    return GROUP_READABLE_MODE if group_readable else PRIVATE_MODE


def default_runs_root(profile_runs_root: str | None = None) -> Path:
    """``$HPCTRAIN_RUNS_DIR``, else the profile's ``storage.runs_root``, else ``./runs``."""
    env = os.environ.get("HPCTRAIN_RUNS_DIR")
    if env:
        return usable_root(env, "$HPCTRAIN_RUNS_DIR")
    if profile_runs_root:
        return usable_root(profile_runs_root, "the profile's storage.runs_root")
    return usable_root("runs", "./runs")


def usable_root(text: str | Path, what: str) -> Path:
    """``text`` as an absolute folder that is, or can become, a runs root; UsageError naming
    ``what`` (``--runs-dir``, ``$HPCTRAIN_RUNS_DIR``, the profile's ``storage.runs_root``), the
    path and the fix when it cannot (not one line of printable text, a NUL byte, a name too
    long, ``~user`` of no such user, a symlink loop, a regular file on the way, something
    other than a folder there): one line, never a traceback. The one door every runs root
    goes through, whichever of those it came from."""
    fix = "name a folder (it is created when missing)"
    raw = os.fspath(text)
    if not raw.strip():    # " " would be a folder named by a space in the current one
        raise UsageError(f"{what} {raw!r} is blank; {fix}, or leave it unset")
    why = safety.text_problem(raw, safety.PATH_MAX) or safety.path_problem(raw)
    if why:
        raise UsageError(f"{what} {safety.short(raw)} {why}; {fix}")
    try:
        expanded = Path(raw).expanduser()
    except RuntimeError:   # ~name of no such user, or no home folder to expand ~ to
        raise UsageError(f"{what} {show(raw)}: {raw.split('/')[0]} is no user's home folder "
                         f"here; {fix}") from None
    try:
        path = file_door.resolve(expanded)
    except file_door.Refused as e:   # a symlink loop
        raise UsageError(f"{what} {show(raw)} {e.why}; {fix}") from None
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:   # bytes that are not UTF-8 reach Python as lone surrogates
        raise UsageError(f"{what} {str(path)!r}: the path is not UTF-8 text, and a run folder's "
                         "files (which name it) must read back as text; run from a folder whose "
                         "path is UTF-8, or give --runs-dir") from None
    probe = path
    while True:
        try:
            st = os.stat(probe)
        except (FileNotFoundError, NotADirectoryError):   # the file on the way is named above
            probe = probe.parent
            continue
        except OSError as e:
            raise UsageError(f"{what} {show(path)}: {e.strerror}; {fix}") from None
        if not stat.S_ISDIR(st.st_mode):
            kind = "a file" if stat.S_ISREG(st.st_mode) else kind_of(st.st_mode)
            where = f"is {kind}" if probe == path else f"{show(probe)} on the way is {kind}"
            raise UsageError(f"{what} {show(path)}: {where}, not a folder; {fix}")
        _not_in_a_run(path, what)
        return path


def _not_in_a_run(path: Path, what: str) -> None:
    """A runs root is never a run folder nor inside one (``--runs-dir RUN`` or ``RUN/logs``):
    the runs made there would live in another run's folder, and removing that run (``runs
    rm``) would delete them with it."""
    for folder in (path, *path.parents):
        if is_run_folder(folder):
            where = "is" if folder == path else f"is inside {show(folder)}, which is"
            raise UsageError(f"{what} {show(path)} {where} a run folder; give the folder that "
                             f"holds run folders (e.g. {show(folder.parent)})")


def expanded(text: str | Path) -> Path:
    """``text`` with ``~``/``~user`` expanded; as given when it names no user's home folder
    (``Path.expanduser`` raises RuntimeError then), so a lookup says "no run ..."."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        return Path(text)


def runs_root(runs_dir: str | Path | None = None) -> Path:
    """The folder a command looks for runs in: ``runs_dir`` (``--runs-dir``), else
    ``$HPCTRAIN_RUNS_DIR``, the default profile's ``storage.runs_root``, or ``./runs``. A
    default profile that cannot be read does not stop anyone from looking at their runs."""
    if runs_dir:
        return usable_root(runs_dir, "--runs-dir")
    from ..config import load_profile
    try:
        profile_root = load_profile().storage.runs_root
    except (HpcTrainError, OSError, ValueError):
        profile_root = None
    return default_runs_root(profile_root)


# Events that reopen a run a user had cancelled, or a finished run resumed with --force.
REOPEN_EVENTS = ("resume", "requeue")


@dataclass(eq=False)
class RunFolder:
    """A run folder: everything it holds, read when asked. ``hpctrain.Run`` (the API's handle,
    :class:`hpctrain.api.Run`) is a RunFolder that can also ask the scheduler (state, status,
    wait); the library passes RunFolders around. Two handles on one folder are equal and hash
    alike (a set of runs, a dict keyed by run): by the absolute path each was given, taken when
    it was made, so a later ``chdir`` changes neither.

    Cheap to create: it only holds the path, and every question reads the folder when it is
    asked. ``RunFolder("runs/tiny-gpt-...")`` opens an existing run folder.
    """

    path: Path

    def __post_init__(self) -> None:
        self.path = expanded(self.path)
        self._key = os.path.abspath(self.path)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunFolder):
            return NotImplemented
        return self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    # ---- files -------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.path.name

    @property
    def shown(self) -> str:
        """The run's id as a message or a listing prints it. The folder's name is whatever is
        on disk (a folder renamed by hand may hold a line feed or an escape code), so it is
        printed in the one printable form, :func:`hpctrain.file_door.show`."""
        return show(self.id)

    @property
    def run_file(self) -> Path:
        return self.path / RUN_FILE

    @property
    def job_file(self) -> Path:
        return self.path / "job.yaml"

    @property
    def profile_file(self) -> Path:
        return self.path / "profile.yaml"

    @property
    def script_file(self) -> Path:
        return self.path / "sbatch.sh"

    @property
    def submitit_dir(self) -> Path:
        return self.path / "submitit"

    @property
    def logs_dir(self) -> Path:
        """``logs/``, a folder of this run's own (:meth:`_own_folder`)."""
        return self._own_folder(self.path / "logs")

    @staticmethod
    def _own_folder(path: Path) -> Path:
        """``path``, a folder a run keeps its own files in: a symbolic link there (to another
        run's logs, or anywhere) would have hpctrain read and write another folder's files as
        this run's, so it is damage, named (:class:`~hpctrain.record.reader.DamagedFile`),
        never followed. hpctrain never makes one."""
        if os.path.islink(path):
            raise reader.DamagedFile(path, "is a symbolic link; a run's logs are in folders of "
                                           "its own, never another's (replace the link with "
                                           "the folder, or move the run folder away)")
        return path

    @property
    def ledger_file(self) -> Path:
        return self.path / "ledger.jsonl"

    @property
    def events_file(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    def attempt_dir(self, attempt: int) -> Path:
        """``logs/attempt-N``: where attempt ``attempt`` (:func:`attempt_number`) logs; a link
        at ``logs`` or there is damage (:meth:`_own_folder`)."""
        return self._own_folder(self.logs_dir / f"attempt-{attempt_number(attempt)}")

    def rank_log(self, attempt: int, rank: int) -> Path:
        """``logs/attempt-N/rank-R.log``: the log of rank ``rank`` (:func:`rank_number`) in
        attempt ``attempt``."""
        return self.attempt_dir(attempt) / f"rank-{rank_number(rank)}.log"

    # ---- metadata ------------------------------------------------------------------------
    def lock(self):
        """Hold the run's lock (``flock`` on ``RUN/.lock``) for a read-modify-write of its
        files. Reentrant within a thread; other threads and processes wait."""
        return folder_lock(self.path / LOCK_FILE, f"run folder {self.path}")

    def meta(self) -> dict:
        """``run.yaml`` ({} while a new folder has none yet), its fields checked; unreadable
        or a field of the wrong type: :class:`~hpctrain.record.reader.DamagedFile` naming it
        (nothing is changed: repair or restore it, or move the run folder away)."""
        try:
            meta = reader.read_mapping(self.run_file, "run file")
            if meta is None:
                return {}
            problem = reader.meta_problem(meta)
            if problem:
                raise reader.DamagedFile(self.run_file, problem)
        except reader.DamagedFile as e:
            raise reader.DamagedFile(
                e.path, e.why, f"run file {self.run_file} cannot be read ({e.why}); nothing "
                f"was changed: repair or restore it, or move the run folder away") from None
        return meta

    def _write_meta(self, meta: dict) -> None:
        meta = _writable(meta, reader.meta_problem, self.run_file)
        try:
            yamlio.write_atomic(self.run_file, yamlio.dump(meta), within=self.path)
        except OSError as e:
            raise RunFileError(f"cannot write {self.run_file}: {_why(e)}") from None

    def update_meta(self, **changes: Any) -> dict:
        with self.lock():
            meta = self.meta()
            meta.update(changes)
            self._write_meta(meta)
        return meta

    def add_job_id(self, job_id: str, kind: str = "train") -> None:
        kind = checked_job_kind(kind, allow_all=False)
        with self.lock():
            meta = self.meta()
            jobs = list(meta.get("jobs", []))
            jobs.append({"job_id": str(job_id), "kind": kind, "submitted": now_iso()})
            meta["jobs"] = jobs
            self._write_meta(meta)

    def job_ids(self, kind: str | None = "train") -> list[str]:
        """The ids of the run's jobs of ``kind`` ("train", "preflight", or None for all), in
        the order they were submitted."""
        kind = checked_job_kind(kind, allow_all=True)
        return [j["job_id"] for j in self.meta().get("jobs", []) if kind is None or j["kind"] == kind]

    # ---- ledger and events ------------------------------------------------------------------
    def ledger(self) -> list[dict]:
        """The ledger's records, each field of its type (else DamagedFile naming the line)."""
        return reader.read_jsonl(self.ledger_file, check=reader.ledger_problem)

    def append_ledger(self, record: dict) -> None:
        record = _writable(record, reader.ledger_problem, self.ledger_file)
        with self.lock():   # update_ledger_record replaces the file: never append beside it
            append_jsonl(self.ledger_file, record)

    def update_ledger_record(self, attempt: int, **changes: Any) -> bool:
        """Set ``changes`` on the newest record of ``attempt`` (a value None removes the key),
        keeping every other record and key; False when the ledger has no such record. The
        ledger is read and replaced atomically (``write_atomic``) under the run's lock, which
        every ledger write holds; a line torn by a killed writer, skipped on reading, is
        dropped."""
        attempt = attempt_number(attempt)
        with self.lock():
            ledger = self.ledger()
            index = next((i for i in range(len(ledger) - 1, -1, -1)
                          if ledger[i].get("attempt") == attempt), None)
            if index is None:
                return False
            record = {**ledger[index], **changes}
            ledger[index] = _writable({k: v for k, v in record.items()
                                       if not (k in changes and v is None)},
                                      reader.ledger_problem, self.ledger_file)
            try:
                yamlio.write_atomic(self.ledger_file,
                                    "".join(json.dumps(r) + "\n" for r in ledger),
                                    within=self.path)
            except OSError as e:
                raise RunFileError(f"cannot write {self.ledger_file}: {_why(e)}") from None
            return True

    def events(self) -> list[dict]:
        return reader.read_jsonl(self.events_file, check=reader.event_problem)

    def event(self, kind: str, **data: Any) -> dict:
        record = _writable({"time": now_iso(), "event": kind, **data}, reader.event_problem,
                           self.events_file)
        append_jsonl(self.events_file, record)
        return record

    def metrics(self, as_frame: bool = False, kind: str | None = "train"):
        """The metrics records (``metrics.jsonl``) of one ``kind``: "train" (one per logged
        step, the default), "validation" (one per evaluation), "test" (the end-of-training
        test loss) or None for all of them; a list of dicts, or with ``as_frame=True`` a pandas
        DataFrame with one row per record (pandas is not a dependency: it is imported only
        then)."""
        kind = checked_metric_kind(kind, allow_all=True)
        if type(as_frame) is not bool:
            raise UsageError(f"as_frame: expected True or False, got {safety.short(as_frame)}")
        records = [r for r in reader.read_jsonl(self.metrics_file, limits.RUN_METRICS_BYTES,
                                                  check=reader.metric_problem)
                   if kind is None or record_kind(r) == kind]
        if not as_frame:
            return records
        try:
            import pandas
        except ImportError:
            raise UsageError("Run.metrics(as_frame=True) needs pandas: pip install pandas "
                             "(or call metrics() for a list of dicts)") from None
        return pandas.DataFrame.from_records(records)

    def latest_metrics(self, kind: str = "train") -> dict | None:
        """The newest metrics record of ``kind``, reading only the end of the file."""
        kind = checked_metric_kind(kind, allow_all=False)
        return reader.read_last_jsonl(self.metrics_file, accept=lambda r: record_kind(r) == kind,
                                      check=reader.metric_problem)

    def cancelled(self, events: list[dict] | None = None) -> bool:
        """A user cancelled the run and did not requeue or resume it since (``events``: what
        ``events()`` returned, when the caller has read it already)."""
        events = checked_records("events", events, "Run.events()")
        for e in reversed(self.events() if events is None else events):
            if e.get("event") == "cancel":
                return True
            if e.get("event") in REOPEN_EVENTS:
                return False
        return False

    def attempt_records(self) -> list[AttemptRecord]:
        """The ledger as typed records (``ledger()`` gives the JSON objects as stored)."""
        return [AttemptRecord.from_dict(r) for r in self.ledger()]

    def ledger_for_budget(self) -> list[AttemptRecord]:
        """The ledger since the last resubmission by a person (``hpctrain resume``, or
        ``hpctrain requeue`` of a stopped run): each one starts a fresh requeue budget."""
        ledger = self.attempt_records()
        start = 0
        for e in self.events():
            if e.get("event") in REOPEN_EVENTS and isinstance(e.get("ledger_records"), int):
                start = e["ledger_records"]
        return ledger[start:]

    def finished(self, ledger: list[dict] | None = None, events: list[dict] | None = None) -> bool:
        """The last attempt reached train.steps (and no forced resume, nor one that raised
        train.steps, reopened the run since). ``ledger`` and ``events``: what ``ledger()`` and
        ``events()`` returned, when the caller has read them already."""
        ledger = checked_records("ledger", ledger, "Run.ledger()")
        events = checked_records("events", events, "Run.events()")
        ledger = self.ledger() if ledger is None else ledger
        if not ledger or ledger[-1].get("exit_reason") != ExitReason.FINISHED:
            return False
        for e in reversed(self.events() if events is None else events):
            if e.get("event") == "attempt_end":
                return True
            if e.get("event") == "resume" and (e.get("force") or e.get("extended_to")):
                return False
        return True

    def attempts_started(self) -> list[int]:
        """The attempts that have a log folder, in order: ``logs/attempt-N`` for each N that
        :func:`attempt_number` takes (a folder ``attempt-0`` or ``attempt-0001`` made by hand
        names no attempt, and every number listed here can be asked about); an attempt's folder
        that is a link is damage (:meth:`_own_folder`)."""
        if not self.logs_dir.is_dir():
            return []
        _, low, high = limits.INTEGERS["log_attempt"]
        nums = []
        for d in self.logs_dir.iterdir():
            m = re.fullmatch(r"attempt-([1-9]\d{0,17})", d.name)
            if m and low <= int(m.group(1)) <= high and self._own_folder(d).is_dir():
                nums.append(int(m.group(1)))
        return sorted(nums)

    def begin_attempt(self) -> int:
        """Claim the next attempt number by creating its log folder (atomic ``mkdir``)."""
        while True:
            started = self.attempts_started()
            recorded = [r.get("attempt") or 0 for r in self.ledger()]
            n = max(started + recorded + [0]) + 1
            try:
                self.attempt_dir(n).mkdir(parents=True)
                return n
            except FileExistsError:
                continue

    def resolved_job(self):
        from ..config import job_from_mapping
        return job_from_mapping(self._mapping(self.job_file, "run's job file"), str(self.job_file))

    def resolved_profile(self):
        from ..config import profile_from_mapping
        return profile_from_mapping(self._mapping(self.profile_file, "run's profile"),
                                    str(self.profile_file))

    def _mapping(self, path: Path, what: str) -> dict:
        data = reader.read_mapping(path, what)
        if data is None:
            raise RunFileError(f"{what} {path} does not exist; the run folder is incomplete")
        return data

    def checkpoint_dir(self, job=None, profile=None) -> Path:
        """Where this run's checkpoints live: the folder recorded in ``run.yaml`` when the run
        was created, else :func:`checkpoint_location` of ``job`` and ``profile`` (or of the
        run's own files: ``job`` a loaded JobConfig, ``profile`` a loaded ClusterProfile)."""
        from ..config import ClusterProfile, JobConfig
        for name, value, kind in (("job", job, JobConfig), ("profile", profile, ClusterProfile)):
            if value is not None and not isinstance(value, kind):
                raise UsageError(f"{name}: expected a loaded {kind.__name__} or None (the run's "
                                 f"own), got {limits.shown(value)}")
        recorded = self.meta().get("checkpoint_dir")
        if recorded:
            return Path(recorded)
        if job is None and self.job_file.is_file():
            job = self.resolved_job()
        if profile is None and self.profile_file.is_file():
            profile = self.resolved_profile()
        return checkpoint_location(self, job, profile)


def _writable(record: dict, problem: Callable[[dict], str | None], path: Path) -> dict:
    """``record`` as its reader will read it back, if that reader takes it: what hpctrain
    writes into a run folder passes the same checks as what it reads there (``reader``'s
    ``*_problem``), so no caller (the runtime, a command, the Python API) can write a record
    that makes the run DAMAGED. Else a UsageError naming the file and the field; nothing is
    written. JSON is the format of every record, run.yaml's fields included; a NaN or an
    infinity is refused where the reader refuses it (a typed field), and written as JSON's
    literal elsewhere, as the reader's parser takes it (a free-form field of an event)."""
    if not isinstance(record, dict):
        raise UsageError(f"cannot write {path.name}: a record is a mapping, not "
                         f"{type(record).__name__}; nothing was written")
    try:
        read_back = file_door.loads(json.dumps(record))
    except (TypeError, ValueError, RecursionError) as e:
        raise UsageError(f"cannot write {path.name}: {show(str(e), 200)} (a record is "
                         "JSON); nothing was written") from None
    found = problem(read_back)
    if found:
        raise UsageError(f"cannot write {path.name}: {found} (its reader would refuse the "
                         "record); nothing was written")
    return read_back


def checkpoint_root_folder(root: str) -> Path:
    """A profile's ``storage.checkpoint_root`` as the folder it names: ``~`` expanded (a
    ``~user`` of no such user raises RuntimeError, for the caller to word), a relative one
    made absolute against the current folder. Both the checks before a run is created and the
    path ``run.yaml`` records read it here, so they name one folder."""
    return Path(os.path.abspath(Path(root).expanduser()))


def checkpoint_location(run: RunFolder, job=None, profile=None) -> Path:
    """The one rule for a run's checkpoint folder, applied when the run is created (and
    recorded in ``run.yaml``): the job's ``checkpoint.dir``, else
    ``<storage.checkpoint_root>/<run id>`` of the profile, else ``RUN/checkpoints``. A
    relative root is relative to the folder the run is created from, as a relative runs root
    is, and made absolute here: ``run.yaml`` records where the checkpoints are, and the ranks,
    which run in the run folder, read that."""
    if job is not None and job.checkpoint.dir:
        return Path(job.checkpoint.dir)
    if profile is not None and profile.storage.checkpoint_root:
        return checkpoint_root_folder(profile.storage.checkpoint_root) / run.id
    return run.path / "checkpoints"


def new_run_id(name: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{name}-{stamp}-{secrets.token_hex(2)}"


def new_private_folder(root: Path, name: str, mode: int = PRIVATE_MODE) -> Path:
    """A new, empty folder ``<root>/<name>-<time>-<hex>`` with ``mode`` (private by default):
    run folders, sweep folders and benchmark results alike."""
    root.mkdir(parents=True, exist_ok=True)
    while True:
        path = root / new_run_id(name)
        try:
            path.mkdir(mode)
        except FileExistsError:
            continue
        os.chmod(path, mode)  # mkdir's mode is masked by the umask
        return path


def create_run(root: Path, name: str, mode: int = PRIVATE_MODE) -> RunFolder:
    """A new, empty run folder under ``root`` with ``mode`` (private by default)."""
    return RunFolder(new_private_folder(root, name, mode))


def iter_runs(root: Path) -> Iterator[RunFolder]:
    if not root.is_dir():
        return
    for d in root.iterdir():
        if is_run_folder(d):
            yield RunFolder(d)


def _job_ids_or_none(run: RunFolder) -> list[str]:
    """Job ids of a run, for looking another run up: a sibling whose run.yaml is damaged
    must not hide the one asked for (it is reported when it is itself used)."""
    try:
        return run.job_ids(kind=None)
    except RunFileError:
        return []


def runs_named(name: str, runs: list[RunFolder]) -> list[RunFolder]:
    """The runs of the job called ``name``, newest first (by the creation time run.yaml
    records); a run whose run.yaml cannot be read is left out."""
    def name_and_created(run: RunFolder):
        try:
            meta = run.meta()
        except RunFileError:
            return None, ""
        return meta.get("name"), str(meta.get("created") or "")
    found = [(created, run.id, run) for run in runs if run.id.startswith(f"{name}-")
             for got, created in [name_and_created(run)] if got == name]
    return [run for _, _, run in sorted(found, key=lambda t: t[:2], reverse=True)]


def find_run(ref: str, root: Path, note: Callable[[str], None] | None = None) -> RunFolder:
    """A run by folder path, run id, a job name (its newest run; ``note`` is told which when
    there are several), a unique id prefix, or a Slurm/local job id it submitted. A prefix
    that matches several runs of different jobs is an error listing them.

    The one door every command's RUN argument goes through: an empty or blank name is refused
    here (a prefix match would otherwise select the only run, so ``hpctrain cancel "$UNSET"``
    would cancel it)."""
    if not isinstance(ref, str) or not ref.strip():
        raise UsageError(f"RUN: expected a run folder, run name or job id, got {ref!r}"
                         + (" (empty: is a shell variable unset?)" if isinstance(ref, str) else ""))
    p = expanded(ref)
    if is_run_folder(p):
        return RunFolder(p.resolve())
    runs = list(iter_runs(root))
    exact = [r for r in runs if r.id == ref]
    if exact:
        return exact[0]
    by_job = [r for r in runs if ref in _job_ids_or_none(r)]
    if len(by_job) == 1:
        return by_job[0]
    prefix = [r for r in runs if r.id.startswith(ref)]
    named = runs_named(ref, prefix)
    if named:
        if note is not None and len(named) > 1:
            note(f"{show(ref)}: the newest of {len(named)} runs of that job, {named[0].shown}")
        return named[0]
    if len(prefix) == 1:
        return prefix[0]
    if len(prefix) > 1:
        names = ", ".join(r.shown for r in sorted(prefix, key=lambda r: r.id)[:5])
        raise RunNotFoundError(f"{ref!r} matches {len(prefix)} runs ({names}); give more of the name")
    # the name as given, cut short: a pasted log line or a 50,000-character word is one line
    raise RunNotFoundError(f"no run {safety.short(ref)} under {root} (give a run folder, run name "
                           "or job id; "
                           f"`hpctrain runs` lists them; --runs-dir or $HPCTRAIN_RUNS_DIR picks the root)")
