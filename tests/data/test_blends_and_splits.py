"""Blends and splits: the position -> (corpus, sample) map a checkpoint's one integer resumes,
megatron-core's split arithmetic, and the checks that refuse bad blends before submit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hpctrain.config import job_from_mapping
from hpctrain.data import indexed
from hpctrain.data.blend import BlendedSamples, check_splits, split_samples
from hpctrain.data.gpt_dataset import GPTSamples
from hpctrain.data.splits import parse_split, split_ranges
from hpctrain.errors import ConfigError, UsageError
from hpctrain.record.folder import RunFolder as Run
from hpctrain.submission.checks import check_data
from tests.conftest import token_corpus


def _corpus(path, docs: int, doc_len: int, base: int = 0) -> str:
    return token_corpus(path, docs, doc_len, base=base)


def _job(data: dict, **train) -> object:
    return job_from_mapping({"name": "t", "model": {"num_layers": 1, "hidden_size": 8,
                                                    "num_attention_heads": 1, "vocab_size": 257,
                                                    "seq_length": 8},
                             "batch": {"micro_batch_size": 1, "global_batch_size": 4},
                             "train": {"steps": 1, **train}, "data": data}, "t")


def _parts(tmp_path, weights):
    parts = []
    for i, _ in enumerate(weights):
        ds = indexed.IndexedDataset(_corpus(tmp_path / f"c{i}", 20 + 7 * i, 50, base=40 * i))
        parts.append(GPTSamples(ds, 8, seed=3, stream=(i, 0)))
    return parts


@pytest.mark.parametrize("weights", [[0.7, 0.3], [1, 1, 5], [0.01, 0.5, 0.2, 0.29]])
def test_blend_keeps_every_corpus_to_its_share_and_reads_each_in_order(tmp_path, weights):
    blend = BlendedSamples(_parts(tmp_path, weights), weights)
    n, share = len(weights), np.asarray(weights) / sum(weights)
    seen = [[] for _ in weights]
    counts = np.zeros(n, dtype=int)
    for p in range(5 * blend.block + 17):
        corpus, within = blend.locate(p)
        seen[corpus].append(within)
        counts[corpus] += 1
        if (p + 1) % 97 == 0 or (p + 1) % blend.block == 0:
            assert np.all(np.abs(counts - share * (p + 1)) <= n + 1), (p, counts)
    for i in range(n):                      # each corpus's own order: no gap, no repeat
        assert seen[i] == list(range(len(seen[i])))


def test_each_corpus_is_spread_evenly_over_a_block_as_documented(tmp_path):
    """Block k holds m_i samples of corpus i, the t-th of them at (t + 1/2) / m_i of the
    block, ties to the lower corpus: the order every run of such a blend has read, so a run
    resumed by a later version reads what it would have."""
    weights = [3, 1, 0.5]
    blend = BlendedSamples(_parts(tmp_path, weights), weights)
    for k in (0, 1, 7):
        here = blend.counts_before(k + 1) - blend.counts_before(k)
        want = sorted(((t + 0.5) / m, i, t) for i, m in enumerate(here) for t in range(m))
        corpus, within = blend.block_order(k)
        assert list(zip(corpus, within)) == [(i, blend.counts_before(k)[i] + t)
                                             for _, i, t in want]


def test_a_blend_needs_one_weight_per_corpus_and_names_every_corpus_for_a_bad_token(tmp_path):
    parts = _parts(tmp_path, [1, 1])
    for weights in ([1], [1, 1, 1]):
        with pytest.raises(ValueError, match="one weight per corpus"):
            BlendedSamples(parts, weights)
    for part in parts:
        part.vocab_size = 150
    blend = BlendedSamples(parts, [1, 1])
    blend.check_tokens(149)
    with pytest.raises(UsageError, match=r"one of data\.path \(.*c0\), data\.path \(.*c1\) "
                                         r"holds token id 150"):
        blend.check_tokens(150)
    blend.check_tokens(149, 0)
    with pytest.raises(UsageError, match=r"one of data\.path \(.*c0\), data\.path \(.*c1\) "
                                         r"holds token id -1; token ids are 0 or more"):
        blend.check_tokens(149, -1)


def test_resume_at_any_position_reads_the_next_sample_of_every_corpus(tmp_path):
    weights = [0.6, 0.4]
    whole = BlendedSamples(_parts(tmp_path, weights), weights)
    first = [whole.locate(p) for p in range(3000)]
    for stop in (0, 1, 1023, 1024, 1500, 2047):
        resumed = BlendedSamples(_parts(tmp_path, weights), weights)   # a new attempt
        assert [resumed.locate(p) for p in range(stop, 3000)] == first[stop:]
        before = [max([w for c, w in first[:stop] if c == i], default=-1) for i in range(2)]
        nxt = {c: w for c, w in reversed(first[stop:])}
        assert all(nxt[i] == before[i] + 1 for i in range(2))
    assert np.array_equal(whole.sample(1234), BlendedSamples(
        _parts(tmp_path, weights), weights).sample(1234))


def test_split_matches_megatron_core_and_one_corpus_keeps_its_order(tmp_path):
    from hpctrain.runtime import cpu_shim
    cpu_shim.install()
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix, parse_and_normalize_split)
    for text in ("969,30,1", "98,2,0", "1,1,1", "100", "3,0,1"):
        ours = parse_split(text)
        assert np.allclose(ours, parse_and_normalize_split(text))
        matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(text))
        for docs in (1, 7, 100, 12345):
            ref = [(int(round(m[0] * float(docs))), int(round(m[1] * float(docs))))
                   if m is not None else None for m in matrix]     # the builder's arithmetic
            got = split_ranges(docs, ours)
            assert [g if g[1] > g[0] else None for g in got] == \
                [r if r is not None and r[1] > r[0] else None for r in ref], (text, docs)
    prefix = _corpus(tmp_path / "one", 30, 40)
    job = _job({"path": prefix})
    one = split_samples(job.data, "train", 8, 1234)
    plain = GPTSamples(indexed.IndexedDataset(prefix), 8, 1234)
    assert all(np.array_equal(one.sample(p), plain.sample(p)) for p in range(0, 400, 7))


def test_split_cuts_documents_and_the_parts_do_not_overlap(tmp_path):
    prefix = _corpus(tmp_path / "c", 100, 30)
    job = _job({"path": prefix, "split": "80,10,10"}, eval_interval=5, eval_at_end=True)
    ds = indexed.IndexedDataset(prefix)
    windows = {}
    for split in ("train", "valid", "test"):
        s = split_samples(job.data, split, 8, 1234)
        (part,) = s.parts
        windows[split] = part.tokens
    assert windows["train"].size == 80 * 30 and windows["valid"].size == 10 * 30
    assert windows["test"].size == 10 * 30
    together = np.concatenate([windows[s] for s in ("train", "valid", "test")])
    assert np.array_equal(together, ds.tokens)       # contiguous, in order, no overlap


def test_bad_blends_are_refused_naming_the_field(tmp_path):
    a = _corpus(tmp_path / "a", 10, 40)
    cases = [({"blend": [{"path": a, "weight": 0}]}, "data.blend[0].weight: must be above 0"),
             ({"blend": [{"path": a, "weight": -2}]}, "data.blend[0].weight: must be above 0"),
             ({"path": a, "blend": [{"path": a}]}, "data.blend: give either"),
             ({"tokenizer": "byte"}, "data.path: missing"),
             ({"path": a, "split": "0,1,1"}, "data.split: '0,1,1': the training share"),
             ({"path": a, "split": "969,30,1", "valid_blend": [{"path": a}]},
              "data.split: give either")]
    for data, message in cases:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            _job(data)
    with pytest.raises(ConfigError, match=r"data.split: train.eval_interval is set but the split "
                                          r"'100,0,0' leaves no validation data"):
        _job({"path": a, "split": "100,0,0"}, eval_interval=10)
    with pytest.raises(ConfigError, match=r"data.valid_blend: train.eval_interval is set but "
                                          r"there is no validation data"):
        _job({"path": a}, eval_interval=10)
    with pytest.raises(ConfigError, match=r"data.test_blend: train.eval_at_end is set"):
        _job({"path": a, "valid_blend": [{"path": a}]}, eval_at_end=True)
    _job({"path": a, "valid_blend": [{"path": a}]}, eval_interval=3)       # fine


def test_submit_checks_refuse_missing_empty_and_unsplittable_corpora(tmp_path):
    a = _corpus(tmp_path / "a", 40, 40)
    one_doc = _corpus(tmp_path / "one", 1, 400)
    empty = _corpus(tmp_path / "empty", 0, 1)
    with pytest.raises(UsageError, match=r"data.blend\[1\].path: .*nope.bin does not exist"):
        check_data(_job({"blend": [{"path": a}, {"path": str(tmp_path / "nope")}]}))
    with pytest.raises(UsageError, match=r"data.blend\[1\].path: .*empty holds 0 tokens"):
        check_data(_job({"blend": [{"path": a}, {"path": empty}]}))
    with pytest.raises(UsageError, match=r"data.split: '969,30,1' leaves no validation "
                                         r"documents in any corpus"):
        check_data(_job({"path": one_doc, "split": "969,30,1"}, eval_interval=2))
    job = _job({"blend": [{"path": one_doc, "weight": 3}, {"path": a}], "split": "90,10,0"},
               eval_interval=2)
    check_data(job)                       # the one-document corpus trains, the other validates
    notes: list = []
    valid = split_samples(job.data, "valid", 8, 1, notes=notes)
    assert len(valid.parts) == 1 and valid.parts[0].dataset.prefix == a
    assert notes and "data.blend[0]" in notes[0] and "left out of the validation blend" in notes[0]
    train = split_samples(job.data, "train", 8, 1)
    assert np.allclose(train.weights, [0.75, 0.25])
    check_splits(job)


def test_metrics_kinds_are_read_apart(tmp_path):
    run = Run(tmp_path)
    records = [{"kind": "train", "step": 1, "loss": 5.0}, {"step": 2, "loss": 4.0},
               {"kind": "validation", "step": 2, "loss": 4.5},
               *({"kind": "train", "step": s, "loss": 3.0} for s in range(3, 2000)),
               {"kind": "test", "step": 2000, "loss": 4.1}]
    run.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert [r["step"] for r in run.metrics()][:3] == [1, 2, 3]
    assert run.metrics(kind="validation") == [records[2]]
    assert len(run.metrics(kind=None)) == len(records)
    assert run.latest_metrics()["step"] == 1999
    assert run.latest_metrics("validation") == records[2]      # far back: the tail read grows
    assert run.latest_metrics("test")["loss"] == 4.1


def test_validate_checks_the_splits_of_data_that_is_there(tmp_path):
    import yaml
    from tests.conftest import REPO, hpctrain
    one_doc = _corpus(tmp_path / "one", 1, 400)
    job = yaml.safe_load((REPO / "examples" / "tiny.yaml").read_text())
    job["data"] = {"path": one_doc, "split": "969,30,1"}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    proc = hpctrain("validate", str(tmp_path / "job.yaml"), "--profile", "local")
    assert proc.returncode == 2 and proc.stderr.startswith(
        "Error: data.split: '969,30,1' leaves no validation documents in any corpus"), proc.stderr
    job["data"] = {"path": str(tmp_path / "elsewhere"), "split": "969,30,1"}   # not mounted here
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    proc = hpctrain("validate", str(tmp_path / "job.yaml"), "--profile", "local")
    assert proc.returncode == 0, proc.stderr
