"""Megatron's indexed format: our writer and reader against megatron-core's own, tokenizers,
``hpctrain data prepare`` on the example corpus, and the GPT sample order."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from hpctrain.data import indexed
from hpctrain.data.gpt_dataset import GPTSamples, rank_microbatch_positions, rank_microbatches
from hpctrain.data.prepare import ensure_prepared, prepare
from hpctrain.data.tokenizers import ByteTokenizer, HuggingFaceTokenizer, load_tokenizer
from hpctrain.errors import UsageError
from tests.conftest import REPO, hpctrain

CORPUS = REPO / "examples" / "corpus" / "kjv.txt.gz"


def _megatron_indexed():
    from hpctrain.runtime import cpu_shim
    cpu_shim.install()
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
    return IndexedDataset, IndexedDatasetBuilder


def test_our_files_read_by_megatron_and_megatron_files_read_by_us(tmp_path):
    import torch
    MegatronDataset, MegatronBuilder = _megatron_indexed()
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50000, size=n).astype(np.uint16) for n in (5, 1, 17, 300, 2)]

    with indexed.IndexedDatasetWriter(tmp_path / "ours", np.uint16) as w:
        for d in docs[:3]:
            w.add_document(d)
        w.add_sequence(docs[3])  # one document made of two sequences
        w.add_sequence(docs[4])
        w.end_document()
    theirs = MegatronDataset(str(tmp_path / "ours"))
    assert len(theirs) == 5
    for i, d in enumerate(docs):
        assert np.array_equal(theirs[i], d)
    assert list(theirs.document_indices) == [0, 1, 2, 3, 5]

    builder = MegatronBuilder(str(tmp_path / "megatron.bin"), dtype=np.uint16)
    for d in docs[:3]:
        builder.add_item(torch.from_numpy(d.astype(np.int64)))
        builder.end_document()
    builder.add_document(torch.from_numpy(np.concatenate(docs[3:]).astype(np.int64)),
                         [len(docs[3]), len(docs[4])])
    builder.finalize(str(tmp_path / "megatron.idx"))
    ours = indexed.IndexedDataset(tmp_path / "megatron")
    assert (tmp_path / "megatron.idx").read_bytes() == (tmp_path / "ours.idx").read_bytes()
    assert (tmp_path / "megatron.bin").read_bytes() == (tmp_path / "ours.bin").read_bytes()
    assert [list(ours[i]) for i in range(5)] == [list(d) for d in docs]
    assert list(ours.document(3)) == list(np.concatenate(docs[3:]))
    assert ours.num_documents == 4 and ours.dtype == np.uint16


def test_damaged_index_is_a_one_line_error(tmp_path):
    with indexed.IndexedDatasetWriter(tmp_path / "d", np.int32) as w:
        w.add_document([1, 2, 3])
    idx = tmp_path / "d.idx"
    good = idx.read_bytes()
    idx.write_bytes(b"NOTMMID" + good[7:])
    with pytest.raises(UsageError, match="not a Megatron index file"):
        indexed.IndexedDataset(tmp_path / "d")
    idx.write_bytes(good[:-4])
    with pytest.raises(UsageError, match="truncated"):
        indexed.IndexedDataset(tmp_path / "d")
    idx.write_bytes(good)
    (tmp_path / "d.bin").write_bytes(b"\0" * 8)
    with pytest.raises(UsageError, match="holds 8 bytes but"):
        indexed.IndexedDataset(tmp_path / "d")
    with pytest.raises(UsageError, match="does not exist"):
        indexed.IndexedDataset(tmp_path / "missing")


def test_writer_leaves_nothing_behind_on_error(tmp_path):
    with pytest.raises(RuntimeError):
        with indexed.IndexedDatasetWriter(tmp_path / "x", np.uint16) as w:
            w.add_document([1, 2])
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_byte_tokenizer_roundtrip_and_vocab():
    tok = load_tokenizer("byte")
    ids = tok.encode("Grüße, world")
    assert ids.max() < 256 and tok.vocab_size == 257 and tok.eod == 256
    assert tok.decode(ids) == "Grüße, world"


def _tiny_hf_tokenizer(folder):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "</s>"])
    tok.train_from_iterator(["in the beginning god created the heaven and the earth"] * 20,
                            trainer=trainer)
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return folder


def test_local_hugging_face_tokenizer(tmp_path):
    folder = _tiny_hf_tokenizer(tmp_path / "tok")
    tok = HuggingFaceTokenizer(folder)
    assert tok.eod == tok._tok.token_to_id("</s>")
    ids = tok.encode("the heaven and the earth")
    assert tok.decode(ids).replace(" ", "") == "theheavenandtheearth"
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("\n".join(json.dumps({"text": t}) for t in ("god created", "the earth")))
    stats = prepare([jsonl], tmp_path / "out", str(folder))
    ds = indexed.IndexedDataset(tmp_path / "out")
    assert stats.documents == 2 and ds.num_documents == 2
    assert int(ds.document(0)[-1]) == tok.eod and int(ds.document(1)[-1]) == tok.eod
    with pytest.raises(UsageError, match="no tokenizer.json"):
        HuggingFaceTokenizer(tmp_path)
    with pytest.raises(UsageError, match="does not exist"):
        load_tokenizer(str(tmp_path / "nope"))


def test_prepare_text_and_jsonl_documents(tmp_path):
    txt = tmp_path / "a.txt"
    txt.write_text("first paragraph\nstill first\n\n\nsecond\n")
    jl = tmp_path / "b.jsonl.gz"
    with gzip.open(jl, "wt") as f:
        f.write(json.dumps({"content": "héllo"}) + "\n\n" + json.dumps({"content": "x"}) + "\n")
    prepare([txt], tmp_path / "t")
    t = indexed.IndexedDataset(tmp_path / "t")
    assert t.num_documents == 2
    assert ByteTokenizer().decode(t.document(0)) == "first paragraph\nstill first\n"
    assert int(t.document(1)[-1]) == 256
    prepare([jl], tmp_path / "j", json_key="content")
    j = indexed.IndexedDataset(tmp_path / "j")
    assert j.num_documents == 2 and ByteTokenizer().decode(j.document(0)) == "héllo"
    with pytest.raises(UsageError, match=r"b.jsonl.gz:1: no 'text' field \(fields: content\)"):
        prepare([jl], tmp_path / "k")


def test_long_paragraph_is_one_document_in_pieces(tmp_path, monkeypatch):
    from hpctrain.data import sources
    monkeypatch.setattr(sources, "PIECE_CHARS", 10)
    txt = tmp_path / "long.txt"
    txt.write_text("".join(f"line {i}\n" for i in range(6)) + "\nnext\n")
    prepare([txt], tmp_path / "p")
    ds = indexed.IndexedDataset(tmp_path / "p")
    assert ds.num_documents == 2 and len(ds) > 2
    assert ByteTokenizer().decode(ds.document(0)) == "".join(f"line {i}\n" for i in range(6))


def test_cli_prepares_the_example_corpus_and_reports_bad_input(tmp_path):
    out = tmp_path / "kjv"
    proc = hpctrain("data", "prepare", str(CORPUS), "--output", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)
    with gzip.open(CORPUS, "rb") as f:
        raw = f.read()
    ds = indexed.IndexedDataset(out)
    assert stats["tokens"] == len(raw) + 1 == ds.num_tokens  # bytes + one end-of-document
    assert bytes(ds.tokens[:-1].astype(np.uint8)) == raw
    info = json.loads(hpctrain("data", "info", str(out), "--json").stdout)
    assert (info["documents"], info["tokens"], info["vocab_size"]) == (1, len(raw) + 1, 257)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{broken\n')
    proc = hpctrain("data", "prepare", str(bad), "--output", str(tmp_path / "b"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"Error: {bad}:2: not valid JSON (Expecting property name enclosed in double quotes); "
        "JSONL needs one object per line"]
    proc = hpctrain("data", "prepare", str(tmp_path / "x.csv"), "--output", str(tmp_path / "c"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    assert not list(tmp_path.glob("b.*")) and not list(tmp_path.glob("c.*"))


def test_gpt_samples_order_is_seeded_and_dp_slices_tile_the_global_batch(tmp_path):
    with indexed.IndexedDatasetWriter(tmp_path / "d", np.uint16) as w:
        w.add_document(np.arange(1000) % 250)
    ds = indexed.IndexedDataset(tmp_path / "d")
    a, b = GPTSamples(ds, 9, seed=7), GPTSamples(ds, 9, seed=7)
    c = GPTSamples(ds, 9, seed=8)
    assert a.num_samples == 111
    order = [a.sample_index(p) for p in range(a.num_samples)]
    assert sorted(order) == list(range(a.num_samples))          # each sample once per epoch
    assert order == [b.sample_index(p) for p in range(a.num_samples)]
    assert order != [c.sample_index(p) for p in range(a.num_samples)]
    epoch2 = [a.sample_index(a.num_samples + p) for p in range(a.num_samples)]
    assert sorted(epoch2) == sorted(order) and epoch2 != order  # reshuffled next epoch
    s = a.sample(5)
    j = a.sample_index(5)
    assert list(s) == list(np.arange(j * 9, j * 9 + 10) % 250)  # seq_length + 1 tokens
    whole = rank_microbatches(a, 32, 16, 0, 1, 4)
    parts = [m for r in range(2) for m in rank_microbatches(a, 32, 16, r, 2, 2)]
    assert np.array_equal(np.concatenate(whole), np.concatenate(parts))
    beyond = next(p for p in range(a.num_samples) if a.sample_index(p) * 9 % 250 >= 100)
    with pytest.raises(UsageError, match="beyond model.vocab_size"):
        GPTSamples(ds, 9, seed=7, vocab_size=100).sample(beyond)   # a window with ids >= 100
    with pytest.raises(UsageError, match=r"holds 1000 tokens, fewer than one sample of "
                                         r"model.seq_length \+ 1 = 5001; use more data"):
        GPTSamples(ds, 5000, seed=7)


def test_ensure_prepared_without_importing_torch(tmp_path):
    script = f"""
