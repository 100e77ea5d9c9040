"""What rank 0's metrics writer puts in ``metrics.jsonl``, TensorBoard and the progress line,
held to arithmetic done here: every value of a record from the step times, losses and
stragglers fed to it, on a real run folder, read back by TensorBoard's own reader.

A team reads these numbers to decide whether a run is healthy (loss, throughput, MFU) and
the ETA to plan around it; the status and report commands read them back. A mean over the
wrong steps or a throughput from the wrong batch would mislead quietly, so each is checked
against its definition, not against a run of the same code."""

from __future__ import annotations

import json
import math
import shutil
import statistics

import pytest

from hpctrain.flops import model_flops_per_step
from hpctrain.health.stragglers import SlowNode
from hpctrain.model_shape import ModelShape
from hpctrain.runtime.metrics import MetricsWriter
from tests.runtime.helpers import job_mapping, local_profile, rank_context

WORLD, TP = 4, 2
PEAK = 123.0                # TFLOP/s per device, the profile's node.peak_tflops
STEPS, INTERVAL = 10, 3
GBS = 16                    # job_mapping's global batch


def _writer(tmp_path, rank: int = 0, peak: float | None = PEAK, name: str = "run",
            tracking: dict | None = None) -> MetricsWriter:
    job = job_mapping(str(tmp_path / "unused"), "tp2dp2_zero1", steps=STEPS,
                      train={"log_interval": INTERVAL}, **({"tracking": tracking} if tracking
                                                           else {}))
    ctx = rank_context(tmp_path, name, job, WORLD, rank,
                       local_profile(WORLD, node={"peak_tflops": peak}), attempt=3)
    return MetricsWriter(ctx, STEPS, resume_step=0)


def _records(writer) -> list[dict]:
    path = writer.ctx.run.metrics_file
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# Ten steps: their times (all different, so a mean over the wrong steps shows), losses, and
# what else the loop hands the writer. Step 5 is skipped (logged outside the interval), step 9
# has an infinite gradient norm and names a straggler with the ranks' compute times.
TIMES = {s: 0.1 * s + 0.01 * s * s for s in range(1, STEPS + 1)}
LOSSES = {s: 5.0 - 0.25 * s for s in range(1, STEPS + 1)}
SLOW = SlowNode(node="node-b", ranks=[2, 3], ratio=1.5, seconds=0.3, median_s=0.2, intervals=2)
COMPUTE = {"compute_s": [0.2000004, 0.1, 0.4, 0.3000007], "tflops": [10.0, 0.0, 7.5, 9.0]}


def _feed(writer) -> dict[int, dict | None]:
    out = {}
    for s in range(1, STEPS + 1):
        out[s] = writer.record(
            s, LOSSES[s], math.inf if s == 9 else 1.0 / s, 1e-3 * s, TIMES[s],
            "loss spike" if s == 5 else None, consumed_samples=GBS * s,
            skipped_total=1 if s >= 5 else 0,
            stragglers=[SLOW] if s == 9 else ([] if s in (3, 6) else None),
            compute=COMPUTE if s == 9 else None)
    return out


