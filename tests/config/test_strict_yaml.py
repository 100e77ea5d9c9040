"""The one YAML loader (hpctrain.config.yamlio): duplicate keys are errors naming both lines,
YAML 1.2 core types only, a string field gets exactly what was written, and whatever hpctrain
writes reads back equal through the same loader.

Regression tests for each way YAML 1.1 changed meaning silently, then property-based tests
(Hypothesis, fixed budget and seed from tests/conftest.py) that search for what the door misses.
"""

from __future__ import annotations

import os
import re
import string
from pathlib import Path

import pytest
from hypothesis import example, given, strategies as st

from hpctrain.config import job_from_mapping, load_job, profile_from_mapping, yamlio
from hpctrain.errors import ConfigError, UsageError
from tests.conftest import REPO, hpctrain

TINY_JOB = REPO / "examples" / "tiny.yaml"


def test_duplicate_key_is_an_error_naming_both_lines(tmp_path):
    text = TINY_JOB.read_text()
    job = tmp_path / "job.yaml"
    job.write_text(text + "\ntrain:\n  steps: 999\n")
    first = 1 + next(i for i, line in enumerate(text.splitlines()) if line.startswith("train:"))
    last = len(text.splitlines()) + 2
    with pytest.raises(ConfigError) as err:
        load_job(job)
    msg = str(err.value)
    assert "'train' is given twice" in msg and f"line {first} and line {last}" in msg
    proc = hpctrain("validate", str(job))
    assert proc.returncode == 2 and proc.stderr.startswith("Error:") and "given twice" in proc.stderr


def test_duplicate_keys_nested_and_spelled_differently():
    with pytest.raises(ConfigError, match=r"'1' and '0x1' are the same key \(line 2 and line 3\)"):
        yamlio.parse_mapping("env:\n  1: a\n  0x1: b\n", "p.yaml")
    with pytest.raises(ConfigError, match="'a' is given twice"):
        yamlio.parse_mapping("x: {a: 1, 'a': 2}\n", "p.yaml")


def test_yaml11_rewrites_are_gone_and_strings_stay_as_written():
    data = yamlio.parse_mapping("a: 1:30\nb: yes\nc: 2024-01-01\nd: ~\ne: 0x10\nf: 1e3\n", "x")
    assert data["a"] == "1:30" and data["b"] == "yes" and data["c"] == "2024-01-01"
    assert data["d"] is None and data["e"] == 16 and data["f"] == 1000.0
    profile = profile_from_mapping(yamlio.parse_mapping(
        "env:\n  A: 2.20\n  B: 1:30\n  C: 010\n  D: 0x10\n  E: 1e3\n  F: 007\n", "p.yaml"), "p.yaml")
    assert profile.env == {"A": "2.20", "B": "1:30", "C": "010", "D": "0x10", "E": "1e3", "F": "007"}


def absolute_corpora(job: dict) -> None:
    """The example job's corpus paths made absolute (``data.path`` or each blend's)."""
    data = job["data"]
    for corpus in [data] if "path" in data else data["blend"]:
        corpus["path"] = str((TINY_JOB.parent / corpus["path"]).resolve())


def test_a_name_of_digits_is_the_name_as_written(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(TINY_JOB.read_text().replace("name:", "name: 0x10\nold_name:", 1))
    data = yamlio.read_mapping(job)
    data.pop("old_name")
    absolute_corpora(data)
    assert job_from_mapping(data, "job").name == "0x10"


def test_only_core_tags_construct():
    for doc in ("a: !!timestamp 2020-01-01\n", "a: !!binary aGk=\n", "a: !!set {x}\n",
                "a: !!python/object:os.system {}\n", "<<: {a: 1}\nb: 2\n"):
        try:
            data = yamlio.parse_mapping(doc, "x")
        except ConfigError as e:
            assert "invalid YAML at line" in str(e)
        else:   # a merge key is a plain key in YAML 1.2: the schema refuses it as unknown
            assert "<<" in data


def test_alias_expansion_is_bounded():
    doc = "a: &a [1,2,3,4,5,6,7,8,9,0]\n"
    for prev, name in zip("abcdefg", "bcdefgh"):
        doc += f"{name}: &{name} [{', '.join(['*' + prev] * 10)}]\n"
    with pytest.raises(ConfigError, match="expands to over"):
        yamlio.parse_mapping(doc, "x")


def test_a_job_in_a_folder_whose_name_is_not_utf8_is_refused_at_the_door(tmp_path):
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
    folder.mkdir()
    (folder / "data").symlink_to(TINY_JOB.parent / "data") if (TINY_JOB.parent / "data").exists() \
        else None
    job = folder / "job.yaml"
    job.write_text(TINY_JOB.read_text())
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_job(job)
    proc = hpctrain("submit", str(job), "--dry-run")
    assert proc.returncode == 2 and proc.stderr.startswith("Error:") and "not UTF-8" in proc.stderr


def test_dump_refuses_what_would_not_read_back():
    with pytest.raises(UsageError, match="not UTF-8"):
        yamlio.dump({"data": {"path": "/x/\udcff"}})


# ------------------------------------------------------------------------------ properties

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63),
                     st.floats(allow_nan=True), _text)
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_text, inner, max_size=4)), max_leaves=20)


