"""The one reader of run-folder files: regular files only, bounded, checked, never blocking.

A run folder is written by hpctrain, but anyone who can write it (a user repairing it by hand,
a disk that filled mid-write, a tool that left a FIFO or a symlink to ``/dev/zero`` behind) can
put anything there. Every file hpctrain reads from a run folder or a checkpoint folder (run.yaml,
the ledger, events, metrics, result and failure records, heartbeats, hang verdicts, rank logs,
``checkpoints/latest``, manifests) is read here, through :mod:`hpctrain.file_door` (the door
every file hpctrain did not just write goes through) without following links, so one set of
rules holds for all of them:

* the file is opened with ``O_NONBLOCK`` (a FIFO with no writer would block a plain ``open``
  forever) and ``O_NOFOLLOW`` (a symlink is refused, wherever it points), then checked with
  ``fstat`` on the open descriptor: a FIFO, device, socket or folder is refused before a byte
  is read;
* at most a bounded number of bytes is read (``hpctrain.limits``): a bigger file is refused, or
  only its end is read where the end is what is wanted (``tail``);
* text must be UTF-8 and JSON must parse and hold the type it should; what does not is a
  :class:`DamagedFile` naming the file, the line or field, and why.

A :class:`DamagedFile` is a ``RunFileError`` (a ``UsageError``): a command that needs the file
ends with one ``Error:`` line naming it; ``hpctrain runs`` shows the run as DAMAGED and lists
the others. Nothing is ever rewritten because it could not be read. A file that does not exist
is not damage: readers return their "missing" value (None or empty).
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterator

from .. import file_door, limits
from ..config.profile import SCHEDULERS
from ..errors import HpcTrainError
from .files import METRIC_KINDS, RunFileError

class DamagedFile(RunFileError):
    """A run-folder file that exists but is not what hpctrain writes there."""

    def __init__(self, path: Path | str, why: str, message: str | None = None) -> None:
        self.path = Path(path)
        self.why = why
        super().__init__(message or f"cannot read {_show(self.path)}: {why}")


_show = file_door.show

# what a run-folder file that is not a regular file is told (after the door's reason)
_ONLY_REGULAR = "hpctrain reads only regular files in a run folder"
_LINKS = ("a symbolic link", "behind a symlink loop")


@contextlib.contextmanager
def open_regular(path: Path | str) -> Iterator[int | None]:
    """The descriptor of ``path`` opened for reading through the file door without following
    links (:func:`hpctrain.file_door.open_regular`), or None when it does not exist;
    DamagedFile for anything else, a failed read inside the block included."""
    try:
        with file_door.open_regular(path, follow_links=False) as fd:
            yield fd
    except file_door.Refused as e:
        raise DamagedFile(path, _reason(e)) from None


def _reason(e: "file_door.Refused") -> str:
    if e.kind in _LINKS:
        return f"{e.why}; {_ONLY_REGULAR} (replace it with the file, or move the run folder away)"
    if e.kind is not None:
        return f"{e.why}; {_ONLY_REGULAR}"
    return e.why


def read_bytes(path: Path | str, limit: int = limits.RUN_RECORD_BYTES) -> bytes | None:
    """The whole file (None when missing); DamagedFile past ``limit`` bytes."""
    try:
        return file_door.read_file(path, limit, follow_links=False)
    except file_door.TooBig:
        raise DamagedFile(path, f"is over {limit:,} bytes, more than hpctrain ever writes "
                                f"there (limits.{_limit_name(limit)})") from None
    except file_door.Refused as e:
        raise DamagedFile(path, _reason(e)) from None


def _limit_name(limit: int) -> str:
    for name in ("RUN_RECORD_BYTES", "RUN_METRICS_BYTES", "RUN_LOG_BYTES", "RUN_SMALL_BYTES"):
        if getattr(limits, name) == limit:
            return name
    return f"{limit:,} bytes"


def tail_bytes(path: Path | str, max_bytes: int) -> tuple[bytes, int] | None:
    """The last ``max_bytes`` of the file and its size (None when missing): for files that grow
    (metrics, logs), where the end is what is wanted."""
    p = Path(path)
    with open_regular(p) as fd:
        if fd is None:
            return None
        size = os.fstat(fd).st_size
        start = max(0, size - max_bytes)
        return file_door.read_fd(fd, max_bytes - 1, start), size


def read_from(path: Path | str, offset: int, limit: int) -> bytes | None:
    """At most ``limit`` bytes from ``offset`` (following a growing log); None when missing."""
    p = Path(path)
    with open_regular(p) as fd:
        if fd is None:
            return None
        return file_door.read_fd(fd, limit - 1, offset)


def decode(data: bytes, path: Path | str, *, strict: bool) -> str:
    """UTF-8 text; bad bytes are damage when ``strict`` (records), replaced otherwise (logs)."""
    if not strict:
        return data.decode("utf-8", errors="replace")
    try:
        return file_door.decode_utf8(data)
    except file_door.Refused as e:
        raise DamagedFile(path, e.why) from None


def read_text(path: Path | str, limit: int = limits.RUN_RECORD_BYTES, *,
              strict: bool = True) -> str | None:
    data = read_bytes(path, limit)
    return None if data is None else decode(data, path, strict=strict)


def read_json(path: Path | str, limit: int = limits.RUN_SMALL_BYTES,
              check: Callable[[dict], str | None] | None = None) -> dict | None:
    """One JSON object (a result, a heartbeat, a manifest); None when missing. Not JSON, not an
    object, or refused by ``check`` (which returns what is wrong, naming the field): damage."""
    text = read_text(path, limit)
    if text is None:
        return None
    try:
        data = file_door.json_object(text)
    except file_door.Refused as e:
        raise DamagedFile(path, e.why) from None
    problem = SURROGATE if _escapes_surrogate(text) and _lone_surrogate(data) else \
        check(data) if check else None
    if problem:
        raise DamagedFile(path, problem, f"cannot read {_show(Path(path))}: {problem} (nothing "
                                         "was changed: repair or restore it)")
    return data


# JSON (and YAML) can escape half of a UTF-16 pair alone ("\ud800"): the string it gives is no
# Unicode text (printing it, writing it as UTF-8, fails), so a record holding one is damage
SURROGATE = "holds an unpaired UTF-16 surrogate escape (\\ud800-\\udfff), which is not text"


def _escapes_surrogate(text: str | bytes) -> bool:
    """Whether ``text`` may escape a surrogate (the cheap test before walking a record)."""
    if isinstance(text, bytes):
        return b"\\ud" in text or b"\\uD" in text
    return "\\ud" in text or "\\uD" in text


def _lone_surrogate(value: Any) -> bool:
    """Whether any text in ``value`` (keys included) holds an unpaired surrogate."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(v, dict):
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def parse_jsonl(data: bytes, path: Path | str,
                check: Callable[[dict], str | None] | None = None) -> list[dict]:
    """The records of JSONL bytes. A line that is not JSON (torn by a writer killed
    mid-write, or cut by a tail read) is skipped; a record that parses but is not an object,
    gives a key twice (no writer of hpctrain's does; which value is meant cannot be told), or
    that ``check`` refuses (a field of the wrong type), is damage naming the line."""
    out = []
    for number, line in enumerate(data.split(b"\n"), 1):
        line = line.strip()
        if not line:
            continue
        try:
            record = file_door.loads(line)
        except file_door.DuplicateKey as e:
            _damaged_line(path, number, str(e))
        except (ValueError, RecursionError):
            continue
        if not isinstance(record, dict):
            raise DamagedFile(path, f"line {number} is a JSON {type(record).__name__}, "
                                    "expected an object")
        problem = SURROGATE if _escapes_surrogate(line) and _lone_surrogate(record) else \
            check(record) if check else None
        if problem:
            _damaged_line(path, number, problem)
        out.append(record)
    return out


