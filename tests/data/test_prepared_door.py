"""``data.prepared.check_prepared``, the door where data already prepared is taken for a job,
held to each of its rules with a ``PREFIX.meta.json`` written here: which tokenizer and which
source files a record names, against those a job names, whether the recorded files are still
in place, moved or copied. A rule that is wrong either refuses a moved project's data for
nothing or lets a job train on tokens made another way."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpctrain.data.prepared import check_prepared, recorded_source, recorded_tokenizer
from hpctrain.errors import UsageError


def _job(tokenizer: str = "byte", vocab: int = 512):
    return SimpleNamespace(data=SimpleNamespace(tokenizer=tokenizer),
                           model=SimpleNamespace(vocab_size=vocab))


def _record(prefix: Path, tokenizer: str = "byte", sources=None, input_bytes=None) -> str:
    meta = {"tokenizer": tokenizer, "vocab_size": 256}
    if sources is not None:
        meta["sources"] = [str(s) for s in sources]
    if input_bytes is not None:
        meta["input_bytes"] = input_bytes
    Path(f"{prefix}.meta.json").write_text(json.dumps(meta))
    return str(prefix)


def _file(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _tokenizer(folder: Path, text: str = '{"model": "one"}') -> Path:
    _file(folder / "tokenizer.json", text)
    return folder


def test_a_tokenizer_is_recorded_by_its_absolute_path_and_byte_by_its_name(tmp_path,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert recorded_tokenizer("byte") == "byte"
    for spec in ("tok", "zeta/tokenizer.json", "a"):       # names sorting either side of byte
        assert recorded_tokenizer(spec) == str(tmp_path / spec)
    assert recorded_source("corpus/a.txt") == str(tmp_path / "corpus" / "a.txt")


def test_a_record_from_before_paths_were_absolute_is_taken_with_any_tokenizer_file(tmp_path):
    """A relative recorded tokenizer came from a folder unknown now: only byte against a file
    can be told apart."""
    prefix = _record(tmp_path / "corpus", tokenizer="tok")
    check_prepared(_job(str(_tokenizer(tmp_path / "mine"))), "data.path", prefix, [])
    with pytest.raises(UsageError, match=r"^data.tokenizer: .* was prepared with 'tok', the job "
                                         r"names 'byte'"):
        check_prepared(_job("byte"), "data.path", prefix, [tmp_path / "a.txt"])


def test_a_recorded_tokenizer_that_is_gone_is_matched_by_its_name_alone(tmp_path):
    """A project moved: the recorded tokenizer no longer exists; the job's of the same name is
    it, one of another name (either side of it in sort order) is not."""
    prefix = _record(tmp_path / "corpus", tokenizer=str(tmp_path / "gone" / "tok-m"))
    check_prepared(_job(str(_tokenizer(tmp_path / "here" / "tok-m"))), "data.path", prefix, [])
    for other in ("tok-a", "tok-z"):
        with pytest.raises(UsageError, match=r"^data.tokenizer: .* was prepared with"):
            check_prepared(_job(str(_tokenizer(tmp_path / "here" / other))), "data.path",
                           prefix, [])


def test_a_tokenizer_copy_is_the_same_name_and_the_same_bytes(tmp_path):
    """The original left in place: a copy is taken when its file holds the same bytes; one of
    the same size and time but other bytes (which a shallow compare would take), or a folder
    of that name without a tokenizer.json, is refused."""
    original = _tokenizer(tmp_path / "orig" / "tok", '{"model": "one"}')
    prefix = _record(tmp_path / "corpus", tokenizer=str(original))
    copy = tmp_path / "copy" / "tok"
    shutil.copytree(original, copy)
    check_prepared(_job(str(copy)), "data.path", prefix, [])
    forged = _tokenizer(tmp_path / "forged" / "tok", '{"model": "two"}')    # same size
    st = os.stat(original / "tokenizer.json")
    os.utime(forged / "tokenizer.json", ns=(st.st_atime_ns, st.st_mtime_ns))
    empty = tmp_path / "empty" / "tok"
    empty.mkdir(parents=True)
    for wrong in (forged, empty):
        with pytest.raises(UsageError, match=r"^data.tokenizer: .* was prepared with"):
            check_prepared(_job(str(wrong)), "data.path", prefix, [])


def test_a_source_copy_is_the_same_name_and_the_same_size(tmp_path):
    original = _file(tmp_path / "orig" / "a.txt", "twelve bytes")
    prefix = _record(tmp_path / "corpus", sources=[original], input_bytes=12)
    check_prepared(_job(), "data.path", prefix, [_file(tmp_path / "copy" / "a.txt", "twelve bytes")])
    for text in ("twelve bytes and more", "short"):
        with pytest.raises(UsageError, match=r"^data.prepare_from: .* was prepared from"):
            check_prepared(_job(), "data.path", prefix, [_file(tmp_path / "other" / "a.txt", text)])


def test_the_field_named_is_the_corpus_s_own_prepare_from(tmp_path):
    original = _file(tmp_path / "orig" / "a.txt", "twelve bytes")
    other = _file(tmp_path / "other" / "b.txt", "twelve bytes")
    prefix = _record(tmp_path / "corpus", sources=[original], input_bytes=12)
    for field, named in (("data.path", "data.prepare_from"),
                         ("data.blend[0].path", "data.blend[0].prepare_from"),
                         ("data.validation.path", "data.validation.prepare_from")):
        with pytest.raises(UsageError) as err:
            check_prepared(_job(), field, prefix, [other])
        assert str(err.value).startswith(f"{named}: "), str(err.value)
        assert f"point {field} at a new prefix" in str(err.value)


def test_sources_must_be_as_many_as_recorded(tmp_path):
    """One file more or one fewer than recorded is another corpus, even where the files the
    two lists share are the same."""
    a = _file(tmp_path / "a.txt", "aaaa")
    b = _file(tmp_path / "b.txt", "bbbb")
    prefix = _record(tmp_path / "corpus", sources=[a, b], input_bytes=8)
    check_prepared(_job(), "data.path", prefix, [a, b])
    for wanted in ([a], [a, b, a]):
        with pytest.raises(UsageError, match=r"^data.prepare_from: .* was prepared from"):
            check_prepared(_job(), "data.path", prefix, wanted)


def test_a_moved_project_s_sources_hold_exactly_the_recorded_bytes(tmp_path):
    """The recorded sources are gone (the project moved): the job's files of the same names
    are them only when they hold the recorded ``input_bytes`` in all, no fewer and no more;
    a job's source that is missing too is refused in one line, never an OSError."""
    gone = [tmp_path / "gone" / "a.txt", tmp_path / "gone" / "b.txt"]
    prefix = _record(tmp_path / "corpus", sources=gone, input_bytes=8)
    here = [_file(tmp_path / "here" / "a.txt", "aaaa"), _file(tmp_path / "here" / "b.txt", "bbbb")]
    check_prepared(_job(), "data.path", prefix, here)
    for text in ("bbb", "bbbbb"):
        here[1].write_text(text)
        with pytest.raises(UsageError) as err:
            check_prepared(_job(), "data.path", prefix, here)
        assert f"({4 + len(text)} bytes; the data was prepared from 8 bytes)" in str(err.value)
    here[1].unlink()
    with pytest.raises(UsageError, match=r"^data.prepare_from: .* was prepared from") as err:
        check_prepared(_job(), "data.path", prefix, here)
    assert "bytes;" not in str(err.value)                 # no size to give for a missing file