@given(st.dictionaries(_text, _values, max_size=6))
def test_whatever_is_written_reads_back_equal(data):
    text = yamlio.dump(data)
    back = yamlio.parse(text, "x")
    assert yamlio._same(back if back is not None else {}, data)


_plain = st.text(string.ascii_letters + string.digits + ".:_+-", min_size=1, max_size=12)


@given(_plain)
def test_a_string_field_gets_exactly_the_text_written(word):
    """Whatever plain scalar is written for an environment value, the profile gets that text,
    or the load fails with one error (true/false/null are not text): never a re-spelling."""
    try:
        profile = profile_from_mapping(yamlio.parse_mapping(f"env:\n  V: {word}\n", "p"), "p")
    except ConfigError as e:
        assert "env.V" in str(e) or "invalid YAML" in str(e)
    else:
        assert profile.env["V"] == word


@given(st.text(max_size=300))
@example("name: a\x00b\n")      # PyYAML's reader error had no line: "at unacceptable character"
@example("a: 1\nb: \ufffe\n")
def test_any_document_is_a_mapping_or_one_config_error(text):
    try:
        data = yamlio.parse_mapping(text, "x")
    except ConfigError as e:
        assert str(e).startswith("x")
        if "invalid YAML" in str(e):        # where it is, or (a number's digits) what it is
            assert re.match(r"x: invalid YAML( at line \d+, column \d+)?: ", str(e)), str(e)
        assert "\n" not in str(e), str(e)
        return
    assert isinstance(data, dict)
    for build in (job_from_mapping, lambda d, s: profile_from_mapping(d, s)):
        try:
            build(data, "x")
        except ConfigError:
            pass


@given(st.lists(st.sampled_from(["a", "b", "c", "'a'", '"b"', "1", "0x1", "true"]),
                min_size=2, max_size=6))
def test_a_repeated_key_is_always_refused(keys):
    doc = "".join(f"{k}: {i}\n" for i, k in enumerate(keys))
    canon = [yamlio.parse(f"{k}: 0", "k").popitem()[0] for k in keys]
    ident = [yamlio._key_identity(k) for k in canon]
    if len(set(ident)) == len(ident):
        assert len(yamlio.parse_mapping(doc, "x")) == len(keys)
    else:
        with pytest.raises(ConfigError, match="given twice|same key"):
            yamlio.parse_mapping(doc, "x")


def test_numbers_keep_their_text_through_pickle_and_copy():
    import copy
    import pickle
    data = yamlio.parse_mapping("a: 0x10\nb: 2.20\n", "x")
    for back in (pickle.loads(pickle.dumps(data)), copy.deepcopy(data)):
        assert [yamlio.source_text(v) for v in back.values()] == ["0x10", "2.20"]


def _leaves(data, prefix=()):
    for k, v in data.items():
        if isinstance(v, dict):
            yield from _leaves(v, prefix + (k,))
        else:
            yield prefix + (k,)


_TINY = yamlio.read_mapping(TINY_JOB)
absolute_corpora(_TINY)
_LEAVES = sorted(_leaves(_TINY))


@given(st.dictionaries(st.sampled_from(_LEAVES), st.one_of(_scalars, _plain), max_size=4))
def test_every_accepted_job_reads_back_equal_from_what_submit_writes(changes):
    """What submit writes into a run folder (the resolved job, through yamlio.dump) is read
    back by the same loader and schema as the same job: for every job the schema accepts."""
    import copy
    from hpctrain.config.schema import to_dict
    data = copy.deepcopy(_TINY)
    for path, value in changes.items():
        node = data
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    try:
        job = job_from_mapping(data, "job")
    except ConfigError:
        return
    written = yamlio.dump(to_dict(job))
    assert job_from_mapping(yamlio.parse_mapping(written, "job.yaml"), "job.yaml") == job