import sys, json
from hpctrain.config import job_from_mapping
from hpctrain.data.prepare import ensure_prepared
job = job_from_mapping({{"name": "t", "model": {{"num_layers": 1, "hidden_size": 8,
    "num_attention_heads": 1, "vocab_size": 257, "seq_length": 8}},
    "batch": {{"micro_batch_size": 1, "global_batch_size": 1}}, "train": {{"steps": 1}},
    "data": {{"path": "{tmp_path}/kjv", "prepare_from": ["{CORPUS}"]}}}}, "t")
print(json.dumps([ensure_prepared(job), ensure_prepared(job), "torch" in sys.modules]))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [True, False, False]
    assert indexed.exists(tmp_path / "kjv")


def test_ensure_prepared_names_the_field_to_fix(tmp_path):
    from hpctrain.config import job_from_mapping
    job = job_from_mapping({"name": "t", "model": {"num_layers": 1, "hidden_size": 8,
                                                   "num_attention_heads": 1, "vocab_size": 100,
                                                   "seq_length": 8},
                            "batch": {"micro_batch_size": 1, "global_batch_size": 1},
                            "train": {"steps": 1}, "data": {"path": str(tmp_path / "none")}}, "t")
    with pytest.raises(UsageError, match=r"data.path: .*none.bin/.idx do not exist"):
        ensure_prepared(job)
    job.data.prepare_from = [str(CORPUS)]
    with pytest.raises(UsageError, match=r"model.vocab_size: 100 is smaller than the tokenizer's "
                                         r"vocabulary \(257\)"):
        ensure_prepared(job)
    assert not indexed.exists(tmp_path / "none")