@pytest.mark.parametrize("count, said", [(3, None), (4, " and 1 more"), (6, " and 3 more")])
def test_a_message_names_three_sources_and_counts_the_rest(tmp_path, count, said):
    recorded = [_file(tmp_path / "r" / f"{i}.txt", "x") for i in range(count)]
    wanted = [_file(tmp_path / "w" / f"{i}.txt", "yy") for i in range(count)]
    prefix = _record(tmp_path / "corpus", sources=recorded, input_bytes=count)
    with pytest.raises(UsageError) as err:
        check_prepared(_job(), "data.path", prefix, wanted)
    text = str(err.value)
    assert text.count(str(tmp_path / "r")) == 3 and text.count(str(tmp_path / "w")) == 3, text
    if said is None:
        assert " more" not in text, text
    else:
        assert f"2.txt{said}, the job names" in text, text


def test_a_gone_tokenizer_file_is_matched_by_its_own_name_not_its_folder_s(tmp_path):
    """Only a ``tokenizer.json`` stands for its folder: a gone ``tok/vocab.model`` is not the
    job's ``tok/words.model``."""
    prefix = _record(tmp_path / "corpus", tokenizer=str(tmp_path / "gone" / "tok" / "vocab.model"))
    words = _file(tmp_path / "here" / "tok" / "words.model", "x")
    with pytest.raises(UsageError, match=r"^data.tokenizer: .* was prepared with"):
        check_prepared(_job(str(words)), "data.path", prefix, [])
    check_prepared(_job(str(_file(tmp_path / "here" / "tok" / "vocab.model", "x"))),
                   "data.path", prefix, [])


