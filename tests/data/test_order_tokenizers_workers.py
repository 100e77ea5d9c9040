"""The on-the-fly sample order, the SentencePiece and tiktoken tokenizers (models built here
from files on disk: nothing is downloaded) and ``data prepare --workers``."""

from __future__ import annotations

import base64
import gzip
import json
import sys

import numpy as np
import pytest

from hpctrain.data import indexed
from hpctrain.data.gpt_dataset import GPTSamples
from hpctrain.data.order import FeistelOrder
from hpctrain.data.prepare import prepare
from hpctrain.data.tokenizers import load_tokenizer
from hpctrain.data.vocabulary import check_vocab, data_vocab_size
from hpctrain.errors import UsageError
from tests.conftest import REPO, hpctrain

DOCS = REPO / "examples" / "corpus" / "python_docs.txt.gz"


@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 1025])
def test_feistel_order_visits_every_sample_once_per_epoch_in_a_seeded_order(n):
    def order(seed=7, stream=(1, 0), epoch=0):
        o = FeistelOrder(n, seed, stream)
        return [o.index(epoch, p) for p in range(n)]

    first = order()
    assert sorted(first) == list(range(n))
    assert first == order()                                # a new attempt: the same order
    if n >= 17:   # small n: few permutations, two seeds may agree by chance
        assert first != list(range(n))
        assert first != order(seed=8) and first != order(stream=(2, 0))
        assert first != order(epoch=1)                     # reshuffled next epoch


def test_runs_saved_with_the_former_order_keep_it(tmp_path):
    with indexed.IndexedDatasetWriter(tmp_path / "d", np.uint16) as w:
        w.add_document(np.arange(1000) % 250)
    samples = GPTSamples(indexed.IndexedDataset(tmp_path / "d"), 9, seed=7, stream=(0, 1))
    assert samples.order_kind == "feistel-v1"
    samples.use_order("permutation")     # what a checkpoint without `sample_order` asks for
    # the order every run had before: numpy's permutation of (seed, epoch, *stream)
    former = np.random.Generator(np.random.PCG64([7, 1, 0, 1])).permutation(111)
    assert [samples.sample_index(111 + p) for p in range(111)] == list(former)


def _tiny_sentencepiece(tmp_path):
    import sentencepiece as spm   # the `sentencepiece` extra (in `[test]`)
    text = tmp_path / "train.txt"
    with gzip.open(DOCS, "rt") as f:
        text.write_text(f.read(200_000))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "sp"),
                                   vocab_size=300, model_type="bpe", eos_id=2, bos_id=1,
                                   unk_id=0, pad_id=-1, minloglevel=2, num_threads=1)
    return tmp_path / "sp.model"


def _tiny_tiktoken(tmp_path):
    """A Llama 3 style ranks file: every byte, then a few merges (named tokenizer.model, as
    Llama 3 names its own)."""
    merges = [b"th", b"he", b"the", b" the", b"in", b"ing"]
    lines = [base64.b64encode(bytes([b])) + b" %d" % b for b in range(256)]
    lines += [base64.b64encode(m) + b" %d" % (256 + i) for i, m in enumerate(merges)]
    path = tmp_path / "tokenizer.model"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_sentencepiece_model_prepares_and_sizes_the_vocabulary(tmp_path):
    model = _tiny_sentencepiece(tmp_path)
    tok = load_tokenizer(str(model))
    assert type(tok).__name__ == "SentencePieceTokenizer"
    assert tok.vocab_size == 300 and tok.eod == 2
    ids = tok.encode("The function returns a list of strings.")
    assert 0 < ids.size < 40 and ids.max() < 300 and tok.decode(ids).startswith("The function")
    stats = prepare([DOCS], tmp_path / "out" / "docs", str(model))
    assert stats.vocab_size == 300 and stats.dtype == "uint16"
    ds = indexed.IndexedDataset(tmp_path / "out" / "docs")
    assert ds.num_documents == stats.documents > 1 and int(ds.document(0)[-1]) == 2
    assert int(ds.tokens.max()) < 300
    # the vocabulary reaches the model config's check (validate, submit)
    job = _job(tmp_path, str(model), vocab_size=256)
    assert data_vocab_size(job) == 300
    with pytest.raises(UsageError, match=r"model.vocab_size: 256 .* at least 300"):
        check_vocab(job, data_vocab_size(job))


