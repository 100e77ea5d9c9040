"""The tracker thread against MLflow's real client and store (SQLite, no server): attempts of one
run continue one MLflow run, a step trained again after a resume is logged once, as the later
attempt trained it; a tracker nobody answers for is warned about and its records kept."""

from __future__ import annotations

import dataclasses
import json
import socket

from hpctrain.config.tracking import MlflowSection, TrackingSection
from hpctrain.record.files import append_jsonl
from hpctrain.record.reader import read_jsonl
from hpctrain.tracking.backends import RunInfo, backends_for, sweep_folder_for
from hpctrain.tracking.sender import TrackerThread


def _thread(section, info, number, resume, logs) -> TrackerThread:
    """Attempt ``number``'s tracker thread, resumed from ``resume`` (not started)."""
    return TrackerThread(backends_for(section), dataclasses.replace(info, attempt=number),
                         resume_step=resume, metrics_file=info.run_path / "metrics.jsonl",
                         events_file=info.run_path / "events.jsonl",
                         flush_timeout_s=section.flush_timeout_s, log=logs.append, retry_s=0.2,
                         stopping_flush_s=section.flush_timeout_s)


def _attempt(section, info, number, resume, steps, commits, status, logs):
    run_path = info.run_path
    thread = _thread(section, info, number, resume, logs).start()
    for step in steps:
        record = {"kind": "train", "step": step, "loss": 10.0 * number + step, "lr": 1e-3,
                  "attempt": number, "time": 1.7e9 + step}
        append_jsonl(run_path / "metrics.jsonl", record)   # what MetricsWriter writes first
        thread.add(record)
        if step in commits:
            thread.commit(step)
    thread.close(status)


def _info(tmp_path, name="run", sweep=None):
    run_path = tmp_path / name
    run_path.mkdir()
    return RunInfo(run_id="tiny-20260101-000000-ab12", run_path=run_path, job_name="tiny",
                   sweep=sweep,
                   attempt=1, config={"job": {"train": {"steps": 8, "lr": 0.001}},
                                      "profile": {"name": "local"}})


