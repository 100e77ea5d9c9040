"""The data's own files read through one door (``hpctrain.data.files``, over the run-folder
reader's ``read_from``): ``PREFIX.meta.json``, tokenizer files, JSONL records. Whatever they
hold (a FIFO, a link to /dev/zero, binary bytes, JSON nested 200,000 deep, a tiktoken file
with a rank twice, a lone surrogate), ``hpctrain data info``, ``data prepare`` and
``validate`` answer with one ``Error:`` line naming the file and exit 2 (``validate`` warns
about a tokenizer, which may live on the cluster), never a traceback, a Rust panic or a
hang; and nothing on disk changes.

The findings are checked with the real CLI (a subprocess where a hang or a Rust panic's output
on the real stderr would show), the doors with Hypothesis properties (click's runner)."""

from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
import signal
import struct
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings, strategies as st

from hpctrain.cli import cli
from hpctrain.data import indexed
from hpctrain.data.files import read_meta
from hpctrain.data.prepare import prepare
from hpctrain.data.tokenizers import load_tokenizer
from hpctrain.errors import UsageError
from tests.conftest import hpctrain, unix_socket_at

EXAMPLES = int(os.environ.get("HPCTRAIN_HYPOTHESIS_EXAMPLES", "30"))
TEXT = "in the beginning\nwas the word\n\nand the word was with god\n"


# ---- helpers -----------------------------------------------------------------------------------