def test_rank_0_logs_each_interval_with_its_own_mean_time_throughput_and_mfu(tmp_path, lines):
    writer = _writer(tmp_path)
    returned = _feed(writer)
    writer.close(status="stopped")
    logged = {3: [1, 2, 3], 5: [4, 5], 6: [6], 9: [7, 8, 9], 10: [10]}    # step: its interval
    records = _records(writer)
    assert [r["step"] for r in records] == list(logged)
    assert {s for s, r in returned.items() if r is not None} == set(logged)
    job = writer.ctx.job
    flops = model_flops_per_step(ModelShape.from_model(job.model), GBS, TP)
    tokens = GBS * job.model.seq_length
    for rec in records:
        s = rec["step"]
        mean = sum(TIMES[t] for t in logged[s]) / len(logged[s])
        assert rec == returned[s]
        expected = {
            "kind": "train", "step": s, "loss": LOSSES[s],
            "grad_norm": "inf" if s == 9 else 1.0 / s, "lr": 1e-3 * s,
            "tokens_per_s": round(tokens / mean, 1), "step_time_s": round(mean, 4),
            "mfu": round(flops / mean / (WORLD * PEAK * 1e12), 5),
            "skipped": s == 5, "skip_reason": "loss spike" if s == 5 else None,
            "skipped_total": 1 if s >= 5 else 0, "consumed_samples": GBS * s, "attempt": 3}
        assert {k: rec[k] for k in expected} == expected, s
        assert set(rec) - set(expected) == {"time", "stragglers", "compute_s_median",
                                            "compute_s_max", "rank_tflops_min"} & set(rec)
    by_step = {r["step"]: r for r in records}
    assert by_step[3]["stragglers"] == [] and "stragglers" not in by_step[5]
    assert by_step[9]["stragglers"] == [SLOW.to_dict()]
    # to the microsecond (the median itself is 0.25000055)
    assert statistics.median(COMPUTE["compute_s"]) != by_step[9]["compute_s_median"] == 0.250001
    assert by_step[9]["compute_s_max"] == 0.4
    assert by_step[9]["rank_tflops_min"] == 7.5          # a rank without a figure (0) is not one
    assert "compute_s_median" not in by_step[6]
    # one progress line per record, the line the record makes
    progress = [ln for ln in lines if ln.startswith("step ")]
    assert progress == [writer.progress_line(r) for r in records]
    assert progress[1].endswith("| SKIPPED: loss spike")
    assert progress[3].endswith("| straggler node-b")


def test_the_last_step_of_a_long_run_is_logged(tmp_path):
    """Step numbers are compared by value, also past the small integers CPython keeps one
    object for: the last of 1001 steps is logged, though not on the interval."""
    ctx = _writer(tmp_path).ctx
    writer = MetricsWriter(ctx, int("1001"), resume_step=0)
    assert [s for s in range(1, 1002) if writer.due(s, None)] == [INTERVAL * k for k in
                                                                   range(1, 334)] + [1001]
    assert writer.due(1000, "loss spike") and not writer.due(1000, None)
    writer.close()


def test_the_progress_line_reads_each_value_of_its_record(tmp_path):
    writer = _writer(tmp_path)
    rec = {"step": 4, "loss": 2.34567, "grad_norm": 0.12345, "lr": 2.5e-4,
           "tokens_per_s": 1234.6, "step_time_s": 61.0, "mfu": 0.3456, "skipped": False,
           "skip_reason": None}
    assert writer.progress_line(rec) == ("step 4/10 | loss 2.3457 | grad 0.123 | lr 2.50e-04 | "
                                         "1235 tok/s | 61.000 s/step | MFU 34.6% | ETA 6m06s")
    odd = {**rec, "loss": "nan", "grad_norm": None, "mfu": None, "skipped": True,
           "tokens_per_s": None,
           "skip_reason": "non-finite loss", "stragglers": [{"node": "a"}, {"node": "b"}]}
    assert writer.progress_line(odd) == (
        "step 4/10 | loss nan | grad None | lr 2.50e-04 | n/a tok/s | 61.000 s/step | "
        "MFU n/a | ETA 6m06s | SKIPPED: non-finite loss | straggler a, b")


def test_a_step_time_of_zero_gives_no_rate_and_still_a_line(tmp_path, lines):
    """A clock too coarse to see a step (or stepped back by NTP between two readings) must not
    divide by zero nor stop rank 0 on its progress line."""
    writer = _writer(tmp_path)
    # also: compute times without TFLOP/s figures (a CPU), and with none known (all 0)
    compute = {3: {"compute_s": [0.1, 0.3]}, 6: {"compute_s": [0.5], "tflops": [0.0]}}
    recs = [writer.record(s, 3.0, 1.0, 1e-3, 0.0, None, GBS * s, 0, compute=compute.get(s))
            for s in range(1, 2 * INTERVAL + 1)]
    writer.close()
    rec = recs[INTERVAL - 1]
    assert (rec["tokens_per_s"], rec["mfu"], rec["step_time_s"]) == (None, None, 0.0)
    assert lines[-2] == writer.progress_line(rec) and "| n/a tok/s |" in lines[-2]
    assert (rec["compute_s_median"], rec["compute_s_max"]) == (0.2, 0.3)
    assert "rank_tflops_min" not in rec
    assert recs[-1]["rank_tflops_min"] is None and recs[-1]["compute_s_max"] == 0.5