def _damaged_line(path: Path | str, number: int, problem: str) -> None:
    why = f"line {number}: {problem}"
    raise DamagedFile(path, why, f"cannot read {_show(Path(path))}: {why} (nothing was "
                                 f"changed: repair or remove line {number})")


def read_jsonl(path: Path | str, limit: int = limits.RUN_RECORD_BYTES,
               check: Callable[[dict], str | None] | None = None) -> list[dict]:
    """Every complete record of a JSONL file ([] when missing)."""
    data = read_bytes(path, limit)
    return [] if data is None else parse_jsonl(data, path, check)


def read_last_jsonl(path: Path | str, accept: Callable[[dict], bool] | None = None,
                    check: Callable[[dict], str | None] | None = None,
                    max_bytes: int = 1 << 16,
                    give_up_bytes: int = 1 << 24) -> dict | None:
    """The last complete record of a JSONL file that ``accept`` takes, reading only its end
    (metrics files grow): the tail read quadruples until a record is found, up to
    ``give_up_bytes``."""
    while True:
        got = tail_bytes(path, max_bytes)
        if got is None:
            return None
        tail, size = got
        lines = tail.split(b"\n")
        if size > len(tail):
            lines = lines[1:]       # the first line may be cut by the seek
        for record in reversed(parse_jsonl(b"\n".join(lines), path, check)):
            if accept is None or accept(record):
                return record
        if max_bytes >= size or max_bytes >= give_up_bytes:
            return None
        max_bytes *= 4


