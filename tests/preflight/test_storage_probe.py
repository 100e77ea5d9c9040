"""The preflight storage probe on storage that refuses it (a full ``tmpfs``, one remounted
read-only, a folder the user may not write: ``tests/faulty_storage.py``): one row per probe
whose line names the folder and the fault, no probe file left behind, and a link planted at
the name an earlier probe used is never written through."""

from __future__ import annotations

import os

from hpctrain.preflight.storage import check_storage
from tests.faulty_storage import json_lines, run_in_namespace
from tests.preflight.helpers import make_profile

# ``"$PY" -c PROBE FOLDER PROBE_MB``: the storage checks' rows for FOLDER, as one JSON line
PROBE = ('"$PY" -c \'import json, sys\n'
         'from hpctrain.preflight.storage import check_storage\n'
         'from tests.preflight.helpers import make_profile\n'
         'rows = check_storage(sys.argv[1], make_profile(), 1, "n1", probe_mb=int(sys.argv[2]),\n'
         '                     checkpoint_bytes=None, mounts_text="")\n'
         'print(json.dumps({r.check: [r.status, r.measured] for r in rows}))\' ')
MOUNT = 'mount -t tmpfs -o size=1m tmpfs "$1" || exit 9\n'


def _one_line(row: list, *needles: str) -> None:
    status, measured = row
    assert status == "fail" and "\n" not in measured, row
    for needle in needles:
        assert needle in measured, row


def test_the_probe_on_a_full_and_then_read_only_file_system(tmp_path):
    """ENOSPC: the 1 MiB tmpfs takes the 2-byte writable probe but not the 4 MB bandwidth
    probe; then filled to the last byte, the writable probe fails too; then remounted
    read-only (EROFS)."""
    script = (f'{MOUNT}{PROBE}"$1" 4\n'
              'cat /dev/zero > "$1/filler" 2>/dev/null\n'
              f'{PROBE}"$1" 0\n'
              'rm "$1/filler"; mount -o remount,ro "$1"\n'
              f'{PROBE}"$1" 0\n'
              'ls -A "$1"\n')
    proc = run_in_namespace(script, str(tmp_path))
    big, full, read_only = json_lines(proc)
    where = str(tmp_path)
    assert big["storage.writable"][0] == "pass"
    _one_line(big["storage.write_bw"], f"write failed: {where}: No space left on device (ENOSPC)")
    _one_line(full["storage.writable"], f"{where}: No space left on device (ENOSPC)")
    _one_line(read_only["storage.writable"], f"{where}: Read-only file system (EROFS)")
    assert proc.stdout.splitlines()[-1].startswith("{"), proc.stdout   # nothing left there


def test_the_probe_in_a_folder_the_user_may_not_write(tmp_path):
    """EACCES: the folder is 0555 and the probe runs as another uid."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck").chmod(0o555)
    try:
        proc = run_in_namespace(f'{PROBE}"$1/ck" 1', str(tmp_path), other_user=True)
    finally:
        (tmp_path / "ck").chmod(0o755)
    (rows,) = json_lines(proc)
    _one_line(rows["storage.writable"], f"{tmp_path}/ck: Permission denied (EACCES)")
    assert os.listdir(tmp_path / "ck") == []


def test_a_link_planted_at_an_earlier_probe_name_is_left_alone(tmp_path):
    """The probes once used fixed names (``.hpctrain-write-test-PID``,
    ``.hpctrain-preflight-PID.tmp``): links planted there are neither written through nor
    removed, and the probe's own file is gone afterwards."""
    outside = tmp_path / "outside"
    outside.write_text("mine")
    ck = tmp_path / "ck"
    ck.mkdir()
    planted = [ck / f".hpctrain-write-test-{os.getpid()}",
               ck / f".hpctrain-preflight-{os.getpid()}.tmp"]
    for link in planted:
        link.symlink_to(outside)
    os.mkfifo(ck / "fifo")
    rows = {r.check: r for r in check_storage(str(ck), make_profile(), 1, "n1", probe_mb=1,
                                              checkpoint_bytes=None, mounts_text="")}
    assert rows["storage.writable"].status == "pass"
    assert rows["storage.write_bw"].detail["mb_per_s"] > 0
    assert outside.read_text() == "mine"
    assert sorted(os.listdir(ck)) == sorted([p.name for p in planted] + ["fifo"])
