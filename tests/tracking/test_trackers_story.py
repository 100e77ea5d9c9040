"""One run, preempted and resumed on the local profile, reporting to a real MLflow tracking
server (SQLite store, started here) and to W&B in offline mode. The server is killed while the
run is held mid-run: training goes on, the rank log warns, the records it missed are kept; once
the server is back, the resumed attempt sends them. Read back through MLflow's client and W&B's
own reader: one tracker run, every logged step exactly once and in order, as finally trained;
the job as params; the run's events as tags; the report PNG as an artifact."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hpctrain.config import load_job, load_profile, resolve
from hpctrain.config.tracking import MlflowSection, TrackingSection, WandbSection
from hpctrain.record.files import record_kind
from hpctrain.record.reader import read_jsonl
from hpctrain.scheduler.state import live_jobs
from hpctrain.submission import prepare_run, submit_training
from hpctrain.tracking.records import final_records
from hpctrain.tracking.sync import offline_folders
from tests.conftest import wait_until
from tests.ops.helpers import OPS_JOB, cli, slowed, wait_step
from tests.tracking.servers import MlflowServer

pytestmark = pytest.mark.megatron


def _sent_step(run, tracker):
    try:
        return json.loads((run.path / "tracking" / "state.json").read_text())[tracker]["sent_step"]
    except (OSError, ValueError, KeyError):
        return 0


def wandb_records(folder):
    """The records of a W&B offline run folder, read by W&B's own reader (``wandb leet inspect
    --json``, which decodes the run's ``.wandb`` transaction log)."""
    import subprocess
    import sys
    from pathlib import Path
    wandb_cli = Path(sys.executable).with_name("wandb")
    out = subprocess.run([str(wandb_cli), "leet", "inspect", "--json", str(folder)],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def wandb_history(folder):
    """(training steps logged, run ids, tags) of one W&B offline run folder."""
    steps, ids, tags = [], set(), set()
    for record in wandb_records(folder):
        if record.get("type") == "history" and "train/loss" in record["history"]["item"]:
            steps.append(record["history"]["item"]["step"])
        elif record.get("type") == "run":
            ids.add(record["run"]["run_id"])
            tags |= set(record["run"].get("tags") or [])
    return steps, ids, tags


def test_a_preempted_and_resumed_run_is_one_tracker_run_with_each_step_once(tmp_path):
    from mlflow import MlflowClient
    server = MlflowServer(tmp_path / "mlflow").start()
    try:
        job = load_job(OPS_JOB)
        job.train.steps, job.train.log_interval = 10, 1
        job.checkpoint.interval_steps = 2
        job.tracking = TrackingSection(
            mlflow=MlflowSection(tracking_uri=server.uri, experiment="drill"),
            wandb=WandbSection(project="drill", mode="offline", tags=["tiny"]),
            flush_timeout_s=3)
        from hpctrain.data.prepare import ensure_prepared
        ensure_prepared(job)
        profile = load_profile("local")
        profile = slowed(dataclasses.replace(profile, slurm=dataclasses.replace(
            profile.slurm, gpus_per_node=1)), 0.05, hold_after=4)
        root = tmp_path / "runs"
        resolved = resolve(job, profile, source=str(OPS_JOB))
        run = prepare_run(resolved, root, source=str(OPS_JOB))
        submit_training(resolved, run)
        wait_step(run, 4)
        wait_until(lambda: _sent_step(run, "mlflow") >= 4, 180, what="MLflow to receive step 4")
        server.kill()                               # mid-run: the rank holds after step 4
        cli(root, "cancel", run.id)
        wait_until(lambda: not live_jobs(run) and run.ledger(), 120, what="the run to stop")
        first = run.ledger()[0]
        log = run.rank_log(1, 0).read_text()
        assert "tracking: mlflow cannot be reached" in log and "training continues" in log
        missed = [r["step"] for r in final_records(read_jsonl(run.metrics_file), 4,
                                                   first["end_step"])]
        unsent = read_jsonl(run.path / "tracking" / "unsent.jsonl") if missed else []
        assert [u["record"]["step"] for u in unsent if u["tracker"] == "mlflow"] == missed

        server.start()                              # back, same store and address
        (run.path / "hold-release").touch()
        cli(root, "resume", run.id)
        assert [r["exit_reason"] for r in run.ledger()] == ["cancelled", "finished"]

        final = [r for r in final_records(read_jsonl(run.metrics_file), 0, None)
                 if record_kind(r) == "train"]
        assert [r["step"] for r in final] == list(range(1, 11))
        state = json.loads((run.path / "tracking" / "state.json").read_text())
        client = MlflowClient(tracking_uri=server.uri)
        run_id = state["mlflow"]["run_id"]
        for key in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s"):
            history = client.get_metric_history(run_id, key)
            assert [m.step for m in history] == list(range(1, 11)), key
        losses = {m.step: m.value for m in client.get_metric_history(run_id, "train/loss")}
        assert losses == {r["step"]: pytest.approx(r["loss"]) for r in final}
        got = client.get_run(run_id)
        assert got.info.status == "FINISHED" and got.info.run_name == run.id
        assert got.data.params["job.train.steps"] == "10"
        assert got.data.params["profile.name"] == "local"
        for label in ("cancel", "emergency-checkpoint", "resume"):
            assert int(got.data.tags[f"hpctrain.events.{label}"]) >= 1, label
        assert "report.png" in [a.path for a in client.list_artifacts(run_id)]
        exp = client.get_experiment_by_name("drill")
        assert [r.info.run_id for r in client.search_runs([exp.experiment_id])] == [run_id]

        folders = offline_folders(run)
        assert len(folders) == 2                     # one per attempt, one W&B run id
        (s1, ids1, tags1), (s2, ids2, tags2) = (wandb_history(f) for f in folders)
        assert ids1 == ids2 == {state["wandb"]["run_id"]}
        assert s1 + s2 == list(range(1, 11))
        assert {"tiny", "cancel", "emergency-checkpoint"} <= tags1
        assert "resume" in tags2

        out = cli(root, "sync", run.id, "--no-upload").stdout
        assert "mlflow: steps up to 10 sent" in out and "wandb: steps up to 10 sent" in out
    finally:
        server.kill()