def test_without_tensorboard_installed_the_records_are_written(tmp_path, monkeypatch):
    """TensorBoard is optional (``hpctrain[tensorboard]``): without it, no event files."""
    import sys
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)   # import fails
    writer = _writer(tmp_path, name="no-tensorboard")
    assert writer.tb is None
    _feed(writer)
    writer.close()
    assert [r["step"] for r in _records(writer)] == [3, 5, 6, 9, 10]
    assert not (writer.ctx.run.path / "tensorboard").exists()


def test_a_tensorboard_folder_that_cannot_be_made_leaves_the_records(tmp_path, lines):
    """TensorBoard is optional: where its folder cannot be made (a file in the way, a full
    or read-only disk), rank 0 writes its records and lines without it."""
    writer = _writer(tmp_path, name="blocked")
    writer.close()
    shutil.rmtree(writer.ctx.run.path / "tensorboard")
    (writer.ctx.run.path / "tensorboard").write_text("not a folder")
    writer = MetricsWriter(writer.ctx, STEPS, resume_step=0)
    assert writer.tb is None
    _feed(writer)
    writer.record_eval("validation", 10, 2.0, 4, 64, 1.0)
    writer.close()
    assert [r["step"] for r in _records(writer)] == [3, 5, 6, 9, 10, 10]


def test_without_a_peak_mfu_is_null_and_other_ranks_write_nothing(tmp_path, lines):
    unknown = _writer(tmp_path, peak=None, name="no-peak")
    _feed(unknown)
    unknown.close()
    assert [r["mfu"] for r in _records(unknown)] == [None] * 5
    assert all(r["tokens_per_s"] > 0 for r in _records(unknown))
    other = _writer(tmp_path, rank=1, name="rank-1")
    lines.clear()
    assert set(_feed(other).values()) == {None}
    assert other.record_eval("validation", 10, 1.0, 2, 32, 0.5) is None
    other.close(finished_step=10, status="finished")
    assert not other.ctx.run.metrics_file.exists() and lines == []
    assert other._times == []            # the interval's times are let go on every rank