def test_a_runs_root_whose_path_is_not_utf8_is_refused_before_anything_is_created(tmp_path):
    import subprocess
    import sys
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/r\xff"))
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "HPCTRAIN_RUNS_DIR"}
    proc = subprocess.run([sys.executable, "-m", "hpctrain", "submit", str(TINY_JOB), "--dry-run"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("Error:") and "not UTF-8" in proc.stderr
    assert list(folder.iterdir()) == []


def test_a_text_read_again_comes_back_equal_and_unshared():
    """parse() keeps what it read, by text: a second read is equal, numbers keep their text,
    and what one caller changes never reaches the next (each gets a copy of its own)."""
    from hpctrain.config import yamlio
    text = "name: 0x10\nnodes: 2\nenv: {A: '1'}\nlist: [1e3, two]\n"
    first = yamlio.parse(text, "first")
    assert text in yamlio._PARSED
    first["env"]["A"] = "changed"
    first["list"].append("three")
    second = yamlio.parse(text, "second")
    assert second == {"name": 16, "nodes": 2, "env": {"A": "1"}, "list": [1000.0, "two"]}
    assert second["name"].source == "0x10" and second["list"][0].source == "1e3"
    assert second["env"] is not yamlio.parse(text, "third")["env"]
    # a text that fails is refused each time, never kept
    for _ in range(2):
        with pytest.raises(ConfigError, match="given twice"):
            yamlio.parse("a: 1\na: 2\n", "dup")
    assert "a: 1\na: 2\n" not in yamlio._PARSED


# ------------------------------------------------------------------ keys that are not names

_SECTIONS = [()] + sorted({leaf[:-1] for leaf in _LEAVES if len(leaf) > 1})


@pytest.mark.parametrize("written, named", [
    ("~", "a null key (~ or null)"), ("null", "a null key (~ or null)"),
    ("true", "the key true (a boolean)"), ("0x10", "the key 0x10 (a number)"),
    ("1.50", "the key 1.50 (a number)")])
def test_a_key_yaml_reads_as_null_a_boolean_or_a_number_is_named_as_written(tmp_path, written,
                                                                            named):
    """``~: 1`` used to be ``None: unknown key``: the key is named as written, with the fix, at
    the top of a job and in a section of it, and in a profile's ``env``."""
    text = TINY_JOB.read_text()
    job = tmp_path / "job.yaml"
    job.write_text(text.replace("\ntrain:\n", f"\n{written}: 1\ntrain:\n  {written}: 2\n", 1))
    proc = hpctrain("validate", str(job))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    fix = f"unknown key: {named} is not a field name; remove it or write the field's name"
    assert f"problems: {fix}; " in proc.stderr and f"; train: {fix}" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr                 # one line
    assert "None" not in proc.stderr and "True" not in proc.stderr
    profile = tmp_path / "p.yaml"
    profile.write_text((REPO / "cluster_profiles" / "local.yaml").read_text()
                       + f"env:\n  {written}: x\n")
    proc = hpctrain("profiles", "validate", str(profile))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"Error: {profile}: env: {named} is not text; a key here is a "
                                  "name: quote it"), proc.stderr


_NOT_NAMES = st.sampled_from(["~", "null", "Null", "NULL", "true", "False", "TRUE", "0", "-7",
                              "0x1F", "0o17", "1e3", "1.50", ".inf", "-.Inf", ".nan"]) \
    | st.integers(-10**6, 10**6).map(str) | st.floats(allow_nan=False).map(repr)


@given(_NOT_NAMES, st.sampled_from(_SECTIONS))
def test_a_key_that_is_not_text_is_named_as_written_wherever_it_is(written, section):
    """Property: a plain key YAML reads as null, a boolean or a number, at the top of a job or
    in any of its sections, is one problem on that section's path naming the key as written
    (or as null), never Python's ``None``, ``True`` or a number's re-spelling."""
    import copy
    data = copy.deepcopy(_TINY)
    node = data
    for part in section:
        node = node[part]
    key = yamlio.parse(f"{written}: 0", "key").popitem()[0]
    if isinstance(key, str):        # not read as null, a boolean or a number: not this door
        return
    node[key] = 1
    with pytest.raises(ConfigError) as e:
        job_from_mapping(data, "job")
    where = ".".join(section)
    (problem,) = [m for p, m in e.value.problems if p == where and "not a field name" in m]
    if key is None:
        assert "a null key (~ or null)" in problem
    else:
        assert f"the key {written if not isinstance(key, bool) else written.lower()} (a " in \
            problem, problem
    assert "None" not in problem and "True" not in problem and "False" not in problem
