"""What each rank's forward step is fed (``runtime.batches``): every DP rank its own slice of
each global batch, step after step and after a resume elsewhere; TP rank 0 reads and its peer
receives the same rows; tokens and labels are the rows' two shifted views; the loss is the
masked token mean and the step's loss the mean over its microbatches."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from hpctrain.data import indexed
from hpctrain.data.gpt_dataset import GPTSamples
from hpctrain.runtime.batches import _MicrobatchOrder, loss_func, reads_data, step_loss
from tests.conftest import token_corpus


def corpus(path) -> str:
    """40 documents of 23 tokens below 251."""
    return token_corpus(path, 40, 23, stride=7, doc_shift=11, vocab=251)


def test_only_tp_rank_0_of_the_stages_that_use_data_reads():
    assert reads_data(0, True, False) and reads_data(0, False, True) and reads_data(0, True, True)
    assert not reads_data(0, False, False)          # a middle stage
    assert not reads_data(1, True, True)            # it receives from TP rank 0


@pytest.mark.parametrize("dp_size,micro", [(1, 2), (2, 2), (4, 1), (2, 4)])
def test_each_dp_rank_walks_its_own_slice_of_every_global_batch(dp_size, micro):
    layout = SimpleNamespace(global_batch_size=8, micro_batch_size=micro,
                             data_parallel_size=dp_size)
    per_rank = 8 // dp_size
    for consumed in (0, 24):                      # from the start, and resumed at step 3
        walks = []
        for dp in range(dp_size):
            order = iter(_MicrobatchOrder(consumed, layout, dp))
            walks.append([next(order) for _ in range(2 * per_rank // micro)])
        for step in range(2):
            start = consumed + 8 * step
            got = [p for dp in range(dp_size)
                   for mb in walks[dp][step * per_rank // micro:(step + 1) * per_rank // micro]
                   for p in mb]
            assert got == list(range(start, start + 8))     # the global batch, in rank order
        assert all(len(mb) == micro for w in walks for mb in w)


def test_the_loss_is_the_masked_token_mean_and_a_poisoned_one_is_nan():
    import torch
    output = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    loss, report = loss_func(mask, False, output)
    assert loss.item() == pytest.approx((1 + 3 + 6) / 3)
    assert report["loss"].item() == loss.item() and not report["loss"].requires_grad
    loss.mul_(0.5)                                  # the schedule divides the loss in place
    assert report["loss"].item() == pytest.approx(10 / 3)
    assert math.isnan(loss_func(mask, True, output)[0].item())
    reports = [{"loss": torch.tensor(v)} for v in (2.0, 4.0, 9.0)]
    assert step_loss(reports, 3).item() == pytest.approx(5.0)
    assert step_loss(reports, 5).item() == pytest.approx(3.0)
    assert step_loss([], 3) is None


def test_every_rank_is_fed_its_dp_slice_and_tp_peers_the_same_rows(tmp_path):
    """Four real ranks, TP2 × DP2 (``batches_probe.py``): two steps from sample 0, the second
    on the first's reader, then a resume at sample 296 (a new reader) and the step after it
    on that reader, with two model chunks, then back at sample 8 (a new reader again). Each
    rank's forward step got the rows of its DP rank's microbatches, in order; TP rank 1 read
    nothing and received what its TP rank 0 read; the CPU rehearsal reads in the rank (no
    worker processes). A stage that only embeds gets tokens and no labels, one that only
    scores the labels of the next microbatch, and a middle stage reads nothing."""
    from tests.launch import Launch
    from tests.runtime.conftest import _explain
    from tests.runtime.batches_probe import MICROBATCHES, SEQ, STAGES, STEPS
    from hpctrain.data.gpt_dataset import rank_microbatch_positions
    prefix = corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    out.mkdir()
    res = Launch(tmp_path, 4, module="tests.runtime.batches_probe",
                 args=[prefix, str(out)]).wait(600)
    assert res.ok, _explain(res)
    samples = GPTSamples(indexed.IndexedDataset(prefix), SEQ, 1234)
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(4)]
    assert sorted((r["dp"], r["tp"]) for r in ranks) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in ranks:
        want = []
        for consumed, _ in STEPS:
            for positions in rank_microbatch_positions(consumed, 8, r["dp"], 2, 2):
                want.append(np.stack([samples.sample(p) for p in positions]))
        assert len(r["seen"]) == len(want) == len(STEPS) * MICROBATCHES
        for seen, rows in zip(r["seen"], want):
            assert seen["tokens"] == rows[:, :-1].tolist()
            assert seen["labels"] == rows[:, 1:].tolist()
            assert seen["positions"] == list(range(SEQ))
        assert r["reads"] is (r["tp"] == 0)
        read = len(STEPS) * MICROBATCHES + 2          # and the two stages that use data
        assert r["microbatches_read"] == (read if r["tp"] == 0 else 0)
        first, second = rank_microbatch_positions(16, 8, r["dp"], 2, 2)
        rows = [np.stack([samples.sample(p) for p in mb]) for mb in (first, second)]
        embeds, scores, middle = r["stages"]
        assert (embeds["tokens"], embeds["labels"]) == (rows[0][:, :-1].tolist(), None)
        assert (scores["tokens"], scores["labels"]) == (None, rows[1][:, 1:].tolist())
        assert scores["positions"] is None and embeds["positions"] == list(range(SEQ))
        assert (middle["tokens"], middle["labels"], middle["positions"]) == (None, None, None)
        assert [s["read"] for s in r["stages"]] == ([1, 1, 0] if r["tp"] == 0 else [0, 0, 0])
        assert len(r["stages"]) == len(STAGES)
        assert r["num_workers"] == 0
        if r["tp"] == 0:
            # continued, moved on, continued, moved back
            assert r["same_reader"] == [False, True, False, True, False]
        assert [s["chunks"] for s in r["steps"]] == [1, 1, 1, 2, 1]
        for step, (consumed, _) in zip(r["steps"], STEPS):
            labels = [np.stack([samples.sample(p) for p in positions])[:, 1:]
                      for positions in rank_microbatch_positions(consumed, 8, r["dp"], 2, 2)]
            assert step["loss"] == pytest.approx(np.mean([m.mean() for m in labels]))


def test_in_an_interleaved_pipeline_only_the_chunks_that_use_data_read(tmp_path):
    """Six real ranks, PP3 × DP2 with two model chunks per stage (``batches_probe.py
    pipeline``): the first stage's first chunk gets the tokens of its DP rank's microbatches,
    the last stage's last chunk their labels, each read once; the middle stage has no reader
    at all and its chunks get nothing."""
    from tests.launch import Launch
    from tests.runtime.conftest import _explain
    from tests.runtime.batches_probe import MICROBATCHES, SEQ
    from hpctrain.data.gpt_dataset import rank_microbatch_positions
    prefix = corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    out.mkdir()
    res = Launch(tmp_path, 6, module="tests.runtime.batches_probe",
                 args=[prefix, str(out), "pipeline"]).wait(600)
    assert res.ok, _explain(res)
    samples = GPTSamples(indexed.IndexedDataset(prefix), SEQ, 1234)
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(6)]
    assert sorted((r["stage"], r["dp"]) for r in ranks) == [(s, d) for s in range(3)
                                                            for d in range(2)]
    for r in ranks:
        rows = [np.stack([samples.sample(p) for p in mb])
                for mb in rank_microbatch_positions(0, 8, r["dp"], 2, 2)]
        first, last = r["seen"]
        if r["stage"] == 1:
            assert not r["reads"] and r["iterators"] == [False, False]
            assert all(s["tokens"] is None and s["labels"] is None for s in first + last)
            assert r["microbatches_read"] == 0
            continue
        assert r["reads"] and r["microbatches_read"] == MICROBATCHES
        if r["stage"] == 0:
            assert [s["tokens"] for s in first] == [m[:, :-1].tolist() for m in rows]
            assert all(s["labels"] is None for s in first)
            assert all(s["tokens"] is None and s["labels"] is None for s in last)
        else:
            assert [s["labels"] for s in last] == [m[:, 1:].tolist() for m in rows]
            assert all(s["tokens"] is None for s in last)
            assert all(s["tokens"] is None and s["labels"] is None for s in first)
