"""Writers of run-folder files go through the record layer's door (``hpctrain.record.files``,
``outputs.write_atomic`` and ``outputs.AtomicFile``, also reached as ``yamlio.write_atomic``): a FIFO, a device, a folder or a symbolic link where a rank log, the
ledger or a heartbeat goes is an error naming the file (never a hang, never a write through
the link), and nothing but the file meant is changed."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from hpctrain.errors import NotRegularFileError, from_os_error
from hpctrain.outputs import AtomicFile, write_atomic
from hpctrain.record.files import RunFileError, append_jsonl, open_for_append

KINDS = ["absent", "regular", "fifo", "socket", "folder", "link-to-file", "dangling-link",
         "link-to-fifo", "device"]


def _make(path: Path, kind: str, outside: Path) -> None:
    if kind == "regular":
        path.write_bytes(b"kept\n")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        here = os.getcwd()
        os.chdir(path.parent)           # bind takes at most 107 bytes of path
        try:
            s = socket.socket(socket.AF_UNIX)
            s.bind(path.name)
            s.close()
        finally:
            os.chdir(here)
    elif kind == "folder":
        path.mkdir()
    elif kind == "link-to-file":
        path.symlink_to(outside)
    elif kind == "dangling-link":
        path.symlink_to(outside.parent / "nowhere")
    elif kind == "link-to-fifo":
        os.mkfifo(outside.parent / "fifo")
        path.symlink_to(outside.parent / "fifo")
    elif kind == "device":
        path.symlink_to("/dev/null")


@given(kind=st.sampled_from(KINDS), truncate=st.booleans(),
       door=st.sampled_from(["append", "open", "replace", "stream"]))
def test_a_run_file_is_written_only_if_it_is_a_regular_file(tmp_path_factory, kind, truncate,
                                                            door):
    base = tmp_path_factory.mktemp("w")
    (base / "run").mkdir()
    outside = base / "outside.txt"
    outside.write_bytes(b"not the run's\n")
    path = base / "run" / "rank-0.log"
    _make(path, kind, outside)
    try:
        if door == "append":
            append_jsonl(path, {"a": 1})
        elif door == "open":
            os.close(open_for_append(path, truncate=truncate))
        elif door == "replace":
            write_atomic(path, "new\n", durable=truncate)
        else:                              # a writer that streams (a dataset, a PNG)
            with AtomicFile(path, durable=truncate) as f:
                f.write(b"ne")
                f.write(b"w\n")
    except RunFileError as e:
        assert kind not in ("absent", "regular") and door in ("append", "open"), e
        assert str(e).startswith(f"cannot {'append to' if door == 'append' else 'write'} {path}: ")
        assert "\n" not in str(e)
    except NotRegularFileError as e:       # what the CLI's door makes of it: one line, exit 2
        assert kind not in ("absent", "regular") and door in ("replace", "stream"), e
        line = str(from_os_error(e))
        assert line.startswith(f"{path}: is ") and line.endswith(", not a regular file; move "
                                                                  "it away"), line
    else:
        assert kind in ("absent", "regular"), kind
        assert path.is_file() and not path.is_symlink()
        assert door in ("append", "open") or path.read_bytes() == b"new\n"
    assert outside.read_bytes() == b"not the run's\n"          # never written through a link
    assert os.listdir(base / "run") == ["rank-0.log"]          # no temporary file left
    assert sorted(p.name for p in base.iterdir()) == sorted(
        ["run", "outside.txt"] + (["fifo"] if kind == "link-to-fifo" else []))


def test_a_rank_log_that_is_a_fifo_stops_the_rank_at_once(tmp_path):
    """The rank's own output: a FIFO in the log's place would block ``open`` forever."""
    from hpctrain.runtime.log import redirect_output
    os.mkfifo(tmp_path / "rank-0.log")
    with pytest.raises(RunFileError, match="is a FIFO or a device, not a regular file"):
        redirect_output(tmp_path / "rank-0.log")


def test_heartbeats_and_verdicts_never_write_through_a_planted_link(tmp_path):
    """The temporary names the writers once used (``.rank-0.json.PID.tmp``) are not used:
    a link planted there is left alone, and so is what it points to."""
    from hpctrain.health import hang, heartbeat
    outside = tmp_path / "outside"
    outside.write_text("mine")
    attempt = tmp_path / "attempt-1"
    beats = heartbeat.folder(attempt)
    beats.mkdir(parents=True)
    (beats / f".rank-0.json.{os.getpid()}.tmp").symlink_to(outside)
    (attempt / f".{hang.VERDICT_FILE}.{os.getpid()}.tmp").symlink_to(outside)
    heartbeat.write_beat(attempt, heartbeat.Beat(rank=0, node="n1", pid=os.getpid(), step=3))
    assert heartbeat.read_beats(attempt)[0].step == 3
    verdict = hang.Verdict(rank=0, node="n1", pid=1, step=3, phase="step", idle_s=9.0,
                           limit_s=5.0, why="no progress")
    assert hang.claim_verdict(attempt, verdict) == verdict
    assert hang.read_verdict(attempt) == verdict
    assert outside.read_text() == "mine"
    assert sorted(p.name for p in attempt.iterdir() if p.name.startswith(".hang")) == \
        [f".{hang.VERDICT_FILE}.{os.getpid()}.tmp"]          # the planted link, left alone
