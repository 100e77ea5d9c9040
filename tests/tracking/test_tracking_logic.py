"""What trackers are sent, as pure logic: each step once as finally trained, metric names, run
events as tags, and the ``tracking:`` section's one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hpctrain.config import job_from_mapping
from hpctrain.errors import ConfigError
from hpctrain.tracking.records import event_label, final_records, metric_values, shown_events
from tests.conftest import REPO


def rec(step, loss, attempt, kind="train"):
    return {"kind": kind, "step": step, "loss": loss, "attempt": attempt, "lr": 1e-3}


def test_a_step_trained_again_after_a_resume_is_sent_as_the_later_attempt_trained_it():
    # attempt 1 logged 2..8, its last checkpoint held step 4; attempt 2 trained 6 and 8 again
    records = [rec(s, 10 - s, 1) for s in (2, 4, 6, 8)] + [rec(6, 3.5, 2), rec(8, 1.5, 2),
                                                            rec(6, 3.0, 2, "validation")]
    sent = final_records(records, after_step=2, upto_step=8)
    assert [(r["step"], r.get("kind"), r["loss"]) for r in sent] == [
        (4, "train", 6), (6, "train", 3.5), (6, "validation", 3.0), (8, "train", 1.5)]
    assert final_records(records, after_step=0, upto_step=4) == [records[0], records[1]]
    assert [r["step"] for r in final_records(records, 4, None)] == [6, 6, 8]


def test_metric_names_say_what_was_measured_and_leave_out_what_is_not_a_number():
    train = {"kind": "train", "step": 3, "loss": 2.5, "grad_norm": "nan", "lr": 1e-3,
             "tokens_per_s": 900.0, "mfu": None, "skipped": False, "attempt": 2, "time": 1.0,
             "peak_memory_gb": 1.5}
    assert metric_values(train) == {"train/loss": 2.5, "train/lr": 1e-3,
                                    "train/tokens_per_s": 900.0, "train/peak_memory_gb": 1.5}
    assert metric_values({"kind": "validation", "step": 4, "loss": 2.0, "iters": 3,
                          "samples": 12}) == {"validation/loss": 2.0}


def test_run_events_become_tags_and_routine_ones_are_left_out():
    events = [{"event": "signal", "preempting": True}, {"event": "signal", "preempting": False},
              {"event": "checkpoint_saved", "reason": "emergency", "step": 5},
              {"event": "checkpoint_saved", "reason": "periodic", "step": 4},
              {"event": "requeue", "excluded": ["n2"]}, {"event": "requeue", "excluded": []},
              {"event": "hang", "rank": 1}, {"event": "straggler", "node": "n1"},
              {"event": "submitted"}]
    assert [label for label, _ in shown_events(events)] == [
        "preemption", "emergency-checkpoint", "requeue", "excluded-node", "requeue", "hang",
        "straggler"]
    assert event_label({"event": "attempt_end"}) is None


JOB = {"name": "t", "model": {"num_layers": 1, "hidden_size": 8, "num_attention_heads": 2,
                              "vocab_size": 257, "seq_length": 8},
       "batch": {"micro_batch_size": 1, "global_batch_size": 1}, "train": {"steps": 2},
       "data": {"path": "/tmp/x"}}


@pytest.mark.parametrize("tracking, field, words", [
    ({"wandb": {"project": "a/b"}}, "tracking.wandb.project", "not a W&B name"),
    ({"wandb": {"project": "p", "mode": "offlien"}}, "tracking.wandb.mode",
     "did you mean 'offline'"),
    ({"wandb": {}}, "tracking.wandb.project", "missing"),
    ({"mlflow": {"tracking_uri": "localhost:5000"}}, "tracking.mlflow.tracking_uri",
     "not a tracking URI"),
    ({"mlflow": {"tracking_uri": "http://h:5000", "experiment": " "}},
     "tracking.mlflow.experiment", "empty"),
    ({"neptune": {}}, "tracking.neptune", "unknown key"),
])
def test_a_bad_tracking_section_is_one_line_naming_the_field(tracking, field, words):
    with pytest.raises(ConfigError) as e:
        job_from_mapping({**JOB, "tracking": tracking}, "job")
    (line,) = [ln for ln in str(e.value).splitlines() if field in ln]
    assert words in line


def test_a_tracker_that_is_not_installed_is_refused_before_anything_is_queued(tmp_path):
    """``validate`` (the checks ``submit`` makes first) in a Python where importing wandb fails
    as it does when the package is absent (``sys.modules`` entry None, Python's own marker)."""
    job = tmp_path / "job.yaml"
    job.write_text((REPO / "examples" / "tiny.yaml").read_text() +
                   "\ntracking:\n  wandb: {project: demo, mode: offline}\n")
    code = ("import sys; sys.modules['wandb'] = None; from hpctrain.cli import main; "
            f"sys.argv = ['hpctrain', 'validate', {str(job)!r}, '-p', 'local']; main()")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ,
                                            "HPCTRAIN_RUNS_DIR": str(tmp_path / "runs")})
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        "Error: tracking.wandb: the wandb package is not installed; pip install "
        "'hpctrain[wandb]', or remove tracking.wandb"]
    assert not (tmp_path / "runs").exists()


def test_a_state_from_before_evaluations_were_counted_apart_reads_as_it_meant(tmp_path):
    """An older state.json (``sent_step`` only): every evaluation up to it counts as sent, so
    nothing is sent twice; evaluations after it, and training records after it, are not."""
    import json

    from hpctrain.tracking.state import TrackingState, already_sent
    (tmp_path / "tracking").mkdir()
    (tmp_path / "tracking" / "state.json").write_text(json.dumps(
        {"mlflow": {"run_id": "r", "sent_step": 8, "events_sent": 3}}))
    entry = TrackingState(tmp_path).of("mlflow")
    assert entry["sent_evals"] == {"validation": 8, "test": 8}
    assert already_sent(entry, rec(8, 1.0, 1)) and already_sent(entry, rec(8, 1.0, 1, "test"))
    assert not already_sent(entry, rec(9, 1.0, 2, "validation"))
    entry["sent_evals"]["validation"] = 4            # step 8's evaluation was cut short
    assert not already_sent(entry, rec(8, 1.0, 2, "validation"))
    assert already_sent(entry, rec(8, 1.0, 2)) and already_sent(entry, {"step": 8, "loss": 1})
    assert TrackingState(tmp_path / "new").of("wandb")["sent_evals"] == {"validation": 0,
                                                                          "test": 0}