def test_a_resumed_run_is_one_mlflow_run_with_each_step_once_and_a_sweep_one_parent(tmp_path):
    from mlflow import MlflowClient
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    section = TrackingSection(mlflow=MlflowSection(tracking_uri=uri, experiment="drill"))
    sweep_dir = tmp_path / "sweeps" / "tiny-20260101-000000-cd34"
    sweep_dir.mkdir(parents=True)
    (sweep_dir / "sweep.yaml").write_text(f"id: {sweep_dir.name}\nruns:\n"
                                          f"- run_dir: {tmp_path / 'run'}\n"
                                          f"- run_dir: {tmp_path / 'run2'}\n")
    sweep = {"id": sweep_dir.name, "dir": str(sweep_dir), "index": 0}
    info, logs = _info(tmp_path, sweep=sweep), []
    info.sweep_dir = sweep_folder_for(backends_for(section), info.run_path, sweep, logs.append)
    assert info.sweep_dir == sweep_dir
    # attempt 1 crashes after step 6; its newest checkpoint holds step 4
    _attempt(section, info, 1, 0, range(1, 7), {2, 4}, "failed", logs)
    append_jsonl(info.run_path / "events.jsonl", {"event": "resume", "by": "me"})
    _attempt(section, info, 2, 4, range(5, 9), {6}, "finished", logs)
    # a third attempt that resumes from 6 and finishes at 8 (as after `resume --steps`)
    _attempt(section, info, 3, 6, range(7, 9), {8}, "finished", logs)
    assert logs == []
    state = json.loads((info.run_path / "tracking" / "state.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(state["run_id"], "train/loss")
    assert [(m.step, m.value) for m in history] == [
        (1, 11), (2, 12), (3, 13), (4, 14), (5, 25), (6, 26), (7, 37), (8, 38)]
    run = client.get_run(state["run_id"])
    assert run.data.params["job.train.steps"] == "8" and run.info.status == "FINISHED"
    assert run.data.tags["hpctrain.events.resume"] == "1"
    # a second run of the sweep: a child of the same parent run
    other = dataclasses.replace(_info(tmp_path, "run2", dict(sweep, index=1)),
                                run_id="tiny-20260101-000001-ef56", sweep_dir=sweep_dir)
    _attempt(section, other, 1, 0, range(1, 3), {2}, "finished", logs)
    other_id = json.loads((other.run_path / "tracking" / "state.json").read_text())["mlflow"]
    parent = run.data.tags["mlflow.parentRunId"]
    assert client.get_run(other_id["run_id"]).data.tags["mlflow.parentRunId"] == parent
    assert client.get_run(parent).info.run_name == sweep["id"]
    assert len(client.search_runs([state["experiment_id"]])) == 3   # the parent, two runs


def test_a_tracker_that_does_not_answer_is_warned_about_and_its_records_kept(tmp_path):
    with socket.socket() as s:          # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    section = TrackingSection(mlflow=MlflowSection(tracking_uri=f"http://127.0.0.1:{port}"))
    info, logs = _info(tmp_path), []
    _attempt(dataclasses.replace(section, flush_timeout_s=1), info, 1, 0, range(1, 5), {4},
             "stopped", logs)
    # warned once, however many times it is tried again (every 0.2 s here)
    warned = [line for line in logs if line.startswith("tracking: mlflow cannot be reached")]
    assert len(warned) == 1 and "retrying every 0.2 s; training continues" in warned[0], logs
    unsent = read_jsonl(info.run_path / "tracking" / "unsent.jsonl")
    assert [u["record"]["step"] for u in unsent] == [1, 2, 3, 4]
    assert any("mlflow did not receive 4 record(s) (steps 1-4)" in line and
               "`hpctrain sync tiny-20260101-000000-ab12`" in line for line in logs), logs


def test_an_evaluation_cut_short_and_run_again_after_the_resume_reaches_the_tracker(tmp_path):
    """Validation after every step. Attempt 1 is preempted in step 8's evaluation and saves
    step 8 (its training record is sent, its validation loss does not exist yet); attempt 2
    resumes at 8 and evaluates step 8 again: that validation loss was never sent, and is.
    Each attempt's records are handed over before its thread starts, so the thread takes
    them as it takes a live attempt's (the metrics file, which an attempt's start reads to
    send what earlier attempts left, gets them after)."""
    from mlflow import MlflowClient
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    section = TrackingSection(mlflow=MlflowSection(tracking_uri=uri, experiment="drill"))
    info, logs = _info(tmp_path), []

    def attempt(number, resume, records, commits, status):
        thread = _thread(section, info, number, resume, logs)
        made = []
        for kind, step, loss in records:
            made.append({"kind": kind, "step": step, "loss": loss, "attempt": number,
                         "time": 1.7e9 + step})
            thread.add(made[-1])
            if commits.get(step) == kind:
                thread.commit(step)
        thread.start().close(status)
        for record in made:
            append_jsonl(info.run_path / "metrics.jsonl", record)

    first = [(kind, s, loss) for s in range(1, 9)
             for kind, loss in (("train", 10.0 + s), ("validation", 5.0 + s)) if (kind, s) !=
             ("validation", 8)]
    attempt(1, 0, first, {7: "validation", 8: "train"}, "stopped")
    attempt(2, 8, [("validation", 8, 4.0), ("train", 9, 29.0), ("validation", 9, 3.0)],
            {9: "validation"}, "finished")
    assert logs == []
    state = json.loads((info.run_path / "tracking" / "state.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=uri)
    validation = client.get_metric_history(state["run_id"], "validation/loss")
    assert sorted((m.step, m.value) for m in validation) == \
        [(s, 5.0 + s) for s in range(1, 8)] + [(8, 4.0), (9, 3.0)]
    train_loss = client.get_metric_history(state["run_id"], "train/loss")
    assert sorted(m.step for m in train_loss) == list(range(1, 10))
    assert state["sent_step"] == 9 and state["sent_evals"] == {"validation": 9, "test": 0}


def test_run_events_are_numbered_across_attempts_and_counted(tmp_path):
    """Each shown event is one tag numbered after the ones before it, whichever attempt sent
    them, and each kind's count adds up over the attempts."""
    from mlflow import MlflowClient
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    section = TrackingSection(mlflow=MlflowSection(tracking_uri=uri, experiment="drill"))
    info, logs = _info(tmp_path), []
    events = info.run_path / "events.jsonl"
    append_jsonl(events, {"event": "signal", "preempting": True, "signal": "SIGUSR1"})
    _attempt(section, info, 1, 0, range(1, 3), {2}, "stopped", logs)
    append_jsonl(events, {"event": "attempt_end", "attempt": 1})          # not shown
    append_jsonl(events, {"event": "resume", "by": "me"})
    _attempt(section, info, 2, 2, range(3, 5), {4}, "stopped", logs)
    append_jsonl(events, {"event": "resume", "by": "you"})
    _attempt(section, info, 3, 4, range(5, 7), {6}, "finished", logs)
    assert logs == []
    state = json.loads((info.run_path / "tracking" / "state.json").read_text())["mlflow"]
    tags = MlflowClient(tracking_uri=uri).get_run(state["run_id"]).data.tags
    numbered = sorted(k for k in tags if k.startswith("hpctrain.event."))
    assert numbered == ["hpctrain.event.0000.preemption", "hpctrain.event.0001.resume",
                        "hpctrain.event.0002.resume"], numbered
    assert '"by": "you"' in tags["hpctrain.event.0002.resume"]
    assert tags["hpctrain.events.resume"] == "2" and tags["hpctrain.events.preemption"] == "1"


def test_what_an_attempt_could_not_send_the_next_one_sends_first(tmp_path):
    """Attempt 1's tracker cannot be reached (a server nobody answers for): its records,
    committed, stay unsent. Attempt 2, resumed from step 4 with a tracker that answers, sends
    them before its own, each step once."""
    from mlflow import MlflowClient
    with socket.socket() as s:          # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = TrackingSection(mlflow=MlflowSection(tracking_uri=f"http://127.0.0.1:{port}"),
                           flush_timeout_s=1)
    info, logs = _info(tmp_path), []
    _attempt(down, info, 1, 0, range(1, 5), {4}, "stopped", logs)
    assert any(line.startswith("tracking: mlflow cannot be reached") for line in logs), logs
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    up = TrackingSection(mlflow=MlflowSection(tracking_uri=uri, experiment="drill"))
    logs.clear()
    _attempt(up, info, 2, 4, range(5, 7), {6}, "finished", logs)
    assert logs == []
    state = json.loads((info.run_path / "tracking" / "state.json").read_text())["mlflow"]
    history = MlflowClient(tracking_uri=uri).get_metric_history(state["run_id"], "train/loss")
    assert sorted((m.step, m.value) for m in history) == [
        (1, 11), (2, 12), (3, 13), (4, 14), (5, 25), (6, 26)]