@pytest.mark.parametrize("name", ["tok-a", "tok-c"])
def test_a_tokenizer_of_another_name_is_no_copy_even_with_the_same_bytes(tmp_path, name):
    original = _tokenizer(tmp_path / "orig" / "tok-b")
    prefix = _record(tmp_path / "corpus", tokenizer=str(original))
    other = tmp_path / "other" / name
    shutil.copytree(original, other)
    with pytest.raises(UsageError, match=r"^data.tokenizer: .* was prepared with"):
        check_prepared(_job(str(other)), "data.path", prefix, [])


@pytest.mark.parametrize("name", ["a.txt", "c.txt"])
def test_a_source_of_another_name_is_no_copy_even_of_the_same_size(tmp_path, name):
    """The recorded source still in place: another name (sorting either side) is another file,
    even of the same size; and a job's source that is missing is refused in one line."""
    original = _file(tmp_path / "orig" / "b.txt", "twelve bytes")
    prefix = _record(tmp_path / "corpus", sources=[original], input_bytes=12)
    for wanted in (_file(tmp_path / "other" / name, "twelve bytes"), tmp_path / "none" / "b.txt"):
        with pytest.raises(UsageError, match=r"^data.prepare_from: .* was prepared from"):
            check_prepared(_job(), "data.path", prefix, [wanted])


@pytest.mark.parametrize("names", [("b.txt", "a.txt"), ("b.txt", "c.txt")])
def test_a_moved_project_s_source_of_another_name_is_refused_without_sizes(tmp_path, names):
    """The recorded source is gone: the job's file of another name (sorting either side) is not
    it, however many bytes it holds; the message gives sizes only for the same names."""
    gone, other = tmp_path / "gone" / names[0], _file(tmp_path / "here" / names[1], "aaaa")
    prefix = _record(tmp_path / "corpus", sources=[gone], input_bytes=4)
    with pytest.raises(UsageError) as err:
        check_prepared(_job(), "data.path", prefix, [other])
    assert str(err.value).startswith("data.prepare_from: ") and "bytes;" not in str(err.value)


def test_sources_deleted_after_preparing_still_name_the_data(tmp_path):
    """The data was prepared and its sources deleted (they take room): the job naming the same
    files is the same data, though none of them can be read any more."""
    gone = [tmp_path / "gone" / "a.txt", tmp_path / "gone" / "b.txt"]
    prefix = _record(tmp_path / "corpus", sources=gone, input_bytes=8)
    check_prepared(_job(), "data.path", prefix, gone)


def test_the_same_file_under_another_path_is_the_same_source_whatever_its_size_now(tmp_path):
    """A hard link names the very file the data was prepared from: it is that source (the
    recorded size is only compared where the recorded file is gone)."""
    original = _file(tmp_path / "orig" / "a.txt", "twelve bytes")
    prefix = _record(tmp_path / "corpus", sources=[original], input_bytes=999)
    link = tmp_path / "elsewhere" / "a.txt"
    link.parent.mkdir()
    os.link(original, link)
    check_prepared(_job(), "data.path", prefix, [link])
