"""Filesystem errors reach the user as one ``Error:`` line naming the path (exit 2 for a path
the user gave that cannot be used, 1 for the system failing), never ``internal error``; output
paths are written only as regular files or new paths (never renamed over a device)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from hpctrain.errors import HpcTrainError, UsageError, from_os_error
from hpctrain.outputs import check_output_file
from tests.conftest import REPO, hpctrain

TINY = str(REPO / "examples" / "tiny.yaml")


def one_error_line(proc, code: int, *needles: str) -> None:
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("Error:") and "internal error" not in proc.stderr, proc.stderr
    for n in needles:
        assert n in proc.stderr, proc.stderr


@pytest.fixture
def a_run(tmp_path):
    runs = tmp_path / "runs"
    proc = hpctrain("submit", TINY, "--dry-run", "--runs-dir", str(runs))
    assert proc.returncode == 0, proc.stderr
    return runs, next(p.name for p in runs.iterdir() if p.name != "sweeps")


def test_report_never_writes_over_a_device_or_a_folder(a_run, tmp_path):
    runs, run = a_run
    for target in ("/dev/null", str(tmp_path)):
        proc = hpctrain("report", run, "--runs-dir", str(runs), "-o", target)
        one_error_line(proc, 2, target)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_runs_dir_that_cannot_be_a_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for runs_dir in (tmp_path / "file" / "runs", tmp_path / "loop" / "runs", tmp_path / "file",
                     tmp_path / ("n" * 300)):
        for command in (["runs"], ["submit", TINY, "--dry-run"]):
            proc = hpctrain(*command, "--runs-dir", str(runs_dir))
            one_error_line(proc, 2)


def test_output_prefix_that_is_a_folder_and_names_too_long(tmp_path):
    (tmp_path / "corpus.bin").mkdir()
    proc = hpctrain("data", "prepare", str(REPO / "examples" / "corpus" / "kjv.txt.gz"),
                    "-o", str(tmp_path / "corpus"))
    one_error_line(proc, 2, "corpus.bin", "is a folder")
    proc = hpctrain("data", "prepare", str(REPO / "examples" / "corpus" / "kjv.txt.gz"),
                    "-o", str(tmp_path / ("x" * 300)))
    one_error_line(proc, 2)


def test_a_folder_that_cannot_be_written(tmp_path):
    """A read-only folder: chmod for a user; as root (who ignores modes), /proc, which refuses
    new entries whatever the user."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    target = ro if not os.access(ro, os.W_OK) else Path("/proc/hpctrain-test")
    proc = hpctrain("submit", TINY, "--dry-run", "--runs-dir", str(target / "runs"))
    one_error_line(proc, 2, str(target))
    ro.chmod(0o755)


@given(st.sampled_from(sorted(__import__("errno").errorcode)), st.text(max_size=20))
def test_every_os_error_is_one_line_naming_the_path(code, name):
    err = from_os_error(OSError(code, os.strerror(code), name or None))
    assert isinstance(err, HpcTrainError) and "\n" not in str(err)
    assert str(err).startswith(repr(name[:200]) if name and not name.isprintable() else (name or "a file"))


@given(st.sampled_from(["/dev/null", "/dev/zero", "/proc", "/"]))
def test_output_door_refuses_what_is_not_a_regular_file(path):
    with pytest.raises(UsageError, match="give the path of a regular file"):
        check_output_file(path, "--output")


# Run folders on storage that refuses writes, made for real (tests/faulty_storage.py): the
# command that writes (submit) ends with one Error line naming the file and the fix; the run
# already there keeps every byte and still lists; no half-made run folder is left.
FIRST_RUN = f'mkdir -p "$1/runs"\ncli first submit {TINY} --dry-run --runs-dir "$1/runs"\n' \
            'sums "$1/runs" >"$OUT/before.sums"\n'
AFTER = f'cli second submit {TINY} --dry-run --runs-dir "$1/runs"\n' \
        'sums "$1/runs" >"$OUT/after.sums"\nls "$1/runs" >"$OUT/folders"\n' \
        'cli runs runs --runs-dir "$1/runs"\n'


def _storage_refused(out: Path, code: int, *needles: str) -> None:
    from tests.faulty_storage import cli_result
    assert cli_result(out, "first")[0] == 0, cli_result(out, "first")
    rc, _, err = cli_result(out, "second")
    lines = err.strip().splitlines()
    assert rc == code and len(lines) == 1 and lines[0].startswith("Error: "), (rc, err)
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert (out / "before.sums").read_text() == (out / "after.sums").read_text()
    (run,) = (out / "folders").read_text().split()          # no half-made second run
    rc, listing, err = cli_result(out, "runs")
    assert rc == 0 and run in listing, (rc, listing, err)


