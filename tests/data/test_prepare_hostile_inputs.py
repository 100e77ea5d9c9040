"""``hpctrain data prepare`` given hostile inputs: JSONL records that give a key twice or are not
objects, a tokenizer.json that loads but cannot encode, file names holding line breaks or
escape codes, an output that is one of the inputs. One ``Error:`` line naming the file and the
fix, exit 2, and nothing already on disk lost."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from hpctrain.data.prepare import prepare
from hpctrain.errors import UsageError
from tests.conftest import hpctrain, one_error_line


@pytest.mark.parametrize("line, said", [
    (b'{"text": "a", "text": "b"}', "an object gives the key 'text' twice"),
    (b'[1, 2]', "expected a JSON object, got a JSON list"),
    (b'null', "expected a JSON object, got a JSON null"),
    (b'"just text"', "expected a JSON object, got a JSON string"),
    (b'{"text": 5}', "field 'text' is a JSON number, expected text"),
    (b'{"text": null}', "field 'text' is a JSON null, expected text"),
])
def test_a_jsonl_record_is_read_by_the_one_json_parser(tmp_path, line, said):
    """A record giving ``text`` twice was read as its last value (``json.loads``), silently;
    the kinds were Python's (``NoneType``, ``int``)."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_bytes(b'{"text": "fine"}\n' + line + b"\n")
    proc = hpctrain("data", "prepare", str(corpus), "-o", str(tmp_path / "out"))
    one_error_line(proc, f"{corpus}:2", said)
    assert not list(tmp_path.glob("out*"))


def test_an_output_file_that_is_an_input_is_refused_and_the_input_kept(tmp_path):
    """``data prepare corpus.meta.json -o corpus`` read the corpus (a ``.json`` is JSONL) and
    then wrote the sidecar over it."""
    corpus = tmp_path / "corpus.meta.json"
    corpus.write_text('{"text": "the only copy of this corpus"}\n')
    before = corpus.read_bytes()
    proc = hpctrain("data", "prepare", str(corpus), "-o", str(tmp_path / "corpus"))
    one_error_line(proc, "--output:", "is the input file", "choose another output prefix")
    assert corpus.read_bytes() == before
    assert not (tmp_path / "corpus.bin").exists()


@pytest.mark.parametrize("option", ["FILES", "--output", "--tokenizer"])
@pytest.mark.parametrize("name", ["a\nb", "x\x1b]0;title\x07", "n" * 300])
def test_a_path_option_holding_a_line_break_or_an_escape_code_is_refused(tmp_path, option, name):
    """An output prefix with an escape code was created and echoed raw ("Wrote ..."), and a
    tokenizer path with a line break made a two-line error."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("text\n")
    args = {"FILES": [str(tmp_path / (name + ".txt")), "-o", str(tmp_path / "out")],
            "--output": [str(corpus), "-o", str(tmp_path / name)],
            "--tokenizer": [str(corpus), "-o", str(tmp_path / "out"), "-t", name]}[option]
    proc = hpctrain("data", "prepare", *args)
    one_error_line(proc, "Invalid value for", option if option != "FILES" else "FILES...")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]


def test_a_tokenizer_that_loads_but_cannot_encode_is_one_line(tmp_path):
    """A WordLevel tokenizer.json whose unknown token is not in its vocabulary loads, then
    fails on the first word it does not know: that was an internal error."""
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
        "decoder": None, "model": {"type": "WordLevel", "vocab": {"a": 0, "</s>": 1},
                                   "unk_token": "[UNK]"}}))
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b\n")
    for workers in ("1", "2"):
        proc = hpctrain("data", "prepare", str(corpus), "-o", str(tmp_path / "out"), "-t",
                        str(folder), "-j", workers)
        one_error_line(proc, "--tokenizer:", "cannot encode the text", "Missing [UNK]")
    assert not list(tmp_path.glob("out*"))


_record = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["text", "id", "meta"]), inner, max_size=3), max_leaves=6)
_line = st.one_of(_record.map(lambda v: json.dumps(v).encode()), st.binary(max_size=20),
                  st.sampled_from([b'{"text": "a", "text": "b"}', b"NaN", b"{", b""]))


@given(st.lists(_line, min_size=1, max_size=5))
def test_any_jsonl_is_prepared_or_refused_in_one_line(tmp_path_factory, lines):
    """Property: whatever a JSONL file holds, ``prepare`` writes the dataset or raises one
    UsageError, one printable line; a refused input leaves no output behind."""
    folder = tmp_path_factory.mktemp("jsonl")
    corpus = folder / "c.jsonl"
    corpus.write_bytes(b"\n".join(lines) + b"\n")
    try:
        stats = prepare([corpus], folder / "out")
    except UsageError as e:
        assert "\n" not in str(e) and str(e).isprintable()
        assert not list(folder.glob("out*"))
    else:
        assert stats.documents >= 1 and (folder / "out.bin").exists()


def test_an_output_that_cannot_be_created_is_named_not_its_temporary_file(tmp_path):
    """The write door's temporary file (``.x.bin.k3j2.tmp``) was the name in the error."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("text\n")
    proc = hpctrain("data", "prepare", str(corpus), "-o", "/proc/hpctrain-x")
    one_error_line(proc, "/proc/hpctrain-x.bin")
    assert ".tmp" not in proc.stderr


