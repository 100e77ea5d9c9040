"""The file door (``hpctrain/file_door.py``), which every file hpctrain did not just write goes
through (profiles and jobs, kernel tables, tokenizers and data sidecars, run-folder records):
Hypothesis builds what a path may be (a regular file of any size, a FIFO, a socket, a folder,
a link to any of them, a dangling link, a link loop, nothing) and the door must give the bytes
of a regular file within its bound, None for nothing, and a ``Refused`` for everything else,
never block on a FIFO, never read past its bound, never raise anything else."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from hpctrain import file_door

KINDS = ("regular", "fifo", "socket", "folder", "missing")


def _make(where: Path, kind: str, data: bytes) -> list:
    """Create ``where`` as ``kind``; returns what must be kept alive (a bound socket)."""
    if kind == "regular":
        where.write_bytes(data)
    elif kind == "fifo":
        os.mkfifo(where)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(where))
        return [s]
    elif kind == "folder":
        where.mkdir()
    return []


@settings(max_examples=120, deadline=None)
@given(kind=st.sampled_from(KINDS), via=st.sampled_from(("direct", "link", "loop")),
       follow=st.booleans(), data=st.binary(max_size=64), limit=st.integers(0, 80))
def test_the_door_reads_a_regular_file_within_its_bound_and_refuses_the_rest(
        kind, via, follow, data, limit):
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "target"
        keep = _make(target, kind, data)
        path = target
        if via == "link":
            path = Path(tmp) / "link"
            path.symlink_to(target)
        elif via == "loop":
            path = Path(tmp) / "loop"
            path.symlink_to(Path(tmp) / "loop2")
            (Path(tmp) / "loop2").symlink_to(path)
        try:
            got = file_door.read_file(path, limit, follow_links=follow)
        except file_door.Refused as e:
            got = e
        finally:
            for s in keep:
                s.close()
        readable = kind == "regular" and via != "loop" and (via == "direct" or follow)
        if via in ("loop", "link") and not follow:
            assert isinstance(got, file_door.Refused) and got.why == "is a symbolic link"
        elif via == "loop":
            assert isinstance(got, file_door.Refused) and got.why == "is behind a symlink loop"
        elif kind == "missing":
            assert got is None
        elif readable and len(data) <= limit:
            assert got == data
        elif readable:
            assert isinstance(got, file_door.TooBig)
        else:
            assert isinstance(got, file_door.Refused) and got.kind == {
                "fifo": "a FIFO", "socket": "a socket", "folder": "a folder"}[kind]
            assert got.why.startswith(f"is {got.kind}") and got.why.endswith(", not a regular file")


def test_the_bound_is_read_exactly_from_the_offset_across_chunks(tmp_path):
    """Reads go in chunks of 1 MiB: a bound past one chunk still ends one byte past the bound
    (the caller's sign of "too big"), from the offset asked, and a file's end ends it."""
    data = os.urandom(3 << 20)
    path = tmp_path / "big"
    path.write_bytes(data)
    limit, offset = (3 << 19) + 7, 123
    fd = os.open(path, os.O_RDONLY)
    try:
        assert file_door.read_fd(fd, limit, offset) == data[offset:offset + limit + 1]
        assert file_door.read_fd(fd, 10 << 20, offset) == data[offset:]
    finally:
        os.close(fd)
    with pytest.raises(file_door.TooBig):
        file_door.read_file(path, limit, follow_links=False)
    assert file_door.read_file(path, len(data), follow_links=False) == data


def test_a_read_that_fails_is_refused_with_the_system_s_reason(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)         # a folder: pread fails (EISDIR)
    try:
        with pytest.raises(file_door.Refused, match=r"^cannot be read \(Is a directory\)$"):
            file_door.read_fd(fd, 10)
    finally:
        os.close(fd)
    with pytest.raises(file_door.Refused) as e:
        file_door.read_file(tmp_path / ("x" * 300), 10, follow_links=True)
    assert e.value.why == "cannot be read (File name too long)" and e.value.kind is None


def test_a_path_is_shown_as_is_up_to_its_width_cut_in_the_middle_beyond_and_quoted_when_not_printable():
    assert file_door.show("a" * 300) == "a" * 300
    long = "/scratch/" + "d" * 400 + "/tiny-gpt-20250101-120000-ab12"
    shown = file_door.show(long)
    assert len(shown) == 300 and shown.startswith("/scratch/ddd") and "..." in shown
    assert shown.endswith("/tiny-gpt-20250101-120000-ab12")     # the run id stays
    assert file_door.show("a" * 30, width=30) == "a" * 30
    assert file_door.show("a\nb") == repr("a\nb")
    assert file_door.show("run\x1b[2J\x1b]0;title\x07") == repr("run\x1b[2J\x1b]0;title\x07")
    assert file_door.show("/runs/x") == "/runs/x"
    cut = file_door.show("\n" + "x" * 10_000_000, width=60)    # read in part, however long
    assert len(cut) == 60 and cut.startswith("'\\nxxx") and cut.endswith("xxx'")


@given(st.text(max_size=700), st.integers(8, 400))
def test_whatever_a_name_holds_it_is_shown_on_one_printable_line_within_its_width(text, width):
    """The one printable form (run folder names found on disk, sweep labels, paths in errors):
    one line, nothing a terminal acts on, never longer than ``width``, and the text itself
    whenever it is short printable text."""
    shown = file_door.show(text, width)
    assert shown.isprintable() and len(shown) <= width
    if text.isprintable() and len(text) <= width:
        assert shown == text
    elif len(text) > width:
        assert "..." in shown


def test_a_terminal_named_as_a_file_is_refused_and_never_becomes_the_controlling_one():
    """A batch job's shell is a session without a terminal: opening a terminal device without
    O_NOCTTY would make it that session's controlling terminal (and a hang-up on it would
    reach the job). The door opens with O_NOCTTY and refuses the device."""
    master, follower = os.openpty()
    code = f"""
