"""torch's fused attention in real multi-rank megatron-core runs (TP2 on CPU/gloo): it trains
like megatron-core's unfused attention, the kernel that ran is in the log and result.json,
and checkpoints move between the two both ways (the fused attention holds no parameters).
Shares the session's corpus and initial weights (conftest.py)."""

from __future__ import annotations

import pytest

from tests.launch import launch
from tests.runtime.conftest import _explain
from tests.runtime.helpers import losses, result
from tests.runtime.test_megatron_training import _copy_checkpoint

pytestmark = pytest.mark.megatron
# the same math in another summation order, over 12 steps of a model that learns fast (fp32)
REL = 1e-4
UNFUSED = {"attention_backend": "local"}


def _close(a: dict, b: dict, steps) -> None:
    for s in steps:
        assert a[s] == pytest.approx(b[s], rel=REL), (s, a[s], b[s])


@pytest.fixture(scope="module")
def pair(ws):
    """The same TP2 job, once with each attention, a checkpoint at step 6."""
    ckpt = {"interval_steps": 6}
    fused, _ = ws.train("tp2-fused", "tp2", checkpoint=ckpt)
    unfused, _ = ws.train("tp2-unfused", "tp2", checkpoint=ckpt, model=UNFUSED)
    return fused, unfused


def test_tp2_with_fused_attention_trains_like_the_unfused_attention(pair):
    fused, unfused = pair
    _close(losses(fused), losses(unfused), range(1, 13))
    layers = result(fused, 1)["layers"]
    assert layers["core_attention"] == "torch_sdpa" and layers["sdpa_kernels"] == ["flash", "math"]
    assert layers["attention_in_use"] == "torch sdpa flash (tried flash,math)"
    assert result(unfused, 1)["layers"]["attention_in_use"] == "local (megatron-core unfused)"
    log = (fused.path / "launch" / "rank-0.out").read_text()
    assert "attention: torch sdpa flash (tried flash,math) at the first forward (b=2, " \
           "heads=2/2, s=32, d=16, float32, dropout 0.0)" in log


@pytest.mark.parametrize("saved_by, resumed_with", [("unfused", "fused"), ("fused", "unfused")])
def test_a_checkpoint_of_one_attention_resumes_with_the_other(ws, pair, saved_by, resumed_with):
    fused, unfused = pair
    source = {"fused": fused, "unfused": unfused}[saved_by]
    run = ws.new_run(f"tp2-{saved_by}-to-{resumed_with}", "tp2",
                     **({"model": UNFUSED} if resumed_with == "unfused" else {}))
    _copy_checkpoint(source, 6, run)
    res = launch(run.path, 2)
    assert res.codes == [0, 0], _explain(res)
    assert result(run, 1)["start_step"] == 6
    # from the same state at step 6, the other attention continues the same training
    _close(losses(run), losses(source), range(7, 13))
