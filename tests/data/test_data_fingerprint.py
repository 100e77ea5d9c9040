"""The data-stream fingerprint a checkpoint records (``data.fingerprint``): every setting that
gives a saved data position another meaning is refused on resume, naming its field and the fix;
a change that keeps the meaning (batch sizes, steps, the learning rate, the data moved to another
folder) is accepted; a checkpoint saved before fingerprints were recorded is accepted."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hpctrain.config import job_from_mapping
from hpctrain.data import index_header, indexed
from hpctrain.data.fingerprint import corpus_shape, data_changes, data_fingerprint, resume_problem
from hpctrain.data.order import FEISTEL
from tests.conftest import token_corpus

FIX = ("resume with the saved data settings, or start a new run from its weights with "
       "train.init_from")


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("fingerprint")
    return {"a": token_corpus(tmp / "a", 40, 60), "b": token_corpus(tmp / "b", 30, 50),
            "c": token_corpus(tmp / "c", 40, 61), "folder": tmp}


def job(corpora: dict, blend=(("a", 0.5), ("b", 0.5)), **changes):
    """A job over a blend of the test corpora; ``changes``: ``section.key`` -> value."""
    mapping = {"name": "fp",
               "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                         "vocab_size": 256, "seq_length": 32},
               "batch": {"micro_batch_size": 2, "global_batch_size": 16},
               "train": {"steps": 40, "lr": 3e-3, "seed": 1234},
               "data": {"blend": [{"path": corpora[c] if c in corpora else c, "weight": w}
                                  for c, w in blend], "split": "90,5,5"}}
    for key, value in changes.items():
        section, name = key.split("__")
        mapping[section][name] = value
    return job_from_mapping(mapping, "fp.yaml")


def refusal(saved_job, now_job) -> str | None:
    return resume_problem(data_fingerprint(saved_job, FEISTEL), now_job, "step-00000040", 10240)


def test_the_shape_of_a_corpus_comes_from_its_index_header_and_the_bin_size(corpora):
    ds = indexed.IndexedDataset(corpora["a"])
    assert corpus_shape(corpora["a"]) == {"documents": ds.num_documents, "tokens": ds.num_tokens}
    assert corpus_shape(corpora["folder"] / "missing") is None    # not on this machine
    # the header's dtype codes are the reader's
    assert {k: np.dtype(v).itemsize for k, v in indexed.DTYPES.items()} == \
        index_header.ITEMSIZES


def test_the_same_settings_resume(corpora):
    assert refusal(job(corpora), job(corpora)) is None


@pytest.mark.parametrize("changes", [
    {"batch__global_batch_size": 32}, {"batch__micro_batch_size": 4}, {"train__steps": 80},
    {"train__lr": 1e-3}, {"data__split": "900,50,50"},         # the same shares
])
def test_changes_that_keep_the_position_meaning_are_accepted(corpora, changes):
    assert refusal(job(corpora), job(corpora, **changes)) is None


def test_data_moved_to_another_folder_resumes(corpora, tmp_path):
    for suffix in (".bin", ".idx"):
        shutil.copy(corpora["a"] + suffix, tmp_path / f"moved{suffix}")
    assert refusal(job(corpora), job(corpora, blend=((str(tmp_path / "moved"), 0.5),
                                                     ("b", 0.5)))) is None


@pytest.mark.parametrize("blend, changes, field, how", [
    ((("a", 0.9), ("b", 0.1)), {}, "data.blend", "weights 0.5/0.5 -> 0.9/0.1"),
    ((("a", 0.5), ("c", 0.5)), {}, "data.blend",
     "corpus 1: 30 documents, 1500 tokens -> 40 documents, 2440 tokens"),
    ((("b", 0.5), ("a", 0.5)), {}, "data.blend",
     "corpus 0: 40 documents, 2400 tokens -> 30 documents, 1500 tokens"),
    ((("a", 1.0),), {}, "data.blend", "2 -> 1 corpora"),
    (None, {"data__split": "80,10,10"}, "data.split", "split 0.9,0.05,0.05 -> 0.8,0.1,0.1"),
    (None, {"train__seed": 7}, "train.seed", "seed 1234 -> 7"),
    (None, {"model__seq_length": 64}, "model.seq_length", "seq length 32 -> 64"),
])
def test_a_change_of_what_the_position_means_is_refused_naming_the_field(corpora, blend, changes,
                                                                          field, how):
    now = job(corpora, **({"blend": blend} if blend else {}), **changes)
    moved = " and documents would move between training and evaluation" \
        if field == "data.split" else ""
    assert refusal(job(corpora), now) == (
        f"{field}: changed since checkpoint step-00000040 ({how}): position 10240 would skip or "
        f"repeat samples{moved}; {FIX}")


def test_one_corpus_changed_for_another_and_the_split_dropped_are_named(corpora):
    saved = job(corpora, blend=(("a", 1.0),))
    mapping_now = job(corpora, blend=(("c", 1.0),), data__split=None)
    problem = refusal(saved, mapping_now)
    assert problem.startswith("data.blend, data.split: changed since checkpoint step-00000040 "
                              "(corpus 0: 40 documents, 2400 tokens -> 40 documents, 2440 "
                              "tokens; split 0.9,0.05,0.05 -> none): ")
    assert "\n" not in problem


def test_separate_validation_corpora_are_part_of_the_fingerprint(corpora):
    def with_valid(valid):
        j = job(corpora, data__split=None)
        return job_from_mapping({**_mapping(j), "data": {**_mapping(j)["data"], "valid_blend": [
            {"path": corpora[c], "weight": w} for c, w in valid]}}, "fp.yaml")
    assert refusal(with_valid((("c", 1.0),)), with_valid((("c", 2.0),))) is None
    assert refusal(with_valid((("c", 1.0),)), with_valid((("b", 1.0),))) == (
        "data.valid_blend: changed since checkpoint step-00000040 (valid corpus 0: 40 documents, "
        "2440 tokens -> 30 documents, 1500 tokens): the evaluation losses would not continue "
        f"the run's; {FIX}")


def _mapping(j) -> dict:
    from hpctrain.config.schema import to_dict
    return to_dict(j)


def test_a_checkpoint_without_a_fingerprint_is_accepted_and_a_missing_corpus_is_not_compared(
        corpora):
    assert resume_problem(None, job(corpora, train__seed=9), "step-00000040", 10240) is None
    saved = data_fingerprint(job(corpora), FEISTEL)
    # this machine cannot read the data: shapes unknown, the weights still compared
    gone = job(corpora, blend=(("/nowhere/a", 0.5), ("/nowhere/b", 0.5)))
    assert resume_problem(saved, gone, "step-00000040", 10240) is None
    assert "weights 0.5/0.5 -> 0.25/0.75" in resume_problem(
        saved, job(corpora, blend=(("/nowhere/a", 1), ("/nowhere/b", 3))), "step-00000040", 10240)


@settings(max_examples=60, deadline=None)
@given(weights=st.lists(st.floats(min_value=1e-3, max_value=1e3), min_size=2, max_size=2),
       factor=st.floats(min_value=1e-3, max_value=1e3))
def test_weights_scaled_by_any_positive_factor_mean_the_same_position(corpora, weights, factor):
    saved = data_fingerprint(job(corpora, blend=tuple(zip("ab", weights))), FEISTEL)
    now = data_fingerprint(job(corpora, blend=tuple(zip("ab", (w * factor for w in weights)))),
                           FEISTEL)
    assert data_changes(saved, now) == []


FIELDS = {"seed": ("train__seed", 99, "train.seed"),
          "seq_length": ("model__seq_length", 48, "model.seq_length"),
          "split": ("data__split", "70,20,10", "data.split"),
          "weights": ("blend", (("a", 0.2), ("b", 0.8)), "data.blend"),
          "corpus": ("blend", (("a", 0.5), ("c", 0.5)), "data.blend")}


@settings(max_examples=30, deadline=None)
@given(chosen=st.sets(st.sampled_from(sorted(FIELDS)), min_size=1))
def test_every_changed_field_is_named_and_no_other(corpora, chosen):
    changes = {FIELDS[name][0]: FIELDS[name][1] for name in chosen}
    if "weights" in chosen and "corpus" in chosen:
        changes["blend"] = (("a", 0.2), ("c", 0.8))
    problem = refusal(job(corpora), job(corpora, **changes))
    named = problem.split(": changed since")[0].split(", ")
    assert set(named) == {FIELDS[name][2] for name in chosen}