def read_mapping(path: Path | str, what: str) -> dict | None:
    """A YAML mapping of a run folder (run.yaml, job.yaml, profile.yaml), read through this
    door and parsed by the one YAML loader; None when missing."""
    from ..config import yamlio
    text = read_text(path, limits.RUN_SMALL_BYTES)
    if text is None:
        return None
    try:
        data = yamlio.parse_mapping(text, _show(Path(path)))
    except (HpcTrainError, ValueError, RecursionError) as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DamagedFile(path, f"is not a valid {what} ({detail})") from None
    if _lone_surrogate(data):
        raise DamagedFile(path, f"is not a valid {what} (it {SURROGATE})")
    return data


# ---- field types of the records, for ``check`` -------------------------------------------------
#
# A record that passes its check is safe for every reader of it (``status``, ``report``, the
# listing, the batch shell, the requeue policy): a number is finite and far from overflow (a
# plot's ticks, a sum of durations, seconds times ranks stay finite), a step or a count is not
# negative, a list holds what its readers take from it (node names they join and look up,
# mappings they ``.get`` from), and a name or a path that reaches a system call or a command
# line holds no NUL. A field a reader defaults when absent (``.get(key, [])``) is not null.

MAX_INTEGER = 2**63 - 1     # every step, count, size and exit code hpctrain writes fits a C long
MAX_NUMBER = 1e100          # far past any loss, rate, duration or time, far from float overflow
                            # (matplotlib's ticks overflow near 1e308; sums and products too)
MAX_EPOCH = 253402300799    # 9999-12-31T23:59:59 UTC: the last second ``time.localtime`` takes


class Kind:
    """A field's type beyond a Python type: ``test`` says whether a value is one, ``word``
    what was expected (for the message)."""

    def __init__(self, word: str, test: Callable[[Any], bool]) -> None:
        self.word, self.test = word, test

    def problem(self, name: str, value: Any) -> str | None:
        return None if self.test(value) else _expected(name, self.word, value)


class ListOf(Kind):
    """A list whose every item (never null) is of ``kinds``."""

    def __init__(self, kinds: tuple, word: str) -> None:
        super().__init__(word, lambda v: isinstance(v, list))
        self.kinds = kinds

    def problem(self, name: str, value: Any) -> str | None:
        if not isinstance(value, list):
            return _expected(name, self.word, value)
        for i, item in enumerate(value):
            problem = _value_problem(f"{name}[{i}]", item, self.kinds)
            if problem:
                return problem
        return None


class Fields(Kind):
    """A mapping whose fields are of their types; ``required``: present and not null;
    ``not_null``: not null when present. Other keys are kept, unchecked."""

    def __init__(self, types: dict[str, tuple], word: str = "a mapping", *,
                 required: tuple[str, ...] = (), not_null: tuple[str, ...] = ()) -> None:
        super().__init__(word, lambda v: isinstance(v, dict))
        self.types, self.required, self.not_null = types, required, not_null

    def problem(self, name: str, value: Any) -> str | None:
        if not isinstance(value, dict):
            return _expected(name, self.word, value)
        inner = _mapping_problem(value, self.types, self.required, self.not_null)
        return f"{name}.{inner}" if inner else None


