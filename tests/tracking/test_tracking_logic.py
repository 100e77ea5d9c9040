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


# ---- a sweep's MLflow parent run: kept in the sweep's folder, and only there ------------------


class _FakeMlflow:
    """What ``MlflowBackend._sweep_parent`` asks of MLflow's client: a run made."""

    def __init__(self) -> None:
        self.made: list[str] = []

    def create_run(self, exp_id, run_name, tags):
        from types import SimpleNamespace
        self.made.append(run_name)
        return SimpleNamespace(info=SimpleNamespace(run_id=f"parent-{len(self.made)}"))


def _sweep_parent(run_path, sweep, client, logs):
    from hpctrain.config.tracking import MlflowSection, TrackingSection
    from hpctrain.tracking.backends import RunInfo, backends_for, sweep_folder_for
    backends = backends_for(TrackingSection(mlflow=MlflowSection(tracking_uri="sqlite:///x.db")))
    info = RunInfo(run_id=run_path.name, run_path=run_path, job_name="tiny", attempt=1,
                   config={}, sweep=sweep,
                   sweep_dir=sweep_folder_for(backends, run_path, sweep, logs.append))
    backends[0].client = client
    return backends[0]._sweep_parent("1", info)


def _listing(folder):
    return sorted((p.relative_to(folder), p.stat().st_mtime_ns) for p in folder.rglob("*"))


@pytest.mark.parametrize("where", ["other run", "root", "not listed", "damaged", "no file",
                                   "a run folder"])
def test_a_sweep_dir_that_is_not_the_runs_sweep_folder_gets_no_parent_and_is_not_written(
        tmp_path, where):
    """run.yaml's ``sweep.dir`` edited to name another run's folder, ``/``, or a folder under
    ``sweeps/`` whose sweep.yaml does not list the run (or cannot be read): the run gets no
    parent run, one warning says why, and nothing is written or locked there."""
    from tests.ops.helpers import crafted_run
    root = tmp_path / "runs"
    other, run = crafted_run(root), crafted_run(root)
    folder = {"other run": other.path, "root": None}.get(where, root / "sweeps" / "S9")
    if folder is not None and where != "other run":
        folder.mkdir(parents=True)
        if where == "not listed":
            (folder / "sweep.yaml").write_text(f"id: S9\nruns:\n- run_dir: {other.path}\n")
        elif where == "damaged":
            (folder / "sweep.yaml").write_text("id: S9\nruns: 7\n")
        elif where == "a run folder":
            (folder / "sweep.yaml").write_text(f"id: S9\nruns:\n- run_dir: {run.path}\n")
            (folder / "run.yaml").write_text("run_id: S9\n")
    sweep = {"id": "S9", "dir": str(folder or "/"), "index": 0}
    before = _listing(tmp_path)
    client, logs = _FakeMlflow(), []
    assert _sweep_parent(run.path, sweep, client, logs) is None
    assert client.made == [] and _listing(tmp_path) == before
    (line,) = logs
    assert line.startswith("tracking: mlflow: this run of sweep S9 gets no parent run: "), line


def test_the_runs_of_a_sweep_share_one_parent_kept_in_the_sweep_folder(tmp_path):
    from hpctrain.submission import prepare_sweep
    from hpctrain.submission.sweep_values import expand
    from tests.ops.helpers import OPS_JOB, ops_job, ops_profile
    points = expand(ops_job(), ops_profile(ranks_per_node=2), ["train.lr=1e-3,2e-3"])
    sweep_dir, runs = prepare_sweep(points, tmp_path / "runs", source=str(OPS_JOB))
    client, logs = _FakeMlflow(), []
    parents = {_sweep_parent(r.run.path, r.run.meta()["sweep"], client, logs) for r in runs}
    assert parents == {"parent-1"} and client.made == [sweep_dir.name] and logs == []
    assert (sweep_dir / "mlflow-parent.json").is_file()
    assert not any((r.run.path / "mlflow-parent.json").exists() for r in runs)