def test_evaluation_records_and_tensorboard_scalars(tmp_path, lines):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    writer = _writer(tmp_path)
    _feed(writer)
    val = writer.record_eval("validation", 9, 2.5, 4, 64, 1.23456)
    test = writer.record_eval("test", 10, math.nan, 2, 32, 0.5)
    writer.close(status="finished", finished_step=10)
    assert val == {"kind": "validation", "step": 9, "loss": 2.5, "iters": 4, "samples": 64,
                   "seconds": 1.235, "attempt": 3, "time": val["time"]}
    assert test["loss"] == "nan" and test["kind"] == "test"
    assert _records(writer)[-2:] == [val, test]
    # the line says the record's time: 1.23456 s is kept as 1.235, printed 1.24 (not 1.23)
    assert lines[-2:] == ["step 9/10 | validation loss 2.5000 | 4 batches (64 samples) in 1.24 s",
                          "step 10/10 | test loss nan | 2 batches (32 samples) in 0.50 s"]
    events = EventAccumulator(str(writer.ctx.run.path / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert sorted(tags) == sorted(["train/loss", "train/grad_norm", "train/lr",
                                   "train/tokens_per_s", "train/step_time_s", "train/mfu",
                                   "validation/loss"])    # a NaN test loss is no scalar
    records = {r["step"]: r for r in _records(writer) if r["kind"] == "train"}
    for key in ("loss", "lr", "tokens_per_s", "step_time_s", "mfu"):
        got = {e.step: e.value for e in events.Scalars(f"train/{key}")}
        assert got == pytest.approx({s: r[key] for s, r in records.items()}, rel=1e-6), key
    # step 9's infinite gradient norm is a string in the record, not a scalar
    assert {e.step for e in events.Scalars("train/grad_norm")} == set(records) - {9}
    assert [(e.step, e.value) for e in events.Scalars("validation/loss")] == [(9, 2.5)]


def test_the_tracker_gets_what_a_checkpoint_holds_and_at_the_finish_everything(
        tmp_path, lines, monkeypatch):
    """Through MLflow's real client and store: an attempt that stops sends the records up to
    the step its checkpoint holds and ends the tracker run as stopped; one that finishes
    sends every record, its evaluation, the report, and ends it finished."""
    from mlflow import MlflowClient
    monkeypatch.chdir(tmp_path)          # a SQLite store keeps artifacts in ./mlruns
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracking = {"mlflow": {"tracking_uri": uri, "experiment": "metrics"}}
    client = MlflowClient(tracking_uri=uri)

    def tracked(writer):
        state = json.loads((writer.ctx.run.path / "tracking" / "state.json").read_text())
        run = client.get_run(state["mlflow"]["run_id"])
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
        evals = [m.step for m in client.get_metric_history(run.info.run_id, "validation/loss")]
        return run, steps, evals

    stopped = _writer(tmp_path, name="stopped", tracking=tracking)
    _feed(stopped)
    stopped.committed(6)                     # a checkpoint of step 6 is published
    stopped.record_eval("validation", 9, 2.5, 4, 64, 1.0)
    stopped.close(status="stopped")
    run, steps, evals = tracked(stopped)
    assert (steps, evals, run.info.status) == ([3, 5, 6], [], "KILLED")
    assert stopped.tracker is None

    finished = _writer(tmp_path, name="finished", tracking=tracking)
    _feed(finished)
    finished.record_eval("validation", 10, 2.0, 4, 64, 1.0)
    finished.close(finished_step=10, status="finished")
    run, steps, evals = tracked(finished)
    assert (steps, evals, run.info.status) == ([3, 5, 6, 9, 10], [10], "FINISHED")
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
    assert any(path.endswith(".png") for path in artifacts), artifacts
    assert not [ln for ln in lines if ln.startswith("tracking:")], lines


def _scalars(run_path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of ``tag`` as TensorBoard's own reader shows the run's event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(run_path / "tensorboard"))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def _next_second() -> None:
    """TensorBoard reads a folder's event files in name order, and a name begins with the
    second its file was made: attempts are seconds apart, two writers in a test may not be."""
    import time
    now = int(time.time())
    while int(time.time()) == now:
        time.sleep(0.05)


def test_a_resumed_attempt_replaces_what_the_last_one_logged_past_its_checkpoint(tmp_path):
    """Attempt A logs steps 1-6 and an evaluation at 5, then dies; attempt B resumes from the
    checkpoint of step 4 and logs 5-6 again (other losses). TensorBoard shows each step once,
    B's past step 4 and A's up to it, in every tag: A's evaluation at 5 went with its steps."""
    first = _writer(tmp_path, name="resumed")
    ctx = first.ctx
    for s in range(1, 7):
        first.record(s, LOSSES[s], 1.0, 1e-3, 0.5, "loss spike", GBS * s, 0)
    first.record_eval("validation", 3, 4.0, 4, 64, 1.0)
    first.record_eval("validation", 5, 3.0, 4, 64, 1.0)
    first.close()
    _next_second()
    second = MetricsWriter(ctx, STEPS, resume_step=4)
    for s in (5, 6):
        second.record(s, 10.0 + s, 1.0, 1e-3, 0.5, "loss spike", GBS * s, 0)
    second.record_eval("validation", 6, 2.0, 4, 64, 1.0)
    second.close()
    # every value here is exact in TensorBoard's float32
    assert _scalars(ctx.run.path, "train/loss") == [(s, LOSSES[s]) for s in range(1, 5)] + [
        (5, 15.0), (6, 16.0)]
    assert _scalars(ctx.run.path, "validation/loss") == [(3, 4.0), (6, 2.0)]
