"""The validation and test loss (``runtime.evaluation``) on real megatron-core models, from
the evaluator the runtime builds (``evaluation_probe.py``): the loss is the mean token loss of
the first ``eval_iters`` global batches of the split, the same on one rank as on TP2 × PP2 ×
VPP2 and on PP2 × VPP2 × DP2 (one reporting rank per DP replica), the same at every call (eval
mode: dropout off; the models back in training mode after). A preemption signal on any rank
stops it on every rank after the batch under way; rank 0's time limit does the same, or, near
only after the last batch, lets the loss count. Only a complete evaluation is recorded."""

from __future__ import annotations

import json

import pytest

from tests.conftest import token_corpus
from tests.runtime.evaluation_probe import BATCH, HOLD_S, STEP, TRAIN

pytestmark = pytest.mark.megatron
# each layout, and how many ranks report a loss: one per DP replica (TP rank 0, last stage)
LAYOUTS = {"tp2pp2vpp2": 1, "pp2vpp2dp2_zero1": 2}
ITERS = TRAIN["eval_iters"]
SAMPLES = ITERS * BATCH["global_batch_size"]        # what one evaluation reads


def _probe(tmp_path, world: int, layouts) -> dict:
    from tests.launch import Launch
    from tests.runtime.conftest import _explain
    # 200 documents: the validation and test splits hold about 14 samples each, so the first
    # global batches of 8 differ (with fewer, every batch would hold the same few samples)
    prefix = token_corpus(tmp_path / "corpus", 200, 23, stride=7, doc_shift=11, vocab=251)
    out = tmp_path / "out"
    out.mkdir()
    res = Launch(tmp_path, world, module="tests.runtime.evaluation_probe",
                 args=[prefix, str(out), *layouts]).wait(600)
    assert res.ok, _explain(res)
    return {name: [json.loads((out / f"{name}-rank-{r}.json").read_text()) for r in range(world)]
            for name in layouts}


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory) -> dict:
    return _probe(tmp_path_factory.mktemp("eval-one"), 1, ["single"])["single"][0]


def _batches(n: int, kind: str = "validation") -> list:
    """What the watchdog hears and the test hook sees in ``n`` batches of an evaluation."""
    out = []
    for i in range(n):
        out.append(["progress", f"{kind} batch {i + 1}/{ITERS}"])
        if i == 0:
            out.append(["hold", STEP])
    return out


def _said(case: dict) -> list[str]:
    """What the evaluation logged (not the model's own lines, such as the attention kernel's)."""
    return [line for line in case["log"] if line.startswith(f"step {STEP}:")]


def _check_rank(seen: dict, reference: dict, last_stage: int) -> None:
    """Every case of one rank against the one-rank reference losses."""
    plain = seen["plain"]
    assert plain["loss"] == pytest.approx(reference["validation"], rel=1e-5, abs=0)
    assert plain["kind"] == "validation" and plain["iters"] == ITERS
    assert plain["stopped_by"] is None and plain["asked"] == []
    assert plain["calls"] == _batches(ITERS) + [["record_eval", "validation", STEP,
                                                 plain["loss"], ITERS, SAMPLES]]
    assert seen["again"]["loss"] == plain["loss"]                  # bit for bit
    test = seen["test"]
    assert test["loss"] == pytest.approx(reference["test"], rel=1e-5, abs=0)
    assert test["calls"] == _batches(ITERS, "test") + [["record_eval", "test", STEP,
                                                       test["loss"], ITERS, SAMPLES]]
    # a signal on the last rank only: every rank stops after the first batch, nothing recorded;
    # rank 0's log says what stopped it
    for case, why, said in (("signal", "signal", "a preemption signal"),
                            ("deadline_mid", "deadline", "the time limit")):
        cut = seen[case]
        assert (cut["loss"], cut["stopped_by"]) == (None, why), case
        assert cut["calls"] == _batches(1), case
        assert _said(cut) == ([f"step {STEP}: validation stopped by {said}"]
                              if seen["rank"] == 0 else []), case
    assert _said(plain) == _said(seen["deadline_last"]) == []
    # near from the second batch on: every rank stops after it
    second = seen["deadline_second"]
    assert (second["loss"], second["stopped_by"]) == (None, "deadline")
    assert second["calls"] == _batches(2)
    # only rank 0's clock is asked, with the slowest batch so far (the first: it holds),
    # a time no longer than the evaluation had taken then, and with None after the last
    # batch (the trainer then reserves a training step: test_training_loop)
    mid, last = seen["deadline_mid"]["asked"], seen["deadline_last"]["asked"]
    if seen["rank"] == 0:
        assert len(mid) == 1 and HOLD_S <= mid[0] <= seen["deadline_mid"]["asked_at"][0]
        assert len(last) == ITERS and last[-1] is None
        for asked, at in zip(last[:-1], seen["deadline_last"]["asked_at"]):
            assert HOLD_S <= asked <= at
        assert last[:-1] == sorted(last[:-1])          # the slowest so far: never less
        assert len(second["asked"]) == 2
    else:
        assert mid == last == second["asked"] == seen["deadline_elsewhere"]["asked"] == []
    near = seen["deadline_last"]            # complete: the loss counts, then the trainer stops
    assert (near["loss"], near["stopped_by"]) == (plain["loss"], "deadline")
    assert near["calls"] == plain["calls"]
    elsewhere = seen["deadline_elsewhere"]
    assert (elsewhere["loss"], elsewhere["stopped_by"]) == (plain["loss"], None)
    for case in ("plain", "again", "test", "signal", "deadline_mid", "deadline_second",
                 "deadline_last", "deadline_elsewhere"):
        assert all(seen[case]["training_after"]), case              # back in training mode
        assert not seen[case]["reader_left"], case                  # its reader closed
    assert seen["kinds"] == ["test", "validation"]
    # rank 0 says what each evaluation reads
    said = [line.split(" ")[:2] for line in seen["built_log"] if line.startswith("data:")]
    assert said == ([["data:", "validation"], ["data:", "test"]] if seen["rank"] == 0 else [])
    assert seen["due"] == [False, True, False, True, False, True]    # every eval_interval steps
    assert seen["reports_loss"] is (seen["stage"] == last_stage and seen["tp"] == 0)
    assert seen["filled"] > 0


def test_one_rank_s_loss_is_the_mean_token_loss_of_the_split_s_first_batches(one_rank):
    seen = {**one_rank, "rank": 0}
    reference = {"validation": seen["reference_validation"], "test": seen["reference_test"]}
    _check_rank(seen, reference, last_stage=0)
    assert seen["reference_validation"] != seen["reference_test"]
    # a job that evaluates nothing has no evaluator; one with a test at the end only is
    # never due for validation
    assert seen["none"] is None
    assert seen["released"] == [False, True, True]   # the release file, the flag file
    assert seen["test_only"] == {"kinds": ["test"], "due": [False] * 6}


def test_every_layout_gives_one_rank_s_loss_and_stops_together(tmp_path, one_rank):
    reference = {"validation": one_rank["reference_validation"],
                 "test": one_rank["reference_test"]}
    layouts = _probe(tmp_path, 4, LAYOUTS)
    for name, ranks in layouts.items():
        for rank, seen in enumerate(ranks):
            try:
                _check_rank({**seen, "rank": rank}, reference, last_stage=1)
            except AssertionError as e:
                raise AssertionError(f"{name}, rank {rank}: {e}") from e
        # one loss for every rank: the all-reduced sum over one reporter per DP replica
        assert len({r["plain"]["loss"] for r in ranks}) == 1, name
        assert sum(r["reports_loss"] for r in ranks) == LAYOUTS[name], name