def test_sync_never_writes_into_the_folder_run_yaml_names_as_its_sweep(tmp_path):
    """``hpctrain sync B`` with B's run.yaml naming run A's folder as its sweep's: A's folder
    is left as it was, and sync says the run gets no parent run."""
    from hpctrain.config import yamlio
    from tests.ops.helpers import cli, crafted_run
    root = tmp_path / "runs"
    a = crafted_run(root)
    b = crafted_run(root, metrics=[{"step": 1, "loss": 3.0, "time": 1.7e9}],
                    events=[{"event": "checkpoint_saved", "step": 1}])
    job = yamlio.read_mapping(b.job_file)
    job["tracking"]["mlflow"] = {"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db"}
    yamlio.write_atomic(b.job_file, yamlio.dump(job))
    b.update_meta(sweep={"id": "S9", "dir": str(a.path), "index": 0, "values": {"train.lr": 0.1}})
    before = _listing(a.path)
    done = cli(root, "sync", b.id, "--no-upload")
    out = done.stdout
    assert "INFO mlflow" not in done.stderr, done.stderr       # MLflow's setup lines: quiet
    assert _listing(a.path) == before
    assert "this run of sweep S9 gets no parent run" in out and "steps up to 1 sent" in out


def test_sync_speaks_of_itself_not_of_an_attempt_of_training(tmp_path):
    """``hpctrain sync`` shares the tracker thread of training, whose messages said "training
    continues" and "the next attempt ... sends them": sync says what it does instead, waits
    ``tracking.flush_timeout_s`` for an unreachable tracker, and exits 1 with what is unsent."""
    from hpctrain.config import yamlio
    from tests.ops.helpers import cli, crafted_run
    root = tmp_path / "runs"
    run = crafted_run(root, metrics=[{"step": 1, "loss": 3.0, "time": 1.7e9}],
                      events=[{"event": "checkpoint_saved", "step": 1}])
    job = yamlio.read_mapping(run.job_file)
    job["tracking"]["mlflow"] = {"tracking_uri": "http://127.0.0.1:9"}   # nothing listens
    job["tracking"]["flush_timeout_s"] = 1
    yamlio.write_atomic(run.job_file, yamlio.dump(job))
    out = cli(root, "sync", run.id, "--no-upload", check=False)
    assert out.returncode == 1, out
    said = out.stdout + out.stderr
    assert "mlflow cannot be reached" in said and "did not receive 1 record(s)" in said, said
    assert "training continues" not in said and "the next attempt" not in said, said
    assert f"`hpctrain sync {run.id}` run again sends them" in said, said


def test_two_syncs_of_one_run_at_once_make_one_tracker_run(tmp_path):
    """Two `hpctrain sync RUN` at once: before, both found no MLflow run recorded, each
    started one and sent every step to it (two runs in the experiment, one of them recorded
    nowhere). Now the second waits for the first, says so, and finds everything sent."""
    import time
    import mlflow
    from hpctrain.config import yamlio
    from tests.cli.test_interruption import signalled
    from tests.ops.helpers import crafted_run
    root = tmp_path / "runs"
    run = crafted_run(root, metrics=[{"step": s, "loss": 3.0 - s / 10, "time": 1.7e9 + s}
                                     for s in range(1, 6)],
                      events=[{"event": "checkpoint_saved", "step": 5}])
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    job = yamlio.read_mapping(run.job_file)
    job["tracking"]["mlflow"] = {"tracking_uri": uri, "experiment": "two"}
    yamlio.write_atomic(run.job_file, yamlio.dump(job))
    mlflow.set_tracking_uri(uri)       # the database made once (MLflow's own setup is no race
    mlflow.set_experiment("two")       # of hpctrain's)
    second = tmp_path / "second.out"
    # when the first sync has read what was sent and opens the MLflow run, the second
    # starts: it waits (now) or runs to its end (before); the first goes on when either shows
    command = (f"{sys.executable} -m hpctrain sync {run.id} --no-upload > {second} 2>&1 & "
               f"echo $! > {tmp_path}/second.pid; "
               f"while kill -0 $! 2>/dev/null && ! grep -q waiting {second}; do sleep 0.2; done")
    first = signalled("hpctrain.tracking.backends:MlflowBackend.open", 1, "RUN", "sync",
                      run.id, "--no-upload", root=root, command=command)
    assert first.returncode == 0, first.stderr
    pid = int((tmp_path / "second.pid").read_text())
    deadline = time.time() + 120
    while os.path.exists(f"/proc/{pid}") and time.time() < deadline:
        time.sleep(0.2)
    runs = mlflow.search_runs(experiment_names=["two"])
    assert len(runs) == 1, runs
    said = second.read_text().splitlines()
    assert said[0] == f"waiting for another `hpctrain sync` of {run.id} to end ...", said
    assert "mlflow: steps up to 5 sent" in said
