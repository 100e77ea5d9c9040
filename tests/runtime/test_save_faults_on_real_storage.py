"""A checkpoint save refused by real storage (a full tmpfs, a read-only mount, a folder the
user cannot write: ``tests/faulty_storage.py``), through the runtime's save-fault door: one
line naming the save, the path, the fault and its fix; the partial save never published; the
complete checkpoint before it, and ``latest``, unchanged byte for byte. Single processes, no
torch (``save_on_faulty_storage.py`` runs rank 0's own steps on the storage)."""

from __future__ import annotations

from tests.faulty_storage import json_lines, run_in_namespace

PROBE = "tests/runtime/save_on_faulty_storage.py"
PROBE_IN = f'"$PY" {PROBE} "$1/ck"'
MOUNT = 'mount -t tmpfs -o size=1m tmpfs "$1" || exit 9\n'
RESUME = "then `hpctrain resume tiny-20260101-000000-ab12`"


def _checked(before: dict, fault: dict, after: dict, root: str, *needles: str) -> str:
    """The fault is one line with every needle; nothing complete was lost or replaced."""
    line = fault.get("fault")
    assert line, fault
    assert "\n" not in line and line.startswith(f"checkpoint save of step 6 to {root} failed: ")
    assert f"the newest complete checkpoint, {root}/step-00000003, is intact" in line, line
    assert line.endswith(RESUME), line
    for needle in needles:
        assert needle in line, line
    assert fault["logged"].startswith(f"checkpoint: {line}\n")
    assert "Traceback" in fault["logged"]              # kept for the rank log, under the line
    assert before["complete"] == after["complete"] == [3]
    assert before["latest"] == after["latest"] == "step-00000003"
    kept = {name: digest for name, digest in after["files"].items()
            if not name.startswith(".partial-")}
    assert kept == before["files"], (before, after)     # not a byte of them changed
    return line


def test_a_save_on_a_full_file_system(tmp_path):
    """ENOSPC from a 1 MiB tmpfs, in the middle of writing a 4 MiB shard."""
    proc = run_in_namespace(f"{MOUNT}{PROBE_IN} save 3 262144 state save 6 4194304 state",
                            str(tmp_path))
    saved, before, fault, after = json_lines(proc)
    assert saved["saved"].endswith("step-00000003"), saved
    root = f"{tmp_path}/ck"
    _checked(before, fault, after, root,
             f"no space left on the device (ENOSPC: {root}/.partial-step-00000006-a1/__0_0.distcp)",
             "free space on that file system")
    assert after["partials"] == [".partial-step-00000006-a1"]   # left for resume to set aside


def test_a_save_on_a_read_only_file_system(tmp_path):
    """EROFS: the file system holding the checkpoints is remounted read-only."""
    proc = run_in_namespace(f"{MOUNT}{PROBE_IN} save 3 65536 state remount-ro save 6 65536 state",
                            str(tmp_path))
    _, before, fault, after = json_lines(proc)
    root = f"{tmp_path}/ck"
    _checked(before, fault, after, root,
             f"the file system is read-only (EROFS: {root}/.partial-step-00000006-a1)",
             "remount the file system writable, or set storage.checkpoint_root")
    assert after["partials"] == []


def test_a_save_into_a_folder_the_user_cannot_write(tmp_path):
    """EACCES: the checkpoint folder is 0555 and the writer runs as another uid (a user
    namespace without capabilities: root's override does not reach it; outside, it is this
    user, so everything else it reads is its own)."""
    proc = run_in_namespace(f'{PROBE_IN} save 3 65536 state && chmod 0555 "$1/ck"',
                            str(tmp_path), mount=False)
    _, before = json_lines(proc)
    proc = run_in_namespace(f"{PROBE_IN} save 6 65536", str(tmp_path), other_user=True)
    (fault,) = json_lines(proc)
    (after,) = json_lines(run_in_namespace(f"{PROBE_IN} state", str(tmp_path), mount=False))
    root = f"{tmp_path}/ck"
    _checked(before, fault, after, root,
             f"permission denied (EACCES: {root}/.partial-step-00000006-a1)",
             "let the job's user write that folder (chmod/chown)")
    assert after["partials"] == []
    (tmp_path / "ck").chmod(0o755)
