"""The one reader of run-folder files (hpctrain.record.reader): special files are refused
without blocking, sizes are bounded, bad text and wrong-typed records are a DamagedFile naming
the file and the line or field, and nothing is changed on disk."""

from __future__ import annotations

import json
import os
import threading

import pytest

from tests.conftest import unix_socket_at

from hpctrain.record import reader
from hpctrain.record.files import append_jsonl, RunFileError
from hpctrain.record.folder import RunFolder


def special(tmp_path, kind: str):
    path = tmp_path / "ledger.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "link-out":
        outside = tmp_path.parent / f"{tmp_path.name}-outside.jsonl"
        outside.write_text('{"attempt": 1}\n')
        path.symlink_to(outside)
    elif kind == "loop":
        path.symlink_to(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "socket":
        unix_socket_at(path)
    return path


@pytest.mark.parametrize("kind, words", [
    ("fifo", "a FIFO"), ("dev-zero", "symbolic link"), ("link-out", "symbolic link"),
    ("loop", "symbolic link"), ("folder", "a folder"), ("socket", "not a regular file")])
def test_special_files_are_damage_at_once(tmp_path, kind, words):
    path = special(tmp_path, kind)
    for read in (reader.read_bytes, reader.read_jsonl, reader.read_json, reader.read_last_jsonl,
                 lambda p: reader.tail_bytes(p, 100)):
        with pytest.raises(reader.DamagedFile) as e:
            read(path)                                  # a FIFO would block a plain open
        assert words in str(e.value) and str(path) in str(e.value)
    with pytest.raises(RunFileError):                   # nor does an append block or follow
        append_jsonl(path, {"attempt": 2})
    assert os.path.lexists(path)                        # nothing was replaced


def test_a_fifo_with_a_writer_is_refused_too(tmp_path):
    path = special(tmp_path, "fifo")
    fd = os.open(path, os.O_RDWR)                       # a writer that never writes
    try:
        with pytest.raises(reader.DamagedFile, match="a FIFO"):
            reader.read_jsonl(path)
    finally:
        os.close(fd)


def test_sizes_are_bounded_and_missing_files_are_not_damage(tmp_path):
    path = tmp_path / "result.json"
    assert reader.read_json(path) is None and reader.read_jsonl(path) == []
    path.write_text('{"a": "' + "x" * 5000 + '"}')
    with pytest.raises(reader.DamagedFile, match="over 1,000 bytes"):
        reader.read_bytes(path, limit=1000)
    assert reader.tail_bytes(path, 10) == (path.read_bytes()[-10:], path.stat().st_size)


def test_bad_text_and_records(tmp_path):
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(b'{"attempt": 1}\n{"attempt": \xff}\n')
    with pytest.raises(reader.DamagedFile, match="not UTF-8"):
        reader.read_json(path)
    # a line that does not parse (torn by a killed writer) is skipped; a record of the
    # wrong type names the line and the field
    path.write_bytes(b'{"attempt": 1}\n{"attempt": 2, "end_st\n{"attempt": 3}\n')
    assert reader.read_jsonl(path, check=reader.ledger_problem) == [{"attempt": 1},
                                                                     {"attempt": 3}]
    path.write_text('{"attempt": 1}\n{"attempt": "2"}\n')
    with pytest.raises(reader.DamagedFile, match=r"line 2: attempt: expected an integer"):
        reader.read_jsonl(path, check=reader.ledger_problem)
    path.write_text('[1, 2]\n')
    with pytest.raises(reader.DamagedFile, match="line 1 is a JSON list"):
        reader.read_jsonl(path)
    path.write_text('{"a": ' * 100_000)
    assert reader.read_jsonl(path) == []                # deep nesting: no RecursionError


def test_a_record_giving_a_key_twice_is_damage_and_a_torn_line_is_still_skipped(tmp_path):
    """JSON's last-wins would read ``{"attempt": 1, "attempt": 2}`` as attempt 2, silently;
    such a line is damage naming the line and the key (a torn line still is skipped), and a
    single-record file giving a key twice, nested or not, is damage too."""
    path = tmp_path / "ledger.jsonl"
    path.write_text('{"attempt": 1}\n{"attempt": 2, "end_st\n'
                    '{"attempt": 3, "decision": {"requeue": true, "requeue": false}}\n')
    with pytest.raises(reader.DamagedFile) as e:
        reader.read_jsonl(path, check=reader.ledger_problem)
    assert e.value.why == "line 3: an object gives the key 'requeue' twice"
    assert "repair or remove line 3" in str(e.value)
    path.write_text('{"attempt": 1}\n{"attempt": 2, "end_st\n{"attempt": 3}\n')
    assert [r["attempt"] for r in reader.read_jsonl(path)] == [1, 3]
    result = tmp_path / "result.json"
    result.write_text('{"attempt": 1, "exit_reason": "finished", "exit_reason": "failed"}')
    with pytest.raises(reader.DamagedFile, match="gives the key 'exit_reason' twice"):
        reader.read_json(result)
    result.write_text('{"attempt": 1, "exit_reason": "finished"}')
    assert reader.read_json(result) == {"attempt": 1, "exit_reason": "finished"}


@pytest.mark.parametrize("meta, field", [
    ("jobs: 5\n", "jobs: expected a list"),
    ("jobs:\n- kind: train\n", "jobs[0].job_id"),
    ("jobs:\n- {kind: train, job_id: '--help'}\n", "jobs[0].job_id: expected the job id as text "
                                                    "(never starting with '-'), got '--help'"),
    ("name: [1]\n", "name: expected text"),
    ("total_steps: many\n", "total_steps: expected an integer"),
    # written absolute: a relative one, edited in, meant another folder to every process
    ("checkpoint_dir: relative/ck\n", "checkpoint_dir: expected an absolute path"),
    ("- 1\n", "mapping"),
])
def test_run_yaml_fields_are_checked(tmp_path, meta, field):
    run = RunFolder(tmp_path)
    run.run_file.write_text(meta)
    before = run.run_file.read_bytes()
    with pytest.raises(reader.DamagedFile) as e:
        run.meta()
    assert field in str(e.value) and "run.yaml" in str(e.value)
    with pytest.raises(RunFileError):                   # never taken as empty and rewritten
        run.update_meta(name="x")
    assert run.run_file.read_bytes() == before


def test_the_last_record_is_read_from_the_end_only(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with open(path, "w") as f:
        for step in range(1, 3001):
            f.write(json.dumps({"step": step, "loss": 1.0 / step, "pad": "y" * 40}) + "\n")
        f.write('{"step": 3001, "lo')                   # torn by a killed writer
    assert reader.read_last_jsonl(path, max_bytes=256)["step"] == 3000
    assert reader.read_last_jsonl(path, accept=lambda r: r["step"] % 1000 == 0,
                                  max_bytes=256)["step"] == 3000


def test_the_reader_never_waits_for_a_slow_writer(tmp_path):
    """A regular file being appended is read as it is now (no lock, no wait)."""
    path = tmp_path / "events.jsonl"
    append_jsonl(path, {"event": "submit", "time": "t"})
    done = threading.Event()
    t = threading.Thread(target=lambda: (reader.read_jsonl(path), done.set()))
    fd = os.open(path, os.O_RDWR)
    import fcntl
    fcntl.flock(fd, fcntl.LOCK_EX)                      # a writer holds the append lock
    try:
        t.start()
        assert done.wait(30)
    finally:
        os.close(fd)


def test_a_non_finite_loss_as_the_runtime_writes_it_is_a_record_not_damage(tmp_path):
    """A skipped step's NaN loss is written as the text "nan" (JSON has no NaN): Run.metrics()
    reads it back as that step's record; a loss that is other text is still damage."""
    from hpctrain.runtime.metrics import _finite
    run = RunFolder(tmp_path / "r")
    run.path.mkdir()
    for step, loss in ((1, 5.5), (2, float("nan")), (3, float("inf")), (4, 4.5)):
        append_jsonl(run.metrics_file, {"kind": "train", "step": step, "loss": _finite(loss)})
    assert [m["loss"] for m in run.metrics()] == [5.5, "nan", "inf", 4.5]
    append_jsonl(run.metrics_file, {"kind": "train", "step": 5, "loss": "low"})
    with pytest.raises(RunFileError, match="line 5: loss"):
        run.metrics()


def test_a_nul_in_a_path_is_damage_not_a_value_error(tmp_path):
    """A path a damaged record gave (a checkpoint folder, a file a manifest names) with a NUL
    byte in it: a DamagedFile naming it, never ``ValueError: embedded null byte``."""
    for read in (reader.read_bytes, reader.read_json, reader.read_jsonl,
                 lambda p: reader.read_head(p, 8)):
        with pytest.raises(reader.DamagedFile, match="NUL byte"):
            read(tmp_path / "a\x00b")


def test_read_head_reads_the_first_bytes_only(tmp_path):
    path = tmp_path / "report.png"
    assert reader.read_head(path, 8) is None
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"x" * 100)
    assert reader.read_head(path, 8) == b"\x89PNG\r\n\x1a\n"
    path.write_bytes(b"abc")
    assert reader.read_head(path, 8) == b"abc"
    link = tmp_path / "link.png"
    link.symlink_to(path)
    with pytest.raises(reader.DamagedFile, match="symbolic link"):
        reader.read_head(link, 8)


def test_an_unpaired_surrogate_escape_is_damage(tmp_path):
    """JSON's "\\ud800" gives a string no terminal nor UTF-8 file can take: damage naming the
    line; a pair ("\\ud83d\\ude00", an emoji) is text."""
    path = tmp_path / "events.jsonl"
    path.write_text('{"event": "x", "why": "\\ud83d\\ude00"}\n{"event": "\\ud800"}\n')
    with pytest.raises(reader.DamagedFile, match="line 2: holds an unpaired UTF-16 surrogate"):
        reader.read_jsonl(path, check=reader.event_problem)
    path.write_text('{"event": "x", "why": "\\ud83d\\ude00"}\n')
    assert reader.read_jsonl(path, check=reader.event_problem) == [{"event": "x",
                                                                    "why": "\U0001f600"}]


def test_partial_reads_give_exactly_the_bytes_asked(tmp_path):
    """The end of a log (``tail_bytes``), a log followed from an offset (``read_from``) and a
    file's signature (``read_head``): never a byte more than asked, from where asked."""
    path = tmp_path / "rank0.log"
    data = bytes(range(256)) * 40
    path.write_bytes(data)
    assert reader.tail_bytes(path, 100) == (data[-100:], len(data))
    assert reader.tail_bytes(path, 2 * len(data)) == (data, len(data))
    assert reader.read_from(path, 1000, 77) == data[1000:1077]
    assert reader.read_from(path, len(data) - 5, 77) == data[-5:]
    assert reader.read_head(path, 9) == data[:9]


def test_the_last_record_is_looked_for_no_further_than_the_give_up_size(tmp_path):
    """The tail read quadruples up to ``give_up_bytes`` and no further: a record that is only
    farther from the end is not found (a metrics file's last loss is near its end)."""
    path = tmp_path / "metrics.jsonl"
    wanted = json.dumps({"step": 1, "wanted": True}) + "\n"
    filler = "".join(json.dumps({"step": 2 + i}) + "\n" for i in range(200))
    path.write_text(wanted + filler)
    size = len(wanted) + len(filler)
    want = lambda r: r.get("wanted") is True     # noqa: E731
    assert reader.read_last_jsonl(path, want, max_bytes=16, give_up_bytes=1 << 16)["step"] == 1
    give_up = 16 * 4 ** 3                        # the last size read: 16, 64, 256, 1024
    assert give_up < size <= 4 * give_up         # the next read would have reached it
    assert reader.read_last_jsonl(path, want, max_bytes=16, give_up_bytes=give_up) is None


@pytest.mark.parametrize("field, value, damaged", [
    ("end_step", 2**63 - 1, False), ("end_step", 2**63, True), ("end_step", -1, True),
    ("exit_code", -(2**63 - 1), False), ("exit_code", -(2**63), True),
    ("end_time", 253402300799, False), ("end_time", 253402300800, True),
    ("end_time", 0, False), ("end_time", -1, True),
])
def test_ledger_numbers_are_read_up_to_their_bounds_and_no_further(tmp_path, field, value,
                                                                  damaged):
    """Steps and counts fit a C long (what a status line, a sum, a plot takes), times are
    seconds from 1970 to the end of the year 9999 (the last one a date can show)."""
    from datetime import datetime, timezone
    assert datetime.fromtimestamp(253402300799, timezone.utc).year == 9999
    path = tmp_path / "ledger.jsonl"
    path.write_text(json.dumps({"attempt": 1, **{field: value}}) + "\n")
    if damaged:
        with pytest.raises(reader.DamagedFile, match=f"line 1: {field}"):
            reader.read_jsonl(path, check=reader.ledger_problem)
    else:
        assert reader.read_jsonl(path, check=reader.ledger_problem)[0][field] == value


def test_a_value_in_a_message_is_shown_whole_up_to_40_characters():
    assert reader._show_value("x" * 38) == repr("x" * 38)              # 40 with its quotes
    assert reader._show_value("x" * 39) == repr("x" * 39)[:37] + "..."
