"""Nothing in a run folder is lost: private folders, locked read-modify-writes, atomic files,
and damaged files reported by name instead of being taken as empty and overwritten."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import pytest

from hpctrain.config import load_job, load_profile, resolve
from hpctrain.record.files import RunFileError, append_jsonl
from hpctrain.record.reader import read_jsonl
from hpctrain.record.folder import RunFolder, create_run
from hpctrain.submission import prepare_run
from tests.conftest import REPO, hpctrain


@pytest.fixture
def run(tmp_path):
    r = resolve(load_job(REPO / "examples" / "tiny.yaml"), load_profile("dev-slurm"))
    return prepare_run(r, tmp_path / "runs")


def test_run_folders_are_private_unless_the_profile_shares_them_with_the_group(tmp_path):
    old = os.umask(0o002)                      # a permissive umask must not matter
    try:
        private = create_run(tmp_path / "runs", "x")
        shared = create_run(tmp_path / "runs", "x", mode=0o750)
    finally:
        os.umask(old)
    assert private.path.stat().st_mode & 0o777 == 0o700
    assert shared.path.stat().st_mode & 0o777 == 0o750


def test_a_damaged_run_file_is_an_error_naming_it_and_is_never_overwritten(run):
    damaged = b"name: tiny-gpt\njobs: [\n\xff\xfe"
    run.run_file.write_bytes(damaged)
    for action in (run.meta, lambda: run.update_meta(dry_run=True),
                   lambda: run.add_job_id("77"), run.checkpoint_dir):
        with pytest.raises(RunFileError, match=f"run file {run.run_file} cannot be read"):
            action()
    assert run.run_file.read_bytes() == damaged


def test_cli_and_batch_hooks_report_the_damaged_file_with_exit_2(run):
    run.run_file.write_text("jobs: [unclosed\n")
    proc = hpctrain("status", str(run.path))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"Error: run file {run.run_file} cannot be read")
    assert "Traceback" not in proc.stderr
    proc = hpctrain("resume", str(run.path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert run.run_file.read_text() == "jobs: [unclosed\n"


def _add_job_ids(path: str, k: int, n: int) -> None:
    run = RunFolder(__import__("pathlib").Path(path))
    for i in range(n):
        run.add_job_id(f"{k}-{i}")


def test_a_runs_job_ids_are_told_apart_by_kind(run):
    """Job ids are recorded with their kind (`hpctrain preflight` submits a "preflight" job):
    whoever reads them asks for the kind it acts on, training jobs by default."""
    run.add_job_id("101", kind="preflight")
    run.add_job_id("102")
    run.add_job_id("103", kind="preflight")
    assert run.job_ids() == ["102"]
    assert run.job_ids("preflight") == ["101", "103"]
    assert run.job_ids(kind=None) == ["101", "102", "103"]


def test_concurrent_read_modify_writes_of_run_yaml_lose_nothing(run):
    """Four processes (a hook, rank 0, two commands) each add 25 job ids at the same time."""
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_add_job_ids, args=(str(run.path), k, 25)) for k in range(4)]
    [p.start() for p in procs]
    [p.join(120) for p in procs]
    assert [p.exitcode for p in procs] == [0] * 4
    ids = run.job_ids()
    assert sorted(ids) == sorted(f"{k}-{i}" for k in range(4) for i in range(25))
    assert run.meta()["name"] == "tiny-gpt"                      # the rest of the file is intact
    leftovers = [p.name for p in run.path.iterdir() if p.name.startswith(".run.yaml.")]
    assert leftovers == []                                       # no temporary file left behind


def _probe_lock(path: str, out) -> None:
    """In a child: can another process take the run's lock now? And does the child believe
    it holds a lock it inherited?"""
    import fcntl

    from hpctrain.record import files as run_files
    from hpctrain.record.folder import LOCK_FILE
    fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        out.put(("acquired", len(run_files._held)))
    except BlockingIOError:
        out.put(("busy", len(run_files._held)))
    finally:
        os.close(fd)


def test_the_lock_is_reentrant_excludes_others_and_is_not_kept_alive_by_a_fork(run):
    ctx = mp.get_context("fork")
    out, stop = ctx.Queue(), ctx.Event()
    with run.lock():
        with run.lock():
            run.update_meta(inner=True)      # update_meta takes the lock again: no deadlock
        sleeper = ctx.Process(target=stop.wait, args=(120,))   # forked while the lock is held
        sleeper.start()
        probe = ctx.Process(target=_probe_lock, args=(str(run.path), out))
        probe.start()
        assert out.get(timeout=60) == ("busy", 0)   # held here; the child holds nothing
        probe.join(60)
    probe = ctx.Process(target=_probe_lock, args=(str(run.path), out))
    probe.start()
    assert out.get(timeout=60) == ("acquired", 0)   # released though the forked child lives
    probe.join(60)
    assert sleeper.is_alive()
    stop.set()
    sleeper.join(60)
    assert run.meta()["inner"] is True


def test_atomic_writes_get_the_umask_mode_not_mkstemps(run):
    old = os.umask(0o027)
    try:
        run.update_meta(x=1)
    finally:
        os.umask(old)
    assert run.run_file.stat().st_mode & 0o777 == 0o640


def test_a_torn_line_never_swallows_the_next_record(tmp_path):
    path = tmp_path / "ledger.jsonl"
    append_jsonl(path, {"attempt": 1})
    append_jsonl(path, {"attempt": 2})
    assert path.read_bytes() == b'{"attempt": 1}\n{"attempt": 2}\n'   # one line each, no gap
    with open(path, "a") as f:
        f.write('{"attempt": 3, "exit_re')        # a writer killed mid-line
    append_jsonl(path, {"attempt": 4})
    assert read_jsonl(path) == [{"attempt": 1}, {"attempt": 2}, {"attempt": 4}]
    assert path.read_bytes().endswith(b'"exit_re\n{"attempt": 4}\n')   # closed, then appended


def test_the_lock_file_is_private_and_a_full_quota_is_not_taken_for_a_link(run, tmp_path):
    """The run's lock file is created 0600 (only its user can hold the run's lock), and a
    write refused for a storage fault says that fault, not one of the door's own refusals."""
    import errno

    from hpctrain.record.files import _why
    old = os.umask(0o022)
    try:
        (run.path / ".lock").unlink(missing_ok=True)
        with run.lock():
            pass
    finally:
        os.umask(old)
    locks = [p for p in run.path.iterdir() if p.name.endswith("lock")]
    assert locks and all(p.stat().st_mode & 0o777 == 0o600 for p in locks)
    for code in (errno.EDQUOT, errno.ESTALE, errno.ENOSPC):
        said = _why(OSError(code, os.strerror(code)))
        assert "symbolic link" not in said and "FIFO" not in said, said
    assert "symbolic link" in _why(OSError(errno.ELOOP, "Too many levels of symbolic links"))