def _one_error_line(proc_or_result, name: str | None = None, code: int = 2) -> str:
    """The command ended with exactly one ``Error:`` line (naming ``name``) and ``code``."""
    if hasattr(proc_or_result, "returncode"):
        rc, out = proc_or_result.returncode, proc_or_result.stdout + proc_or_result.stderr
    else:
        rc, out = proc_or_result.exit_code, proc_or_result.output
    assert "Traceback" not in out and "internal error" not in out and "panicked" not in out, out
    assert rc == code, (rc, out)
    errors = [line for line in out.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and len(out.strip().splitlines()) == 1, out
    if name:
        assert name in errors[0], errors[0]
    return errors[0]


def _answers(result) -> None:
    """Exit 0, or one ``Error:`` line and exit 2; never an exception out of the command."""
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        (result.output, result.exc_info)
    out = result.output
    assert "Traceback" not in out and "internal error" not in out, out
    if result.exit_code != 0:
        assert result.exit_code == 2, (result.exit_code, out)
        errors = [line for line in out.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1, out


class _Hang(Exception):
    pass


def _invoke(args: list[str]):
    def on_alarm(*_):
        raise _Hang(f"hpctrain {' '.join(args)} did not answer within 60 s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(60)
    try:
        return CliRunner().invoke(cli, args, catch_exceptions=True)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _snapshot(folder: Path) -> dict:
    out = {}
    for p in sorted(folder.iterdir()):
        if p.is_symlink():
            out[p.name] = ("link", os.readlink(p))
        elif p.is_file():
            out[p.name] = p.read_bytes()
        else:
            out[p.name] = oct(os.lstat(p).st_mode)
    return out


def _prepared(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a.txt").write_text(TEXT)
    prepare([folder / "a.txt"], folder / "d", "byte")
    return folder / "d"


def _job(folder: Path, prefix: Path, tokenizer: str = "byte", vocab: int = 300) -> Path:
    job = folder / "job.yaml"
    job.write_text(
        "name: t\n"
        f"model: {{num_layers: 2, hidden_size: 64, num_attention_heads: 4, vocab_size: {vocab}, "
        "seq_length: 8}\n"
        "parallel: {tensor_model_parallel_size: 1, pipeline_model_parallel_size: 1}\n"
        "batch: {micro_batch_size: 1, global_batch_size: 4}\n"
        "train: {steps: 1}\n"
        f"data: {{path: {json.dumps(str(prefix))}, tokenizer: {json.dumps(tokenizer)}, "
        f"prepare_from: [{json.dumps(str(folder / 'a.txt'))}]}}\n")
    return job


def _damage(path: Path, kind: str) -> None:
    if os.path.lexists(path):
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "socket":
        unix_socket_at(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "deep":
        path.write_text("[" * 200_000)
    elif kind == "list":
        path.write_text("[1]")
    elif kind == "binary":
        path.write_bytes(b"\xff\xfe")
    elif kind == "huge":
        with open(path, "wb") as f:          # sparse: past the door's limits, no disk used
            f.truncate(257 << 20)
    else:
        raise ValueError(kind)


def _ranks(extra: list[bytes] = (), every_byte: bool = True) -> bytes:
    lines = [base64.b64encode(bytes([b])) + b" %d" % b for b in range(256)] if every_byte else []
    return b"\n".join(lines + list(extra)) + b"\n"


# ---- 1. PREFIX.meta.json -----------------------------------------------------------------------

META_KINDS = ["fifo", "dev-zero", "socket", "folder", "deep", "list", "binary", "huge"]


@pytest.mark.parametrize("kind", META_KINDS)
def test_a_damaged_meta_json_is_one_error_line_for_info_and_validate(tmp_path, kind):
    prefix = _prepared(tmp_path)
    meta = Path(f"{prefix}.meta.json")
    _damage(meta, kind)
    job = _job(tmp_path, prefix)
    before = _snapshot(tmp_path)
    if kind in ("fifo", "dev-zero", "deep"):        # the audit's cases, in real processes
        _one_error_line(hpctrain("data", "info", str(prefix), timeout=60), "d.meta.json")
        _one_error_line(hpctrain("validate", str(job), timeout=60), "d.meta.json")
    else:
        _one_error_line(_invoke(["data", "info", str(prefix)]), "d.meta.json")
        _one_error_line(_invoke(["validate", str(job)]), "d.meta.json")
    with pytest.raises(UsageError, match=r"d\.meta\.json"):
        read_meta(prefix)
    assert _snapshot(tmp_path) == before


def test_meta_json_fields_of_the_wrong_type_are_named(tmp_path):
    prefix = _prepared(tmp_path)
    meta = Path(f"{prefix}.meta.json")
    for record, field in (({"vocab_size": "257"}, "vocab_size"), ({"vocab_size": True}, "vocab_size"),
                          ({"eod": -1}, "eod"), ({"tokenizer": "a\nb"}, "tokenizer"),
                          ({"tokenizer": "\ud800"}, "tokenizer")):
        meta.write_text(json.dumps(record))
        line = _one_error_line(_invoke(["data", "info", str(prefix)]), "d.meta.json")
        assert f"{field}: expected" in line
    meta.unlink()                          # no sidecar (data Megatron prepared): not an error
    result = _invoke(["data", "info", str(prefix), "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["documents"] == 2


def test_meta_json_through_a_symlink_to_a_regular_file_is_read(tmp_path):
    prefix = _prepared(tmp_path)
    meta = Path(f"{prefix}.meta.json")
    real = tmp_path / "elsewhere.json"
    real.write_bytes(meta.read_bytes())
    meta.unlink()
    meta.symlink_to(real)
    result = _invoke(["data", "info", str(prefix), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["vocab_size"] == 257


@pytest.mark.parametrize("suffix", [".idx", ".bin"])
@pytest.mark.parametrize("kind, said", [("fifo", "is a FIFO"), ("dev-zero", "is a character device"),
                                        ("socket", "is a socket"), ("folder", "is a folder")])
def test_a_dataset_file_that_is_not_a_regular_file_is_said_to_be_what_it_is(tmp_path, suffix,
                                                                          kind, said):
    """``PREFIX.idx`` or ``PREFIX.bin`` a FIFO, a link to /dev/zero, a socket or a folder: one
    line saying what is there (it was "does not exist"), never a hang; nothing changes."""
    prefix = _prepared(tmp_path / "d")
    _damage(Path(f"{prefix}{suffix}"), kind)
    before = _snapshot(prefix.parent)
    line = _one_error_line(_invoke(["data", "info", str(prefix)]), f"d{suffix}")
    assert said in line and "does not exist" not in line, line
    assert _snapshot(prefix.parent) == before


def test_an_index_whose_sequences_are_not_aligned_is_one_error_line(tmp_path):
    idx = struct.pack("<9sQBQQ", indexed.HEADER, 1, 8, 1, 2)       # uint16, 1 sequence
    idx += np.array([1], np.int32).tobytes() + np.array([1], np.int64).tobytes()
    idx += np.array([0, 1], np.int64).tobytes()
    (tmp_path / "p.idx").write_bytes(idx)
    (tmp_path / "p.bin").write_bytes(b"abc")                        # 3 bytes = 1 + 1 × 2
    _one_error_line(hpctrain("data", "info", str(tmp_path / "p"), timeout=60), "p.idx")
    (tmp_path / "p.idx").write_bytes(idx.replace(np.array([1], np.int64).tobytes() +
                                                 np.array([0, 1], np.int64).tobytes(),
                                                 np.array([0], np.int64).tobytes() +
                                                 np.array([0, 1], np.int64).tobytes()))
    _one_error_line(_invoke(["data", "info", str(tmp_path / "p")]), "p.bin")   # 3 % 2 bytes


def _signed_dataset(folder: Path, code: int, dtype, tokens) -> Path:
    """A well-formed index pair of one document in a signed or float dtype (not what
    ``data prepare`` writes: another tool's, or damage)."""
    data = np.asarray(tokens, dtype)
    idx = struct.pack("<9sQBQQ", indexed.HEADER, 1, code, 1, 2)
    idx += np.array([data.size], np.int32).tobytes() + np.array([0], np.int64).tobytes()
    idx += np.array([0, 1], np.int64).tobytes()
    folder.mkdir()
    (folder / "p.idx").write_bytes(idx)
    (folder / "p.bin").write_bytes(data.tobytes())
    return folder / "p"


def test_a_negative_token_id_is_refused_where_it_is_read(tmp_path):
    """An int32 corpus holding -1 passed the check against the vocabulary (its largest id is
    small) and crashed the ranks' embedding lookup; every window read is checked both ways."""
    from hpctrain.data.gpt_dataset import GPTSamples
    prefix = _signed_dataset(tmp_path / "neg", 4, np.int32, [5, 6, -1, 7] * 10)
    samples = GPTSamples(indexed.IndexedDataset(prefix), 8, seed=1, vocab_size=100)
    with pytest.raises(UsageError, match=r"data\.path: .*neg/p holds token id -1; token ids are "
                                         r"0 or more"):
        for position in range(samples.num_samples):
            samples.sample(position, check=True)


def test_an_index_of_float_tokens_is_one_error_line(tmp_path):
    prefix = _signed_dataset(tmp_path / "f", 7, np.float32, [1.5, 2.0, 3.0])
    line = _one_error_line(_invoke(["data", "info", str(prefix)]), "p.idx")
    assert "token dtype float32 (code 7) holds no token ids" in line, line


# ---- 2. tokenizer files ------------------------------------------------------------------------

@pytest.mark.parametrize("extra, every_byte, says", [
    ([b"YQ== 0", b"Yg== 0"], False, r"dup\.tiktoken:2: rank 0 is given already on line 1"),
    ([b"YWI= 300", b"YWI= 301"], True, r":258: the token b'ab' is ranked already"),
    ([b"YWI= -1"], True, r":257: rank -1 is out of range"),
    ([b"YWI= %d" % 2**40], True, r":257: rank 1099511627776 is out of range"),
    ([b"YWI= 9" * 1 + b"9" * 5000], True, r":257: rank 9999.* is out of range"),
    ([b"YQ== 0"], False, r"no rank for the byte 0x00 and 254 more"),
    ([b"== 3"], True, r":257: not a tiktoken ranks line"),
])
def test_a_bad_tiktoken_file_is_one_line_not_a_panic(tmp_path, extra, every_byte, says):
    pytest.importorskip("tiktoken")
    ranks = tmp_path / "dup.tiktoken"
    ranks.write_bytes(_ranks(extra, every_byte))
    with pytest.raises(UsageError, match=r"^data\.tokenizer: .*" + says):
        load_tokenizer(str(ranks))
    (tmp_path / "a.txt").write_text(TEXT)
    # data not prepared yet: validate loads the tokenizer (a warning: it may be the cluster's)
    proc = hpctrain("validate", str(_job(tmp_path, tmp_path / "nope", str(ranks))), timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in out and "panicked" not in out, out
    assert [line for line in out.splitlines() if line.startswith("warning: data.tokenizer:")]
    before = _snapshot(tmp_path)
    _one_error_line(hpctrain("data", "prepare", str(tmp_path / "a.txt"), "-o",
                             str(tmp_path / "out"), "-t", str(ranks), timeout=60), "dup.tiktoken")
    assert _snapshot(tmp_path) == before


def test_a_ranks_file_with_gaps_gives_special_tokens_ids_past_every_rank(tmp_path):
    pytest.importorskip("tiktoken")
    ranks = tmp_path / "gaps.tiktoken"
    ranks.write_bytes(_ranks([base64.b64encode(b"the") + b" 1000"]))
    tok = load_tokenizer(str(ranks))
    assert tok.vocab_size == 1001 + 256 and tok.eod == 1002      # <|end_of_text|> after 1000
    assert list(tok.encode("the")) == [1000]


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge"])
@pytest.mark.parametrize("name", ["tokenizer.model", "folder/tokenizer.json"])
def test_a_tokenizer_file_that_is_not_a_regular_file_is_refused_without_hanging(
        tmp_path, kind, name):
    target = tmp_path / name
    target.parent.mkdir(exist_ok=True)
    _damage(target, kind)
    (tmp_path / "a.txt").write_text(TEXT)
    spec = str(target if name.endswith(".model") else target.parent)
    proc = hpctrain("data", "prepare", str(tmp_path / "a.txt"), "-o", str(tmp_path / "out"),
                    "-t", spec, timeout=60)
    line = _one_error_line(proc, target.name)
    assert {"fifo": "FIFO", "dev-zero": "/dev/zero", "huge": "bytes"}[kind] in line


@pytest.mark.parametrize("content", [b"\xff\xfe\x00", b'{"eos_token": ' + b"[" * 200_000,
                                     b"[1]", b'{"eos_token": "\\ud800"}'])
def test_a_bad_tokenizer_config_is_one_error_line(tmp_path, hf_folder, content):
    folder = tmp_path / "tok"
    shutil.copytree(hf_folder, folder)
    (folder / "tokenizer_config.json").write_bytes(content)
    (tmp_path / "a.txt").write_text(TEXT)
    _one_error_line(hpctrain("data", "prepare", str(tmp_path / "a.txt"), "-o",
                             str(tmp_path / "out"), "-t", str(folder), timeout=60),
                    "tokenizer_config.json")
    assert not (tmp_path / "out.bin").exists()


def test_a_tokenizer_json_linked_as_in_a_hugging_face_cache_still_loads(tmp_path, hf_folder):
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "abc"
    blobs.mkdir()
    snap.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf_folder / name, blobs / name)
        (snap / name).symlink_to(blobs / name)
    tok = load_tokenizer(str(snap))
    assert tok.eod == tok._tok.token_to_id("</s>")


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    folder = tmp_path_factory.mktemp("hf") / "tok"
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([TEXT] * 20, trainer=trainers.BpeTrainer(
        vocab_size=80, special_tokens=["<unk>", "</s>"]))
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return folder


# ---- 3. JSONL records --------------------------------------------------------------------------

@pytest.mark.parametrize("line, says", [
    ('{"text": "\\ud800"}', r"bad\.jsonl:2: field 'text' holds a lone surrogate escape "
                            r"\(\\ud800 at character 0\)"),
    ('{"text": "ok \\udc00 then"}', r"bad\.jsonl:2: .*\\udc00 at character 3"),
    ('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}", r"bad\.jsonl:2: JSON nested too deeply"),
    ('{"text": "x", "n": ' + "1" * 5000 + "}", r"bad\.jsonl:2: not valid JSON"),
    ('{"body": "x", "a\\nb": 1}', r"bad\.jsonl:2: no 'text' field \(fields: 'a\\nb', body\)"),
])
def test_a_bad_jsonl_record_is_one_line_naming_the_line_and_keeps_the_output(tmp_path, line,
                                                                             says):
    prefix = _prepared(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine \\ud83d\\ude00"}\n' + line + "\n")
    before = _snapshot(tmp_path)
    proc = hpctrain("data", "prepare", str(bad), "-o", str(prefix), timeout=120)
    _one_error_line(proc, "bad.jsonl:2")
    with pytest.raises(UsageError, match=says):
        prepare([bad], prefix, "byte")
    assert _snapshot(tmp_path) == before                  # the dataset there is kept whole


# ---- properties: arbitrary bytes at each door ----------------------------------------------------

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats()
                     | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.sampled_from(["vocab_size", "eod", "tokenizer",
                                                        "text", "eos_token", "content"]),
                                       inner, max_size=3), max_leaves=8)
_surrogate = st.integers(0xD800, 0xDFFF).map(lambda c: ("\\u%04x" % c).encode())
BYTES = st.one_of(
    st.binary(max_size=300),
    _json.map(lambda v: json.dumps(v).encode()),
    st.integers(1, 3000).map(lambda n: b"[" * n),
    st.tuples(st.sampled_from([b'{"text": "', b'{"tokenizer": "', b'{"eos_token": "']),
              _surrogate).map(lambda t: t[0] + t[1] + b'"}'),
)
_settings = settings(max_examples=EXAMPLES, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return _prepared(tmp_path_factory.mktemp("dataset"))


@_settings
@given(content=BYTES)
def test_property_any_meta_json_gives_info_or_one_error_line(dataset, tmp_path_factory, content):
    folder = tmp_path_factory.mktemp("meta")
    for suffix in (".bin", ".idx"):
        shutil.copy(f"{dataset}{suffix}", folder / f"d{suffix}")
    (folder / "d.meta.json").write_bytes(content)
    before = _snapshot(folder)
    for args in (["data", "info", str(folder / "d")], ["data", "info", str(folder / "d"), "--json"]):
        _answers(_invoke(args))
    _answers(_invoke(["validate", str(_job(folder, folder / "d", vocab=100_000))]))
    assert {k: v for k, v in _snapshot(folder).items() if k != "job.yaml"} == before


@_settings
@given(content=st.binary(max_size=200))
def test_property_any_index_tail_gives_info_or_one_error_line(dataset, tmp_path_factory, content):
    folder = tmp_path_factory.mktemp("idx")
    shutil.copy(f"{dataset}.bin", folder / "d.bin")
    head = Path(f"{dataset}.idx").read_bytes()[:9 + 8 + 1]
    (folder / "d.idx").write_bytes(head + content)
    _answers(_invoke(["data", "info", str(folder / "d")]))


_rank_line = st.tuples(st.binary(min_size=0, max_size=4).map(base64.b64encode),
                       st.one_of(st.integers(-3, 600), st.integers(), st.just(2**40))) \
    .map(lambda t: t[0] + b" %d" % t[1])
RANKS = st.one_of(
    st.binary(max_size=300).map(lambda b: b"YQ== 0\n" + b),      # looks like tiktoken, then junk
    st.tuples(st.lists(_rank_line | st.binary(max_size=12), max_size=5), st.booleans())
    .map(lambda t: _ranks(t[0], t[1])),
)


@_settings
@given(content=RANKS)
def test_property_any_tiktoken_file_prepares_or_is_one_error_line(tmp_path_factory, content):
    pytest.importorskip("tiktoken")
    folder = tmp_path_factory.mktemp("ranks")
    (folder / "a.txt").write_text(TEXT + "ünïcode ☃ \x00\x7f\n")
    (folder / "r.tiktoken").write_bytes(content)
    result = _invoke(["data", "prepare", str(folder / "a.txt"), "-o", str(folder / "out"),
                      "-t", str(folder / "r.tiktoken")])
    _answers(result)
    if result.exit_code:
        assert "r.tiktoken" in result.output and not (folder / "out.bin").exists()


@_settings
@given(content=BYTES)
def test_property_any_tokenizer_config_prepares_or_is_one_error_line(hf_folder, tmp_path_factory,
                                                                     content):
    folder = tmp_path_factory.mktemp("cfg")
    shutil.copytree(hf_folder, folder / "tok")
    (folder / "tok" / "tokenizer_config.json").write_bytes(content)
    (folder / "a.txt").write_text(TEXT)
    _answers(_invoke(["data", "prepare", str(folder / "a.txt"), "-o", str(folder / "out"),
                      "-t", str(folder / "tok")]))


_record = st.one_of(_json.map(lambda v: json.dumps(v).encode()),
                    _json.map(lambda v: json.dumps({"text": v}).encode()),
                    _surrogate.map(lambda s: b'{"text": "a' + s + b'"}'),
                    st.integers(1, 3000).map(lambda n: b'{"text": ' + b"[" * n),
                    st.binary(max_size=40))


@_settings
@given(lines=st.lists(_record, min_size=1, max_size=4), gz=st.booleans(), raw=st.booleans())
def test_property_any_jsonl_prepares_or_is_one_error_line_and_keeps_the_output(
        dataset, tmp_path_factory, lines, gz, raw):
    folder = tmp_path_factory.mktemp("jsonl")
    for suffix in (".bin", ".idx", ".meta.json"):
        shutil.copy(f"{dataset}{suffix}", folder / f"d{suffix}")
    data = b"\n".join(lines) + b"\n"
    name = "in.jsonl.gz" if gz else "in.jsonl"
    (folder / name).write_bytes(gzip.compress(data) if gz and not raw else data)
    before = _snapshot(folder)
    result = _invoke(["data", "prepare", str(folder / name), "-o", str(folder / "d")])
    _answers(result)
    if result.exit_code:
        assert name in result.output or "holds no text" in result.output, result.output
        assert _snapshot(folder) == before
