"""The data-stream fingerprint a checkpoint records (``data.fingerprint``): every setting that
gives a saved data position another meaning is refused on resume, naming its field and the fix;
a change that keeps the meaning (batch sizes, steps, the learning rate, the data moved to another
folder) is accepted; changed evaluation corpora are a note; a checkpoint saved before
fingerprints were recorded is accepted, and a record that is not a fingerprint is refused as
damaged; an acceptance recorded for a checkpoint lets it load."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hpctrain.config import job_from_mapping
from hpctrain.data import index_header, indexed
from hpctrain.data.fingerprint import (change_accepted, corpus_shape, data_changes,
                                       data_fingerprint, evaluation_note, resume_problem,
                                       well_formed)
from hpctrain.data.order import FEISTEL
from tests.conftest import token_corpus

FIX = ("resume with the saved data settings, or accept the change with `hpctrain resume run-1 "
       "--accept-data-change`")


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
    return resume_problem(data_fingerprint(saved_job, FEISTEL), now_job, "step-00000040", 10240,
                          "run-1")


def test_the_shape_of_a_corpus_comes_from_its_index_header_and_the_bin_size(corpora):
    ds = indexed.IndexedDataset(corpora["a"])
    assert corpus_shape(corpora["a"]) == {"documents": ds.num_documents, "tokens": ds.num_tokens}
    assert corpus_shape(corpora["folder"] / "missing") is None    # not on this machine
    # a link to a corpus (a shared data folder) is read through
    for suffix in (".bin", ".idx"):
        link = corpora["folder"] / f"linked{suffix}"
        if not link.exists():
            link.symlink_to(corpora["a"] + suffix)
    assert corpus_shape(corpora["folder"] / "linked") == corpus_shape(corpora["a"])
    # what cannot be read is unknown, never an error: a header that is not one, a lost .bin
    (corpora["folder"] / "garbage.idx").write_bytes(b"not an index at all, no" * 3)
    (corpora["folder"] / "garbage.bin").write_bytes(b"")
    assert corpus_shape(corpora["folder"] / "garbage") is None
    shutil.copy(corpora["a"] + ".idx", corpora["folder"] / "lonely.idx")
    assert corpus_shape(corpora["folder"] / "lonely") is None
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


def _with_valid(corpora, valid, test=None):
    j = job(corpora, data__split=None)
    data = {**_mapping(j)["data"], "valid_blend": [
        {"path": corpora[c], "weight": w} for c, w in valid]}
    if test:
        data["test_blend"] = [{"path": corpora[c], "weight": w} for c, w in test]
    return job_from_mapping({**_mapping(j), "data": data}, "fp.yaml")


def test_changed_evaluation_corpora_are_a_note_not_a_refusal(corpora):
    """The training position keeps its meaning; the losses measured on another set do not
    continue the curve, as when eval_iters or the global batch size change the set."""
    saved = data_fingerprint(_with_valid(corpora, (("c", 1.0),)), FEISTEL)

    def note(now):
        assert resume_problem(saved, now, "step-00000040", 10240, "run-1") is None
        return evaluation_note(saved, now, "step-00000040")
    assert note(_with_valid(corpora, (("c", 2.0),))) is None       # the same set
    assert note(_with_valid(corpora, (("b", 1.0),))) == (
        "data.valid_blend: changed since checkpoint step-00000040 (valid corpus 0: 40 documents, "
        "2440 tokens -> 30 documents, 1500 tokens): the evaluation losses from here on do not "
        "continue the run's curve")
    assert note(_with_valid(corpora, (("c", 1.0), ("b", 1.0)))) == (
        "data.valid_blend: changed since checkpoint step-00000040 (valid 1 -> 2 corpora): the "
        "evaluation losses from here on do not continue the run's curve")
    assert note(_with_valid(corpora, (("c", 1.0),), test=(("a", 1.0),))) == (
        "data.test_blend: changed since checkpoint step-00000040 (test set from the split -> "
        "its own corpora): the evaluation losses from here on do not continue the run's curve")
    assert evaluation_note(None, _with_valid(corpora, (("b", 1.0),)), "step-1") is None
    # a training change beside it: refused, the note still says what else changed
    other_seed = _with_valid(corpora, (("b", 1.0),))
    other_seed = job_from_mapping({**_mapping(other_seed), "train": {
        **_mapping(other_seed)["train"], "seed": 5}}, "fp.yaml")
    assert resume_problem(saved, other_seed, "step-00000040", 10240, "run-1").startswith(
        "train.seed: changed since checkpoint step-00000040 (seed 1234 -> 5)")
    assert evaluation_note(saved, other_seed, "step-00000040").startswith("data.valid_blend: ")


@pytest.mark.parametrize("damage", [
    lambda r: 5, lambda r: [r], lambda r: {**r, "corpora": 5},
    lambda r: {**r, "corpora": [5]}, lambda r: {**r, "corpora": r["corpora"][:1] + [{}]},
    lambda r: {k: v for k, v in r.items() if k != "corpora"},
    lambda r: {**r, "corpora": [{**r["corpora"][0], "weight": "x"}]},
    lambda r: {**r, "corpora": [{**r["corpora"][0], "weight": float("nan")}]},
    lambda r: {**r, "corpora": [{**r["corpora"][0], "weight": float("inf")}]},
    lambda r: {**r, "corpora": [{**r["corpora"][0], "weight": True}]},
    lambda r: {**r, "corpora": [{**r["corpora"][0], "documents": -1}]},
    lambda r: {**r, "corpora": [{**r["corpora"][0], "tokens": 1.5}]},
    lambda r: {**r, "split": 5}, lambda r: {**r, "split": ["a"]},
    lambda r: {**r, "seed": "1234"}, lambda r: {**r, "seq_length": None},
    lambda r: {**r, "order": 5}, lambda r: {**r, "valid_blend": 5},
    lambda r: {**r, "test_blend": [{"weight": 1}]},
])
def test_a_record_that_is_not_a_fingerprint_is_refused_as_damaged_in_one_line(corpora, damage):
    record = damage(data_fingerprint(job(corpora), FEISTEL))
    assert not well_formed(record)
    problem = resume_problem(record, job(corpora), "step-00000040", 10240, "run-1")
    assert problem.startswith("checkpoint step-00000040: its manifest's data record is damaged "
                              "(not a data fingerprint: ") and problem.endswith(FIX), problem
    assert "\n" not in problem
    assert evaluation_note(record, job(corpora), "step-00000040") is None


def test_a_fingerprint_and_its_later_additions_are_well_formed(corpora):
    record = data_fingerprint(_with_valid(corpora, (("c", 1.0),), test=(("a", 1.0),)), FEISTEL)
    assert well_formed(record) and well_formed({**record, "added_later": [1]})
    assert well_formed({**record, "split": None, "order": None})
    gone = {**record, "corpora": [{"documents": None, "tokens": None, "weight": 1.0}]}
    assert well_formed(gone)


def test_an_acceptance_names_the_checkpoint_it_was_given_for():
    events = [{"event": "resume"}, {"event": "data_change_accepted", "checkpoint": "step-00000040"}]
    assert change_accepted(events, "step-00000040")
    assert not change_accepted(events, "step-00000060")
    assert not change_accepted([{"event": "data_change_accepted", "checkpoint": "step-00000060"}],
                               "step-00000040")                   # another checkpoint's
    for other in ("resume", "cancel", "data_change"):      # an event of another name
        assert not change_accepted([{"event": other, "checkpoint": "step-00000040"}],
                                   "step-00000040")
    assert not change_accepted([], "step-00000040")


def _mapping(j) -> dict:
    from hpctrain.config.schema import to_dict
    return to_dict(j)


def test_a_checkpoint_without_a_fingerprint_is_accepted_and_a_missing_corpus_is_not_compared(
        corpora):
    assert resume_problem(None, job(corpora, train__seed=9), "step-00000040", 10240,
                          "run-1") is None
    saved = data_fingerprint(job(corpora), FEISTEL)
    # this machine cannot read the data: shapes unknown, the weights still compared
    gone = job(corpora, blend=(("/nowhere/a", 0.5), ("/nowhere/b", 0.5)))
    assert resume_problem(saved, gone, "step-00000040", 10240, "run-1") is None
    assert "weights 0.5/0.5 -> 0.25/0.75" in resume_problem(
        saved, job(corpora, blend=(("/nowhere/a", 1), ("/nowhere/b", 3))), "step-00000040", 10240,
        "run-1")
    # a corpus whose shape the checkpoint did not know (saved where it could not be read)
    unknown = {**saved, "corpora": [{**c, "documents": None, "tokens": None}
                                    for c in saved["corpora"]]}
    assert resume_problem(unknown, job(corpora), "step-00000040", 10240, "run-1") is None
    # where the position is not a count, the message does without it
    assert "(seed 1234 -> 9): its data position would skip" in resume_problem(
        saved, job(corpora, train__seed=9), "step-00000040", None, "run-1")


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


def test_a_single_corpus_is_named_by_its_own_field(corpora):
    def single(path):
        return job_from_mapping(
            {**_mapping(job(corpora)), "data": {"path": corpora[path], "split": "90,5,5"}},
            "fp.yaml")
    saved = data_fingerprint(single("a"), FEISTEL)
    assert saved["corpora_field"] == "data.path"
    problem = resume_problem(saved, single("c"), "step-00000040", 10240, "run-1")
    assert problem.startswith("data.path: changed since checkpoint step-00000040 (corpus 0: "), \
        problem


def test_keys_one_side_lacks_are_not_compared_and_each_evaluation_set_is_named(corpora):
    """An older record without the evaluation sets compares what it has; a record whose
    validation and test sets both changed names both."""
    saved = data_fingerprint(_with_valid(corpora, (("c", 1.0),)), FEISTEL)
    older = {k: v for k, v in saved.items() if k not in ("valid_blend", "test_blend", "split")}
    assert data_changes(older, saved) == [] and data_changes(saved, older) == []
    now = {**saved, "valid_blend": None,
           "test_blend": [{"documents": 1, "tokens": 9, "weight": 1.0}]}
    assert [f for f, _ in data_changes(saved, now)] == ["data.valid_blend", "data.test_blend"]
    both = {**saved, "valid_blend": [{"documents": 1, "tokens": 9, "weight": 1.0}],
            "test_blend": [{"documents": 1, "tokens": 9, "weight": 1.0}]}
    assert [f for f, _ in data_changes(saved, both)] == ["data.valid_blend", "data.test_blend"]
