"""Megatron-LM's GPU performance settings, run for real on CPU/gloo: the overlapped
communication trains exactly like the plain path, each pipeline stage draws its own initial
weights, and data is read once per TP group, only by the stages that use it, in worker
processes when asked. Shares the session's corpus and initial weights (conftest.py)."""

from __future__ import annotations

import json
import re
import signal

import pytest

from hpctrain import exit_codes
from hpctrain.record import checkpoint_store as store
from tests.conftest import wait_until
from tests.launch import Launch, launch
from tests.runtime.conftest import _explain
from tests.runtime.helpers import losses, result

pytestmark = pytest.mark.megatron
TOL = 1e-5


def _max_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(abs(a[s] - b[s]) for s in a)


def _reads(run, world: int) -> dict[str, int]:
    """'TP rank t, pipeline stage p' -> microbatches that rank read (from the rank logs)."""
    out = {}
    for r in range(world):
        text = (run.path / "launch" / f"rank-{r}.out").read_text()
        m = re.search(r"data: (\d+) microbatches read by this rank \(([^)]*)\)", text)
        assert m, text[-2000:]
        out[m.group(2)] = int(m.group(1))
    return out


def test_overlapped_gradient_reduction_trains_bitwise_like_reduction_after_backward(ws):
    on, res = ws.train("overlap-on", "single", world=2, parallel={"ddp_bucket_size": 20000})
    log = res.output(0)
    m = re.search(r"gradient reduction overlapped \((\d+) buckets of up to 20,000 parameters\)", log)
    assert m and int(m.group(1)) > 1, log[-3000:]
    off, res = ws.train("overlap-off", "single", world=2, parallel={"overlap_grad_reduce": False})
    assert "gradient reduction after backward (1 bucket)" in res.output(0)
    assert losses(on) == losses(off)                                         # bitwise
    assert result(on, 1)["weights_digest"] == result(off, 1)["weights_digest"]


def test_overlapped_param_gather_matches_the_plain_distributed_optimizer(ws):
    on, res = ws.train("gather-on", "pp2dp2_zero1", parallel={"ddp_bucket_size": 20000})
    assert "parameter gather overlapped with the next forward" in res.output(0)
    assert "pipeline p2p batched" in res.output(0)
    off, res = ws.train("gather-off", "pp2dp2_zero1",
                        parallel={"overlap_grad_reduce": False, "overlap_param_gather": False})
    assert "parameter gather after the step" in res.output(0)
    ref = losses(ws.reference("single"))
    # bucket boundaries move the distributed optimizer's shards, so the gradient norm is summed
    # in another order: equal within rounding, like every layout
    assert _max_diff(losses(on), ref) < TOL and _max_diff(losses(off), ref) < TOL


def _probe(ws, name: str, world: int, **parallel) -> list[dict]:
    run = ws.new_run(name, "single", world=world, parallel=parallel, train={"init_from": None})
    out = run.path / "probe"
    res = Launch(run.path, world, module="tests.runtime.probe_initial_weights",
                 args=[str(run.path), str(out)]).wait(300)
    assert res.codes == [0] * world, _explain(res)
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]


def test_each_pipeline_stage_draws_its_own_initial_weights(ws):
    (single,) = _probe(ws, "seeds-pp1", 1)
    stages = _probe(ws, "seeds-pp4", 4, pipeline_model_parallel_size=4)
    assert [s["pp_rank"] for s in stages] == [0, 1, 2, 3]
    layer = {int(n): d for s in stages for n, d in s["layers"].items()}
    assert sorted(layer) == [1, 2, 3, 4]
    # stage 0 draws from the job's seed, as the single stage does: the same first layer
    assert layer[1] == single["layers"]["1"]
    # stages 1-3 hold no embedding, so with one seed for all they would draw identical layers
    assert len({layer[2], layer[3], layer[4]}) == 3
    again = _probe(ws, "seeds-pp4-again", 4, pipeline_model_parallel_size=4)
    assert [s["layers"] for s in again] == [s["layers"] for s in stages]       # deterministic


def test_only_tensor_rank_0_of_the_first_and_last_stages_reads_data(ws):
    reads = _reads(ws.reference("tp2pp2"), 4)
    per_rank = 12 * 8                               # steps × microbatches (16 / 2, one replica)
    assert reads == {"TP rank 0, pipeline stage 0": per_rank, "TP rank 1, pipeline stage 0": 0,
                     "TP rank 0, pipeline stage 1": per_rank, "TP rank 1, pipeline stage 1": 0}
    run, _ = ws.train("pp4", "single", world=4, parallel={"pipeline_model_parallel_size": 4})
    assert _reads(run, 4) == {"TP rank 0, pipeline stage 0": per_rank,
                              "TP rank 0, pipeline stage 1": 0,     # middle stages: nothing
                              "TP rank 0, pipeline stage 2": 0,
                              "TP rank 0, pipeline stage 3": per_rank}
    assert _max_diff(losses(run), losses(ws.reference("single"))) < TOL


def test_data_read_in_worker_processes_gives_the_same_batches(ws):
    run, _ = ws.train("workers", "single", data={"num_workers": 2})
    assert losses(run) == losses(ws.reference("single"))                        # bitwise


def test_a_signal_to_one_rank_stops_every_rank_at_one_step_and_resumes_bitwise(ws):
    """ZeRO-1 with every overlap on: the asynchronous agreement carries one rank's signal to
    all; the emergency save gathers the parameters first (the pre-hook's lazy gather would
    leave other ranks' shards stale), so the resumed run ends bitwise where an uninterrupted
    one does."""
    ref, _ = ws.train("signal-zero1-ref", "pp2dp2_zero1")
    run = ws.new_run("signal-zero1", "pp2dp2_zero1")
    first = Launch(run.path, 4, env={"HPCTRAIN_TEST_HOLD_AFTER_STEP": "4"})
    wait_until(lambda: any(m["step"] >= 4 for m in run.metrics()), timeout=240,
               what="step 4 of the first attempt")
    first.signal_rank(2, signal.SIGUSR1)                 # a DP replica of the last stage
    (run.path / "hold-release").touch()                  # the others were not told
    res = first.wait(240)
    assert res.codes == [exit_codes.PREEMPTED] * 4, _explain(res)
    r1 = result(run, 1)
    stopped = r1["end_step"]
    assert r1["exit_reason"] == "preempted" and 5 <= stopped < 12, r1
    saved = run.path / "checkpoints" / store.step_name(stopped)
    assert {p.name.split("_")[2] for p in saved.glob("__*_*.distcp")} == {"0", "1", "2", "3"}
    res = launch(run.path, 4, env={"HPCTRAIN_ATTEMPT": "2"})
    assert res.codes == [0] * 4, _explain(res)
    assert result(run, 2)["start_step"] == stopped
    assert losses(run) == losses(ref)                                            # bitwise
    assert result(run, 2)["weights_digest"] == result(ref, 1)["weights_digest"]