@pytest.mark.parametrize("where", ["FILE", "--output", "--tokenizer"])
@pytest.mark.parametrize("value, said", [("", "'' is blank; give a path"),
                                         (" ", "' ' is blank; give a path"),
                                         ("{loop}/x", "is behind a symlink loop")])
def test_a_blank_path_or_one_behind_a_symlink_loop_is_refused_naming_the_option(
        tmp_path, where, value, said):
    """click read "" as ``.`` (``--output .`` is a folder, ``-t .`` has no tokenizer.json), and
    a path behind a loop "does not exist"; the command's path door (``cli.common.CheckedPath``)
    says what it is, naming the option."""
    (tmp_path / "l1").symlink_to("l2")
    (tmp_path / "l2").symlink_to("l1")
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text\n")
    value = value.format(loop=tmp_path / "l1")
    args = {"FILE": str(corpus), "--output": str(tmp_path / "out"), "--tokenizer": "byte"}
    args[where] = value
    proc = hpctrain("data", "prepare", args["FILE"], "--output", args["--output"],
                    "--tokenizer", args["--tokenizer"])
    one_error_line(proc, "FILES" if where == "FILE" else where, said)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt", "l1", "l2"]


@pytest.mark.parametrize("tokenizer", ["/dev/zero", "fifo"])
def test_a_tokenizer_error_names_the_option_typed(tmp_path, tokenizer):
    """The tokenizer's errors named the job field ``data.tokenizer``, which this command has
    not: the user typed ``--tokenizer``."""
    import os
    if tokenizer == "fifo":
        tokenizer = str(tmp_path / "fifo")
        os.mkfifo(tokenizer)
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text\n")
    proc = hpctrain("data", "prepare", str(corpus), "-o", str(tmp_path / "out"), "-t", tokenizer,
                    timeout=60)
    one_error_line(proc, f"--tokenizer: {tokenizer} is ", "not a regular file")
    assert "data.tokenizer" not in proc.stderr


@pytest.mark.parametrize("name, body", [("a.txt", "in the beginning\n\nthe end\n"),
                                        ("a.jsonl", '{"text": "in the beginning"}\n')])
def test_a_byte_order_mark_is_not_text(tmp_path, name, body):
    """A file saved by an editor that writes a UTF-8 byte order mark first gives the same
    documents as without it (the mark was three tokens of the first document, and made the
    first JSONL line not JSON)."""
    import gzip
    from hpctrain.data.sources import read_pieces
    plain, marked, zipped = tmp_path / name, tmp_path / f"bom-{name}", tmp_path / f"{name}.gz"
    plain.write_text(body)
    marked.write_bytes(b"\xef\xbb\xbf" + body.encode())
    zipped.write_bytes(gzip.compress(b"\xef\xbb\xbf" + body.encode()))
    want = [(p.text, p.last) for p in read_pieces(plain)]
    assert want and "\ufeff" not in want[0][0]
    assert [(p.text, p.last) for p in read_pieces(marked)] == want
    assert [(p.text, p.last) for p in read_pieces(zipped)] == want