import os
os.setsid()                       # a session of its own, without a terminal
from hpctrain import file_door
try:
    file_door.read_file({os.ttyname(follower)!r}, 10, follow_links=True)
except file_door.Refused as e:
    print(e.why)
try:
    os.close(os.open("/dev/tty", os.O_RDONLY))
    print("took the terminal")
except OSError:
    print("no terminal")
"""
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, stdin=subprocess.DEVNULL)
    finally:
        os.close(follower)
        os.close(master)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["is a character device, not a regular file",
                                       "no terminal"]


def test_a_name_with_a_nul_byte_is_refused_not_raised():
    with pytest.raises(file_door.Refused, match="NUL byte"):
        file_door.read_file("/tmp/a\0b", 10, follow_links=True)


def test_a_device_is_refused_before_a_byte_is_read():
    with pytest.raises(file_door.Refused, match="character device, not a regular file"):
        file_door.read_file("/dev/zero", 10, follow_links=True)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=40), st.builds(lambda n: "[" * n, st.integers(0, 200_000)),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                              lambda c: st.lists(c, max_size=3)
                              | st.dictionaries(st.text(max_size=3), c, max_size=3)).map(
                                  lambda v: __import__("json").dumps(v))))
def test_json_object_gives_an_object_or_a_reason(text):
    try:
        value = file_door.json_object(text)
    except file_door.Refused as e:
        assert e.why.startswith(("is not JSON", "is JSON nested too deeply", "holds a JSON "))
        assert "\n" not in e.why
    else:
        assert isinstance(value, dict)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=32))
def test_decode_gives_text_or_names_the_first_bad_byte(data):
    try:
        text = file_door.decode_utf8(data)
    except file_door.NotText as e:
        bad = data.decode("utf-8", errors="replace").encode("utf-8")
        assert bad != data and "at offset" in e.why
    else:
        assert text.encode("utf-8") == data


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                     | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=12)


@given(_json, st.sampled_from(["str", "utf-8", "utf-16", "utf-32"]))
def test_json_reads_as_json_does_unless_an_object_gives_a_key_twice(value, encoding):
    """``file_door.loads``, where JSON from a file is parsed: what ``json.loads`` reads, read
    the same (text or bytes in any JSON encoding); an object that gives a key again, at any
    depth, is refused, where ``json.loads`` would keep the last value silently."""
    import json
    text = json.dumps(value)
    data = text if encoding == "str" else text.encode(encoding)
    assert file_door.loads(data) == json.loads(data)
    twice = '{"k": 1, "inner": [' + text + ', {"a": 1, "b": 2, "a": 3}]}'
    assert json.loads(twice)["inner"][1] == {"a": 3, "b": 2}
    with pytest.raises(file_door.DuplicateKey, match="the key 'a' twice"):
        file_door.loads(twice)
    with pytest.raises(file_door.Refused, match="gives the key 'a' twice"):
        file_door.json_object(twice)