def _append_attempts(path: str, first: int, count: int) -> None:
    run = RunFolder(Path(path))
    for n in range(first, first + count):
        run.append_ledger({"attempt": n})


def _update_attempt_100(path: str, count: int) -> None:
    run = RunFolder(Path(path))
    for i in range(count):
        assert run.update_ledger_record(100, updates=i, excluded_nodes=[f"n{i}"])


def test_a_ledger_record_updated_beside_appends_loses_no_record_and_no_key(run):
    """The batch shell rewrites an attempt's record (which nodes were really excluded) while
    other writers append: every record and every key it does not change survive."""
    run.append_ledger({"attempt": 100, "exit_reason": "preflight_failed", "message": None,
                       "excluded_nodes": ["n3"], "from_a_newer_version": {"kept": True}})
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_append_attempts, args=(str(run.path), 1, 30)),
             ctx.Process(target=_append_attempts, args=(str(run.path), 31, 30)),
             ctx.Process(target=_update_attempt_100, args=(str(run.path), 30))]
    [p.start() for p in procs]
    [p.join(120) for p in procs]
    assert [p.exitcode for p in procs] == [0] * 3
    ledger = run.ledger()
    assert sorted(r["attempt"] for r in ledger) == [*range(1, 61), 100]
    assert ledger[0] == {"attempt": 100, "exit_reason": "preflight_failed", "message": None,
                         "excluded_nodes": ["n29"], "from_a_newer_version": {"kept": True},
                         "updates": 29}
    assert run.update_ledger_record(100, updates=None) and "updates" not in run.ledger()[0]
    assert not run.update_ledger_record(99, excluded_nodes=[])   # no such attempt: no change
    leftovers = [p.name for p in run.path.iterdir() if p.name.startswith(".ledger.jsonl.")]
    assert leftovers == []


def test_a_child_forked_inside_the_lock_leaves_it_without_touching_the_parents(run):
    """A process forked while the run's lock is held (a worker started mid-update) and that
    returns through the ``with`` closes nothing of the lock: its copy was closed at the fork,
    and the parent still holds the lock until it leaves the block itself."""
    pid = None
    try:
        with run.lock():
            pid = os.fork()
            if pid == 0:
                pass                          # the child leaves the block as the parent will
            else:
                assert os.waitpid(pid, 0)[1] == 0
                run.update_meta(after_child=True)   # still this process's lock: no deadlock
    except BaseException:
        if pid == 0:
            os._exit(3)
        raise
    if pid == 0:
        os._exit(0)
    assert run.meta()["after_child"] is True