def _first_run_then_broken_tmpfs(tmp_path: Path, size: str, break_it: str) -> Path:
    """A tmpfs of ``size`` in a mount namespace: a first run made on it, then ``break_it``
    (shell, ``$1`` the mount point) run before the second submit; returns the outputs' folder."""
    from tests.faulty_storage import CLI, run_in_namespace
    (tmp_path / "out").mkdir()
    (tmp_path / "mnt").mkdir()
    proc = run_in_namespace(CLI + f'mount -t tmpfs -o size={size} tmpfs "$1" || exit 9\n'
                            + FIRST_RUN + break_it + AFTER,
                            str(tmp_path / "mnt"), out=tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "out"


def test_a_run_folder_on_a_full_file_system(tmp_path):
    out = _first_run_then_broken_tmpfs(tmp_path, "256k",
                                       'dd if=/dev/zero of="$1/fill" bs=4k 2>/dev/null\n')
    _storage_refused(out, 1, f"{tmp_path}/mnt/runs/", "no space left on the device",
                     "free space on that file system")


def test_a_run_folder_on_a_read_only_file_system(tmp_path):
    out = _first_run_then_broken_tmpfs(tmp_path, "1m", 'mount -o remount,ro "$1" || exit 9\n')
    _storage_refused(out, 2, f"{tmp_path}/mnt/runs", "read-only",
                     "choose a folder on a writable file system")


def test_a_runs_folder_the_user_cannot_write(tmp_path):
    """The runs folder is 0555 and hpctrain runs as another uid (a user namespace without
    capabilities: root's override does not reach it; outside, it is this user)."""
    from tests.faulty_storage import CLI, run_in_namespace
    (tmp_path / "out").mkdir()
    base = tmp_path / "base"
    base.mkdir()
    proc = run_in_namespace(CLI + FIRST_RUN + 'chmod 0555 "$1/runs"', str(base), mount=False,
                            out=tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    proc = run_in_namespace(CLI + AFTER, str(base), other_user=True, out=tmp_path / "out")
    (base / "runs").chmod(0o755)
    assert proc.returncode == 0, proc.stderr
    _storage_refused(tmp_path / "out", 2, f"{base}/runs", "permission denied",
                     "give your user access to it")


def test_data_prepare_onto_a_full_file_system_names_the_file(tmp_path):
    """`data prepare` streams its .bin: a write's ENOSPC names no file, and the line said
    `Error: a file: no space left ...`. Now it names PREFIX.bin, and nothing is left."""
    from tests.faulty_storage import CLI, cli_result, run_in_namespace
    (tmp_path / "out").mkdir()
    (tmp_path / "mnt").mkdir()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"paragraph {i}: {'words ' * 40}\n\n" for i in range(2000)))
    proc = run_in_namespace(CLI + 'mount -t tmpfs -o size=64k tmpfs "$1" || exit 9\n'
                            'cli prepare data prepare "$2" --output "$1/corpus"\n'
                            'ls -A "$1" > "$OUT/left"\n',
                            str(tmp_path / "mnt"), str(corpus), out=tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    rc, _, err = cli_result(tmp_path / "out", "prepare")
    assert rc == 1 and err.splitlines() == [
        f"Error: {tmp_path}/mnt/corpus.bin: no space left on the device; free space on that "
        "file system or choose another one"], (rc, err)
    assert (tmp_path / "out" / "left").read_text() == ""


def test_run_yaml_refused_by_a_full_file_system_is_said_with_the_fix(tmp_path):
    """The storage fills between a submission's job.yaml and its run.yaml: the line named
    run.yaml with the C library's words (`No space left on device`); now with the door's words
    and the fix, like every other storage fault, and no half run is left."""
    from tests.cli.test_interruption import _SIGNALLED
    from tests.faulty_storage import CLI, cli_result, run_in_namespace
    (tmp_path / "out").mkdir()
    (tmp_path / "mnt").mkdir()
    script = tmp_path / "signalled.py"
    script.write_text(_SIGNALLED)
    proc = run_in_namespace(
        CLI + 'mount -t tmpfs -o size=256k tmpfs "$1" || exit 9\n'
        'export HOOK_COMMAND="dd if=/dev/zero of=$1/fill bs=4k 2>/dev/null; true"\n'
        'cd "$2" && "$PY" "$3" hpctrain.config.yamlio:write_atomic 3 RUN submit '
        'examples/tiny.yaml --dry-run --runs-dir "$1/runs" >"$OUT/s.out" 2>"$OUT/s.err"\n'
        'echo $? > "$OUT/s.rc"; ls -A "$1/runs" > "$OUT/left"\n',
        str(tmp_path / "mnt"), str(REPO), str(script), out=tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    rc, _, err = cli_result(tmp_path / "out", "s")
    (line,) = err.splitlines()
    assert line.startswith(f"Error: cannot write {tmp_path}/mnt/runs/") and line.endswith(
        "/run.yaml: no space left on the device; free space on that file system or choose "
        "another one"), line
    assert (tmp_path / "out" / "left").read_text() == ""