def test_tiktoken_ranks_file_prepares_with_llama3_special_tokens(tmp_path):
    ranks = _tiny_tiktoken(tmp_path)
    tok = load_tokenizer(str(ranks))
    assert type(tok).__name__ == "TikTokenTokenizer"
    assert tok.vocab_size == 262 + 256 and tok.eod == 262 + 1     # <|end_of_text|>
    ids = list(tok.encode("the thing"))
    assert ids == [258, 32, 256, 261] and tok.decode(ids) == "the thing"   # the, " ", th, ing
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n"
                           for t in ["the king", "<|end_of_text|> is text here", "ünïcode"]))
    stats = prepare([src], tmp_path / "t", str(ranks))
    ds = indexed.IndexedDataset(tmp_path / "t")
    assert stats.documents == 3 and [int(ds.document(d)[-1]) for d in range(3)] == [263] * 3
    assert tok.decode(ds.document(1)[:-1]) == "<|end_of_text|> is text here"  # text, not special
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("dGhl 1\nnot base64!! x\n")
    with pytest.raises(UsageError, match=r"data.tokenizer: .*bad.tiktoken:2: not a tiktoken"):
        load_tokenizer(str(bad))


def test_a_missing_tokenizer_package_names_the_extra(tmp_path, monkeypatch):
    model = tmp_path / "x.model"
    model.write_bytes(b"\x0a\x05hello")
    monkeypatch.setitem(sys.modules, "sentencepiece", None)     # not installed
    with pytest.raises(UsageError) as e:
        load_tokenizer(str(model))
    assert str(e.value) == ("data.tokenizer: a SentencePiece .model needs the `sentencepiece` "
                            "package: pip install 'hpctrain[sentencepiece]'")
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    with pytest.raises(UsageError, match=r"pip install 'hpctrain\[tiktoken\]'"):
        load_tokenizer(str(_tiny_tiktoken(tmp_path)))


def test_prepare_with_workers_writes_the_same_bytes(tmp_path, monkeypatch):
    import hpctrain.data.prepare as prep
    monkeypatch.setattr(prep, "BATCH_TEXTS", 16)     # many batches in flight (cut in this process)
    model = _tiny_sentencepiece(tmp_path)
    serial = prepare([DOCS], tmp_path / "serial", str(model))
    proc = hpctrain("data", "prepare", str(DOCS), "--output", str(tmp_path / "par"),
                    "--tokenizer", str(model), "--workers", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tokens"] == serial.tokens
    parallel = prepare([DOCS], tmp_path / "par16", str(model), workers=2)
    assert parallel.documents == serial.documents
    for suffix in (".bin", ".idx"):
        ref = (tmp_path / f"serial{suffix}").read_bytes()
        assert (tmp_path / f"par{suffix}").read_bytes() == ref
        assert (tmp_path / f"par16{suffix}").read_bytes() == ref
    for count in ("0", "100000"):      # bounded by limits.py: -j 100000 once spawned until killed
        proc = hpctrain("data", "prepare", str(DOCS), "--output", str(tmp_path / "x"),
                        "--workers", count, timeout=60)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
            f"Error: Invalid value for '--workers' / '-j': {count} is not in the range "
            "1<=x<=256. (see `hpctrain data prepare --help`)"], proc.stderr
    with pytest.raises(UsageError, match="--workers: expected an integer from 1 to 256, got 0"):
        prepare([DOCS], tmp_path / "y", workers=0)
    assert not list(tmp_path.glob("[xy].*"))


def _job(tmp_path, tokenizer, vocab_size):
    from hpctrain.config import load_job
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({
        "name": "tok", "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                                 "seq_length": 64, "vocab_size": vocab_size},
        "data": {"path": str(tmp_path / "absent"), "tokenizer": tokenizer,
                 "prepare_from": [str(DOCS)]},
        "batch": {"global_batch_size": 4, "micro_batch_size": 1}, "train": {"steps": 2}}))
    return load_job(path)
