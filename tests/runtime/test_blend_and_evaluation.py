"""A two-corpus blend with a validation split, trained by real megatron-core in 4 processes:
the same global batches and validation loss on TP2×PP2×VPP2 and on DP4, evaluation that
leaves training bit for bit unchanged, and a preemption in the middle of an evaluation that
loses no training work (the resumed attempt evaluates again and ends on the uninterrupted
run's weights), and a time limit that comes near during an evaluation stops it in time."""

from __future__ import annotations

import signal
import time

import pytest

from hpctrain import exit_codes
from hpctrain.record import checkpoint_store as store
from tests.conftest import REPO, hpctrain, wait_until
from tests.launch import Launch, launch
from tests.runtime.conftest import _explain
from tests.runtime.helpers import losses, result

pytestmark = pytest.mark.megatron
TOL = 1e-5
EVAL = {"eval_interval": 4, "eval_iters": 2, "eval_at_end": True}


@pytest.fixture(scope="module")
def blend(ws):
    """The example's two corpora, 70/30, split 90/5/5 by documents."""
    docs = ws.root / "data" / "python_docs_byte"
    if not (docs.parent / "python_docs_byte.idx").exists():
        proc = hpctrain("data", "prepare", str(REPO / "examples" / "corpus" /
                                                  "python_docs.txt.gz"), "--output", str(docs))
        assert proc.returncode == 0, proc.stderr
    return {"path": None, "split": "90,5,5",
            "blend": [{"path": str(ws.data), "weight": 0.7}, {"path": str(docs), "weight": 0.3}]}


def _train(ws, name, layout, blend, train=None, env=None, expect=0):
    run = ws.new_run(name, layout, data=blend, train=dict(train or {}),
                     checkpoint={"interval_steps": 6})
    res = launch(run.path, 4, env=env)
    assert res.codes == [expect] * 4, _explain(res)
    return run, res


def _evals(run, kind="validation") -> dict[int, float]:
    return {r["step"]: r["loss"] for r in run.metrics(kind=kind)}


@pytest.fixture(scope="module")
def evaluated(ws, blend):
    """The uninterrupted blend run with evaluation, TP2×PP2×VPP2."""
    return _train(ws, "blend-eval-tp2pp2vpp2", "tp2pp2vpp2", blend, EVAL)


def test_blend_layouts_see_the_same_batches_and_validation_loss(ws, blend, evaluated):
    run, res = evaluated
    assert "data: training" in res.output(0) and "python_docs_byte (0.3" in res.output(0)
    other, _ = _train(ws, "blend-eval-dp4", "dp4", blend, EVAL)
    a, b = losses(run), losses(other)
    assert sorted(a) == sorted(b) == list(range(1, 13))
    assert max(abs(a[s] - b[s]) for s in a) < TOL, (a, b)
    va, vb = _evals(run), _evals(other)
    assert sorted(va) == [4, 8, 12] and sorted(vb) == [4, 8, 12]
    assert max(abs(va[s] - vb[s]) for s in va) < TOL, (va, vb)
    assert va[12] < va[4]                                   # the model learns held-out text
    ta, tb = _evals(run, "test"), _evals(other, "test")
    assert sorted(ta) == [12] and abs(ta[12] - tb[12]) < TOL
    rec = run.metrics(kind="validation")[0]
    assert rec["iters"] == 2 and rec["samples"] == 32 and rec["attempt"] == 1
    assert "validation loss" in res.output(0)


def test_evaluation_leaves_training_bit_for_bit_unchanged(ws, blend, evaluated):
    run, _ = evaluated
    plain, _ = _train(ws, "blend-no-eval", "tp2pp2vpp2", blend)
    assert losses(plain) == losses(run)                                    # bitwise
    assert result(plain, 1)["weights_digest"] == result(run, 1)["weights_digest"]
    assert plain.metrics(kind="validation") == []


def test_preemption_or_deadline_during_evaluation_saves_the_step_and_evaluates_again(ws, blend, evaluated):
    ref, _ = evaluated
    run = ws.new_run("blend-eval-preempted", "tp2pp2vpp2", data=blend, train=dict(EVAL),
                     checkpoint={"interval_steps": 6})
    env = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "77",
           "HPCTRAIN_TEST_HOLD_IN_EVAL_AT_STEP": "8"}   # held in the evaluation after step 8
    first = Launch(run.path, 4, env=env)
    wait_until(lambda: any(m["step"] >= 8 for m in run.metrics()), timeout=300,
               what="step 8")                     # its agreement done: now evaluating
    first.signal_rank(3, signal.SIGUSR1)
    (run.path / "hold-release").touch()
    res = first.wait(300)
    assert res.codes == [exit_codes.LOCAL_REQUEUE] * 4, _explain(res)
    r1 = result(run, 1)
    assert r1["exit_reason"] == "preempted" and "during evaluation" in r1["message"]
    assert r1["end_step"] == 8 and r1["checkpoint_saved"].endswith(store.step_name(8))
    assert sorted(_evals(run)) == [4]                  # the evaluation of step 8 was cut short
    (run.path / "hold-release").unlink()

    # the next attempt starts with the time limit already within the save's lead: its
    # evaluation of step 8 stops after the first of its two batches instead of eating it
    near = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "77",
            "HPCTRAIN_DEADLINE": str(time.time() + 5)}
    res = launch(run.path, 4, env=near)
    assert res.codes == [exit_codes.PREEMPTED] * 4, _explain(res)   # no progress: no requeue
    r2 = result(run, 2)
    assert r2["exit_reason"] == "deadline" and "during evaluation" in r2["message"]
    assert r2["start_step"] == r2["end_step"] == 8 and not r2["checkpoint_saved"]
    assert "validation stopped by the time limit" in res.output(0)
    assert sorted(_evals(run)) == [4]

    res = launch(run.path, 4, env={"SUBMITIT_EXECUTOR": "local"})
    assert res.codes == [0] * 4, _explain(res)
    r3 = result(run, 3)
    assert r3["start_step"] == 8 and r3["exit_reason"] == "finished"
    again = [r for r in run.metrics(kind="validation") if r["attempt"] == 3]
    assert [r["step"] for r in again] == [8, 12]       # evaluated again, then on schedule
    assert _evals(run) == _evals(ref)                  # the same samples, the same loss
    assert losses(run) == losses(ref)                  # next sample of every corpus: bitwise
    assert r3["weights_digest"] == result(ref, 1)["weights_digest"]