def _show_value(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        # JSON's own NaN/Infinity literals (json.dumps writes them): said as written, so
        # "expected ... 'inf', got inf" does not read as a contradiction
        written = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        return f"{written} (a JSON literal, not a number JSON allows)"
    try:
        shown = repr(value)
    except ValueError:              # an integer past Python's digit limit for str()
        return "a very large integer"
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _expected(name: str, word: str, value: Any) -> str:
    return f"{name}: expected {word}, got {_show_value(value)}"


_TYPE_KINDS: dict[type, Kind] = {}


def _as_kind(kind: "type | Kind") -> Kind:
    if isinstance(kind, Kind):
        return kind
    if kind not in _TYPE_KINDS:     # a bool is not a number: only ``bool`` takes one
        _TYPE_KINDS[kind] = Kind(_type_word(kind), lambda v, t=kind: isinstance(v, t) and (
            t is bool or not isinstance(v, bool)))
    return _TYPE_KINDS[kind]


def _value_problem(name: str, value: Any, kinds: tuple) -> str | None:
    """What is wrong with ``value`` (not null) as one of ``kinds``; None when it is one."""
    problems = []
    for kind in kinds:
        problem = _as_kind(kind).problem(name, value)
        if problem is None:
            return None
        problems.append(problem)
    for kind, problem in zip(kinds, problems):
        if _as_kind(kind).test(value):
            return problem          # a list or a mapping with a wrong item or field: name it
    return _expected(name, " or ".join(_as_kind(k).word for k in kinds), value)


def _mapping_problem(record: dict, types: dict[str, tuple], required: tuple[str, ...] = (),
                     not_null: tuple[str, ...] = ()) -> str | None:
    for name in required:
        if record.get(name) is None:
            return f"{name}: missing ({'null' if name in record else 'absent'})"
    for name in not_null:
        if name in record and record[name] is None:
            return f"{name}: expected {_as_words(types.get(name, ()))}, got None"
    for name, kinds in types.items():
        value = record.get(name)
        if value is None:
            continue
        problem = _value_problem(name, value, kinds)
        if problem:
            return problem
    return None


def _as_words(kinds: tuple) -> str:
    return " or ".join(_as_kind(k).word for k in kinds) or "a value"


def field_problem(record: dict, types: dict[str, tuple]) -> str | None:
    """The first field of ``record`` whose value is not None nor of its type (a bool is not a
    number), as ``field: expected ..., got ...``; a list's item or a mapping's field is named
    (``nodes[0]: ...``, ``decision.reason: ...``)."""
    return _mapping_problem(record, types)


def _type_word(kind: type) -> str:
    return {int: "an integer", float: "a number", str: "text", dict: "a mapping",
            list: "a list", bool: "true or false"}.get(kind, kind.__name__)


def checker(types: dict[str, tuple]) -> Callable[[dict], str | None]:
    return lambda record: field_problem(record, types)


def _integer(low: int, high: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def _number(low: float, high: float) -> Callable[[Any], bool]:
    # NaN fails both comparisons; an int too large for a float never compares true either
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and low <= v <= high


def _no_nul(v: Any) -> bool:
    return isinstance(v, str) and "\0" not in v


INT = (Kind("an integer (within ±2**63)", _integer(-MAX_INTEGER, MAX_INTEGER)),)
COUNT = (Kind("an integer from 0 to 2**63-1", _integer(0, MAX_INTEGER)),)  # steps, counts, sizes
NUMBER = (Kind("a finite number (within ±1e100)", _number(-MAX_NUMBER, MAX_NUMBER)),)
EPOCH = (Kind("a time in seconds since 1970 (0 to the year 9999)", _number(0, MAX_EPOCH)),)
TEXT = (str,)
FLAG = (bool,)
NAME = (Kind("text (no NUL byte)", _no_nul),)           # node names, job ids: command lines
PATH = (Kind("a path (text, no NUL byte)", lambda v: _no_nul(v) and v != ""),)
# a path every process must read alike, whatever folder it runs in (submit's, the ranks' run
# folder, status's): written absolute, so a relative one was edited in by hand
ABSOLUTE_PATH = (Kind("an absolute path (text, no NUL byte)",
                      lambda v: _no_nul(v) and v.startswith("/")),)
NAMES = (ListOf(NAME, "a list of names (text)"),)
MAPPINGS = (ListOf((dict,), "a list of mappings"),)

# how metrics.jsonl holds a loss JSON cannot (the runtime writes str() of a non-finite float:
# a skipped NaN step is a record, not damage)
NON_FINITE = ("nan", "inf", "-inf")
LOSS = NUMBER + (Kind("'nan', 'inf' or '-inf'", lambda v: isinstance(v, str) and v in NON_FINITE),)

# an in-job restart (``RestartPlan.to_dict`` and what the recovery added): the ledger's
# ``in_job_restart``, an ``attempt_start`` event's, and the ``in_job_restart`` event itself
RESTART_TYPES = {"nodes": NAMES, "excluded": NAMES, "spares": NAMES, "why": TEXT,
                 "in_place": FLAG, "after_attempt": COUNT, "recovery_s": NUMBER,
                 "steps_lost": COUNT}
RESTART_NOT_NULL = ("nodes", "excluded", "spares")
RESTART = (Fields(RESTART_TYPES, "an in-job restart (a mapping)", not_null=RESTART_NOT_NULL),)
# a straggler node (``health.stragglers.SlowNode``): a metrics record's ``stragglers``, the
# ledger's ``straggler`` (the batch shell excludes its ``node``), the ``straggler`` event
STRAGGLER_TYPES = {"node": NAME, "ranks": (ListOf(INT, "a list of ranks"),), "ratio": NUMBER,
                   "seconds": NUMBER, "median_s": NUMBER, "intervals": COUNT}
STRAGGLER = (Fields(STRAGGLER_TYPES, "a straggler node (a mapping)", required=("node",)),)
DECISION = (Fields({"requeue": FLAG, "reason": TEXT, "in_job": FLAG},
                   "a decision (a mapping: requeue, reason)"),)
FAILURE = (Fields({"rank": INT, "node": NAME, "time": NUMBER, "message": TEXT},
                  "a failure (a mapping: rank, node, time, message)"),)
HANG = (Fields({"rank": INT, "node": NAME, "step": COUNT, "message": TEXT, "idle_s": NUMBER,
                "limit_s": NUMBER}, "a hang verdict (a mapping)"),)


def _attempt_positive(record: dict) -> str | None:
    """An attempt number the run folder can hold: at most the bound of the attempt door
    (``record.folder.attempt_number``, ``limits.INTEGERS["log_attempt"]``), past which the next
    attempt (``begin_attempt``) would have no number; 0 from folders of older versions."""
    a = record.get("attempt")
    high = limits.INTEGERS["log_attempt"][2]
    if isinstance(a, int) and not isinstance(a, bool) and not 0 <= a <= high:
        return f"attempt: expected an integer from 0 to {high:,}, got {_show_value(a)}"
    return None


# the ledger's records, and result.json (the fields they share)
LEDGER_TYPES = {"attempt": INT, "start_step": COUNT, "end_step": COUNT, "exit_reason": TEXT,
                "exit_code": INT, "checkpoint_loaded": TEXT, "checkpoint_saved": TEXT,
                "last_loss": NUMBER, "start_time": EPOCH, "end_time": EPOCH,
                "message": TEXT, "job_id": NAME, "restart_count": COUNT, "scheduler": TEXT,
                "nodes": NAMES, "started": TEXT, "duration_s": NUMBER,
                "first_failure": FAILURE, "decision": DECISION, "task_exits": MAPPINGS,
                "excluded_nodes": NAMES, "not_excluded_nodes": NAMES, "hang": HANG,
                "straggler": STRAGGLER, "note": TEXT, "exclusion_note": TEXT,
                "preflight_report": TEXT, "first_step_at": EPOCH, "recovery_s": NUMBER,
                "steps_lost": COUNT, "in_job_restart": RESTART, "world_size": COUNT,
                "saves": MAPPINGS}
EVENT_TYPES = {"event": TEXT, "time": TEXT, "attempt": INT, "step": COUNT, "job_id": NAME,
               "ledger_records": COUNT}
# the fields of some events, which their readers use (the same name may mean another thing
# in another event: a ``requeue`` event's ``nodes`` is a count)
EVENT_KIND_TYPES = {
    "attempt_start": {"nodes": TEXT + NAMES, "restart_count": COUNT, "in_job_restart": RESTART},
    "in_job_restart": RESTART_TYPES,
    "straggler": STRAGGLER_TYPES,
    "attempt_end": {"end_step": COUNT, "exit_reason": TEXT, "requeue": FLAG, "reason": TEXT},
    "checkpoint_saved": {"path": TEXT},
    "resume": {"extended_to": COUNT},
    "hang": {"rank": INT, "node": NAME},
}
EVENT_KIND_NOT_NULL = {"in_job_restart": RESTART_NOT_NULL}
# a metrics record's kind decides which records a question reads and the names a tracker is
# sent (`<kind>/loss`): any other word would reach W&B or MLflow as a metric's name
METRIC_KIND = (Kind(" or ".join(repr(k) for k in METRIC_KINDS),
                    lambda v: isinstance(v, str) and v in METRIC_KINDS),)
METRIC_TYPES = {"step": COUNT, "attempt": INT, "kind": METRIC_KIND, "loss": LOSS, "grad_norm": LOSS,
                "lr": NUMBER, "tokens_per_s": NUMBER, "step_time_s": NUMBER, "mfu": NUMBER,
                "time": NUMBER, "stragglers": (ListOf(STRAGGLER, "a list of straggler nodes"),)}
# run.yaml: what ``submit`` and ``resume`` write there
SWEEP = (Fields({"id": NAME, "dir": PATH, "index": COUNT, "values": (dict,)},
                "a sweep (a mapping: id, dir, index, values)", required=("id",)),)
# run.yaml's scheduler picks the backend asked about the run's jobs: any other word read as
# Slurm's (a run of this machine asked squeue, and said UNKNOWN instead of DAMAGED)
SCHEDULER = (Kind(" or ".join(repr(s) for s in SCHEDULERS),
                  lambda v: isinstance(v, str) and v in SCHEDULERS),)
META_TYPES = {"name": TEXT, "profile": TEXT, "created": TEXT, "scheduler": SCHEDULER,
              "checkpoint_dir": ABSOLUTE_PATH, "total_steps": COUNT, "world_size": COUNT,
              "jobs": (list,), "run_id": TEXT, "kind": TEXT, "layout": TEXT,
              "hpctrain_version": TEXT, "job_source": TEXT, "dry_run": FLAG, "sweep": SWEEP,
              "job_history": MAPPINGS, "profile_history": MAPPINGS, "overrides": (dict,),
              "chain": (list,)}
META_NOT_NULL = ("jobs", "job_history", "profile_history", "overrides")


def ledger_problem(record: dict) -> str | None:
    return field_problem(record, LEDGER_TYPES) or _attempt_positive(record)


def event_problem(record: dict) -> str | None:
    kind = record.get("event")
    if not isinstance(kind, str):
        return f"event: expected text, got {_show_value(kind)}"
    return field_problem(record, EVENT_TYPES) or _mapping_problem(
        record, EVENT_KIND_TYPES.get(kind, {}), not_null=EVENT_KIND_NOT_NULL.get(kind, ()))


def metric_problem(record: dict) -> str | None:
    return _mapping_problem(record, METRIC_TYPES, required=("step",))


def meta_problem(meta: dict) -> str | None:
    """What is wrong with run.yaml's fields, naming the field; None when nothing is."""
    problem = _mapping_problem(meta, META_TYPES, not_null=META_NOT_NULL)
    if problem:
        return problem
    for i, job in enumerate(meta.get("jobs") or []):
        if not isinstance(job, dict):
            return f"jobs[{i}]: expected a mapping with job_id and kind, got {job!r:.40}"
        # squeue and sacct read it as the value of their -j: one starting with "-" would be
        # read as an option there (no scheduler gives such an id)
        if not _no_nul(job.get("job_id")) or not job["job_id"] or job["job_id"].startswith("-"):
            return (f"jobs[{i}].job_id: expected the job id as text (never starting with '-'), "
                    f"got {_show_value(job.get('job_id'))}")
        if not isinstance(job.get("kind"), str):
            return f"jobs[{i}].kind: expected text, got {job.get('kind')!r:.40}"
    return None


# a sweep folder's sweep.yaml (``submission.folders.write_sweep_file``), as ``report SWEEP`` and
# the trackers read it (``record.sweeps``, the one door of sweep folders): every run it lists
# is named by an absolute path (a relative one would mean wherever the reader stands)
ABSOLUTE_PATH = (Kind("a path (absolute, text, no NUL byte)",
                      lambda v: _no_nul(v) and v.startswith("/")),)
SWEEP_RUN = (Fields({"index": COUNT, "run": NAME, "run_dir": ABSOLUTE_PATH, "values": (dict,),
                     "job_id": NAME, "outcome": TEXT},
                    "a run of the sweep (a mapping: index, run, run_dir, values)",
                    required=("run_dir",)),)
SWEEP_FILE_TYPES = {"id": NAME, "created": TEXT, "source": TEXT, "profile": TEXT,
                    "runs": (ListOf(SWEEP_RUN, "a list of the sweep's runs"),)}


def sweep_file_problem(data: dict) -> str | None:
    """What is wrong with sweep.yaml's fields, naming the field; None when nothing is."""
    return _mapping_problem(data, SWEEP_FILE_TYPES, required=("runs",))

# a checkpoint's manifest.json (``checkpoint_store.build_manifest``), as ``status`` and
# ``report`` read it: every file it names is inside the checkpoint's folder
CHECKPOINT_FORMAT = "hpctrain-checkpoint"   # a checkpoint manifest's "format" (checkpoint_store)
MANIFEST_TYPES = {"format_version": INT, "step": COUNT, "created": TEXT, "run": TEXT,
                  "total_bytes": COUNT, "files": (dict,)}
MANIFEST_FILE = Fields({"size": COUNT, "crc32c": TEXT, "crc32": TEXT},
                       "a mapping (size, checksum)")


def manifest_problem(manifest: dict) -> str | None:
    """What is wrong with a checkpoint's manifest, naming the field; None when nothing is."""
    if manifest.get("format") != CHECKPOINT_FORMAT:
        return (f"format: expected {CHECKPOINT_FORMAT!r}, got "
                f"{_show_value(manifest.get('format'))}")
    problem = _mapping_problem(manifest, MANIFEST_TYPES, required=("files",))
    if problem:
        return problem
    for name, info in manifest["files"].items():
        shown = _show_value(name)
        if not name or "\0" in name or name.startswith("/") or \
                ".." in name.replace("\\", "/").split("/"):
            return (f"files: {shown} is not a file name inside the checkpoint folder (empty, "
                    "absolute, with '..' or a NUL byte)")
        problem = MANIFEST_FILE.problem(f"files[{shown}]", info)
        if problem:
            return problem
    return None


def read_head(path: Path | str, size: int) -> bytes | None:
    """The first ``size`` bytes of a regular file (fewer when it is shorter; None when it does
    not exist): what a file is, by its signature, without reading it whole."""
    with open_regular(path) as fd:
        if fd is None:
            return None
        return file_door.read_fd(fd, size - 1)


def describe(error: BaseException) -> dict[str, Any]:
    """``{"file": ..., "why": ...}`` of a damage, for listings and JSON."""
    if isinstance(error, DamagedFile):
        return {"file": str(error.path), "why": error.why}
    return {"file": None, "why": str(error).splitlines()[0] if str(error) else type(error).__name__}
