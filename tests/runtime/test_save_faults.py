"""Storage faults during a checkpoint save, made for real on this machine (a file where the
folder should be, a folder removed under the writer, a file-size limit), said in one line: the
path, the fault, the newest complete checkpoint, the command that continues. Errors that are
not the storage's keep their own message."""

from __future__ import annotations

import os
import subprocess
import sys

from torch.distributed.checkpoint.api import CheckpointException

from hpctrain.runtime.checkpoint.save_faults import fault_of, save_fault
from hpctrain.view.follow import TRACEBACK_HEADER, Rank0Progress


def _raised(fn) -> BaseException:
    try:
        fn()
    except BaseException as e:   # noqa: BLE001 - the fault under test
        return e
    raise AssertionError("no fault")


def _line(e, root, newest="/ck/step-00000003") -> str:
    fault = save_fault(e, step=6, path=root, newest=newest, run_id="tiny-20260101-000000-ab12")
    assert fault is not None, e
    text = str(fault)
    assert "\n" not in text and text.startswith(f"checkpoint save of step 6 to {root} failed: ")
    assert text.endswith("then `hpctrain resume tiny-20260101-000000-ab12`")
    return text


def test_a_file_where_the_checkpoint_folder_should_be(tmp_path):
    (tmp_path / "checkpoints").write_text("not a folder")
    e = _raised(lambda: (tmp_path / "checkpoints" / ".partial-step-00000006").mkdir())
    text = _line(e, tmp_path / "checkpoints")
    assert "a part of the path is not a folder (ENOTDIR:" in text
    assert "the newest complete checkpoint, /ck/step-00000003, is intact" in text


def test_the_folder_removed_under_every_ranks_writer(tmp_path):
    """As megatron-core reports a failed write: torch's CheckpointException holding each
    rank's (exception, traceback); the fault is said once."""
    partial = tmp_path / ".partial-step-00000006"
    partial.mkdir()
    partial.rmdir()
    errors = {r: (_raised(lambda: open(partial / f"__{r}_0.distcp", "wb")), None) for r in (0, 1)}
    e = _raised(lambda: (_ for _ in ()).throw(CheckpointException("write", errors)))
    text = _line(e, tmp_path, newest=None)
    assert "vanished under the save" in text and "(ENOENT:" in text
    assert "no complete checkpoint was saved before it" in text
    assert text.count("ENOENT") == 1


PAST_THE_LIMIT = r"""
import os, resource, signal, sys
from hpctrain.runtime.checkpoint.save_faults import fault_of
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
try:
    with open(sys.argv[1], "wb") as f:
        f.write(bytes(1 << 17))
except BaseException as e:
    print(fault_of(e))
"""


def test_a_write_past_the_file_size_limit(tmp_path):
    """EFBIG; torch's zip writer loses the errno (``inline_container.cc: unexpected pos``): the
    runtime test of a real save under the same limit checks that path."""
    out = subprocess.run([sys.executable, "-c", PAST_THE_LIMIT, str(tmp_path / "shard")],
                         capture_output=True, text=True, timeout=120)
    assert "a file grew past the size this process may write" in out.stdout, out
    assert "(EFBIG)" in out.stdout, out


def test_the_zip_writers_words_are_understood():
    e = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert fault_of(e) == "a write failed part-way (the file system is full or failing?)"


def test_a_rank_told_only_that_the_write_failed_elsewhere(tmp_path):
    from hpctrain.record.culprit import peer_vanished
    e = _raised(lambda: (_ for _ in ()).throw(CheckpointException("write", {})))
    text = str(save_fault(e, step=6, path=tmp_path, newest=None, run_id="r"))
    assert text.startswith(f"checkpoint save of step 6 to {tmp_path} aborted: a write failed "
                           "on another rank")
    assert peer_vanished(text)          # the ledger names the rank that saw the fault


def test_other_failures_keep_their_own_message():
    assert fault_of(_raised(lambda: int("x"))) is None
    assert fault_of(_raised(lambda: os.kill(os.getpid(), 99999))) is None   # EINVAL


def test_following_a_run_shows_the_line_and_not_the_traceback():
    log = ["12:00:01 rank 0: step 5 loss 4.1",
           "12:00:02 rank 0: checkpoint: checkpoint save of step 6 to /ck failed: ...",
           f"12:00:02 rank 0: {TRACEBACK_HEADER}",
           "    Traceback (most recent call last):",
           '      File "x.py", line 1, in <module>',
           "    OSError: [Errno 27] File too large",
           "12:00:03 rank 0: attempt 1 failed: checkpoint save of step 6 ..."]
    keep = Rank0Progress()
    assert [line for line in log if keep(line)] == [log[0], log[1], log[6]]