def test_a_missing_prepare_from_file_is_named_by_its_field(tmp_path):
    """A job copied away from its corpus (``prepare_from: [corpus/kjv.txt.gz]``, relative to the
    job file): validate and dry runs called it ok without a word, and submit failed in the
    preparation with ``input file ... does not exist``, naming no field. validate and dry runs
    warn, naming the field; submit's check and the preparation refuse, naming it, before
    anything is written."""
    from hpctrain.config import load_job
    from hpctrain.submission import check_data
    job_file = tmp_path / "base.yaml"
    shutil.copy(REPO / "examples" / "tiny.yaml", job_file)
    field = "data.blend[0].prepare_from[0]"
    missing = f"input file {tmp_path / 'corpus' / 'kjv.txt.gz'} does not exist"
    runs = tmp_path / "runs"
    for args in (("validate",), ("submit", "--dry-run", "--runs-dir", str(runs))):
        proc = hpctrain(args[0], str(job_file), *args[1:])
        assert proc.returncode == 0, proc.stderr
        assert f"warning: {field}: {missing}; fix the path" in proc.stderr
        assert "warning: data.blend[1].prepare_from[0]: input file" in proc.stderr
    (dry_run,) = runs.iterdir()
    job = load_job(job_file)
    with pytest.raises(UsageError, match=rf"^{re.escape(f'{field}: {missing}')}"):
        check_data(job)
    with pytest.raises(UsageError, match=rf"^{re.escape(f'{field}: {missing}')}"):
        ensure_prepared(job)
    job.data.blend[0].prepare_from = [str(CORPUS)]
    with pytest.raises(UsageError, match=r"^data.blend\[1\].prepare_from\[0\]: input file"):
        check_data(job)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.yaml", "runs"]
    assert list(runs.iterdir()) == [dry_run]
    (tmp_path / "folder.txt").mkdir()
    single = load_job(job_file)
    single.data.blend = []
    single.data.path, single.data.prepare_from = str(tmp_path / "c"), [str(tmp_path / "folder.txt")]
    with pytest.raises(UsageError, match=r"^data.prepare_from\[0\]: input .*folder.txt is not a"):
        check_data(single)


