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

JSONL files are appended with one ``write`` under an exclusive lock, so concurrent writers
(the batch shell, rank 0, a user's ``hpctrain cancel``) never interleave partial lines.
Nothing here imports torch.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .config import yamlio
from .errors import RunNotFoundError, UsageError

RUN_FILE = "run.yaml"


def default_runs_root(profile_runs_root: str | None = None) -> Path:
    """``$HPCTRAIN_RUNS_DIR``, else the profile's ``storage.runs_root``, else ``./runs``."""
    env = os.environ.get("HPCTRAIN_RUNS_DIR")
    if env:
        return Path(env).expanduser().resolve()
    if profile_runs_root:
        return Path(profile_runs_root).expanduser().resolve()
    return Path("runs").resolve()


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")


def append_jsonl(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=False) + "\n"
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_jsonl(path: Path) -> list[dict]:
    """Every complete record; a torn last line (a writer killed mid-write) is skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def read_last_jsonl(path: Path, max_bytes: int = 1 << 16) -> dict | None:
    """The last complete record of a JSONL file, reading only its end (metrics files grow)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line, or the first line cut by the seek
        if isinstance(record, dict):
            return record
    return None


# Events that reopen a run a user had cancelled, or a finished run resumed with --force.
REOPEN_EVENTS = ("resume", "requeue")


@dataclass
class Run:
    """A run folder. Cheap to create: it only holds the path."""

    path: Path

    # ---- files -------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.path.name

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
        return self.path / "logs"

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
        return self.logs_dir / f"attempt-{attempt}"

    def rank_log(self, attempt: int, rank: int) -> Path:
        return self.attempt_dir(attempt) / f"rank-{rank}.log"

    # ---- metadata ------------------------------------------------------------------------
    def meta(self) -> dict:
        try:
            return yamlio.read_mapping(self.run_file, "run file")
        except UsageError:
            return {}

    def update_meta(self, **changes: Any) -> dict:
        meta = self.meta()
        meta.update(changes)
        yamlio.write_atomic(self.run_file, yamlio.dump(meta))
        return meta

    def add_job_id(self, job_id: str, kind: str = "train") -> None:
        meta = self.meta()
        jobs = list(meta.get("jobs", []))
        jobs.append({"job_id": str(job_id), "kind": kind, "submitted": now_iso()})
        meta["jobs"] = jobs
        yamlio.write_atomic(self.run_file, yamlio.dump(meta))

    def job_ids(self, kind: str | None = "train") -> list[str]:
        return [j["job_id"] for j in self.meta().get("jobs", []) if kind is None or j["kind"] == kind]

    # ---- ledger and events ------------------------------------------------------------------
    def ledger(self) -> list[dict]:
        return read_jsonl(self.ledger_file)

    def append_ledger(self, record: dict) -> None:
        append_jsonl(self.ledger_file, record)

    def events(self) -> list[dict]:
        return read_jsonl(self.events_file)

    def event(self, kind: str, **data: Any) -> dict:
        record = {"time": now_iso(), "event": kind, **data}
        append_jsonl(self.events_file, record)
        return record

    def metrics(self) -> list[dict]:
        return read_jsonl(self.metrics_file)

    def cancelled(self, events: list[dict] | None = None) -> bool:
        """A user cancelled the run and did not requeue or resume it since."""
        for e in reversed(self.events() if events is None else events):
            if e.get("event") == "cancel":
                return True
            if e.get("event") in REOPEN_EVENTS:
                return False
        return False

    def ledger_for_budget(self) -> list[dict]:
        """The ledger since the last resubmission by a person (``hpctrain resume``, or
        ``hpctrain requeue`` of a stopped run): each one starts a fresh requeue budget."""
        ledger = self.ledger()
        start = 0
        for e in self.events():
            if e.get("event") in REOPEN_EVENTS and isinstance(e.get("ledger_records"), int):
                start = e["ledger_records"]
        return ledger[start:]

    def finished(self, ledger: list[dict] | None = None, events: list[dict] | None = None) -> bool:
        """The last attempt reached train.steps (and no forced resume reopened the run since)."""
        ledger = self.ledger() if ledger is None else ledger
        if not ledger or ledger[-1].get("exit_reason") != "finished":
            return False
        for e in reversed(self.events() if events is None else events):
            if e.get("event") == "attempt_end":
                return True
            if e.get("event") == "resume" and e.get("force"):
                return False
        return True

    def attempts_started(self) -> list[int]:
        if not self.logs_dir.is_dir():
            return []
        nums = []
        for d in self.logs_dir.iterdir():
            m = re.fullmatch(r"attempt-(\d+)", d.name)
            if m and d.is_dir():
                nums.append(int(m.group(1)))
        return sorted(nums)

    def begin_attempt(self) -> int:
        """Claim the next attempt number by creating its log folder (atomic ``mkdir``)."""
        while True:
            started = self.attempts_started()
            recorded = [int(r.get("attempt", 0)) for r in self.ledger()]
            n = max(started + recorded + [0]) + 1
            try:
                self.attempt_dir(n).mkdir(parents=True)
                return n
            except FileExistsError:
                continue

    def resolved_job(self):
        from .config import job_from_mapping
        return job_from_mapping(yamlio.read_mapping(self.job_file, "run's job file"), str(self.job_file))

    def resolved_profile(self):
        from .config import profile_from_mapping
        return profile_from_mapping(yamlio.read_mapping(self.profile_file, "run's profile"),
                                    str(self.profile_file))

    def checkpoint_dir(self) -> Path:
        meta = self.meta()
        if meta.get("checkpoint_dir"):
            return Path(meta["checkpoint_dir"])
        return self.path / "checkpoints"


def new_run_id(name: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{name}-{stamp}-{secrets.token_hex(2)}"


def create_run(root: Path, name: str) -> Run:
    root.mkdir(parents=True, exist_ok=True)
    while True:
        path = root / new_run_id(name)
        try:
            path.mkdir()
            return Run(path)
        except FileExistsError:
            continue


def iter_runs(root: Path) -> Iterator[Run]:
    if not root.is_dir():
        return
    for d in root.iterdir():
        if (d / RUN_FILE).is_file():
            yield Run(d)


def find_run(ref: str, root: Path) -> Run:
    """A run by folder path, run id, unique id prefix, or a Slurm/local job id it submitted."""
    p = Path(ref).expanduser()
    if (p / RUN_FILE).is_file():
        return Run(p.resolve())
    runs = list(iter_runs(root))
    exact = [r for r in runs if r.id == ref]
    if exact:
        return exact[0]
    by_job = [r for r in runs if ref in r.job_ids(kind=None)]
    if len(by_job) == 1:
        return by_job[0]
    prefix = [r for r in runs if r.id.startswith(ref)]
    if len(prefix) == 1:
        return prefix[0]
    if len(prefix) > 1:
        names = ", ".join(sorted(r.id for r in prefix)[:5])
        raise RunNotFoundError(f"{ref!r} matches {len(prefix)} runs ({names}); give more of the name")
    raise RunNotFoundError(f"no run {ref!r} under {root} (give a run folder, run name or job id; "
                           f"`hpctrain runs` lists them; --runs-dir or $HPCTRAIN_RUNS_DIR picks the root)")