@pytest.mark.parametrize("micro_batch_size", [1, 2, 4])
def test_every_sample_of_a_step_is_read_once_over_the_ranks_whatever_the_micro_batch(
        micro_batch_size):
    """The 7B example trains with micro_batch_size 1: each DP rank reads its own consecutive
    block of the global batch, one microbatch after the other, and the next step starts right
    after this one (a resume at ``consumed_samples`` reads exactly what comes next)."""
    global_batch, dp = 16, 4
    for consumed in (0, 48):
        read = []
        for dp_rank in range(dp):
            mbs = rank_microbatch_positions(consumed, global_batch, dp_rank, dp, micro_batch_size)
            assert len(mbs) == global_batch // (dp * micro_batch_size)
            assert all(len(m) == micro_batch_size for m in mbs)
            flat = [p for m in mbs for p in m]
            first = consumed + dp_rank * global_batch // dp
            assert flat == list(range(first, first + global_batch // dp))
            read += flat
        assert read == list(range(consumed, consumed + global_batch))


def test_every_sample_is_whole_when_the_corpus_ends_on_a_sample_boundary(tmp_path):
    """A corpus of exactly 100 samples' worth of tokens (1000 tokens, seq_length 10): a sample
    needs seq_length + 1 tokens (its labels reach one token further), so only 99 samples fit,
    and each one the run reads over two epochs is whole, with its labels shifted by one."""
    with indexed.IndexedDatasetWriter(tmp_path / "d", np.uint16) as w:
        w.add_document(np.arange(1000) % 250)
    samples = GPTSamples(indexed.IndexedDataset(tmp_path / "d"), 10, seed=1)
    assert samples.num_samples == 99
    for position in range(2 * samples.num_samples):
        window = samples.sample(position)
        assert window.size == 11
        assert list(window[1:]) == list((window[:-1] + 1) % 250)


def test_a_corpus_of_exactly_one_sample_trains_on_it_every_step(tmp_path):
    """The smallest corpus that can train: seq_length + 1 tokens make one sample, read again
    each epoch (a smoke test's data); one token fewer is refused."""
    with indexed.IndexedDatasetWriter(tmp_path / "d", np.uint16) as w:
        w.add_document(np.arange(11))
    samples = GPTSamples(indexed.IndexedDataset(tmp_path / "d"), 10, seed=1)
    assert samples.num_samples == 1
    for position in range(3):
        assert list(samples.sample(position)) == list(range(11))
    with pytest.raises(UsageError, match="fewer than one sample"):
        GPTSamples(indexed.IndexedDataset(tmp_path / "d"), 11, seed=1)


def test_token_ids_up_to_the_vocabulary_train_and_one_beyond_is_refused(tmp_path):
    """Data prepared with a 250-token vocabulary (ids 0..249) trains with model.vocab_size 250;
    with 249 the first sample that holds id 249 is refused, naming the id and the field."""
    with indexed.IndexedDatasetWriter(tmp_path / "d", np.uint16) as w:
        w.add_document(np.arange(1000) % 250)
    ds = indexed.IndexedDataset(tmp_path / "d")
    fits = GPTSamples(ds, 9, seed=7, vocab_size=250)
    assert all(fits.sample(p).max() <= 249 for p in range(fits.num_samples))
    small = GPTSamples(ds, 9, seed=7, vocab_size=249)
    with pytest.raises(UsageError, match=r"holds token id 249, beyond model.vocab_size \(249\)"):
        for p in range(small.num_samples):
            small.sample(p)
    # the training ranks read unchecked (check=False) and check each batch themselves, where
    # the error stays one line (runtime.batches)
    assert max(small.sample(p, check=False).max() for p in range(small.num_samples)) == 249


def test_a_resume_in_the_second_epoch_and_repeated_evaluations_read_the_same_samples(tmp_path):
    """Two stories of reading the order out of its first pass: a run resumed past its first
    epoch (a fresh reader starting at position 120 of a 99-sample corpus) reads what the run
    that never stopped read there; a small validation split whose evaluation wraps into the
    next epoch reads the same samples at the next evaluation, which starts again at 0."""
    with indexed.IndexedDatasetWriter(tmp_path / "d", np.uint16) as w:
        w.add_document(np.arange(1000) % 250)
    ds = indexed.IndexedDataset(tmp_path / "d")
    steady = GPTSamples(ds, 10, seed=3)
    seen = [steady.sample_index(p) for p in range(130)]
    resumed = GPTSamples(ds, 10, seed=3)
    assert [resumed.sample_index(p) for p in range(120, 130)] == seen[120:]
    validation = GPTSamples(ds, 10, seed=3, tokens=ds.tokens[:400], stream=(1,))
    first = [list(validation.sample(p)) for p in range(50)]   # 39 samples: wraps into epoch 1
    assert [list(validation.sample(p)) for p in range(50)] == first


def test_a_split_too_small_for_one_sample_says_so_and_how_to_fix_it(tmp_path):
    with indexed.IndexedDatasetWriter(tmp_path / "d", np.uint16) as w:
        w.add_document(np.arange(1000) % 250)
    ds = indexed.IndexedDataset(tmp_path / "d")
    with pytest.raises(UsageError, match=r"holds 8 tokens in this split, fewer than one sample "
                                         r"of model.seq_length \+ 1 = 11; use more data, a "
                                         r"larger share of data.split"):
        GPTSamples(ds, 10, seed=3, tokens=ds.tokens[992:])
    with pytest.raises(UsageError, match="holds 0 tokens in this split"):   # a share of none
        GPTSamples(ds, 10, seed=3, tokens=ds.tokens[:0])


def _data_job(tmp_path, **data):
    from hpctrain.config import job_from_mapping
    return job_from_mapping({"name": "t", "model": {"num_layers": 1, "hidden_size": 8,
                                                    "num_attention_heads": 1, "vocab_size": 257,
                                                    "seq_length": 8},
                             "batch": {"micro_batch_size": 1, "global_batch_size": 1},
                             "train": {"steps": 1}, "data": data}, "t")


def test_data_prepared_otherwise_than_the_job_says_is_refused_at_every_door(tmp_path):
    """Data prepared with ``byte``, then the job names a Hugging Face tokenizer (or other
    files): the .bin/.idx are there, but not what the job would train on. ``submit``'s
    preparation and ``validate``'s check both refuse it, naming the field; the same job as
    prepared passes, and data without ``PREFIX.meta.json`` (another tool's) is taken as is."""
    from hpctrain.submission.checks import check_data
    text = tmp_path / "a.txt"
    text.write_text("in the beginning god created the heaven and the earth\n\n" * 40)
    other = tmp_path / "b.txt"
    other.write_text("and the earth was without form\n\n" * 40)
    tok = str(_tiny_hf_tokenizer(tmp_path / "tok"))
    prefix = str(tmp_path / "corpus")
    as_prepared = _data_job(tmp_path, path=prefix, prepare_from=[str(text)])
    assert ensure_prepared(as_prepared)
    files = {s: (tmp_path / f"corpus{s}").read_bytes() for s in (".bin", ".idx", ".meta.json")}
    fix = (f"point data.path at a new prefix to prepare it there, or remove {prefix}.bin/.idx/"
           f".meta.json to prepare it again")
    changed = _data_job(tmp_path, path=prefix, prepare_from=[str(text)], tokenizer=tok)
    for door in (ensure_prepared, check_data):
        with pytest.raises(UsageError) as e:
            door(changed)
        assert str(e.value) == (f"data.tokenizer: {prefix} was prepared with 'byte', the job "
                                f"names '{tok}'; {fix}")
    moved = _data_job(tmp_path, path=prefix, prepare_from=[str(other)])
    with pytest.raises(UsageError, match=rf"^data.prepare_from: {prefix} was prepared from "
                                         rf"{text}, the job names {other}; "):
        check_data(moved)
    # a job that does not prepare the prefix and names a tokenizer names it too
    with pytest.raises(UsageError, match=r"^data.tokenizer: .* set data.tokenizer to 'byte'"):
        check_data(_data_job(tmp_path, path=prefix, tokenizer=tok))
    assert {s: (tmp_path / f"corpus{s}").read_bytes() for s in files} == files
    assert not ensure_prepared(as_prepared)
    check_data(as_prepared)
    check_data(_data_job(tmp_path, path=prefix))      # the tokenizer left at its default
    (tmp_path / "corpus.meta.json").unlink()          # prepared by another tool: no record
    assert not ensure_prepared(changed)
    check_data(moved)


def test_a_tokenizer_named_relative_to_another_folder_is_the_same_tokenizer(tmp_path,
                                                                             monkeypatch):
    """``data prepare -t ./tok`` records the tokenizer's absolute path: a job file elsewhere
    naming the same folder (made absolute against the job file) takes the data."""
    from hpctrain.submission.checks import check_data
    (tmp_path / "a.txt").write_text("the heaven and the earth\n\n" * 10)
    _tiny_hf_tokenizer(tmp_path / "tok")
    monkeypatch.chdir(tmp_path)
    prepare(["a.txt"], "corpus", "./tok")
    meta = json.loads((tmp_path / "corpus.meta.json").read_text())
    assert (meta["tokenizer"], meta["sources"]) == (str(tmp_path / "tok"),
                                                    [str(tmp_path / "a.txt")])
    check_data(_data_job(tmp_path, path=str(tmp_path / "corpus"), tokenizer=str(tmp_path / "tok"),
                         prepare_from=[str(tmp_path / "a.txt")]))


def _project(folder, tokenizer: str = "tok"):
    """A project as a user keeps one: corpus/, tokenizer/ and data/ side by side, the data
    prepared from the corpus with the tokenizer (``byte`` or the folder named)."""
    (folder / "corpus").mkdir(parents=True)
    (folder / "corpus" / "a.txt").write_text("in the beginning god created the heaven\n\n" * 40)
    if tokenizer != "byte":
        _tiny_hf_tokenizer(folder / tokenizer)
    (folder / "data").mkdir()
    prepare([folder / "corpus" / "a.txt"], folder / "data" / "corpus",
            tokenizer if tokenizer == "byte" else str(folder / tokenizer))
    return folder


def _project_job(tmp_path, folder, tokenizer: str = "tok", source: str = "corpus/a.txt"):
    return _data_job(tmp_path, path=str(folder / "data" / "corpus"),
                     prepare_from=[str(folder / source)],
                     tokenizer=tokenizer if tokenizer == "byte" else str(folder / tokenizer))


def test_a_project_moved_elsewhere_takes_its_prepared_data(tmp_path):
    """The record holds absolute paths; a project moved from $HOME to $SCRATCH is the same
    data: the same file names and total size, and a tokenizer of the same name (its folder or
    the tokenizer.json in it). A source of another size, or another tokenizer, is refused."""
    from hpctrain.submission.checks import check_data
    home, scratch = tmp_path / "home", tmp_path / "scratch"
    home.mkdir()
    _project(home / "proj")
    shutil.move(str(home / "proj"), str(scratch))
    for tokenizer in ("tok", "tok/tokenizer.json"):
        job = _project_job(tmp_path, scratch, tokenizer)
        check_data(job)
        assert not ensure_prepared(job)
    _tiny_hf_tokenizer(scratch / "other")                       # another tokenizer, there now
    with pytest.raises(UsageError, match=rf"^data.tokenizer: {scratch}/data/corpus was prepared "
                                         rf"with '{home}/proj/tok', the job names "
                                         rf"'{scratch}/other'; point data.path at a new prefix"):
        check_data(_project_job(tmp_path, scratch, "other"))
    with pytest.raises(UsageError, match=r"^data.tokenizer: .* was prepared with '.*/tok', the "
                                         r"job names 'byte'"):
        check_data(_project_job(tmp_path, scratch, "byte"))
    size = (scratch / "corpus" / "a.txt").stat().st_size
    with (scratch / "corpus" / "a.txt").open("a") as f:         # edited since: another size
        f.write("and")
    with pytest.raises(UsageError) as e:
        check_data(_project_job(tmp_path, scratch))
    assert str(e.value) == (
        f"data.prepare_from: {scratch}/data/corpus was prepared from {home}/proj/corpus/a.txt, "
        f"the job names {scratch}/corpus/a.txt ({size + 3} bytes; the data was prepared "
        f"from {size} bytes); point data.path at a new prefix to prepare it there, or remove "
        f"{scratch}/data/corpus.bin/.idx/.meta.json to prepare it again")


def test_a_tokenizer_or_source_still_in_place_is_compared_as_a_file(tmp_path):
    """Where the recorded paths still exist, the job's must be the same files or copies of
    them: the folder or the tokenizer.json in it, a link to either, a copy with the same
    bytes (a tokenizer) or the same size (a source) is taken; another tokenizer folder of the
    same name, or another source of the same name elsewhere, is not."""
    from hpctrain.submission.checks import check_data
    proj = _project(tmp_path / "proj")
    (tmp_path / "link").symlink_to(proj)
    check_data(_project_job(tmp_path, proj, "tok/tokenizer.json"))
    check_data(_project_job(tmp_path, tmp_path / "link"))
    copy = tmp_path / "copy"
    shutil.copytree(proj, copy)                   # the original left in place

    def job_with(tokenizer, source):
        return _data_job(tmp_path, path=str(proj / "data" / "corpus"),
                         prepare_from=[str(source)], tokenizer=str(tokenizer))
    check_data(job_with(copy / "tok", copy / "corpus" / "a.txt"))
    check_data(job_with(copy / "tok" / "tokenizer.json", proj / "corpus" / "a.txt"))
    other = tmp_path / "other"
    other.mkdir()
    (other / "tok").mkdir()
    text = (proj / "tok" / "tokenizer.json").read_text()
    (other / "tok" / "tokenizer.json").write_text(text.replace('"</s>"', '"<eos>"'))
    with pytest.raises(UsageError, match=r"^data.tokenizer: .* was prepared with"):
        check_data(job_with(other / "tok", proj / "corpus" / "a.txt"))
    (other / "a.txt").write_text("in the beginning god created the heaven\n\n" * 41)
    with pytest.raises(UsageError, match=r"^data.prepare_from: .* was prepared from"):
        check_data(job_with(proj / "tok", other / "a.txt"))
    (other / "b.txt").write_bytes((proj / "corpus" / "a.txt").read_bytes())
    with pytest.raises(UsageError, match=r"^data.prepare_from: .* was prepared from"):
        check_data(job_with(proj / "tok", other / "b.txt"))        # another name


def test_validate_refuses_data_prepared_with_another_tokenizer_in_one_line(tmp_path):
    import yaml
    from tests.conftest import one_error_line
    (tmp_path / "a.txt").write_text("in the beginning god created the heaven\n\n" * 40)
    _tiny_hf_tokenizer(tmp_path / "tok")
    prepare([tmp_path / "a.txt"], tmp_path / "corpus", "byte")
    job = yaml.safe_load((REPO / "examples" / "tiny.yaml").read_text())
    job["data"] = {"path": "corpus", "tokenizer": "./tok", "prepare_from": ["a.txt"]}
    job["train"].pop("eval_interval")         # no validation data: all of it trains
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    proc = hpctrain("validate", str(tmp_path / "job.yaml"), "--profile", "local")
    one_error_line(proc, f"data.tokenizer: {tmp_path / 'corpus'} was prepared with 'byte', the "
                         f"job names '{tmp_path / 'tok'}'; point data.path at a new prefix")
    job["data"]["tokenizer"] = "byte"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    proc = hpctrain("validate", str(tmp_path / "job.yaml"), "--profile", "local")
    assert proc.returncode == 0, proc.stderr
